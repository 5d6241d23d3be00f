//! Perfetto's track compressor: the tracks of one group (legacy async operations of one scope
//! and root name, or descriptor tracks merged by name or `sibling_merge_key`) shared among
//! the group's cookies (an async id, a track uuid). An event goes to the track that holds its
//! cookie, else to the first track with nothing open (which its cookie then holds), else to a
//! new one; so cookies whose slices do not overlap in time share a track, and overlapping ones
//! never do. The track's index in its group is its `track_compressor_idx` dimension.
//!
//! Perfetto finds the track by scanning the group; here a cookie map and an ordered set of the
//! idle tracks find the same one in logarithmic time, so that a trace cannot make a group whose
//! every event costs its size.

use std::collections::BTreeSet;

use crate::storage::strings::FxHashMap;
use crate::storage::NONE;

/// What an event does to its group's tracks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// A slice begins: the track holds one more open slice.
    Begin,
    /// A slice ends: one fewer (never below none).
    End,
    /// An instant (a begin and an end at once: the count is unchanged).
    Instant,
    /// Not a slice (a counter, a log, a child's link to its parent): the group's first track,
    /// made (held by cookie 0) if the group has none.
    Default,
}

/// One group's tracks, in the order they were made.
#[derive(Debug, Default)]
pub(crate) struct TrackGroup {
    tracks: Vec<GroupTrack>,
    /// Cookie → the track that holds it (at most one does).
    by_cookie: FxHashMap<u64, u32>,
    /// The tracks with nothing open, by index (the first is the one Perfetto picks).
    idle: BTreeSet<u32>,
}

/// One track of a group: the cookie it holds, how many of its slices are open, and its track
/// id (`NONE` until [`TrackGroup::set_track`]).
#[derive(Clone, Copy, Debug)]
struct GroupTrack {
    cookie: u64,
    open: u32,
    track: u32,
}

impl TrackGroup {
    /// The index of the track for an event of `cookie` that does `step`, its open count
    /// updated. Its track id is [`track`](Self::track) (`NONE`: the caller makes the track and
    /// gives it with [`set_track`](Self::set_track)).
    pub(crate) fn pick(&mut self, cookie: u64, step: Step) -> usize {
        let at = if step == Step::Default {
            if self.tracks.is_empty() {
                self.push(0);
            }
            0
        } else if let Some(&at) = self.by_cookie.get(&cookie) {
            at
        } else if let Some(&at) = self.idle.first() {
            let t = &mut self.tracks[at as usize];
            self.by_cookie.remove(&t.cookie);
            t.cookie = cookie;
            self.by_cookie.insert(cookie, at);
            at
        } else {
            self.push(cookie)
        } as usize;
        let t = &mut self.tracks[at];
        match step {
            Step::Begin => {
                t.open += 1;
                self.idle.remove(&(at as u32));
            }
            Step::End if t.open > 0 => {
                t.open -= 1;
                if t.open == 0 {
                    self.idle.insert(at as u32);
                }
            }
            _ => {}
        }
        at
    }

    /// The track id at index `at` (`NONE` if not made yet).
    pub(crate) fn track(&self, at: usize) -> u32 {
        self.tracks[at].track
    }

    pub(crate) fn set_track(&mut self, at: usize, track: u32) {
        self.tracks[at].track = track;
    }

    /// The track id `cookie` holds, if it holds one that was made.
    pub(crate) fn held_by(&self, cookie: u64) -> Option<u32> {
        let &at = self.by_cookie.get(&cookie)?;
        Some(self.tracks[at as usize].track).filter(|&t| t != NONE)
    }

    fn push(&mut self, cookie: u64) -> u32 {
        let at = self.tracks.len() as u32;
        self.tracks.push(GroupTrack {
            cookie,
            open: 0,
            track: NONE,
        });
        self.by_cookie.insert(cookie, at);
        self.idle.insert(at);
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Perfetto's track compressor as it reads (a linear search per event): what
    /// [`TrackGroup::pick`]'s indexes must agree with.
    fn pick_linear(tracks: &mut Vec<(u64, u32)>, cookie: u64, step: Step) -> usize {
        let at = if step == Step::Default {
            if tracks.is_empty() {
                tracks.push((0, 0));
            }
            0
        } else if let Some(at) = tracks.iter().position(|t| t.0 == cookie) {
            at
        } else if let Some(at) = tracks.iter().position(|t| t.1 == 0) {
            tracks[at].0 = cookie;
            at
        } else {
            tracks.push((cookie, 0));
            tracks.len() - 1
        };
        match step {
            Step::Begin => tracks[at].1 += 1,
            Step::End => tracks[at].1 = tracks[at].1.saturating_sub(1),
            _ => {}
        }
        at
    }

    proptest::proptest! {
        #[test]
        fn a_group_picks_the_track_perfettos_compressor_picks(
            events in proptest::collection::vec((0u64..6, 0u8..4), 0..200)
        ) {
            let mut group = TrackGroup::default();
            let mut model = Vec::new();
            for (cookie, step) in events {
                let step = [Step::Begin, Step::End, Step::Instant, Step::Default][step as usize];
                let got = group.pick(cookie, step);
                let want = pick_linear(&mut model, cookie, step);
                proptest::prop_assert_eq!(got, want);
                let opens: Vec<u32> = group.tracks.iter().map(|t| t.open).collect();
                let model_opens: Vec<u32> = model.iter().map(|t| t.1).collect();
                proptest::prop_assert_eq!(opens, model_opens);
            }
        }
    }
}

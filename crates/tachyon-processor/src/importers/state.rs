//! TrackEvent state tracks: a track whose descriptor has a `state` (a `StateDescriptor`) takes
//! `TYPE_STATE` events, each naming the state the track is in from then on (the event's name;
//! no name: no state). As Perfetto's `StateTracker`: a state lasts until the next event with
//! another value on the track (`dur = -1` while none came); an event repeating the current
//! value continues it, its args added to the state's; an event without a value ends the
//! current state and starts none.
//!
//! Rows go to the `state` table; the tracks (`thread_state_track_event`,
//! `process_state_track_event`, `global_state_track_event`, event type `state`) are listed by
//! the `state_track`, `process_state_track` and `thread_state_track` views.
//!
//! A `TYPE_STATE` event on a track that is not a state track, or without a track uuid, is a
//! parser error (`track_event_parser_errors`), as in Perfetto.

use crate::importers::{Event, Parser};
use crate::storage::state::StateRow;
use crate::storage::NONE;

impl Parser {
    /// A `TYPE_STATE` event (kind `EventKind::State`) on state track `track`.
    pub(crate) fn apply_state(&mut self, ev: &Event, track: u32) {
        if let Some(&row) = self.st.states.active.get(&track) {
            let current = self.st.states.rows[row as usize];
            if current.value == ev.name && ev.name != NONE {
                let set = self.args_for(current.arg_set, ev);
                self.st.states.rows[row as usize].arg_set = set;
                return;
            }
            let r = &mut self.st.states.rows[row as usize];
            r.dur = ev.ts.saturating_sub(r.ts);
            self.st.states.active.remove(&track);
        }
        if ev.name == NONE {
            return;
        }
        let arg_set = self.args_for(NONE, ev);
        let id = self.st.states.rows.len() as u32;
        self.st.states.rows.push(StateRow {
            ts: ev.ts,
            dur: -1,
            track,
            category: ev.category,
            value: ev.name,
            arg_set,
        });
        self.st.states.active.insert(track, id);
    }
}

//! Converting timestamps of any clock onto the trace clock (BOOTTIME unless a ClockSnapshot's
//! `primary_trace_clock` says otherwise), as Perfetto's `ClockTracker` does.
//!
//! Each ClockSnapshot says "at one instant, clock A read a, clock B read b, …". Clocks that
//! appear together are connected; converting a timestamp of clock X walks the shortest chain of
//! connections from X to the trace clock (breadth-first, cached), and across each hop uses the
//! snapshot whose source reading is the latest one not after the timestamp (the earliest one
//! for timestamps before every snapshot): `t_B = b + (t_A − a)`. All arithmetic is in
//! nanoseconds: a clock's raw values are multiplied by its `unit_multiplier_ns`.
//!
//! Clock ids 64–127 are scoped to one packet sequence; callers map them to a global id with
//! [`sequence_clock`] before asking. An *incremental* clock carries deltas: each value is added
//! to the clock's previous absolute value, which each snapshot resets. That is how the C++ SDK
//! encodes timestamps (clock 64 with `is_incremental`), and it requires converting packets in
//! the order they were written, which the importer does (conversion happens before sorting).
//!
//! With no ClockSnapshot in the whole trace nothing is converted: raw timestamps are trace time.

use std::collections::VecDeque;

use crate::strings::FxHashMap;

/// A clock id; sequence-scoped ids carry the sequence id in the upper 32 bits.
pub(crate) type ClockId = u64;

/// `BUILTIN_CLOCK_BOOTTIME`, the default trace clock.
pub(crate) const BOOTTIME: ClockId = tachyon_protos::BuiltinClock::Boottime as ClockId;

/// Whether a clock id is sequence-scoped (64–127).
pub(crate) fn is_sequence_clock(id: u32) -> bool {
    (64..=127).contains(&id)
}

/// The global id of sequence-scoped clock `id` on sequence `seq`.
pub(crate) fn sequence_clock(seq: u32, id: u32) -> ClockId {
    ((seq as u64) << 32) | id as u64
}

/// One clock's reading in a snapshot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClockReading {
    pub(crate) id: ClockId,
    pub(crate) value: u64,
    pub(crate) is_incremental: bool,
    pub(crate) unit_multiplier_ns: u64,
}

#[derive(Debug)]
struct ClockInfo {
    unit_ns: i64,
    incremental: bool,
    /// Absolute value (ns) of an incremental clock, advanced by every delta.
    last_ns: i64,
}

/// Why a snapshot was rejected.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct InvalidSnapshot;

#[derive(Debug)]
pub(crate) struct ClockTracker {
    trace_clock: ClockId,
    clocks: FxHashMap<ClockId, ClockInfo>,
    /// For each connected pair (lower id, higher id): readings (lower, higher) in ns, sorted by
    /// the lower id's reading (snapshots of one pair may arrive out of order when several
    /// sequences write them: each sequence's are in order, the file interleaves them).
    edges: FxHashMap<(ClockId, ClockId), Vec<(i64, i64)>>,
    /// The latest reading of each clock in snapshots of the same set of clocks, to reject
    /// snapshots that go backwards. Keyed by the set, as Perfetto's ClockTracker does: a
    /// snapshot with a sequence-scoped clock is a different set on every sequence, so two
    /// sequences' snapshots never conflict, while one sequence's must move forward.
    last_snapshot: FxHashMap<(ClockId, u64), i64>,
    adjacency: FxHashMap<ClockId, Vec<ClockId>>,
    path_cache: FxHashMap<ClockId, Option<Vec<ClockId>>>,
    any_snapshot: bool,
    converted: bool,
}

impl Default for ClockTracker {
    fn default() -> Self {
        ClockTracker {
            trace_clock: BOOTTIME,
            clocks: FxHashMap::default(),
            edges: FxHashMap::default(),
            last_snapshot: FxHashMap::default(),
            adjacency: FxHashMap::default(),
            path_cache: FxHashMap::default(),
            any_snapshot: false,
            converted: false,
        }
    }
}

impl ClockTracker {
    /// Sets the trace clock; only honoured before the first conversion, so that all
    /// timestamps share one domain.
    pub(crate) fn set_trace_clock(&mut self, id: ClockId) -> bool {
        if self.converted && id != self.trace_clock {
            return false;
        }
        self.trace_clock = id;
        self.path_cache.clear();
        true
    }

    pub(crate) fn add_snapshot(
        &mut self,
        readings: &[ClockReading],
    ) -> Result<(), InvalidSnapshot> {
        // Validate everything first: a snapshot is taken whole or not at all.
        let mut ids: Vec<ClockId> = readings.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        let fingerprint = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            ids.hash(&mut h);
            h.finish()
        };
        let mut ns = Vec::with_capacity(readings.len());
        for (i, r) in readings.iter().enumerate() {
            if readings[..i].iter().any(|o| o.id == r.id) {
                return Err(InvalidSnapshot);
            }
            let unit = r.unit_multiplier_ns.max(1);
            let v = (r.value as i128) * (unit as i128);
            let v = i64::try_from(v).map_err(|_| InvalidSnapshot)?;
            if let Some(&last) = self.last_snapshot.get(&(r.id, fingerprint)) {
                if v < last && !r.is_incremental {
                    return Err(InvalidSnapshot);
                }
            }
            ns.push(v);
        }
        self.any_snapshot = true;
        for (r, &v) in readings.iter().zip(&ns) {
            let info = self.clocks.entry(r.id).or_insert(ClockInfo {
                unit_ns: 1,
                incremental: false,
                last_ns: 0,
            });
            info.unit_ns = r.unit_multiplier_ns.max(1).min(i64::MAX as u64) as i64;
            info.incremental = r.is_incremental;
            info.last_ns = v;
            self.last_snapshot.insert((r.id, fingerprint), v);
        }
        for i in 0..readings.len() {
            for j in i + 1..readings.len() {
                let (a, b) = (readings[i].id, readings[j].id);
                let (key, pair) = if a < b {
                    ((a, b), (ns[i], ns[j]))
                } else {
                    ((b, a), (ns[j], ns[i]))
                };
                let list = self.edges.entry(key).or_default();
                if list.is_empty() {
                    self.adjacency.entry(a).or_default().push(b);
                    self.adjacency.entry(b).or_default().push(a);
                    self.path_cache.clear();
                }
                // Sorted by the lower side; a pair out of order on the other side (a clock that
                // disagrees with its partner about which snapshot came first) replaces the
                // entries it contradicts, so both sides stay sorted for the searches.
                let at = list.partition_point(|l| l.0 <= pair.0);
                if list.last().is_some_and(|l| l.0 <= pair.0 && l.1 <= pair.1) {
                    list.push(pair);
                } else {
                    list.insert(at, pair);
                    list.retain(|l| {
                        (l.0 <= pair.0 && l.1 <= pair.1) || (l.0 >= pair.0 && l.1 >= pair.1)
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether `clock` can currently be converted.
    pub(crate) fn has_path(&mut self, clock: ClockId) -> bool {
        !self.any_snapshot || clock == self.trace_clock || self.path(clock).is_some()
    }

    /// Converts a raw reading of `clock` (in its units) to trace time in ns.
    pub(crate) fn convert(&mut self, clock: ClockId, raw: u64) -> Option<i64> {
        if !self.any_snapshot {
            // Perfetto's rule: without any ClockSnapshot, timestamps are already trace time.
            return Some(raw as i64);
        }
        self.converted = true;
        let info = match self.clocks.get_mut(&clock) {
            Some(info) => info,
            None if clock == self.trace_clock => return Some(raw as i64),
            None => return None,
        };
        let delta = (raw as i128) * (info.unit_ns as i128);
        let mut ts = if info.incremental {
            let v = i64::try_from(info.last_ns as i128 + delta).ok()?;
            info.last_ns = v;
            v
        } else {
            i64::try_from(delta).ok()?
        };
        if clock == self.trace_clock {
            return Some(ts);
        }
        let path = self.path(clock)?;
        for hop in path.windows(2) {
            let (a, b) = (hop[0], hop[1]);
            let forward = a < b;
            let list = self.edges.get(&if forward { (a, b) } else { (b, a) })?;
            let src = |p: &(i64, i64)| if forward { p.0 } else { p.1 };
            let dst = |p: &(i64, i64)| if forward { p.1 } else { p.0 };
            let idx = list.partition_point(|p| src(p) <= ts);
            let snap = &list[idx.saturating_sub(1)];
            ts = dst(snap).checked_add(ts.checked_sub(src(snap))?)?;
        }
        Some(ts)
    }

    /// Breadth-first shortest path from `clock` to the trace clock, cached.
    fn path(&mut self, clock: ClockId) -> Option<Vec<ClockId>> {
        if let Some(p) = self.path_cache.get(&clock) {
            return p.clone();
        }
        let target = self.trace_clock;
        let mut prev: FxHashMap<ClockId, ClockId> = FxHashMap::default();
        let mut queue = VecDeque::from([clock]);
        prev.insert(clock, clock);
        let mut found = false;
        while let Some(c) = queue.pop_front() {
            if c == target {
                found = true;
                break;
            }
            for &n in self.adjacency.get(&c).into_iter().flatten() {
                if let std::collections::hash_map::Entry::Vacant(e) = prev.entry(n) {
                    e.insert(c);
                    queue.push_back(n);
                }
            }
        }
        let result = found.then(|| {
            let mut p = vec![target];
            let mut c = target;
            while c != clock {
                c = prev[&c];
                p.push(c);
            }
            p.reverse();
            p
        });
        self.path_cache.insert(clock, result.clone());
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(id: ClockId, value: u64) -> ClockReading {
        ClockReading {
            id,
            value,
            is_incremental: false,
            unit_multiplier_ns: 1,
        }
    }

    #[test]
    fn no_snapshot_means_no_conversion() {
        let mut c = ClockTracker::default();
        assert_eq!(c.convert(3, 42), Some(42));
        assert!(c.has_path(128));
    }

    #[test]
    fn converts_through_latest_snapshot_and_multiple_hops() {
        let mut c = ClockTracker::default();
        c.add_snapshot(&[r(BOOTTIME, 1000), r(3, 100)]).unwrap();
        c.add_snapshot(&[r(BOOTTIME, 2000), r(3, 1050)]).unwrap();
        c.add_snapshot(&[r(3, 1500), r(200, 10)]).unwrap();
        assert_eq!(c.convert(3, 150), Some(1050));
        assert_eq!(c.convert(3, 1100), Some(2050));
        // Before the first snapshot: extrapolate from the first one.
        assert_eq!(c.convert(3, 50), Some(950));
        // Two hops: 200 -> 3 -> BOOTTIME.
        assert_eq!(c.convert(200, 20), Some(2000 + (1510 - 1050)));
        assert_eq!(c.convert(99, 1), None);
        assert!(!c.has_path(99));
    }

    #[test]
    fn incremental_clock_with_multiplier() {
        let mut c = ClockTracker::default();
        let seq = sequence_clock(7, 64);
        c.add_snapshot(&[
            r(BOOTTIME, 10_000),
            ClockReading {
                id: seq,
                value: 10,
                is_incremental: true,
                unit_multiplier_ns: 1000,
            },
        ])
        .unwrap();
        assert_eq!(c.convert(seq, 2), Some(12_000));
        assert_eq!(c.convert(seq, 3), Some(15_000));
    }

    #[test]
    fn rejects_backwards_and_duplicate_snapshots() {
        let mut c = ClockTracker::default();
        c.add_snapshot(&[r(BOOTTIME, 1000), r(3, 100)]).unwrap();
        assert_eq!(
            c.add_snapshot(&[r(BOOTTIME, 900), r(3, 200)]),
            Err(InvalidSnapshot)
        );
        assert_eq!(
            c.add_snapshot(&[r(3, 900), r(3, 200)]),
            Err(InvalidSnapshot)
        );
        assert_eq!(
            c.add_snapshot(&[r(3, u64::MAX), r(BOOTTIME, 1)]),
            Err(InvalidSnapshot)
        );
    }
}

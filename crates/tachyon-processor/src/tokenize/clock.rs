//! Converting timestamps of any clock onto the trace clock (BOOTTIME unless a ClockSnapshot's
//! `primary_trace_clock` says otherwise), as Perfetto's `ClockTracker` does.
//!
//! Each ClockSnapshot says "at one instant, clock A read a, clock B read b, …". Snapshots of the
//! same clocks in the same order form a *series* (Perfetto's snapshot hash, which it computes
//! from the clock ids in the order the snapshot lists them): one reading per clock per
//! snapshot, in file order, every clock moving forward (a snapshot that moves a clock of its
//! series backwards is rejected). Clocks that appear together are connected; converting a
//! timestamp of clock X walks a shortest chain of connections from X to the trace clock, and
//! each hop uses **one** series: within that series, the snapshot whose source reading is the
//! latest one not after the timestamp (the earliest one for timestamps before every snapshot)
//! gives `t_B = b + (t_A − a)`. All arithmetic is in nanoseconds: a clock's raw values are
//! multiplied by its `unit_multiplier_ns`.
//!
//! Which chain and which series are chosen decides the result to the nanosecond when several
//! series link the same clocks (Tachyon's SDK writes the trace clock against BOOTTIME on every
//! sequence, each sequence's snapshots a series of their own, each read by its own thread with
//! its own error of tens to hundreds of ns). Tachyon chooses as Perfetto's `ClockSynchronizer`
//! does, so that both processors give the same timestamps: Perfetto keeps its clock graph as an
//! ordered set of edges (from, to, snapshot hash), clock ids ordered by (id, sequence), and its
//! breadth-first search takes the first path that reaches the target. That is the shortest path
//! whose hops are smallest in that order: at each step the next clock with the smallest id among
//! those one hop nearer the target, through the series with the **lowest snapshot hash** that
//! links the two clocks (among the series seen so far in the file: a later series with a lower
//! hash takes over from then on, as in Perfetto, which recomputes paths after every snapshot).
//! [`snapshot_hash`] is Perfetto's hash (its MurmurHash combiner over each clock's
//! (id, sequence id, trace file 0, machine 0)), so the choice is the same.
//!
//! Clock ids 64–127 are scoped to one packet sequence; callers map them to a global id with
//! [`sequence_clock`] before asking. An *incremental* clock carries deltas: each value is added
//! to the clock's previous absolute value, which each snapshot resets. That is how the C++ SDK
//! encodes timestamps (clock 64 with `is_incremental`), and it requires converting packets in
//! the order they were written, which the importer does (conversion happens before sorting). An
//! incremental clock is converted through the snapshot that last reset it (a producer may
//! restart it from zero at every reset).
//!
//! A timestamp whose clock has no path to the trace clock yet (the snapshot linking it may come
//! later in the file) is [`Converted::Later`]: the importer keeps it for the end of the file.
//! What can be resolved in file order is resolved first: an incremental clock's delta is added
//! at once (the next deltas build on it), and the pending value remembers the snapshot that
//! anchored it, so only the hops to the trace clock wait.
//!
//! With no ClockSnapshot in the whole trace nothing is converted: raw timestamps are trace time.

use std::collections::VecDeque;

use crate::storage::strings::FxHashMap;

/// A clock id; sequence-scoped ids carry the sequence id in the upper 32 bits.
pub(crate) type ClockId = u64;

/// `BUILTIN_CLOCK_BOOTTIME`, the default trace clock.
pub(crate) const BOOTTIME: ClockId = tachyon_protos::BuiltinClock::Boottime as ClockId;

/// `BUILTIN_CLOCK_MONOTONIC`, the clock of TrackEvent's legacy microsecond timestamps.
pub(crate) const MONOTONIC: ClockId = tachyon_protos::BuiltinClock::Monotonic as ClockId;

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
    /// The latest snapshot with this clock: (series, row).
    anchor: (usize, usize),
}

/// A timestamp that cannot be converted yet: its clock has no path to the trace clock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    clock: ClockId,
    value: PendingValue,
}

#[derive(Clone, Copy, Debug)]
enum PendingValue {
    /// No snapshot has mentioned the clock yet: its unit is unknown.
    Raw(u64),
    /// The reading in ns; for an incremental clock, its absolute value and the snapshot it
    /// builds on.
    Ns {
        ns: i64,
        anchor: Option<(usize, usize)>,
    },
}

impl Pending {
    /// Whether a snapshot had mentioned the clock (its unit and encoding are known).
    pub(crate) fn clock_known(&self) -> bool {
        matches!(self.value, PendingValue::Ns { .. })
    }
}

/// The result of [`ClockTracker::convert`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Converted {
    /// Trace time in ns.
    At(i64),
    /// No path to the trace clock yet: [`ClockTracker::finish`] at the end of the file.
    Later(Pending),
    /// The value does not fit (overflow).
    Failed,
}

impl Converted {
    /// The trace time, if the conversion could be made.
    pub(crate) fn at(self) -> Option<i64> {
        match self {
            Converted::At(ts) => Some(ts),
            Converted::Later(_) | Converted::Failed => None,
        }
    }
}

/// The accepted snapshots of one set of clocks, in file order.
#[derive(Debug)]
struct Series {
    /// The set's clocks, sorted.
    ids: Vec<ClockId>,
    /// Perfetto's snapshot hash of the series (see [`snapshot_hash`]).
    hash: u32,
    /// Per clock (in `ids` order), its reading (ns) in each snapshot. Non-decreasing for every
    /// clock that is not incremental (`add_snapshot` rejects the others).
    readings: Vec<Vec<i64>>,
    /// Per clock: some reading is below the one before it (an incremental clock restarted):
    /// no [`Memo`] is made through such a column.
    unsorted: Vec<bool>,
}

/// One hop of a conversion path: from column `from` to column `to` of series `series`.
#[derive(Clone, Copy, Debug)]
struct Hop {
    series: usize,
    from: usize,
    to: usize,
}

/// A conversion's whole path as one offset: a reading `ns` of `clock` (through `anchor`) in
/// `lo..hi` takes the same snapshot row at every hop as the reading the memo was made from, so
/// it converts to `ns + offset`. A sequence's events mostly convert on one clock between the
/// same snapshots, and this is one comparison and an add instead of the walk.
///
/// Made only when the walk provably gives the same number: paths of at most two hops, every
/// reading involved and the range within ±2^60 (no step of the walk can overflow, so its
/// checked steps add up to the offset), and the rows of unanchored hops chosen in columns
/// whose readings never go down (where the binary search's row is the one whose interval
/// holds the reading). Forgotten whenever a snapshot arrives or the paths change.
#[derive(Clone, Copy, Debug)]
struct Memo {
    clock: ClockId,
    anchor: Option<(usize, usize)>,
    lo: i64,
    hi: i64,
    offset: i64,
}

/// Bound on the readings and values a [`Memo`] covers.
const MEMO_BOUND: i64 = 1 << 60;

/// Why a snapshot was rejected.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct InvalidSnapshot;

#[derive(Debug)]
pub(crate) struct ClockTracker {
    trace_clock: ClockId,
    /// Each clock a snapshot described → its position in `infos` (positions never change).
    clocks: FxHashMap<ClockId, usize>,
    infos: Vec<ClockInfo>,
    /// The clock converted last and its position in `infos`: a sequence's packets come in
    /// runs on one clock, so most conversions skip the map.
    last_clock: (ClockId, usize),
    series: Vec<Series>,
    /// Clocks in snapshot order → the series' index in `series`. Keyed as Perfetto keys its
    /// snapshot hashes: a snapshot with a sequence-scoped clock is a different series on every
    /// sequence, so two sequences' snapshots never conflict, while one sequence's must move
    /// forward.
    series_of_set: FxHashMap<Vec<ClockId>, usize>,
    /// For each connected pair (lower id, higher id): the series with the lowest hash that
    /// links it, the one conversions between the two use.
    links: FxHashMap<(ClockId, ClockId), usize>,
    adjacency: FxHashMap<ClockId, Vec<ClockId>>,
    path_cache: FxHashMap<ClockId, Option<Vec<Hop>>>,
    /// The path converted along last, and its clock (a copy of its `path_cache` entry): a
    /// sequence's packets come in runs, each converting its timestamp on the same clock.
    last_path: Option<(ClockId, Vec<Hop>)>,
    /// The last conversion as one offset, and the readings it holds for: see [`Memo`].
    memo: Option<Memo>,
    any_snapshot: bool,
    converted: bool,
}

impl Default for ClockTracker {
    fn default() -> Self {
        ClockTracker {
            trace_clock: BOOTTIME,
            clocks: FxHashMap::default(),
            infos: Vec::new(),
            last_clock: (0, usize::MAX),
            series: Vec::new(),
            series_of_set: FxHashMap::default(),
            links: FxHashMap::default(),
            adjacency: FxHashMap::default(),
            path_cache: FxHashMap::default(),
            last_path: None,
            memo: None,
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
        self.clear_paths();
        true
    }

    pub(crate) fn add_snapshot(
        &mut self,
        readings: &[ClockReading],
    ) -> Result<(), InvalidSnapshot> {
        // Validate everything first: a snapshot is taken whole or not at all. An empty one
        // links nothing (and a series needs at least one column).
        if readings.is_empty() {
            return Err(InvalidSnapshot);
        }
        // New rows change which snapshot a reading falls in.
        self.memo = None;
        let ordered: Vec<ClockId> = readings.iter().map(|r| r.id).collect();
        let mut ids = ordered.clone();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(InvalidSnapshot);
        }
        let existing = self.series_of_set.get(&ordered).copied();
        let mut ns = Vec::with_capacity(readings.len());
        for r in readings {
            let unit = r.unit_multiplier_ns.max(1);
            // Both factors are u64s from the trace: their product may not fit even an i128.
            let v = (r.value as i128)
                .checked_mul(unit as i128)
                .and_then(|v| i64::try_from(v).ok())
                .ok_or(InvalidSnapshot)?;
            if let Some(s) = existing {
                let series = &self.series[s];
                let col = series.column(r.id);
                if !r.is_incremental && series.readings[col].last().is_some_and(|&last| v < last) {
                    return Err(InvalidSnapshot);
                }
            }
            ns.push(v);
        }
        self.any_snapshot = true;
        let s = match existing {
            Some(s) => s,
            None => {
                let s = self.series.len();
                self.series.push(Series {
                    readings: vec![Vec::new(); ids.len()],
                    unsorted: vec![false; ids.len()],
                    hash: snapshot_hash(&ordered),
                    ids,
                });
                self.series_of_set.insert(ordered, s);
                s
            }
        };
        let row = self.series[s].readings[0].len();
        for (r, &v) in readings.iter().zip(&ns) {
            let col = self.series[s].column(r.id);
            let series = &mut self.series[s];
            if series.readings[col].last().is_some_and(|&last| v < last) {
                series.unsorted[col] = true;
            }
            series.readings[col].push(v);
            let info = ClockInfo {
                unit_ns: r.unit_multiplier_ns.max(1).min(i64::MAX as u64) as i64,
                incremental: r.is_incremental,
                last_ns: v,
                anchor: (s, row),
            };
            match self.clocks.get(&r.id) {
                Some(&i) => self.infos[i] = info,
                None => {
                    self.clocks.insert(r.id, self.infos.len());
                    self.infos.push(info);
                }
            }
        }
        if existing.is_some() {
            // A set seen before linked its pairs then; links are never removed.
            return Ok(());
        }
        // The pairs this series connects that no earlier one did, and those it links with a
        // lower hash than the series that linked them so far.
        let (set, hash) = (&self.series[s].ids, self.series[s].hash);
        for i in 0..set.len() {
            for j in i + 1..set.len() {
                let (a, b) = (set[i], set[j]);
                match self.links.entry((a, b)) {
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(s);
                        self.adjacency.entry(a).or_default().push(b);
                        self.adjacency.entry(b).or_default().push(a);
                        self.path_cache.clear();
                        self.last_path = None;
                    }
                    std::collections::hash_map::Entry::Occupied(mut e) => {
                        if hash < self.series[*e.get()].hash {
                            e.insert(s);
                            self.path_cache.clear();
                            self.last_path = None;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Converts a raw reading of `clock` (in its units) to trace time in ns, or says why not
    /// yet. An incremental clock's delta is taken now either way.
    #[inline]
    pub(crate) fn convert(&mut self, clock: ClockId, raw: u64) -> Converted {
        if !self.any_snapshot {
            // Perfetto's rule: without any ClockSnapshot, timestamps are already trace time.
            return Converted::At(raw as i64);
        }
        let found = match self.last_clock {
            (c, i) if c == clock && i != usize::MAX => Some(i),
            _ => self.clocks.get(&clock).copied(),
        };
        let info = match found.and_then(|i| Some((i, self.infos.get_mut(i)?))) {
            Some((i, info)) => {
                self.last_clock = (clock, i);
                info
            }
            None if clock == self.trace_clock => {
                self.converted = true;
                return Converted::At(raw as i64);
            }
            None => {
                return Converted::Later(Pending {
                    clock,
                    value: PendingValue::Raw(raw),
                })
            }
        };
        let delta = (raw as i128) * (info.unit_ns as i128);
        let (ns, anchor) = if info.incremental {
            let Ok(v) = i64::try_from(info.last_ns as i128 + delta) else {
                return Converted::Failed;
            };
            info.last_ns = v;
            (v, Some(info.anchor))
        } else {
            let Ok(v) = i64::try_from(delta) else {
                return Converted::Failed;
            };
            (v, None)
        };
        self.resolve(clock, ns, anchor)
    }

    /// Converts a timestamp left [`Converted::Later`], at the end of the file; `None` if its
    /// clock is still not linked to the trace clock (or the result overflows).
    pub(crate) fn finish(&mut self, pending: Pending) -> Option<i64> {
        match pending.value {
            PendingValue::Raw(raw) => self.convert(pending.clock, raw),
            PendingValue::Ns { ns, anchor } => self.resolve(pending.clock, ns, anchor),
        }
        .at()
    }

    /// Walks the path of a reading of `clock` already in ns (`anchor`: the snapshot that last
    /// reset an incremental clock): `Later` without a path, `Failed` on overflow.
    #[inline]
    fn resolve(&mut self, clock: ClockId, ns: i64, anchor: Option<(usize, usize)>) -> Converted {
        if clock == self.trace_clock {
            self.converted = true;
            return Converted::At(ns);
        }
        if let Some(m) = &self.memo {
            if m.clock == clock && m.anchor == anchor && m.lo <= ns && ns < m.hi {
                self.converted = true;
                return Converted::At(ns + m.offset);
            }
        }
        self.walk(clock, ns, anchor)
    }

    /// [`ClockTracker::resolve`] past the trace clock and the memo: the path's hops.
    #[inline(never)]
    fn walk(&mut self, clock: ClockId, ns: i64, anchor: Option<(usize, usize)>) -> Converted {
        if !matches!(&self.last_path, Some((c, _)) if *c == clock) {
            let path = match self.path_cache.get(&clock) {
                Some(path) => path.clone(),
                None => {
                    let path = self.find_path(clock);
                    self.path_cache.insert(clock, path.clone());
                    path
                }
            };
            let Some(path) = path else {
                return Converted::Later(Pending {
                    clock,
                    value: PendingValue::Ns { ns, anchor },
                });
            };
            self.last_path = Some((clock, path));
        }
        let Some((_, path)) = &self.last_path else {
            return Converted::Failed; // Unreachable: set just above.
        };
        self.converted = true;
        let mut ts = ns;
        // The memo being made: `ns`'s range so far, and whether the path qualifies.
        let (mut lo, mut hi) = (-MEMO_BOUND, MEMO_BOUND);
        let mut memo_ok = path.len() <= 2 && (-MEMO_BOUND..MEMO_BOUND).contains(&ns);
        for (i, hop) in path.iter().enumerate() {
            let series = &self.series[hop.series];
            let (src, dst) = (&series.readings[hop.from], &series.readings[hop.to]);
            let snap = match anchor {
                // An incremental clock: the snapshot that last reset it before this reading.
                Some((s, row)) if i == 0 && s == hop.series => row,
                _ => {
                    let row = src.partition_point(|&v| v <= ts).saturating_sub(1);
                    // The readings of this hop that take the same row: from the row's own
                    // (none below for the first row) to the next row's (none above for the
                    // last), as values of `ns` (`ts - ns` is what the hops before added).
                    if memo_ok && !series.unsorted[hop.from] {
                        let acc = ts - ns;
                        if row > 0 {
                            lo = lo.max(src[row].saturating_sub(acc));
                        }
                        if let Some(&next) = src.get(row + 1) {
                            hi = hi.min(next.saturating_sub(acc));
                        }
                    } else {
                        memo_ok = false;
                    }
                    row
                }
            };
            memo_ok &= [src.get(snap), dst.get(snap)]
                .iter()
                .all(|v| v.is_some_and(|v| (-MEMO_BOUND..MEMO_BOUND).contains(v)));
            let Some(next) = ts
                .checked_sub(src[snap])
                .and_then(|d| dst[snap].checked_add(d))
            else {
                return Converted::Failed;
            };
            ts = next;
        }
        if memo_ok && lo <= ns && ns < hi {
            self.memo = Some(Memo {
                clock,
                anchor,
                lo,
                hi,
                offset: ts - ns,
            });
        }
        Converted::At(ts)
    }

    /// Forgets every path (the graph or the trace clock changed).
    fn clear_paths(&mut self) {
        self.path_cache.clear();
        self.last_path = None;
        self.memo = None;
    }

    /// The path Perfetto's breadth-first search takes from `clock` to the trace clock: a
    /// shortest one, each hop to the next clock smallest in Perfetto's order (`perfetto_order`)
    /// among those one hop nearer the target, through the lowest-hash series linking the two.
    fn find_path(&self, clock: ClockId) -> Option<Vec<Hop>> {
        let target = self.trace_clock;
        // Distances to the target (links are symmetric).
        let mut dist: FxHashMap<ClockId, u32> = FxHashMap::default();
        let mut queue = VecDeque::from([target]);
        dist.insert(target, 0);
        while let Some(c) = queue.pop_front() {
            if c == clock {
                break;
            }
            let d = dist[&c];
            for &n in self.adjacency.get(&c).into_iter().flatten() {
                if let std::collections::hash_map::Entry::Vacant(e) = dist.entry(n) {
                    e.insert(d + 1);
                    queue.push_back(n);
                }
            }
        }
        let mut d = *dist.get(&clock)?;
        let mut hops = Vec::with_capacity(d as usize);
        let mut c = clock;
        while d > 0 {
            let next = self
                .adjacency
                .get(&c)
                .into_iter()
                .flatten()
                .copied()
                .filter(|n| dist.get(n) == Some(&(d - 1)))
                .min_by_key(|&n| perfetto_order(n))?;
            let s = self.links[&(c.min(next), c.max(next))];
            let series = &self.series[s];
            hops.push(Hop {
                series: s,
                from: series.column(c),
                to: series.column(next),
            });
            c = next;
            d -= 1;
        }
        Some(hops)
    }
}

/// Where Perfetto's ordered clock graph puts a clock: by clock id, then sequence id.
fn perfetto_order(id: ClockId) -> (u32, u32) {
    (id as u32, (id >> 32) as u32)
}

/// Perfetto's snapshot hash: its `MurmurHashCombiner` over each clock of the snapshot, in the
/// snapshot's order, each clock as (clock id, sequence id, trace file id, machine id), the last
/// two 0 for the one file and machine Tachyon imports; truncated to 32 bits as Perfetto keeps it.
pub(crate) fn snapshot_hash(clocks: &[ClockId]) -> u32 {
    fn mix(mut h: u64) -> u64 {
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        h
    }
    let mut hash: u64 = 0xe17a_1465;
    for &id in clocks {
        let (clock, seq) = perfetto_order(id);
        for part in [clock, seq, 0, 0] {
            let piece = mix(part as u64);
            hash ^= piece
                .wrapping_add(0x9e37_79b9)
                .wrapping_add(hash << 6)
                .wrapping_add(hash >> 2);
        }
    }
    hash as u32
}

impl Series {
    /// The column of clock `id` (which must be in the set).
    fn column(&self, id: ClockId) -> usize {
        self.ids
            .binary_search(&id)
            .expect("the clock is in the series' set")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The converted value, if the conversion could be made now.
    fn at(c: &mut ClockTracker, clock: ClockId, raw: u64) -> Option<i64> {
        c.convert(clock, raw).at()
    }

    fn r(id: ClockId, value: u64) -> ClockReading {
        ClockReading {
            id,
            value,
            is_incremental: false,
            unit_multiplier_ns: 1,
        }
    }

    /// A reading of an incremental clock in `ns_per_unit` nanosecond units.
    fn incremental(id: ClockId, value: u64, ns_per_unit: u64) -> ClockReading {
        ClockReading {
            is_incremental: true,
            unit_multiplier_ns: ns_per_unit,
            ..r(id, value)
        }
    }

    /// A conversion through the memo of the last one gives what the walk gives, on random
    /// snapshots (one and two hops, an incremental clock, readings going back, values near
    /// the rows' edges and near the bounds) and random conversions in between.
    #[test]
    fn memo_converts_as_the_walk_does() {
        let mut next = crate::xorshift(0x6a09_e667_f3bc_c909);
        for round in 0..200 {
            let (mut with, mut without) = (ClockTracker::default(), ClockTracker::default());
            let seq = sequence_clock(1 + round % 3, 64);
            let mut readings = Vec::new();
            let big = |x: u64| match x % 5 {
                0 => (MEMO_BOUND as u64).wrapping_add(x % 7).wrapping_sub(3),
                1 => u64::MAX - x % 100,
                _ => x % 10_000,
            };
            for step in 0..60 {
                let x = next();
                if step % 10 == 0 || x % 13 == 0 {
                    let snap = match x % 3 {
                        0 => vec![r(BOOTTIME, big(next())), r(3, big(next()))],
                        1 => vec![r(3, big(next())), incremental(seq, x % 500, 1 + x % 3)],
                        _ => vec![r(BOOTTIME, big(next())), incremental(seq, x % 900, 1)],
                    };
                    let a = with.add_snapshot(&snap);
                    assert_eq!(a, without.add_snapshot(&snap));
                    readings.extend(snap.iter().map(|r| r.value));
                    continue;
                }
                let clock = if x % 2 == 0 { 3 } else { seq };
                // Near a reading (either side of a row's edge) or anywhere.
                let raw = match (x >> 8) % 3 {
                    0 if !readings.is_empty() => {
                        let v = readings[(x >> 16) as usize % readings.len()];
                        v.wrapping_add((x >> 32) % 5).wrapping_sub(2)
                    }
                    1 => (x >> 20) % 50,
                    _ => big(x >> 4),
                };
                let got = with.convert(clock, raw).at();
                without.memo = None;
                let want = without.convert(clock, raw).at();
                assert_eq!(
                    got, want,
                    "round {round} step {step}: clock {clock} raw {raw}"
                );
            }
        }
    }

    #[test]
    fn no_snapshot_means_no_conversion() {
        let mut c = ClockTracker::default();
        assert_eq!(at(&mut c, 3, 42), Some(42));
        assert_eq!(at(&mut c, 128, 5), Some(5));
    }

    #[test]
    fn converts_through_latest_snapshot_and_multiple_hops() {
        let mut c = ClockTracker::default();
        c.add_snapshot(&[r(BOOTTIME, 1000), r(3, 100)]).unwrap();
        c.add_snapshot(&[r(BOOTTIME, 2000), r(3, 1050)]).unwrap();
        c.add_snapshot(&[r(3, 1500), r(200, 10)]).unwrap();
        assert_eq!(at(&mut c, 3, 150), Some(1050));
        assert_eq!(at(&mut c, 3, 1100), Some(2050));
        // Before the first snapshot: extrapolate from the first one.
        assert_eq!(at(&mut c, 3, 50), Some(950));
        // Two hops: 200 -> 3 -> BOOTTIME.
        assert_eq!(at(&mut c, 200, 20), Some(2000 + (1510 - 1050)));
        assert_eq!(at(&mut c, 99, 1), None);
        assert!(matches!(c.convert(99, 1), Converted::Later(p) if !p.clock_known()));
    }

    #[test]
    fn incremental_clock_with_multiplier() {
        let mut c = ClockTracker::default();
        let seq = sequence_clock(7, 64);
        c.add_snapshot(&[r(BOOTTIME, 10_000), incremental(seq, 10, 1000)])
            .unwrap();
        assert_eq!(at(&mut c, seq, 2), Some(12_000));
        assert_eq!(at(&mut c, seq, 3), Some(15_000));
    }

    /// Three threads' snapshots of the same two clocks, each thread's a series of its own (a
    /// sequence-scoped clock makes it distinct, as Tachyon's SDK writes them), each with its
    /// own read error: conversions use the series with the lowest snapshot hash among those
    /// seen so far, as Perfetto's, so the other threads' errors move nothing, and a series with
    /// a lower hash takes over from the moment it appears.
    #[test]
    fn one_series_per_hop_the_lowest_hash() {
        let trace = 0x8000_0000 | 7;
        let set = |seq: u32, t: u64, offset: i64| {
            [
                r(BOOTTIME, (t as i64 + offset) as u64),
                r(trace, t),
                r(sequence_clock(seq, 65), t),
            ]
        };
        let hash = |seq: u32| snapshot_hash(&set(seq, 0, 0).map(|r| r.id));
        // Sequences 1..=3 ordered by their series' hash.
        let mut seqs = [1u32, 2, 3];
        seqs.sort_by_key(|&s| hash(s));
        let [low, mid, high] = seqs;
        let offsets = [-760i64, -500, -300];
        let mut c = ClockTracker::default();
        // The highest hash first: it is the only link.
        c.add_snapshot(&set(high, 1_000_000, offsets[2])).unwrap();
        assert_eq!(at(&mut c, trace, 1_000_100), Some(1_000_100 - 300));
        // A lower one takes over for every later conversion, whatever the times.
        c.add_snapshot(&set(mid, 1_010_000, offsets[1])).unwrap();
        assert_eq!(at(&mut c, trace, 1_000_100), Some(1_000_100 - 500));
        c.add_snapshot(&set(low, 1_020_000, offsets[0])).unwrap();
        assert_eq!(at(&mut c, trace, 1_019_900), Some(1_019_900 - 760));
        assert_eq!(at(&mut c, trace, 1_020_100), Some(1_020_100 - 760));
        // Later snapshots of other series change nothing; the chosen one's own do.
        c.add_snapshot(&set(high, 2_000_000, 0)).unwrap();
        assert_eq!(at(&mut c, trace, 2_000_100), Some(2_000_100 - 760));
        c.add_snapshot(&set(low, 2_000_000, -700)).unwrap();
        assert_eq!(at(&mut c, trace, 2_000_100), Some(2_000_100 - 700));
        assert_eq!(at(&mut c, trace, 1_500_000), Some(1_500_000 - 760));
    }

    /// Perfetto's snapshot hash depends on the clocks and their order in the snapshot (the
    /// same clocks listed in another order are another series), and on the sequence of a
    /// sequence-scoped clock. (`demo_timestamps_match_perfetto` in `tachyon`'s tests checks
    /// the resulting timestamps against Perfetto's trace processor.)
    #[test]
    fn snapshot_hash_is_order_and_sequence_sensitive() {
        let a = snapshot_hash(&[BOOTTIME, 3]);
        assert_ne!(a, snapshot_hash(&[3, BOOTTIME]));
        assert_ne!(
            snapshot_hash(&[BOOTTIME, sequence_clock(1, 64)]),
            snapshot_hash(&[BOOTTIME, sequence_clock(2, 64)])
        );
        assert_eq!(a, snapshot_hash(&[BOOTTIME, 3]));
    }

    /// An incremental clock that restarts from zero at every snapshot (allowed: its readings
    /// are not required to move forward) converts from its latest snapshot.
    #[test]
    fn incremental_clock_restarting_at_each_snapshot() {
        let mut c = ClockTracker::default();
        let seq = sequence_clock(4, 64);
        c.add_snapshot(&[r(BOOTTIME, 5_000), incremental(seq, 0, 1)])
            .unwrap();
        assert_eq!(at(&mut c, seq, 10), Some(5_010));
        c.add_snapshot(&[r(BOOTTIME, 9_000), incremental(seq, 0, 1)])
            .unwrap();
        assert_eq!(at(&mut c, seq, 10), Some(9_010));
        assert_eq!(at(&mut c, seq, 5), Some(9_015));
    }

    /// A sequence whose first packets (in the file) tie its incremental clock to the trace clock
    /// before any snapshot ties the trace clock to BOOTTIME, as when a ring buffer overwrote the
    /// sequence's own global snapshot: its deltas are taken in order, the rest waits for the end
    /// of the file instead of the events being dropped.
    #[test]
    fn incremental_clock_without_a_path_yet_waits_with_its_deltas_taken() {
        let mut c = ClockTracker::default();
        let trace = 0x8000_0000 | 7;
        let seq = sequence_clock(1, 64);
        c.add_snapshot(&[r(trace, 1_000), incremental(seq, 1_000, 1)])
            .unwrap();
        let pending: Vec<Pending> = [100, 50]
            .into_iter()
            .map(|delta| match c.convert(seq, delta) {
                Converted::Later(p) => p,
                other => panic!("{other:?}"),
            })
            .collect();
        // A new generation resets the clock, and a later sequence links the trace clock.
        c.add_snapshot(&[r(trace, 5_000), incremental(seq, 5_000, 1)])
            .unwrap();
        c.add_snapshot(&[r(BOOTTIME, 10_000), r(trace, 9_000)])
            .unwrap();
        assert_eq!(at(&mut c, seq, 10), Some(6_010));
        let finished: Vec<_> = pending.into_iter().map(|p| c.finish(p)).collect();
        assert_eq!(finished, [Some(2_100), Some(2_150)]);
        // Still no path at the end of the file: None.
        let lonely = sequence_clock(2, 64);
        c.add_snapshot(&[incremental(lonely, 0, 1), r(0x8000_0000 | 9, 0)])
            .unwrap();
        let Converted::Later(p) = c.convert(lonely, 1) else {
            panic!("no path")
        };
        assert_eq!(c.finish(p), None);
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
        assert_eq!(c.add_snapshot(&[]), Err(InvalidSnapshot));
        // A reading and a unit whose product overflows even an i128 (a fuzzer's find).
        assert_eq!(
            c.add_snapshot(&[incremental(5, u64::MAX, u64::MAX), r(BOOTTIME, 2000)]),
            Err(InvalidSnapshot)
        );
    }
}

//! Sorting tokenized events by timestamp before they are parsed.
//!
//! Packets of one sequence arrive in order, but sequences interleave arbitrarily in a trace
//! file, so events must be sorted before slices can be stacked. Two modes, after Perfetto's
//! `TraceSorter`:
//!
//! * **Full sort** (the default): every event is kept until the end of the file, then handed
//!   on in timestamp order (events with equal timestamps in file order). Nothing is ever out of
//!   order. The events are kept in *runs*: each event joins the current run of its sequence
//!   (the tokenizer names it) if its timestamp is not before that run's last, else it starts a
//!   new run of that sequence. Every run is thus already sorted, and the end of the file is a
//!   k-way merge of the runs by (timestamp, arrival number), the same order as a stable sort
//!   of everything. A run keeps its events in blocks, and a block is freed as soon as the
//!   merge has handed its last event on, so the events' memory shrinks while the parser's
//!   tables grow instead of both peaking together (with no sort scratch either). Sequences
//!   write in time order, so there are few runs; a trace with very many (a sequence going
//!   back in time over and over) is sorted as one array instead, in place.
//! * **Windowed**: for traces streamed to a file (`write_into_file`), where the service writes
//!   a `read_tracing_buffers_completed` event after every read of its buffers. On such an
//!   event, if at least two `all_data_sources_flushed` events arrived since the last
//!   extraction, the events that arrived before the *previous* read marker are sorted and
//!   handed on; later ones wait. An event arriving with a timestamp before one already handed
//!   on can no longer be placed: it is dropped and counted in `sorter_push_event_out_of_order`.
//!   A trace without those service events is, in effect, fully sorted at the end. A packet
//!   whose clock cannot be resolved yet forces full sort for the rest of the import (it is
//!   converted at the end of the file), as in Perfetto.
//!
//! Thread and process naming events carry `i64::MIN` (a name holds for the whole trace) and
//! are never dropped as out of order.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::importers::Event;
use crate::storage::strings::FxHashMap;
use crate::SortMode;

/// Largest block of a run, in events (448 KiB); a run's first block is small and each next
/// one doubles, so the many short runs of a trace with many sequences stay small.
const MAX_BLOCK: usize = 8192;
const FIRST_BLOCK: usize = 16;
/// Beyond this many runs the merge would cost more than sorting everything at once.
const MAX_RUNS: usize = 4096;
/// While merging, freed blocks are handed back to the system after about this many bytes
/// (glibc would otherwise keep them resident below the top of its heap).
const RELEASE_EVERY: usize = 64 << 20;

/// Events of one sequence in timestamp order, in blocks.
#[derive(Debug, Default)]
struct Run {
    blocks: VecDeque<Vec<Event>>,
    /// Index of the next event to hand on in `blocks[0]`.
    head: usize,
    last_ts: i64,
}

impl Run {
    fn push(&mut self, ev: Event) {
        match self.blocks.back_mut() {
            Some(b) if b.len() < b.capacity() => b.push(ev),
            last => {
                let cap = last.map_or(FIRST_BLOCK, |b| (b.capacity() * 2).min(MAX_BLOCK));
                let mut b = Vec::with_capacity(cap);
                b.push(ev);
                self.blocks.push_back(b);
            }
        }
        self.last_ts = ev.ts;
    }

    fn peek(&self) -> Option<&Event> {
        self.blocks.front().and_then(|b| b.get(self.head))
    }

    /// Hands on the head; returns the bytes of a block that was freed.
    fn advance(&mut self) -> usize {
        self.head += 1;
        match self.blocks.front() {
            Some(b) if self.head >= b.len() => {
                let bytes = b.capacity() * std::mem::size_of::<Event>();
                self.blocks.pop_front();
                self.head = 0;
                bytes
            }
            _ => 0,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Sorter {
    mode: SortMode,
    /// Whether events go into `runs` (a sorter created in full-sort mode) or `pending`.
    use_runs: bool,
    runs: Vec<Run>,
    /// A sequence's current run.
    run_of: FxHashMap<u32, usize>,
    pending: Vec<Event>,
    /// Arrival number of `pending[0]`.
    base: u64,
    /// Arrival number of the next event.
    next: u64,
    /// Arrival number at the last `read_tracing_buffers_completed`.
    read_marker: u64,
    flushes: u32,
    last_ts: i64,
    pub(crate) out_of_order: i64,
}

impl Sorter {
    pub(crate) fn new(mode: SortMode) -> Self {
        Sorter {
            mode,
            use_runs: mode == SortMode::Full,
            runs: Vec::new(),
            run_of: FxHashMap::default(),
            pending: Vec::new(),
            base: 0,
            next: 0,
            read_marker: 0,
            flushes: 0,
            last_ts: i64::MIN,
            out_of_order: 0,
        }
    }

    /// An event of sequence `seq` (the run it joins: any number is correct, the sequence's
    /// keeps runs long).
    pub(crate) fn push(&mut self, mut ev: Event, seq: u32) {
        ev.order = self.next as u32; // Modulo 2^32: see `Event::order`.
        self.next += 1;
        if !self.use_runs {
            self.pending.push(ev);
            return;
        }
        let current = self.run_of.get(&seq).copied();
        match current {
            Some(r) if self.runs[r].last_ts <= ev.ts => self.runs[r].push(ev),
            _ => {
                self.run_of.insert(seq, self.runs.len());
                let mut run = Run::default();
                run.push(ev);
                self.runs.push(run);
            }
        }
    }

    pub(crate) fn force_full_sort(&mut self) {
        self.mode = SortMode::Full;
    }

    pub(crate) fn notify_flush(&mut self) {
        self.flushes += 1;
    }

    /// A `read_tracing_buffers_completed` event: returns the events that may be parsed now,
    /// sorted (empty in full-sort mode).
    pub(crate) fn on_read_buffers(&mut self) -> Vec<Event> {
        if self.mode == SortMode::Full || self.flushes < 2 {
            return Vec::new();
        }
        let limit = self.read_marker;
        self.read_marker = self.next;
        self.flushes = 0;
        let n = limit
            .saturating_sub(self.base)
            .min(self.pending.len() as u64) as usize;
        self.base += n as u64;
        let batch: Vec<Event> = self.pending.drain(..n).collect();
        self.sorted(batch)
    }

    /// End of file: hands everything left to `apply`, in order, freeing the events' memory as
    /// it goes.
    pub(crate) fn drain_all(&mut self, mut apply: impl FnMut(&Event)) {
        if self.use_runs && self.runs.len() > MAX_RUNS {
            // Too many runs to merge: one array, sorted in place (arrival numbers make the
            // unstable sort's order that of a stable one).
            let mut all = Vec::with_capacity(self.runs.iter().map(Run::len).sum());
            for run in std::mem::take(&mut self.runs) {
                for b in run.blocks {
                    all.extend_from_slice(&b);
                }
            }
            all.sort_unstable_by_key(|e| (e.ts, e.order));
            self.base = self.next;
            for ev in &all {
                apply(ev);
            }
            return;
        }
        if !self.use_runs {
            let batch = std::mem::take(&mut self.pending);
            self.base = self.next;
            for ev in &self.sorted(batch) {
                apply(ev);
            }
            return;
        }
        self.run_of.clear();
        let mut runs = std::mem::take(&mut self.runs);
        let mut heads: BinaryHeap<Reverse<(i64, u32, usize)>> = runs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.peek().map(|e| Reverse((e.ts, e.order, i))))
            .collect();
        let mut freed = 0;
        while let Some(Reverse((_, _, i))) = heads.pop() {
            let run = &mut runs[i];
            if let Some(ev) = run.peek() {
                apply(ev);
            }
            freed += run.advance();
            if let Some(e) = run.peek() {
                heads.push(Reverse((e.ts, e.order, i)));
            }
            if freed >= RELEASE_EVERY {
                crate::trim::release_free_memory();
                freed = 0;
            }
        }
        self.base = self.next;
    }

    fn sorted(&mut self, mut batch: Vec<Event>) -> Vec<Event> {
        batch.sort_by_key(|e| e.ts); // Stable: equal timestamps keep arrival order.
        let before = batch.len();
        let last = self.last_ts;
        batch.retain(|e| e.ts == i64::MIN || e.ts >= last);
        self.out_of_order += (before - batch.len()) as i64;
        if let Some(max) = batch.iter().map(|e| e.ts).max() {
            self.last_ts = self.last_ts.max(max);
        }
        batch
    }
}

impl Run {
    fn len(&self) -> usize {
        self.blocks.iter().map(Vec::len).sum::<usize>() - self.head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::importers::EventKind;

    fn ev(ts: i64) -> Event {
        Event::bare(EventKind::Instant, ts, 0, 0)
    }

    fn ts(v: &[Event]) -> Vec<i64> {
        v.iter().map(|e| e.ts).collect()
    }

    fn drain(s: &mut Sorter) -> Vec<Event> {
        let mut out = Vec::new();
        s.drain_all(|e| out.push(*e));
        out
    }

    #[test]
    fn full_sort_waits_for_the_end() {
        let mut s = Sorter::new(SortMode::Full);
        for t in [5, 1, 3] {
            s.push(ev(t), 1);
        }
        s.notify_flush();
        s.notify_flush();
        assert!(s.on_read_buffers().is_empty());
        assert_eq!(ts(&drain(&mut s)), vec![1, 3, 5]);
    }

    /// The merge of runs hands events on exactly as a stable sort of everything would: by
    /// timestamp, equal timestamps in arrival order, whatever sequences they came from.
    #[test]
    fn full_sort_is_a_stable_sort_of_everything() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for case in 0..50 {
            let mut s = Sorter::new(SortMode::Full);
            let mut all = Vec::new();
            let mut clocks = [0i64; 5];
            let n = 1 + rnd(3000);
            for i in 0..n {
                let seq = rnd(5) as u32;
                // Mostly forward per sequence, sometimes back, sometimes a naming event.
                let t = match rnd(20) {
                    0 => i64::MIN,
                    1 => clocks[seq as usize] - rnd(50) as i64,
                    _ => {
                        clocks[seq as usize] += rnd(4) as i64;
                        clocks[seq as usize]
                    }
                };
                let mut e = ev(t);
                e.data = i; // Identifies the event.
                all.push(e);
                s.push(e, seq);
            }
            all.sort_by_key(|e| e.ts);
            let got: Vec<u64> = drain(&mut s).iter().map(|e| e.data).collect();
            let want: Vec<u64> = all.iter().map(|e| e.data).collect();
            assert_eq!(got, want, "case {case}");
        }
    }

    #[test]
    fn many_runs_are_sorted_as_one_array() {
        let mut s = Sorter::new(SortMode::Full);
        let n = (MAX_RUNS as i64 + 10) * 2;
        for t in 0..n {
            // Each event goes back in time: a new run every time.
            let mut e = ev(n - t / 2);
            e.data = t as u64;
            s.push(e, 7);
        }
        let got = drain(&mut s);
        assert_eq!(got.len(), n as usize);
        assert!(got
            .windows(2)
            .all(|w| (w[0].ts, w[0].data) < (w[1].ts, w[1].data)));
    }

    #[test]
    fn windowed_extracts_up_to_the_previous_read_and_drops_late_events() {
        let mut s = Sorter::new(SortMode::Windowed);
        s.push(ev(10), 1);
        s.push(ev(5), 1);
        s.notify_flush();
        s.notify_flush();
        // First read: the previous marker is the start, nothing to extract yet.
        assert!(s.on_read_buffers().is_empty());
        s.push(ev(20), 1);
        // Too few flushes since the last extraction: nothing.
        assert!(s.on_read_buffers().is_empty());
        s.notify_flush();
        s.notify_flush();
        assert_eq!(ts(&s.on_read_buffers()), vec![5, 10]);
        s.push(ev(7), 1); // Before 10, already handed on: dropped.
        s.push(ev(i64::MIN), 1); // Naming events are never late.
        assert_eq!(ts(&drain(&mut s)), vec![i64::MIN, 20]);
        assert_eq!(s.out_of_order, 1);
    }
}

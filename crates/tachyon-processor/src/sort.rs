//! Sorting tokenized events by timestamp before they are parsed.
//!
//! Packets of one sequence arrive in order, but sequences interleave arbitrarily in a trace
//! file, so events must be sorted before slices can be stacked. Two modes, after Perfetto's
//! `TraceSorter`:
//!
//! * **Full sort** (the default): every event is kept until the end of the file, then sorted
//!   (stably, so events with equal timestamps keep file order) and parsed. Nothing is ever out
//!   of order; memory grows with the trace.
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

use crate::importers::Event;
use crate::SortMode;

#[derive(Debug)]
pub(crate) struct Sorter {
    mode: SortMode,
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
            pending: Vec::new(),
            base: 0,
            next: 0,
            read_marker: 0,
            flushes: 0,
            last_ts: i64::MIN,
            out_of_order: 0,
        }
    }

    pub(crate) fn push(&mut self, ev: Event) {
        self.pending.push(ev);
        self.next += 1;
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

    /// End of file: everything left, sorted.
    pub(crate) fn drain_all(&mut self) -> Vec<Event> {
        let batch = std::mem::take(&mut self.pending);
        self.base = self.next;
        self.sorted(batch)
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

    #[test]
    fn full_sort_waits_for_the_end() {
        let mut s = Sorter::new(SortMode::Full);
        for t in [5, 1, 3] {
            s.push(ev(t));
        }
        s.notify_flush();
        s.notify_flush();
        assert!(s.on_read_buffers().is_empty());
        assert_eq!(ts(&s.drain_all()), vec![1, 3, 5]);
    }

    #[test]
    fn windowed_extracts_up_to_the_previous_read_and_drops_late_events() {
        let mut s = Sorter::new(SortMode::Windowed);
        s.push(ev(10));
        s.push(ev(5));
        s.notify_flush();
        s.notify_flush();
        // First read: the previous marker is the start, nothing to extract yet.
        assert!(s.on_read_buffers().is_empty());
        s.push(ev(20));
        // Too few flushes since the last extraction: nothing.
        assert!(s.on_read_buffers().is_empty());
        s.notify_flush();
        s.notify_flush();
        assert_eq!(ts(&s.on_read_buffers()), vec![5, 10]);
        s.push(ev(7)); // Before 10, already handed on: dropped.
        s.push(ev(i64::MIN)); // Naming events are never late.
        assert_eq!(ts(&s.drain_all()), vec![i64::MIN, 20]);
        assert_eq!(s.out_of_order, 1);
    }
}

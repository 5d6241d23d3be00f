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
//!   of everything (a loser tree: one comparison per level of the runs' tree). A run keeps its events encoded as differences from the event before
//!   (`encode`: about 6 to 12 bytes instead of 56) in blocks, and a block is freed as soon as
//!   the merge has handed its last event on, so the events' memory shrinks while the parser's
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

use std::collections::VecDeque;

use crate::importers::{Event, EventKind};
use crate::storage::strings::FxHashMap;
use crate::SortMode;

/// Largest block of a run, in bytes; a run's first block is small and each next one doubles,
/// so the many short runs of a trace with many sequences stay small.
const MAX_BLOCK: usize = 256 << 10;
const FIRST_BLOCK: usize = 256;
/// Beyond this many runs the merge would cost more than sorting everything at once.
const MAX_RUNS: usize = 4096;
/// While merging, freed memory (event blocks, and the argument pages of the events parsed) is
/// handed back to the system after about this many bytes of blocks: glibc would otherwise keep
/// it resident below the top of its heap while the tables grow elsewhere, and the peak would
/// not drop. At about 7 bytes per encoded event that is every 600 000 events or so (a
/// release costs a walk of glibc's free lists, nothing per event).
const RELEASE_EVERY: usize = 4 << 20;

/// Events of one sequence in timestamp order, encoded (`encode`) in blocks of bytes. Each
/// block starts from `Event::bare`'s zeros, so a block decodes on its own.
///
/// The last block is allocated at its full size (zeroed) and filled up to `fill`: an event is
/// encoded straight into the block's next `MAX_ENCODED` bytes, with no per-byte capacity
/// check. A block is cut to its filled length when the next one starts (and when the merge
/// reads it), so every other block's length is what it holds.
#[derive(Debug)]
struct Run {
    blocks: VecDeque<Vec<u8>>,
    /// Bytes written to the last block.
    fill: usize,
    /// Read position in `blocks[0]`.
    pos: usize,
    /// The event decoded last (`advance`), which the next is decoded over in place: the
    /// merge hands this one on, no copy.
    head: Event,
    /// The last event written to the last block.
    write_prev: Event,
    last_ts: i64,
    len: usize,
}

impl Default for Run {
    fn default() -> Self {
        Run {
            blocks: VecDeque::new(),
            fill: 0,
            pos: 0,
            head: zero(),
            write_prev: zero(),
            last_ts: 0,
            len: 0,
        }
    }
}

impl Run {
    #[inline(always)]
    fn push(&mut self, ev: &Event) {
        // The last block has room for one more event exactly when its next `MAX_ENCODED`
        // bytes exist: one lookup both checks and finds them.
        let fill = self.fill;
        match self
            .blocks
            .back_mut()
            .and_then(|b| b.get_mut(fill..fill + MAX_ENCODED))
            .and_then(|d| <&mut [u8; MAX_ENCODED]>::try_from(d).ok())
        {
            Some(dst) => self.fill = fill + encode(dst, &self.write_prev, ev),
            None => self.push_to_new_block(ev),
        }
        self.write_prev = *ev;
        self.last_ts = ev.ts;
        self.len += 1;
    }

    /// Encodes `ev` at the start of a new block.
    #[cold]
    fn push_to_new_block(&mut self, ev: &Event) {
        self.new_block();
        if let Some(dst) = self
            .blocks
            .back_mut()
            .and_then(|b| b.first_chunk_mut::<MAX_ENCODED>())
        {
            self.fill = encode(dst, &self.write_prev, ev);
        }
    }

    /// Cuts the last block to what it holds and starts the next, twice its size up to
    /// `MAX_BLOCK`.
    #[cold]
    fn new_block(&mut self) {
        let cap = match self.blocks.back_mut() {
            Some(b) => {
                b.truncate(self.fill);
                (b.capacity() * 2).min(MAX_BLOCK)
            }
            None => FIRST_BLOCK,
        };
        self.blocks.push_back(vec![0; cap]);
        self.fill = 0;
        self.write_prev = zero();
        if self.blocks.len() == 1 {
            self.pos = 0;
        }
    }

    /// Decodes the next event into `head`; false if there is none. Adds the bytes of a block
    /// it frees to `freed`.
    #[inline]
    fn advance(&mut self, freed: &mut usize) -> bool {
        let last = self.blocks.len() == 1;
        let Some(b) = self.blocks.front() else {
            return false;
        };
        let end = if last { self.fill } else { b.len() };
        if self.pos == 0 {
            self.head = zero(); // A block decodes on its own.
        }
        let Some(n) = b
            .get(self.pos..end)
            .and_then(|rest| decode_into(rest, &mut self.head))
        else {
            self.blocks.clear(); // Unreachable: the run reads back what it wrote.
            return false;
        };
        self.len -= 1;
        self.pos += n;
        if self.pos >= end {
            *freed += b.capacity();
            self.blocks.pop_front();
            self.pos = 0;
        }
        true
    }

    /// Takes the next event, if any (a copy of `head`).
    fn pop(&mut self, freed: &mut usize) -> Option<Event> {
        self.advance(freed).then_some(self.head)
    }
}

/// What the first event of a block is encoded against.
fn zero() -> Event {
    Event::bare(EventKind::SliceBegin, 0, 0, 0)
}

/// The most bytes one event takes encoded.
const MAX_ENCODED: usize = 96;
// A new block holds at least one event.
const _: () = assert!(FIRST_BLOCK >= MAX_ENCODED);

/// The LEB128 varint at `b[*at..]`. Most of an encoded event's fields are one byte, which
/// takes the first branch; string ids past 127 take two, the second.
#[inline(always)]
fn get(b: &[u8], at: &mut usize) -> Option<u64> {
    let byte = *b.get(*at)?;
    *at += 1;
    if byte < 0x80 {
        return Some(u64::from(byte));
    }
    let low = u64::from(byte & 0x7f);
    let byte = *b.get(*at)?;
    *at += 1;
    if byte < 0x80 {
        return Some(low | u64::from(byte) << 7);
    }
    get_long(b, at, low | u64::from(byte & 0x7f) << 7)
}

/// The rest of a varint longer than two bytes, whose first 14 bits are `v`.
#[inline(never)]
fn get_long(b: &[u8], at: &mut usize, mut v: u64) -> Option<u64> {
    let mut shift = 14;
    while shift < 64 {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(v);
        }
        shift += 7;
    }
    None
}

/// Writes `v` as a LEB128 varint at `out[*at..]`; `encode`'s bound (`MAX_ENCODED`) leaves
/// room for every field's longest form.
#[inline(always)]
fn put(out: &mut [u8; MAX_ENCODED], at: &mut usize, mut v: u64) {
    while v >= 0x80 {
        out[*at] = v as u8 | 0x80;
        *at += 1;
        v >>= 7;
    }
    out[*at] = v as u8;
    *at += 1;
}

const SAME_TRACK: u8 = 1;
const SAME_NAME: u8 = 2;
const SAME_CATEGORY: u8 = 4;
const NO_DATA: u8 = 8;
const NO_FLOWS: u8 = 16;
const LEGACY_THREAD: u8 = 32;
/// The event arrived right after `prev` and its args follow `prev`'s: neither the arrival
/// number nor the args' start is written. Within a writer's chunk that is every event.
const CONTIGUOUS: u8 = 64;

/// Appends `e` to `out` as the difference from `prev`, the event before it in the block: an
/// event of a sorted run mostly repeats its predecessor's track, name and category and
/// advances its timestamp, arrival number and arguments a little, so it takes about 6 to 12
/// bytes instead of 56. Returns the number of bytes written at the start of `out`: at most
/// 2 + 10 (ts) + 5 (order) + 5 (args, zigzag of a 33-bit difference) + 5 (nargs) + 10 (track)
/// + 10 (data) + 5 + 5 (name, category) + 5 + 3 + 3 (flows) = 68, below `MAX_ENCODED`.
#[inline(always)]
fn encode(out: &mut [u8; MAX_ENCODED], prev: &Event, e: &Event) -> usize {
    let mut flags = 0;
    if e.track == prev.track {
        flags |= SAME_TRACK;
    }
    if e.name == prev.name {
        flags |= SAME_NAME;
    }
    if e.category == prev.category {
        flags |= SAME_CATEGORY;
    }
    if e.data == 0 {
        flags |= NO_DATA;
    }
    if e.flows == 0 && e.nflows == 0 && e.nterm == 0 {
        flags |= NO_FLOWS;
    }
    if e.legacy_thread {
        flags |= LEGACY_THREAD;
    }
    let contiguous =
        e.order == prev.order.wrapping_add(1) && e.args == prev.args.wrapping_add(prev.nargs);
    if contiguous {
        flags |= CONTIGUOUS;
    }
    out[0] = e.kind as u8;
    out[1] = flags;
    let at = &mut 2;
    put(out, at, e.ts.wrapping_sub(prev.ts) as u64);
    if !contiguous {
        put(out, at, u64::from(e.order.wrapping_sub(prev.order)));
        let args = i64::from(e.args) - i64::from(prev.args);
        put(out, at, ((args << 1) ^ (args >> 63)) as u64);
    }
    put(out, at, u64::from(e.nargs));
    if flags & SAME_TRACK == 0 {
        put(out, at, e.track);
    }
    if flags & NO_DATA == 0 {
        put(out, at, e.data);
    }
    // Ids are written plus one, so that `NONE` (u32::MAX, an end's name and category) takes
    // one byte rather than five.
    if flags & SAME_NAME == 0 {
        put(out, at, u64::from(e.name.wrapping_add(1)));
    }
    if flags & SAME_CATEGORY == 0 {
        put(out, at, u64::from(e.category.wrapping_add(1)));
    }
    if flags & NO_FLOWS == 0 {
        put(out, at, u64::from(e.flows));
        put(out, at, u64::from(e.nflows));
        put(out, at, u64::from(e.nterm));
    }
    *at
}

/// The event `encode` wrote at the start of `b` after `prev`, and its length.
#[cfg(test)]
fn decode(b: &[u8], prev: &Event) -> Option<(Event, usize)> {
    let mut e = *prev;
    let n = decode_into(b, &mut e)?;
    Some((e, n))
}

/// Decodes the event `encode` wrote at the start of `b` over `e`, the event it was encoded
/// after (a field the encoding says is unchanged is not touched); returns its length.
#[inline(always)]
fn decode_into(b: &[u8], e: &mut Event) -> Option<usize> {
    let kind = *EventKind::ALL.get(usize::from(*b.first()?))?;
    let flags = *b.get(1)?;
    let mut at = 2;
    e.ts = e.ts.wrapping_add(get(b, &mut at)? as i64);
    if flags & CONTIGUOUS != 0 {
        e.order = e.order.wrapping_add(1);
        e.args = e.args.wrapping_add(e.nargs);
    } else {
        e.order = e.order.wrapping_add(get(b, &mut at)? as u32);
        let z = get(b, &mut at)?;
        e.args = (i64::from(e.args) + ((z >> 1) as i64 ^ -((z & 1) as i64))) as u32;
    }
    e.nargs = get(b, &mut at)? as u32;
    if flags & SAME_TRACK == 0 {
        e.track = get(b, &mut at)?;
    }
    e.data = if flags & NO_DATA != 0 {
        0
    } else {
        get(b, &mut at)?
    };
    if flags & SAME_NAME == 0 {
        e.name = (get(b, &mut at)? as u32).wrapping_sub(1);
    }
    if flags & SAME_CATEGORY == 0 {
        e.category = (get(b, &mut at)? as u32).wrapping_sub(1);
    }
    if flags & NO_FLOWS != 0 {
        (e.flows, e.nflows, e.nterm) = (0, 0, 0);
    } else {
        e.flows = get(b, &mut at)? as u32;
        e.nflows = get(b, &mut at)? as u16;
        e.nterm = get(b, &mut at)? as u16;
    }
    e.kind = kind;
    e.legacy_thread = flags & LEGACY_THREAD != 0;
    Some(at)
}

#[derive(Debug)]
pub(crate) struct Sorter {
    mode: SortMode,
    /// Whether events go into `runs` (a sorter created in full-sort mode) or `pending`.
    use_runs: bool,
    runs: Vec<Run>,
    /// A sequence's current run.
    run_of: FxHashMap<u32, usize>,
    /// The sequence pushed to last and its current run (what `run_of` says).
    last_run: Option<(u32, usize)>,
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
            last_run: None,
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
        // Events come in runs of one sequence: the last sequence's run is remembered.
        let current = match self.last_run {
            Some((s, r)) if s == seq => Some(r),
            _ => self.run_of.get(&seq).copied(),
        };
        match current {
            Some(r) if self.runs[r].last_ts <= ev.ts => {
                self.last_run = Some((seq, r));
                self.runs[r].push(&ev)
            }
            _ => {
                let r = self.runs.len();
                self.run_of.insert(seq, r);
                self.last_run = Some((seq, r));
                let mut run = Run::default();
                run.push(&ev);
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
        // Every run is taken below: later events start new ones.
        self.run_of.clear();
        self.last_run = None;
        if self.use_runs && self.runs.len() > MAX_RUNS {
            // Too many runs to merge: one array, sorted in place (arrival numbers make the
            // unstable sort's order that of a stable one).
            let mut all = Vec::with_capacity(self.runs.iter().map(Run::len).sum());
            let mut freed = 0;
            for mut run in std::mem::take(&mut self.runs) {
                while let Some(e) = run.pop(&mut freed) {
                    all.push(e);
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
        let mut runs = std::mem::take(&mut self.runs);
        let mut freed = 0;
        // Each run's next event is its `head`, decoded in place.
        let keys: Vec<u128> = runs
            .iter_mut()
            .enumerate()
            .map(|(i, run)| match run.advance(&mut freed) {
                true => merge_key(&run.head, i),
                false => done_key(i),
            })
            .collect();
        let mut tree = LoserTree::new(&keys);
        loop {
            let top = tree.winner();
            if top >= DONE {
                break;
            }
            let i = (top as u32 & RUN_MASK) as usize;
            let run = &mut runs[i];
            apply(&run.head);
            // The run's next event replays its path to the root.
            let next = match run.advance(&mut freed) {
                true => merge_key(&run.head, i),
                false => done_key(i),
            };
            tree.replace_winner(i, next);
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

/// The merge's order as one number: timestamp, then arrival number, then run (which makes
/// every key distinct, as the tuple `(ts, order, run)` is). A run with no event left has
/// `DONE` set, above every event's key.
#[inline(always)]
fn merge_key(e: &Event, run: usize) -> u128 {
    let ts = (e.ts as u64 ^ (1 << 63)) as u128; // i64 order as u64 order.
    (ts << 63) | (u128::from(e.order) << 31) | run as u128
}

/// The key of run `run` once it is empty.
fn done_key(run: usize) -> u128 {
    DONE | run as u128
}

const DONE: u128 = 1 << 127;
/// The run's bits of a key (`MAX_RUNS` is far below 2^31).
const RUN_MASK: u32 = (1 << 31) - 1;
const _: () = assert!(MAX_RUNS < RUN_MASK as usize);

/// A tournament (loser) tree over the runs' head keys: `nodes[0]` is the smallest key, every
/// other node the larger of the two keys that met there. Taking the smallest and putting its
/// run's next key in replays one path from that run's leaf to the root: log2(runs) comparisons
/// of one number each, where a binary heap's sift compares each tuple twice per level.
struct LoserTree {
    nodes: Vec<u128>,
}

impl LoserTree {
    fn new(keys: &[u128]) -> Self {
        let k = keys.len();
        // `None`: no key has reached the node yet. Leaf `i` is node `k + i`; node `n`'s parent
        // is `n / 2`; each inner node is reached once from each side.
        let mut nodes: Vec<Option<u128>> = vec![None; k.max(1)];
        for (i, &key) in keys.iter().enumerate() {
            let mut cur = key;
            let mut n = (k + i) / 2;
            let mut parked = false;
            while n > 0 {
                match nodes[n] {
                    None => {
                        nodes[n] = Some(cur);
                        parked = true;
                        break;
                    }
                    Some(other) if other < cur => {
                        nodes[n] = Some(cur);
                        cur = other;
                    }
                    Some(_) => {}
                }
                n /= 2;
            }
            if !parked {
                nodes[0] = Some(cur);
            }
        }
        LoserTree {
            nodes: nodes.into_iter().map(|n| n.unwrap_or(DONE)).collect(),
        }
    }

    #[inline(always)]
    fn winner(&self) -> u128 {
        self.nodes[0]
    }

    /// Run `run` (the winner's) now has `key` at its head.
    #[inline(always)]
    fn replace_winner(&mut self, run: usize, mut key: u128) {
        let k = self.nodes.len();
        let mut n = (k + run) / 2;
        while n > 0 {
            let other = self.nodes[n];
            if other < key {
                self.nodes[n] = key;
                key = other;
            }
            n /= 2;
        }
        self.nodes[0] = key;
    }
}

impl Run {
    fn len(&self) -> usize {
        self.len
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
        let mut next = crate::xorshift(0x9e37_79b9_7f4a_7c15u64);
        let mut rnd = move |n: u64| next() % n;
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

    /// A varint of every length (one byte, two, and the long path) reads back as written, and
    /// a cut one reads as nothing.
    #[test]
    fn varints_of_every_length_read_back() {
        let mut rnd = crate::xorshift(0x3c6e_f372_fe94_f82bu64);
        for bits in 0..=64u32 {
            for _ in 0..20 {
                let v = if bits == 0 {
                    0
                } else {
                    (rnd() >> (64 - bits)) | (1u64 << (bits - 1))
                };
                let mut out = [0u8; MAX_ENCODED];
                let mut n = 0;
                put(&mut out, &mut n, v);
                let mut at = 0;
                assert_eq!(get(&out[..n], &mut at), Some(v), "{v:#x}");
                assert_eq!(at, n);
                let mut at = 0;
                assert_eq!(get(&out[..n - 1], &mut at), None, "{v:#x} cut");
            }
        }
    }

    /// Every field of an event reads back as written, whatever its predecessor.
    #[test]
    fn events_read_back_as_encoded() {
        let mut rnd = crate::xorshift(0x2545_f491_4f6c_dd1du64);
        let mut prev = zero();
        let mut out = Vec::new();
        let mut want = Vec::new();
        for i in 0..5000 {
            let r = rnd();
            // Extreme and ordinary values alike.
            let pick = |v: u64, small: u64| if r % 3 == 0 { v } else { small };
            let e = Event {
                ts: [i64::MIN, i64::MAX, -1, 0, (r >> 8) as i64][i % 5],
                track: pick(rnd(), prev.track),
                data: pick(rnd(), 0),
                name: pick(rnd(), 7) as u32,
                category: pick(rnd(), u64::from(crate::storage::NONE)) as u32,
                args: pick(rnd(), 3) as u32,
                nargs: pick(rnd(), 0) as u32,
                flows: pick(rnd(), 0) as u32,
                nflows: pick(rnd(), 0) as u16,
                nterm: pick(rnd(), 1) as u16,
                kind: EventKind::ALL[(r % 22) as usize],
                legacy_thread: r & 64 != 0,
                order: rnd() as u32,
            };
            // Often the next arrival with its args right after the previous event's (the
            // short form), wrapping at 2^32 too.
            let e = if r % 4 == 1 {
                Event {
                    order: prev.order.wrapping_add(1),
                    args: prev.args.wrapping_add(prev.nargs),
                    ..e
                }
            } else {
                e
            };
            let mut buf = [0u8; MAX_ENCODED];
            let n = encode(&mut buf, &prev, &e);
            out.extend_from_slice(&buf[..n]);
            want.push(e);
            prev = e;
        }
        let (mut at, mut prev) = (0, zero());
        for w in &want {
            let (e, n) = decode(&out[at..], &prev).expect("decodes");
            assert_eq!(format!("{e:?}"), format!("{w:?}"));
            at += n;
            prev = e;
        }
        assert_eq!(at, out.len());
        for (i, k) in EventKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
    }

    /// The loser tree hands keys on in ascending order for any number of runs (powers of two
    /// and not, one run, none), whatever order the runs' keys come in.
    #[test]
    fn the_loser_tree_merges_like_a_sort() {
        let mut rnd = crate::xorshift(0x51_7cc1_b727_220au64);
        for k in 0..40usize {
            // Run r's keys: ascending, some shared between runs (a key is unique by its run).
            let runs: Vec<Vec<u128>> = (0..k)
                .map(|r| {
                    let mut v: Vec<u128> =
                        (0..rnd() % 30).map(|_| u128::from(rnd() % 50)).collect();
                    v.sort_unstable();
                    v.into_iter().map(|x| (x << 63) | r as u128).collect()
                })
                .collect();
            let mut want: Vec<u128> = runs.iter().flatten().copied().collect();
            want.sort_unstable();
            let mut at = vec![0usize; k];
            let heads: Vec<u128> = (0..k)
                .map(|r| runs[r].first().copied().unwrap_or(done_key(r)))
                .collect();
            let mut tree = LoserTree::new(&heads);
            let mut got = Vec::new();
            while tree.winner() < DONE {
                let top = tree.winner();
                got.push(top);
                let r = (top as u32 & RUN_MASK) as usize;
                at[r] += 1;
                tree.replace_winner(r, runs[r].get(at[r]).copied().unwrap_or(done_key(r)));
            }
            assert_eq!(got, want, "{k} runs");
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

//! The `tachyon-memory` thread: drains the record rings, keeps the live-allocation tables and
//! per-site totals, writes the live-heap counters and the heap profile dumps, and sums it all
//! up when the session stops.
//!
//! Order: records are merged across rings by time. A pass only applies records older than the
//! moment it began (read before any ring), and keeps younger ones for the next pass: a free is
//! pushed before its block is released, so an allocation that reuses the address is always
//! younger than the pass that could miss the free, and is applied after it.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::live::LiveTable;
use super::local::{self, Record, EXACT, HOOK, OFF, PROBE};
use super::profile::{self, HeapDump, Totals};
use super::sites;
use super::{MemoryConfig, MemoryMode};
use crate::track_event::global;
use crate::track_event::state::{with_state, TrackRef};
use crate::{CounterSample, CounterTrack, Unit};

/// Sites listed per heap in a [`HeapSummary`].
const TOP_SITES: usize = 10;

/// One allocation site in a summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteSummary {
    /// Zone names, outermost first (empty: outside every zone).
    pub zones: Vec<String>,
    /// The native call stack, innermost first (addresses in the call instructions, as
    /// [`callstack::capture`](crate::callstack::capture) gives them), when allocation stacks
    /// were recorded ([`MemoryConfig::callstack_depth`](super::MemoryConfig::callstack_depth));
    /// else empty.
    pub stack: Vec<u64>,
    /// Bytes still live at the end.
    pub live_bytes: u64,
    /// Blocks still live at the end.
    pub live_count: u64,
    /// Bytes allocated in the session.
    pub allocated_bytes: u64,
    /// Allocations in the session.
    pub alloc_count: u64,
}

/// What one heap (the global allocator or a pool) did in a session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapSummary {
    /// [`GLOBAL_HEAP`](super::GLOBAL_HEAP) or the pool's name.
    pub name: String,
    /// Highest live bytes, and when (trace clock, ns).
    pub peak_bytes: u64,
    /// When the peak was reached (trace clock, ns).
    pub peak_ts: u64,
    /// Live bytes and blocks at the end.
    pub live_bytes: u64,
    /// Blocks live at the end.
    pub live_count: u64,
    /// Bytes allocated, and how many allocations.
    pub allocated_bytes: u64,
    /// Allocations recorded.
    pub alloc_count: u64,
    /// Frees of recorded blocks.
    pub free_count: u64,
    /// Frees of addresses never recorded (allocated before tracking, untracked); counted only.
    pub unseen_frees: u64,
    /// Allocations at an address still live (its free was not recorded): the old block is
    /// taken as freed.
    pub implicit_frees: u64,
    /// Top sites by bytes still live at the end (leaks), most first.
    pub top_live: Vec<SiteSummary>,
    /// Top sites by bytes allocated, most first.
    pub top_allocated: Vec<SiteSummary>,
}

/// What memory tracking saw in a session ([`Report::memory`](crate::Report::memory)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemorySummary {
    /// The mode it ran in.
    pub mode: MemoryMode,
    /// When tracking started (trace clock, ns).
    pub start_ts: u64,
    /// The global allocator first, then each pool used.
    pub heaps: Vec<HeapSummary>,
    /// Records lost because a thread's ring stayed full.
    pub lost: u64,
    /// Events not recorded: made while the thread was inside the hook (signal handlers) or by
    /// the tracker's own thread.
    pub untracked: u64,
    /// Allocations that failed (null).
    pub failed: u64,
    /// Heap profile dumps written.
    pub dumps: u64,
    /// Threads that recorded events.
    pub threads: u64,
    /// Allocations whose native stack could not be kept (not walkable, or the stack table
    /// was full): attributed to their zones instead.
    pub stacks_missed: u64,
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl fmt::Display for MemorySummary {
    /// One line: `memory (exact): peak 1.2 MiB at +0.153 s, 8.0 MiB allocated in 1234
    /// allocations, 12.0 KiB live at the end in 3 blocks`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(h) = self.heaps.first() else {
            return write!(f, "memory ({}): nothing recorded", self.mode);
        };
        write!(
            f,
            "memory ({}): peak {} at +{:.3} s, {} allocated in {} allocations, {} live at the end in {} blocks",
            self.mode,
            human(h.peak_bytes),
            h.peak_ts.saturating_sub(self.start_ts) as f64 / 1e9,
            human(h.allocated_bytes),
            h.alloc_count,
            human(h.live_bytes),
            h.live_count,
        )?;
        if self.lost > 0 {
            write!(f, ", {} records lost", self.lost)?;
        }
        Ok(())
    }
}

/// The live-heap counter of one heap, thinned to one sample per period plus the period's peak.
struct Counter {
    uuid: u64,
    name: String,
    period: u64,
    last_emit: Option<u64>,
    /// Value and time of the latest change not yet written, and the period's peak.
    pending: Option<(u64, u64)>,
    peak: Option<(u64, u64)>,
}

impl Counter {
    #[inline]
    fn change(&mut self, value: u64, ts: u64) {
        if self.period == 0 {
            emit(self.uuid, &self.name, value, ts);
            return;
        }
        match self.last_emit {
            Some(t) if ts < t.saturating_add(self.period) => {
                if self.peak.is_none_or(|(v, _)| value > v) {
                    self.peak = Some((value, ts));
                }
                self.pending = Some((value, ts));
            }
            _ => {
                self.flush();
                emit(self.uuid, &self.name, value, ts);
                self.last_emit = Some(ts);
            }
        }
    }

    fn flush(&mut self) {
        if let Some((v, ts)) = self.pending.take() {
            if let Some((pv, pts)) = self.peak.take() {
                if pv > v && pts < ts {
                    emit(self.uuid, &self.name, pv, pts);
                }
            }
            emit(self.uuid, &self.name, v, ts);
            self.last_emit = Some(ts);
        }
        self.peak = None;
    }

    /// At the end of a pass: write what has waited a full period.
    fn tick(&mut self, now: u64) {
        if let (Some(t), Some(_)) = (self.last_emit, self.pending) {
            if now >= t.saturating_add(self.period) {
                self.flush();
            }
        }
    }
}

fn emit(uuid: u64, name: &str, value: u64, ts: u64) {
    let t = TrackRef {
        uuid,
        name,
        unit: Some(Unit::Bytes),
    };
    with_state(|st| {
        st.counter_slow(
            None,
            t,
            CounterSample::Int(value.min(i64::MAX as u64) as i64),
            ts,
        )
    });
}

struct Heap {
    summary: HeapSummary,
    live: LiveTable,
    /// Totals per zone-path site id (dense: ids are the interner's).
    sites: Vec<Totals>,
    /// Totals per native-stack site id, without [`sites::STACK_SITE`] (dense too).
    stack_sites: Vec<Totals>,
    freed_bytes: u64,
    counter: Counter,
    used: bool,
}

impl Heap {
    fn new(name: String, period: u64) -> Heap {
        let track_name = if name == super::GLOBAL_HEAP {
            "Heap".to_owned()
        } else {
            format!("Heap: {name}")
        };
        Heap {
            summary: HeapSummary {
                name,
                ..HeapSummary::default()
            },
            live: LiveTable::default(),
            sites: Vec::new(),
            stack_sites: Vec::new(),
            freed_bytes: 0,
            counter: Counter {
                uuid: CounterTrack::new(track_name.clone(), Unit::Bytes).uuid(),
                name: track_name,
                period,
                last_emit: None,
                pending: None,
                peak: None,
            },
            used: false,
        }
    }

    fn site(&mut self, site: u32) -> &mut Totals {
        let (v, i) = if site & sites::STACK_SITE != 0 {
            (&mut self.stack_sites, (site & !sites::STACK_SITE) as usize)
        } else {
            (&mut self.sites, site as usize)
        };
        if i >= v.len() {
            v.resize(i + 1, Totals::default());
        }
        &mut v[i]
    }

    fn alloc(&mut self, addr: u64, size: u64, site: u32, ts: u64) {
        self.used = true;
        if let Some(old) = self.live.insert(addr, size, site) {
            self.summary.implicit_frees += 1;
            self.release(old, ts, false);
        }
        let s = &mut self.summary;
        s.live_bytes += size;
        s.live_count += 1;
        s.allocated_bytes += size;
        s.alloc_count += 1;
        if s.live_bytes > s.peak_bytes {
            s.peak_bytes = s.live_bytes;
            s.peak_ts = ts;
        }
        let t = self.site(site);
        t.allocated += size;
        t.allocs += 1;
        let live = self.summary.live_bytes;
        self.counter.change(live, ts);
    }

    fn release(&mut self, (size, site): (u64, u32), ts: u64, emit: bool) {
        let s = &mut self.summary;
        s.live_bytes -= size;
        s.live_count -= 1;
        s.free_count += 1;
        self.freed_bytes += size;
        let t = self.site(site);
        t.freed += size;
        t.frees += 1;
        if emit {
            let live = self.summary.live_bytes;
            self.counter.change(live, ts);
        }
    }

    /// An allocation and the free of the same block, one right after the other (a short-lived
    /// block: the common case): the same as [`alloc`](Self::alloc) then
    /// [`free`](Self::free), without the live table when the address was not live before.
    fn alloc_then_free(&mut self, r: &Record, ts: u64, free_ts: u64, via_filter: bool) {
        self.pairs(r, ts, free_ts, via_filter, 1);
    }

    /// `n` times [`alloc_then_free`](Self::alloc_then_free) of `r`'s block at the same
    /// readings, at the cost of one (a run of identical pair records: a loop over one block
    /// whose allocations took their free's reading). The counter gets the one transient the
    /// `n` identical ones amount to when it is thinned ([`Tracker::apply`] folds runs only
    /// then).
    fn pairs(&mut self, r: &Record, ts: u64, free_ts: u64, via_filter: bool, n: u64) {
        let (addr, size, site) = (r.addr, r.size, r.site());
        if self.live.contains(addr) {
            for _ in 0..n {
                self.alloc(addr, size, site, ts);
                self.free(addr, free_ts, true, via_filter);
            }
            return;
        }
        if via_filter {
            local::filter_remove(addr);
        }
        self.used = true;
        let bytes = size * n;
        let s = &mut self.summary;
        s.allocated_bytes += bytes;
        s.alloc_count += n;
        s.free_count += n;
        let peak = s.live_bytes + size;
        if peak > s.peak_bytes {
            s.peak_bytes = peak;
            s.peak_ts = ts;
        }
        self.freed_bytes += bytes;
        let t = self.site(site);
        t.allocated += bytes;
        t.allocs += n;
        t.freed += bytes;
        t.frees += n;
        let live = self.summary.live_bytes;
        self.counter.change(live + size, ts);
        self.counter.change(live, free_ts);
    }

    /// `via_filter`: a sampled-mode free the overflow filter let through (its count is
    /// decremented when it matches a sampled block).
    fn free(&mut self, addr: u64, ts: u64, exact: bool, via_filter: bool) {
        match self.live.remove(addr) {
            Some(old) => {
                self.release(old, ts, true);
                if via_filter {
                    local::filter_remove(addr);
                }
            }
            // Sampled mode: most frees the filter lets through are of unsampled blocks.
            None if exact => {
                self.used = true;
                self.summary.unseen_frees += 1;
            }
            None => {}
        }
    }

    fn discard(&mut self, ts: u64) {
        let mut live = Vec::with_capacity(self.live.len());
        self.live.drain(|size, site| live.push((size, site)));
        for v in live {
            self.release(v, ts, false);
        }
        let live = self.summary.live_bytes;
        self.counter.change(live, ts);
    }

    fn samples(&self) -> Vec<(u32, Totals)> {
        let zones = self.sites.iter().enumerate().map(|(i, t)| (i as u32, t));
        let stacks =
            (self.stack_sites.iter().enumerate()).map(|(i, t)| (sites::STACK_SITE | i as u32, t));
        zones
            .chain(stacks)
            .filter(|(_, t)| t.allocs > 0)
            .map(|(i, t)| (i, *t))
            .collect()
    }

    fn finish(&mut self) -> HeapSummary {
        self.counter.flush();
        let sites = self.samples();
        let summarize = |(site, t): &(u32, Totals)| {
            let (zones, stack) = sites::site_parts(*site);
            SiteSummary {
                zones,
                stack,
                live_bytes: t.allocated - t.freed,
                live_count: t.allocs - t.frees,
                allocated_bytes: t.allocated,
                alloc_count: t.allocs,
            }
        };
        let mut by_live: Vec<&(u32, Totals)> = sites
            .iter()
            .filter(|(_, t)| t.allocated > t.freed)
            .collect();
        by_live.sort_by_key(|(s, t)| (std::cmp::Reverse(t.allocated - t.freed), *s));
        let mut by_alloc: Vec<&(u32, Totals)> = sites.iter().collect();
        by_alloc.sort_by_key(|(s, t)| (std::cmp::Reverse(t.allocated), *s));
        let mut out = self.summary.clone();
        out.top_live = by_live.into_iter().take(TOP_SITES).map(summarize).collect();
        out.top_allocated = by_alloc
            .into_iter()
            .take(TOP_SITES)
            .map(summarize)
            .collect();
        out
    }
}

struct Tracker {
    mode: MemoryMode,
    mode_bits: u32,
    start_ticks: u64,
    start_ns: u64,
    session: u32,
    heaps: Vec<Heap>,
    batch: Vec<Record>,
    /// Where each time-ordered run of `batch` lies (one per ring drained), and the merge's
    /// scratch space.
    runs: Vec<std::ops::Range<usize>>,
    scratch: Vec<Record>,
    pending: Vec<Record>,
    /// The drains' open allocations (reused space).
    open: Vec<local::Open>,
    counter_period: u64,
    writer: Option<crate::writer::TraceWriter>,
    profile_index: u64,
    /// The coarse clock against the trace clock, read at the first dump.
    coarse: Option<profile::CoarseBase>,
    dumps: u64,
    threads: std::collections::HashSet<i32>,
}

impl Tracker {
    fn heap(&mut self, pool: u16) -> &mut Heap {
        let i = pool as usize;
        while self.heaps.len() <= i {
            let n = self.heaps.len() as u16;
            self.heaps
                .push(Heap::new(sites::pool_name(n), self.counter_period));
        }
        &mut self.heaps[i]
    }

    /// One pass over the rings; `last`: apply everything (the session is stopping).
    fn pass(&mut self, last: bool) {
        let clock = crate::clock::clock();
        let now_ticks = clock.ticks();
        // Published before any ring is drained: a free that takes its allocation's reading
        // instead of a new one ([`local::PASS_TICKS`]) is from after this moment or in a ring
        // this pass has not drained yet.
        local::PASS_TICKS.store(now_ticks, Ordering::Relaxed);
        let watermark = if last { u64::MAX } else { now_ticks };
        let exact = self.mode_bits & EXACT != 0;
        let mut batch = std::mem::take(&mut self.batch);
        let mut runs = std::mem::take(&mut self.runs);
        runs.clear();
        // What the last pass kept back is one run (the tail of a merged batch), each ring's
        // records another.
        batch.append(&mut self.pending);
        if !batch.is_empty() {
            runs.push(0..batch.len());
        }
        let mut open = std::mem::take(&mut self.open);
        open.clear();
        for ring in local::rings() {
            let from = batch.len();
            let (n, left_open) = ring.drain_into(&mut batch);
            if n > 0 {
                self.threads.insert(ring.tid());
                runs.push(from..batch.len());
            }
            match left_open {
                Some(o) => open.push(o),
                None => ring.recycle_if_exited(),
            }
        }
        // The allocations left open (each ring's newest record, which its thread may still
        // mark freed): taken now, with their marks as they are after the barrier.
        local::settle(&open, &mut batch);
        self.open = open;
        if runs.len() > 1 {
            merge_runs(&mut batch, &mut runs, &mut self.scratch);
        }
        self.runs = runs;
        let split = batch.partition_point(|r| r.ticks < watermark);
        self.pending.extend_from_slice(&batch[split..]);
        batch.truncate(split);
        self.apply(&batch, exact);
        batch.clear();
        self.batch = batch;
        self.tick_counters();
    }

    /// Applies time-ordered records (those from before the session, pushed after the last
    /// one's final pass, are skipped: they sort first).
    fn apply(&mut self, batch: &[Record], exact: bool) {
        let clock = crate::clock::clock();
        let start = self.start_ticks;
        let mut i = batch.partition_point(|r| r.ticks < start);
        while i < batch.len() {
            let r = &batch[i];
            i += 1;
            let ts = clock.ticks_to_ns(r.ticks);
            match r.kind() {
                local::KIND_ALLOC if r.meta & local::PAIR_FREED != 0 => {
                    let via_filter = r.meta & local::PAIR_VIA_FILTER != 0;
                    // Identical pair records that follow (the same block, size, site and
                    // reading) are applied as one step when the counter is thinned: what they
                    // do to it is one transient at that reading. (Via the filter each pair
                    // decrements it: one at a time.)
                    let mut n = 1;
                    if self.counter_period > 0 && !via_filter {
                        while batch.get(i) == Some(r) {
                            n += 1;
                            i += 1;
                        }
                    }
                    self.heap(0).pairs(r, ts, ts, via_filter, n);
                }
                local::KIND_ALLOC => match batch.get(i) {
                    Some(f) if f.kind() == local::KIND_FREE && f.addr == r.addr => {
                        i += 1;
                        let via_filter = f.meta & local::FREE_FROM_FILTER != 0;
                        let free_ts = clock.ticks_to_ns(f.ticks);
                        self.heap(0).alloc_then_free(r, ts, free_ts, via_filter);
                    }
                    _ => self.heap(0).alloc(r.addr, r.size, r.site(), ts),
                },
                local::KIND_FREE => {
                    let via_filter = r.meta & local::FREE_FROM_FILTER != 0;
                    self.heap(0).free(r.addr, ts, exact, via_filter)
                }
                local::KIND_POOL_ALLOC => self.heap(r.pool()).alloc(r.addr, r.size, r.site(), ts),
                local::KIND_POOL_FREE => self.heap(r.pool()).free(r.addr, ts, true, false),
                local::KIND_POOL_DISCARD => self.heap(r.pool()).discard(ts),
                _ => {}
            }
        }
    }

    /// At the end of a pass: counters write what has waited a full period.
    fn tick_counters(&mut self) {
        let clock = crate::clock::clock();
        let now = clock.now();
        for h in &mut self.heaps {
            h.counter.tick(now);
        }
    }

    fn dump(&mut self) {
        if self.writer.is_none() {
            let Some(handle) = global::current_session(self.session) else {
                return;
            };
            self.writer = handle
                .arbiter
                .create_trace_writer(handle.target_buffer)
                .ok();
        }
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        let interval = match self.mode {
            MemoryMode::Sampled { interval } => interval,
            _ => 1,
        };
        let overran = local::LOST.load(Ordering::Relaxed) > 0;
        let names: Vec<String> = self.heaps.iter().map(|h| h.summary.name.clone()).collect();
        let dumps: Vec<HeapDump<'_>> = self
            .heaps
            .iter()
            .zip(&names)
            .enumerate()
            .filter(|(i, (h, _))| *i == 0 || h.used)
            .map(|(i, (h, n))| HeapDump {
                name: n,
                // Pools are recorded exactly in every mode.
                sampling_interval: if i == 0 { interval } else { 1 },
                buffer_overran: overran,
                samples: h.samples(),
            })
            .collect();
        let coarse = *self.coarse.get_or_insert_with(profile::CoarseBase::read);
        profile::write_dump(
            w,
            &mut self.profile_index,
            coarse,
            self.start_ns,
            &dumps,
            &sites::site_parts,
        );
        w.flush();
        self.dumps += 1;
    }
}

/// Merges the time-ordered runs of `batch` into one, in place (`scratch`: reused space). Runs
/// are merged in pairs, each merge copying stretches of one run at a time (found by binary
/// search): a ring that recorded a few events beside one that recorded many costs a few
/// copies, not a comparison per record. Equal readings keep the earlier run's record first
/// (only records of one ring can share a reading, and they are in one run).
fn merge_runs(
    batch: &mut Vec<Record>,
    runs: &mut Vec<std::ops::Range<usize>>,
    scratch: &mut Vec<Record>,
) {
    while runs.len() > 1 {
        scratch.clear();
        let mut merged = Vec::with_capacity(runs.len().div_ceil(2));
        for pair in runs.chunks(2) {
            let from = scratch.len();
            match pair {
                [a, b] => merge2(&batch[a.clone()], &batch[b.clone()], scratch),
                [a] => scratch.extend_from_slice(&batch[a.clone()]),
                _ => unreachable!("chunks of two"),
            }
            merged.push(from..scratch.len());
        }
        std::mem::swap(batch, scratch);
        *runs = merged;
    }
}

/// Appends the merge of two time-ordered runs to `out` (ties: `a` first).
fn merge2(mut a: &[Record], mut b: &[Record], out: &mut Vec<Record>) {
    out.reserve(a.len() + b.len());
    while let (Some(x), Some(y)) = (a.first(), b.first()) {
        if x.ticks <= y.ticks {
            let n = a.partition_point(|r| r.ticks <= y.ticks);
            out.extend_from_slice(&a[..n]);
            a = &a[n..];
        } else {
            let n = b.partition_point(|r| r.ticks < x.ticks);
            out.extend_from_slice(&b[..n]);
            b = &b[n..];
        }
    }
    out.extend_from_slice(a);
    out.extend_from_slice(b);
}

struct Running {
    thread: JoinHandle<MemorySummary>,
    stop: &'static AtomicBool,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);
static STOP: AtomicBool = AtomicBool::new(false);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts tracking for the session just installed (in-process): probes whether [`Tracked`]
/// is the global allocator, and if so starts the tracker thread and turns the hook on. Does
/// nothing with the mode off or the allocator not installed.
///
/// [`Tracked`]: super::Tracked
pub(crate) fn start_session(config: &MemoryConfig) {
    if config.mode == MemoryMode::Off {
        return;
    }
    let mut running = lock(&RUNNING);
    if running.is_some() {
        return;
    }
    HOOK.set_mode(PROBE);
    drop(std::hint::black_box(Box::new(0u64)));
    HOOK.set_mode(OFF);
    if !local::INSTALLED.load(Ordering::Relaxed) {
        return;
    }
    // Threads mark an allocation freed right after it instead of pushing a free when the
    // tracker can take their newest records with an asymmetric barrier (membarrier).
    local::PAIR_FLAGS.store(local::register_barrier(), Ordering::Relaxed);
    let session = global::session_of(global::EPOCH.load(Ordering::Relaxed));
    let clock = crate::clock::clock();
    let (bits, interval) = match config.mode {
        MemoryMode::Exact => (EXACT, 1),
        // The sampled mode word carries the session's generation: each thread's first
        // allocation in it draws the thread's countdown anew (`local::sampled_mode`).
        MemoryMode::Sampled { interval } => (local::sampled_mode(), interval.max(1)),
        MemoryMode::Off => return,
    };
    local::SAMPLE_INTERVAL.store(interval, Ordering::Relaxed);
    let seed = config.seed.unwrap_or_else(crate::clock::realtime_ns);
    local::SAMPLE_SEED.store(seed, Ordering::Relaxed);
    local::filter_clear();
    let depth = config.stack_depth();
    if depth > 0 {
        // The unwinder builds its tables on first use, under a lock, allocating: done here,
        // outside the hook, so the hook never builds them (an allocation made while another
        // capture holds that lock would wait for itself).
        let mut warm = [0u64; 4];
        crate::callstack::capture(&mut warm, 0);
    }
    local::STACK_DEPTH.store(depth as u8, Ordering::Relaxed);
    local::STACKS_MISSED.store(0, Ordering::Relaxed);
    for c in [&local::LOST, &local::UNTRACKED, &local::FAILED] {
        c.store(0, Ordering::Relaxed);
    }
    STOP.store(false, Ordering::Relaxed);
    let tracker = Tracker {
        mode: config.mode,
        mode_bits: bits,
        start_ticks: clock.ticks(),
        start_ns: clock.now(),
        session,
        heaps: Vec::new(),
        batch: Vec::new(),
        runs: Vec::new(),
        scratch: Vec::new(),
        pending: Vec::new(),
        open: Vec::new(),
        counter_period: config.counter_period.as_nanos().min(u64::MAX as u128) as u64,
        writer: None,
        profile_index: 0,
        coarse: None,
        dumps: 0,
        threads: Default::default(),
    };
    let dump_period = config.dump_period;
    local::PASS_TICKS.store(tracker.start_ticks, Ordering::Relaxed);
    local::TRACKER_RUNNING.store(true, Ordering::Relaxed);
    let thread = std::thread::Builder::new()
        .name("tachyon-memory".into())
        .spawn(move || run(tracker, dump_period));
    let Ok(thread) = thread else {
        local::TRACKER_RUNNING.store(false, Ordering::Relaxed);
        return;
    };
    *running = Some(Running {
        thread,
        stop: &STOP,
    });
    local::ZONES_ON.store(true, Ordering::Relaxed);
    HOOK.set_mode(bits);
}

/// Stops tracking: the hook goes quiet, the tracker applies what is left, writes the last heap
/// profile and returns its summary (`None` if tracking was not running).
pub(crate) fn stop_session() -> Option<MemorySummary> {
    let running = lock(&RUNNING).take()?;
    HOOK.set_mode(OFF);
    local::ZONES_ON.store(false, Ordering::Relaxed);
    running.stop.store(true, Ordering::Release);
    local::WAKE_CV.notify_all();
    let summary = running.thread.join().ok();
    local::TRACKER_RUNNING.store(false, Ordering::Relaxed);
    summary
}

fn run(mut t: Tracker, dump_period: Option<Duration>) -> MemorySummary {
    local::set_untracked_thread();
    let mut next_dump = dump_period.map(|p| std::time::Instant::now() + p);
    loop {
        if !STOP.load(Ordering::Acquire) {
            local::wait_for_work(Duration::from_millis(1));
        }
        local::take_wake();
        let stopping = STOP.load(Ordering::Acquire);
        t.pass(stopping);
        local::room_made();
        if let (Some(at), Some(p)) = (next_dump, dump_period) {
            if std::time::Instant::now() >= at && !stopping {
                t.dump();
                next_dump = Some(std::time::Instant::now() + p);
            }
        }
        if stopping {
            break;
        }
    }
    let heaps: Vec<HeapSummary> = t
        .heaps
        .iter_mut()
        .enumerate()
        .filter(|(i, h)| *i == 0 || h.used)
        .map(|(_, h)| h.finish())
        .collect();
    t.dump();
    // The thread's own writer (counters) flushes when the thread exits; the dump writer now.
    drop(t.writer.take());
    MemorySummary {
        mode: t.mode,
        start_ts: t.start_ns,
        heaps,
        lost: local::LOST.swap(0, Ordering::Relaxed),
        untracked: local::UNTRACKED.swap(0, Ordering::Relaxed),
        failed: local::FAILED.swap(0, Ordering::Relaxed),
        dumps: t.dumps,
        threads: t.threads.len() as u64,
        stacks_missed: local::STACKS_MISSED.swap(0, Ordering::Relaxed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec(ticks: u64, addr: u64) -> Record {
        Record {
            addr,
            ticks,
            ..Record::default()
        }
    }

    /// A run of identical pair records applied as one step leaves the heap as applying each
    /// pair does (totals, peak, sites), also when the block was live before (an unseen free).
    #[test]
    #[cfg_attr(
        miri,
        ignore = "the counter's samples start the tracer's drain thread, which outlives the test under Miri; safe code"
    )]
    fn a_run_of_pairs_equals_its_pairs_one_by_one() {
        for live_before in [false, true] {
            let r = Record {
                addr: 0x7000,
                size: 64,
                ticks: 5,
                meta: local::KIND_ALLOC | local::PAIR_FREED | 3u64 << 32,
            };
            let mut run = Heap::new("test".into(), 1_000);
            let mut each = Heap::new("test".into(), 1_000);
            for h in [&mut run, &mut each] {
                h.alloc(0x9000, 100, 1, 1);
                if live_before {
                    h.alloc(r.addr, 8, 2, 2);
                }
            }
            run.pairs(&r, 10, 10, false, 7);
            for _ in 0..7 {
                each.alloc(r.addr, r.size, r.site(), 10);
                each.free(r.addr, 10, true, false);
            }
            assert_eq!(run.freed_bytes, each.freed_bytes);
            let (a, b) = (run.finish(), each.finish());
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
            assert_eq!(a.alloc_count, 7 + 1 + u64::from(live_before));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 128 },
            ..ProptestConfig::default()
        })]
        /// Merging time-ordered runs gives what a stable sort of their concatenation gives
        /// (equal readings in run order).
        #[test]
        #[cfg_attr(miri, ignore = "property test: slow under Miri, no unsafe code involved")]
        fn merged_runs_equal_a_stable_sort(
            lens in proptest::collection::vec(0usize..40, 0..7),
            seed in any::<u64>(),
        ) {
            let mut x = seed | 1;
            let mut batch = Vec::new();
            let mut runs = Vec::new();
            for (run, len) in lens.iter().enumerate() {
                let from = batch.len();
                let mut t = 0;
                for i in 0..*len {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    t += x % 4; // repeated readings too
                    batch.push(rec(t, (run * 1000 + i) as u64));
                }
                if batch.len() > from {
                    runs.push(from..batch.len());
                }
            }
            let mut want = batch.clone();
            want.sort_by_key(|r| r.ticks);
            merge_runs(&mut batch, &mut runs, &mut Vec::new());
            prop_assert_eq!(batch, want);
        }
    }
}

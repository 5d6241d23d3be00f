//! Per-thread state: the thread's trace writer (one packet sequence), its interning tables,
//! its incremental clock and the descriptors it has emitted in the current generation.
//!
//! A *generation* is the span between two incremental-state clears on the sequence. It starts
//! with four packets: a `ClockSnapshot` tying the trace clock to BOOTTIME, MONOTONIC and
//! REALTIME; the clearing packet (`SEQ_INCREMENTAL_STATE_CLEARED`, `TracePacketDefaults` with
//! the sequence-scoped incremental clock 64 and this thread's track, and a snapshot defining
//! clock 64 against the trace clock); the process's and the thread's track descriptors. Every
//! interned name, source location and track descriptor is then emitted once per generation,
//! in the packet that first needs it. A new generation starts when the session asks
//! (`clear_period_ms`, a new process name), when the writer lost a packet (the incremental
//! clock's chain and the interning tables can no longer be trusted by the reader), and when
//! the thread first writes in a session.
//!
//! After a loss the new generation starts with the first packet that reaches the buffer again,
//! not before: while the shared memory buffer is full, each event goes to the writer's scratch
//! chunk and is counted lost, once (see `restart`). A generation start, and the descriptors
//! and clock snapshots events need, are only written when the writer says they will reach the
//! buffer (`TraceWriter::make_room`), so `packets_dropped` counts lost events, not lost set-up.
//!
//! Hot path (a zone's begin or end, an instant, without arguments): inline in the macro
//! ([`named_event`], [`slice_end`]), one `%fs` load and two stores take the thread's slot and
//! put it back (no borrow flag, no destructor-registration check), one relaxed load of the
//! epoch, then `Slot::try_push_with` (`queue.rs`): a compare for room, the counter read raw (no
//! conversion), two stores of the record and the published position. Everything else is behind
//! a call to a `#[cold]` function. The record is encoded later by whoever holds the slot's
//! lock ([`ThreadState::drain_queue`]: the `tachyon-drain` thread, [`drain_all`], or this thread
//! in [`with_state`] before any other event), through the fast path that used to run on the
//! thread: the callsite's template (24 bytes: three words) and the delta's varint (at most 3
//! bytes, no loop) stored straight into the chunk, the count bumped.

use std::cell::Cell;
use std::collections::HashMap;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::Duration;

use tachyon_protos::trace_packet::SequenceFlags;
use tachyon_protos::{
    counter_descriptor, track_descriptor, track_event, TracePacket, TrackDescriptor, TrackEvent,
};

use super::callsite::{Callsite, CallsiteKind, Enabled, Unit};
use super::encode::{self, CounterSample, Template, TYPE_SLICE_END};
use super::global::{self, session_of, EPOCH};
use super::queue::{self, Guard, Holder, Hot, Record, Slot};
use crate::callstack::CallstackInterner;
use crate::clock::{self, Clock, Converter, Snapshot, TRACE_CLOCK_ID};
use crate::writer::TraceWriter;

#[path = "state_ext.rs"]
pub(crate) mod ext;

/// The sequence-scoped incremental clock (as Perfetto's SDK).
pub(crate) const INCREMENTAL_CLOCK_ID: u32 = 64;

/// The trace clock again, sequence-scoped, in the global clock snapshots: it makes each
/// sequence's snapshots a clock set of their own (see `write_global_snapshot`). Never used for
/// timestamps.
pub(crate) const SNAPSHOT_SET_CLOCK_ID: u32 = 65;

/// A fresh global clock snapshot on each sequence this often (trace-clock ns): each one also
/// disciplines the trace clock to BOOTTIME (`clock::Snapshot::take`), and tells a reader that
/// joins late (a ring that wrapped) how the clocks relate.
const SNAPSHOT_PERIOD_NS: u64 = 1_000_000_000;

/// Upper bounds on encoded sizes (fragment header, sequence marks and protozero's 4-byte size
/// reservations included) for the room the writer makes before packets the SDK writes on its
/// own: a `ClockSnapshot` packet; a generation start without its variable parts (process and
/// thread names, command line); a track descriptor without its names.
const SNAPSHOT_ROOM: usize = 128;
const GENERATION_ROOM_BASE: usize = 384;
const DESCRIPTOR_ROOM_BASE: usize = 96;
/// Per string of a descriptor: tag and length.
const STRING_ROOM: usize = 6;

/// Interning ids of dynamic names start here, far above the callsites' static ids.
const DYN_IID_BASE: u64 = 1 << 40;

const SEQ_INCREMENTAL_STATE_CLEARED: u32 = SequenceFlags::SeqIncrementalStateCleared as u32;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = SequenceFlags::SeqNeedsIncrementalState as u32;

/// A track an event goes to, other than the thread's own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TrackRef<'a> {
    pub(crate) uuid: u64,
    pub(crate) name: &'a str,
    pub(crate) unit: Option<Unit>,
}

// `repr(C)`: the fields the fast path of `replay` reads come first (the writer's own are
// inside it, at its end).
#[repr(C)]
pub(crate) struct ThreadState {
    /// The process's trace clock, copied (its source never changes once calibrated, and its
    /// tick → ns model is shared): reading it here saves the `OnceLock` check of
    /// `clock::now()` on every event.
    clock: Clock,
    /// The clock's tick → ns conversion as of the start of the run being drained
    /// ([`replay_all`](Self::replay_all)): every record of the run was read before it, so it
    /// converts them all exactly, without the shared model's atomic loads per record.
    ticks: Converter,
    /// The [`EPOCH`] this state is current for.
    epoch: u64,
    /// While queued events are encoded: the epoch they were recorded in, which the state
    /// follows instead of [`EPOCH`] (see `drain_queue`).
    pin: Option<u64>,
    /// The incremental clock's value (trace-clock ns of the last delta-encoded packet).
    last_ts: u64,
    /// Write a clock snapshot before the first packet at or after this (0 without incremental
    /// timestamps: every packet takes the slow path then).
    next_snapshot: u64,
    /// `seen[id].generation == generation`: the callsite `id`'s interned data (or counter
    /// descriptor) is on the sequence, and `seen[id].template` is its event's fixed bytes.
    seen: Vec<Interned>,
    generation: u32,
    incremental: bool,
    /// Upper bound on the size of a generation start (its four packets), from the last one
    /// written: the room `restart` makes for the next.
    generation_room: usize,
    /// When the periodic clock snapshot is due, with incremental timestamps or without
    /// (`next_snapshot` doubles as the fast path's gate, always 0 without them).
    next_clock_snapshot: u64,
    dyn_names: HashMap<Box<str>, u64>,
    next_dyn_iid: u64,
    tracks_seen: HashMap<u64, u32>,
    tid: i64,
    track_uuid: u64,
    thread_name: Option<String>,
    /// The thread's rank among the process's threads (a group hint, `ext.rs`).
    group_rank: Option<i32>,
    /// Interning ids `ext.rs` gave its names, categories and argument names: (iid, generation).
    ext_keys: HashMap<Box<str>, (u64, u32)>,
    /// Lock holds' pre-encoded packets, by lock index and kind of hold (`ext.rs`).
    ext_templates: ext::LockTemplates,
    writer: Option<TraceWriter>,
    /// Call stacks interned on this sequence, valid for `callstacks_generation`.
    callstacks: CallstackInterner,
    callstacks_generation: u32,
}

/// One entry of the thread's interning table, by callsite id.
#[derive(Clone, Copy, Debug, Default)]
struct Interned {
    generation: u32,
    template: Template,
}

/// A thread's state and its event queue.
type ThreadSlot = Slot<ThreadState>;

/// The queue is closed: no `EPOCH` value equals this (it would take 2^32 − 1 sessions).
const CLOSED: u64 = u64::MAX;

/// Every thread's slot, for the drainers ([`drain_all`]).
static SLOTS: Mutex<Vec<Arc<ThreadSlot>>> = Mutex::new(Vec::new());

fn slots() -> MutexGuard<'static, Vec<Arc<ThreadSlot>>> {
    SLOTS.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// This thread's slot, when nothing on this thread is using it. Null before its first use,
    /// while it is in use (so a nested call, from an argument whose evaluation traces, or a
    /// signal handler that traces, finds it null and records nothing) and once the thread's
    /// [`OWNER`] is gone. No destructor: reading it is one `%fs`-relative load, without the
    /// registration check a `RefCell<Option<Arc<_>>>` costs, nor a borrow flag.
    static SLOT: Cell<*const ThreadSlot> = const { Cell::new(ptr::null()) };
    /// Owns the slot: closes it (the queue drained, the writer flushed) when the thread exits.
    static OWNER: Owner = const {
        Owner {
            slot: Cell::new(ptr::null()),
            gone: Cell::new(false),
        }
    };
}

/// The owner of a thread's slot, from its first event to the thread's exit.
struct Owner {
    /// From `Arc::into_raw`; null before the first event.
    slot: Cell<*const ThreadSlot>,
    /// The slot was closed (the thread is exiting): no new one.
    gone: Cell<bool>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.gone.set(true);
        let p = self.slot.replace(ptr::null());
        // First make the slot unreachable: events from other thread-local destructors that run
        // later find nothing.
        SLOT.with(|s| s.set(ptr::null()));
        if p.is_null() {
            return;
        }
        // SAFETY: `p` comes from `Arc::into_raw` in `with_new_state`, and this is the only
        // place that takes that reference back, once.
        let slot = unsafe { Arc::from_raw(p) };
        {
            // The last events, then the writer flushes as it drops.
            let mut st = slot.lock();
            ThreadState::drain_queue(&mut st);
            st.release_writer();
        }
        slots().retain(|s| !Arc::ptr_eq(s, &slot));
    }
}

/// The latest timestamp of each released writer's sequence, by (arbiter id, writer id): the
/// floor of the next owner of the id, which continues the sequence.
static SEQUENCE_FLOORS: Mutex<Option<HashMap<(u64, u16), u64>>> = Mutex::new(None);

fn record_sequence_floor(arbiter: u64, writer: u16, ts: u64) {
    let mut floors = SEQUENCE_FLOORS.lock().unwrap_or_else(|e| e.into_inner());
    floors
        .get_or_insert_with(HashMap::new)
        .insert((arbiter, writer), ts);
}

fn take_sequence_floor(arbiter: u64, writer: u16) -> u64 {
    let mut floors = SEQUENCE_FLOORS.lock().unwrap_or_else(|e| e.into_inner());
    floors
        .as_mut()
        .and_then(|m| m.remove(&(arbiter, writer)))
        .unwrap_or(0)
}

/// Puts the slot back in [`SLOT`] when a `with_state` call ends (also when it unwinds).
struct Restore(*const ThreadSlot);

impl Drop for Restore {
    #[inline(always)]
    fn drop(&mut self) {
        let p = self.0;
        SLOT.with(|s| s.set(p));
    }
}

/// Runs `f` with this thread's state, once the events in its queue are encoded; `None` while
/// the thread is exiting, or when called from inside `f` (an argument whose evaluation
/// traces): such nested events are not recorded.
#[inline(always)]
pub(crate) fn with_state<R>(f: impl FnOnce(&mut ThreadState) -> R) -> Option<R> {
    let p = SLOT.with(|s| s.replace(ptr::null()));
    if p.is_null() {
        return with_new_state(f);
    }
    let _restore = Restore(p);
    // SAFETY: a non-null `SLOT` is this thread's slot, kept alive by the `Arc` its `OWNER`
    // holds (given up only in `Owner::drop`, which clears `SLOT` first).
    let slot = unsafe { &*p };
    let mut st = slot.lock();
    let n = ThreadState::drain_queue(&mut st);
    if n > 0 {
        OWNER_ENCODED.fetch_add(n as u64, Ordering::Relaxed);
    }
    let r = f(&mut st);
    // The queue opens for the epoch the state is current for, if it has a writer there; the
    // next event that finds `EPOCH` elsewhere comes back here (see `named_event`).
    // Closed while every event takes a call stack (`TACHYON_CALLSTACK`): the hot path's push
    // then fails and `named_event_cold` captures the stack on this thread.
    let open = st.writer.is_some()
        && st.epoch == EPOCH.load(Ordering::Relaxed)
        && crate::callstack::default_depth() == 0;
    // SAFETY: this thread owns the slot, and took it out of `SLOT`: no other producer
    // reference exists on this thread (the hot paths take it from `SLOT` too).
    let hot = unsafe { &mut slot.producer().hot };
    hot.epoch = if open { st.epoch } else { CLOSED };
    hot.session = st.session();
    Some(r)
}

/// `with_state` when [`SLOT`] is null: creates the slot on the thread's first event; `None`
/// when the slot is in use (a nested call) or gone.
#[cold]
#[inline(never)]
fn with_new_state<R>(f: impl FnOnce(&mut ThreadState) -> R) -> Option<R> {
    let created = OWNER
        .try_with(|o| {
            if o.gone.get() || !o.slot.get().is_null() {
                return false;
            }
            let state = ThreadState::new();
            let hot = Hot {
                epoch: CLOSED,
                session: 0,
                clock: state.clock,
            };
            let slot = Arc::new(Slot::new(state, hot));
            slots().push(Arc::clone(&slot));
            start_drainer();
            crate::crash::thread_started();
            let p = Arc::into_raw(slot);
            o.slot.set(p);
            SLOT.with(|s| s.set(p));
            true
        })
        .unwrap_or(false);
    if created {
        with_state(f)
    } else {
        None
    }
}

/// A template's [`EVENT_PREFIX`](encode::EVENT_PREFIX) bytes as little-endian words, what
/// [`TraceWriter::write_event_run`] takes: loaded straight into registers.
#[inline(always)]
const fn prefix_words(p: &[u8; encode::EVENT_PREFIX]) -> [u64; 3] {
    let mut words = [0u64; 3];
    let mut i = 0;
    while i < encode::EVENT_PREFIX {
        words[i / 8] |= (p[i] as u64) << (8 * (i % 8));
        i += 1;
    }
    words
}

/// The delta from `last_ts` to `ts` if a fast path may write it: at most three varint bytes
/// (`FAST_DELTA_LIMIT`; one unsigned compare covers time going back too) and before the next
/// clock snapshot is due.
#[inline(always)]
fn fast_window_delta(ts: u64, last_ts: u64, next_snapshot: u64) -> Option<u64> {
    let delta = ts.wrapping_sub(last_ts);
    (delta < TraceWriter::FAST_DELTA_LIMIT && ts < next_snapshot).then_some(delta)
}

/// Who drains the queues, and so how ([`drain_all`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drain {
    /// The drainer thread's pass: threads with queued events that are not busy with their
    /// state (a busy thread encodes its queue itself when it lets go).
    Pass,
    /// A flush the service asked for ([`request_flush_pass`]), made by the drainer thread:
    /// every thread that is not busy. (Not on the service's thread: encoding may need a chunk
    /// that only the service frees.)
    Flush,
    /// A flush or stop on a thread that may wait: every thread, waiting for another drainer
    /// but not for the owner (see `Holder`), so that every event queued before the call is
    /// encoded when it returns.
    FlushAll,
    /// After a session ended: as `Flush`, and the writers of threads whose session ended
    /// flush and drop, so the stop does not wait for those threads' next event.
    Release,
}

/// Encodes the events queued on every thread (see [`Drain`] for which), and flushes the
/// writers a flush request is pending for (the writer does so at its next packet, which a
/// sleeping thread does not write). Returns the number of events encoded.
pub(crate) fn drain_all(how: Drain) -> usize {
    // This thread's own slot is locked below like any other: taken out of `SLOT` meanwhile, so
    // that a signal handler tracing on this thread finds nothing instead of waiting for a lock
    // this thread holds.
    let own = SLOT.with(|s| s.replace(ptr::null()));
    let _restore = Restore(own);
    let all: Vec<Arc<ThreadSlot>> = slots().clone();
    let mut n = 0;
    for slot in &all {
        if how == Drain::Pass && slot.pending() == 0 {
            continue;
        }
        // Never waiting for an owner (see `Holder`): its queue is empty while it holds the lock.
        let st = match how {
            Drain::Pass | Drain::Flush => slot.try_lock(Holder::Drainer),
            Drain::FlushAll | Drain::Release => slot.lock_unless_owner(),
        };
        let Some(mut st) = st else {
            continue;
        };
        // This thread's own queue keeps its lines (it writes them next), and so does every
        // queue when the process has one CPU: its threads take turns on the same caches.
        let give_up = !ptr::eq(Arc::as_ptr(slot), own) && cpus_apart();
        n += ThreadState::drain_queue_as(&mut st, give_up);
        if how == Drain::Release
            && session_of(st.epoch) != session_of(EPOCH.load(Ordering::Relaxed))
        {
            st.writer = None;
        }
        if let Some(w) = st.writer.as_mut() {
            w.flush_if_requested();
        }
    }
    n
}

/// Whether the process may run on more than one CPU (its affinity and CPU quota, as
/// `available_parallelism` reads them; looked at once): only then can a drainer run on another
/// core than the thread whose queue it drains, and only then does giving the queue's lines up
/// after a run pay (`queue::give_lines_up`). On one CPU the flushed lines are the ones the
/// thread writes next, and it would fetch them back from memory.
fn cpus_apart() -> bool {
    static APART: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *APART.get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 1))
}

/// The drainer's pace. After a pass that found this many events or more it goes round again
/// at once; after fewer, it naps ([`drain_nap`]). A pass encodes an event in 5-9 ns on this
/// VM, about as long as a thread recording at full speed takes to queue one (its counter read,
/// ~10 ns), so a drainer that keeps up with such a thread finds about as many events a pass as
/// the pass before encoded: with a sixteenth of the queue it stays in that loop without a nap,
/// its passes short and the lines it reads recent, and the thread's queue never fills. Each nap
/// is a context switch out and in (about as much as encoding a few hundred events); with a
/// higher threshold the drainer naps between the passes of a flood, the queue fills meanwhile
/// and the thread encodes its own events (docs/data-path.md, "The ring's lines given up").
const DRAIN_BUSY: usize = queue::CAPACITY / 16;
const DRAIN_NAP: Duration = Duration::from_micros(100);
/// After passes that found every queue empty, the nap doubles up to this (a session with
/// nothing to trace wakes the drainer a thousand times a second, not seven thousand; each
/// wake-up, a context switch in and out with the caches refilled, costs about as much as
/// encoding a few hundred events). Meanwhile a queue that fills to an eighth
/// ([`queue::WAKE_FILL`]) wakes the drainer (the producer looks every [`queue::WAKE_STEP`]
/// records, off its fast path), so a burst after a quiet spell is not left to its own thread.
const DRAIN_NAP_LONG: Duration = Duration::from_millis(1);
/// With no session, the drainer looks this often (a session's start does not wake it: the
/// first events wait at most this long in their queue, which holds them).
const DRAIN_IDLE: Duration = Duration::from_millis(20);

/// The nap after a pass that found `found` events, the previous nap having been `nap`: `None`
/// to go round at once. With `apart` false (the process has one CPU, [`cpus_apart`]) the
/// drainer runs only by taking the core from a traced thread, so it keeps to the longer naps
/// and goes round at once only after [`DRAIN_BUSY_ONE_CPU`] events: each of its wake-ups there
/// is a switch away from the thread it drains.
fn drain_nap(found: usize, nap: Duration, apart: bool) -> Option<Duration> {
    // On one CPU the flood tier is empty: it starts where going round at once does.
    let (flood, busy) = if apart {
        (DRAIN_FLOOD, DRAIN_BUSY)
    } else {
        (DRAIN_BUSY_ONE_CPU, DRAIN_BUSY_ONE_CPU)
    };
    match found {
        0 => Some((2 * nap).clamp(DRAIN_NAP, DRAIN_NAP_LONG)),
        n if n < flood => Some(DRAIN_NAP),
        n if n < busy => Some(DRAIN_NAP_FLOOD),
        _ => None,
    }
}

/// [`DRAIN_BUSY`] for a process with one CPU: a quarter of the queue.
const DRAIN_BUSY_ONE_CPU: usize = queue::CAPACITY / 4;

/// A pass that found this many events or more (and fewer than [`DRAIN_BUSY`]) is followed by
/// the short [`DRAIN_NAP_FLOOD`] instead of [`DRAIN_NAP`]: events came at 5 M a second or more
/// (512 in a 100 µs nap), and a thread recording at full speed fills its queue in about 160 µs,
/// most of which [`DRAIN_NAP`] with its wake-up's latency would leave to the queue to fill (and
/// the thread to encode it itself, on its own time, while the drainer sleeps). (The drainer's
/// timer slack is set to match: see [`drainer`].)
const DRAIN_FLOOD: usize = queue::CAPACITY / 32;
const DRAIN_NAP_FLOOD: Duration = Duration::from_micros(25);

/// Events the threads encoded themselves, their queue full (the drainer behind), or before a
/// slow-path event: work the hot path did that the drainer's CPU time does not show. Counted
/// only on those slow paths, for the client bench's account of where encoding ran.
pub(crate) static OWNER_ENCODED: AtomicU64 = AtomicU64::new(0);

/// Set by [`request_flush_pass`], taken by the drainer thread.
static FLUSH_PASS: AtomicBool = AtomicBool::new(false);

/// What the drainer thread runs after each pass, set while a session is on: the in-process
/// service's commit pump (`tachyon_service::CommitPump`), which copies the chunks the pass
/// committed into the central buffer on this thread, before it naps, rather than leaving them
/// to the service thread's next turn (about a millisecond of copying every 2 ms in a flood,
/// on the core the drainer runs on, which the drainer then waits for while the traced threads'
/// queues fill).
type AfterPass = Arc<dyn Fn() + Send + Sync>;
static AFTER_PASS: Mutex<Option<AfterPass>> = Mutex::new(None);

/// Sets (or, with `None`, clears) what the drainer runs after each pass ([`AFTER_PASS`]). A
/// call already under way may finish after it is cleared: what is set must stay safe to call
/// once its session has stopped (a `CommitPump` then does nothing).
#[cfg_attr(not(feature = "in-process"), allow(dead_code))]
pub(crate) fn set_after_pass(f: Option<AfterPass>) {
    *AFTER_PASS.lock().unwrap_or_else(|e| e.into_inner()) = f;
}

/// Runs [`AFTER_PASS`], if set, outside its lock: a stop that clears it never waits for it.
/// A panic in it (a bug in the service's commit path) is caught here: the drainer thread is
/// started once per process and must outlive it.
fn after_pass() {
    let f = AFTER_PASS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(Arc::clone);
    if let Some(f) = f {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f()));
    }
}

/// Asks the drainer thread for a [`Drain::Flush`] pass (within [`DRAIN_NAP`] while a session
/// runs): the service's periodic flush, which must not encode on its own thread. (The
/// in-process service and live capture ask for it; a daemon's flushes reach writers directly.)
#[cfg_attr(not(feature = "in-process"), allow(dead_code))]
pub(crate) fn request_flush_pass() {
    FLUSH_PASS.store(true, Ordering::Relaxed);
}

/// Starts the drainer thread once: it encodes the queued events of every thread while a
/// session runs, so that the threads themselves only queue them (Tracy's design), and flushes
/// the writers of threads that sleep when a flush is requested.
fn start_drainer() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("tachyon-drain".into())
            .spawn(drainer);
        // Without the thread (no resources for one), threads drain their own queues when
        // full, and flushes and stops drain the rest: slower, nothing lost.
        drop(spawned);
    });
}

/// The drainer thread's loop: passes paced by [`drain_nap`] while a session runs.
fn drainer() {
    // Only this thread sets it, once.
    let _ = queue::DRAINER.set(std::thread::current());
    if helper_sched_batch() {
        run_as_batch();
    }
    // Linux lets a sleep last 50 µs past its end by default (the timer slack), twice the
    // flood's nap: 5 µs keeps the nap near what it asks for.
    #[cfg(all(target_os = "linux", not(miri)))]
    // SAFETY: `PR_SET_TIMERSLACK` takes a number and changes only the calling thread's slack;
    // no memory is handed over.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 5_000 as libc::c_ulong);
    }
    let mut nap = DRAIN_NAP;
    loop {
        if FLUSH_PASS.swap(false, Ordering::Relaxed) {
            drain_all(Drain::Flush);
            after_pass();
        }
        if EPOCH.load(Ordering::Relaxed) == 0 {
            std::thread::sleep(DRAIN_IDLE);
            continue;
        }
        let found = drain_all(Drain::Pass);
        after_pass();
        match drain_nap(found, nap, cpus_apart()) {
            Some(n) if n > DRAIN_NAP => {
                nap = n;
                queue::DRAINER_NAPS_LONG.store(true, Ordering::Relaxed);
                // Woken early by a filling queue (or a stale wake: one pass more).
                std::thread::park_timeout(n);
                queue::DRAINER_NAPS_LONG.store(false, Ordering::Relaxed);
            }
            Some(n) => {
                nap = n;
                std::thread::sleep(n);
            }
            None => nap = DRAIN_NAP,
        }
    }
}

/// Whether the drainer runs under `SCHED_BATCH` (`TACHYON_HELPER_SCHED=batch`; the normal
/// policy otherwise). A batch thread keeps the CPU share of its nice level but its wake-ups
/// never preempt a running thread: it runs on a free core, or at the running thread's tick.
/// At the normal policy the drainer, waking every 100 µs while a session is busy, often runs at
/// once on the traced thread's own core (about 1 000 involuntary context switches of the traced
/// thread in the client bench's flood of 2 M zones, against about 30 in batch). In batch, on a
/// machine with no free core, the traced thread's queue fills and the thread encodes it itself:
/// less CPU in all (about 3 ns an event on the thread, cache-hot, against the drainer's 10 on
/// the other core) and nothing lost, but on the thread's own time, so its wall time per zone
/// rises (docs/data-path.md has both). Not the default for that reason.
fn helper_sched_batch() -> bool {
    std::env::var_os("TACHYON_HELPER_SCHED").is_some_and(|v| v == "batch")
}

/// Puts the calling thread under `SCHED_BATCH` (Linux); whether it runs as a batch thread now.
pub(crate) fn run_as_batch() -> bool {
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `sched_setscheduler` reads `param` (a live, initialised struct) and changes
        // only the calling thread's policy (pid 0: this thread); no memory is handed over.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) == 0 }
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    {
        false
    }
}

/// A slice begin (`TY` = `TYPE_SLICE_BEGIN`) or an instant (`TYPE_INSTANT`) of an enabled
/// static callsite without arguments on this thread, now; the session it went to (0: none).
/// Inline in the macro: the record pushed on the thread's queue, the counter read inline (with
/// another clock source, one call); everything else behind a call to a cold function.
#[inline(always)]
pub(crate) fn named_event<const TY: u8>(cs: &'static Callsite) -> u32 {
    let word = ptr::from_ref(cs)
        .cast::<u8>()
        .map_addr(|a| a | usize::from(TY));
    if let Some(session) = push(word) {
        return session;
    }
    named_event_cold(cs, TY)
}

/// A slice end on this thread's track, in `session`, now (as [`named_event`]).
#[inline(always)]
pub(crate) fn slice_end(session: u32) {
    let word = ptr::without_provenance((session as usize) << 2 | usize::from(TYPE_SLICE_END));
    if push(word).is_none() {
        slice_end_cold(session);
    }
}

/// Pushes `[word, now]` on this thread's queue if it is open for the current epoch and has
/// room; the queue's session.
#[inline(always)]
fn push(word: *const u8) -> Option<u32> {
    push_with(|_| Some(word))
}

/// As [`push`], the word made from the counter's reading (`None`: nothing pushed).
#[inline(always)]
fn push_with(word: impl FnOnce(u64) -> Option<*const u8>) -> Option<u32> {
    let p = SLOT.with(|s| s.replace(ptr::null()));
    if p.is_null() {
        return None;
    }
    let _restore = Restore(p);
    // SAFETY: as in `with_state`: a non-null `SLOT` is this thread's live slot.
    let slot = unsafe { &*p };
    // SAFETY: this thread owns the slot and took it out of `SLOT`, so no other producer
    // reference is alive on it (nothing that interrupts this thread can reach it meanwhile).
    unsafe { slot.try_push_with(EPOCH.load(Ordering::Relaxed), word) }
}

/// As [`push`], stamped with `ticks`: a counter reading this thread took with nothing pushed
/// since (a lock's release, read before the unlock and queued after it).
#[inline(always)]
fn push_at(word: *const u8, ticks: u64) -> Option<u32> {
    let p = SLOT.with(|s| s.replace(ptr::null()));
    if p.is_null() {
        return None;
    }
    let _restore = Restore(p);
    // SAFETY: as in `push_with`.
    let slot = unsafe { &*p };
    // SAFETY: as in `push_with`.
    unsafe { slot.try_push_at(EPOCH.load(Ordering::Relaxed), Some(ticks), |_| Some(word)) }
}

#[cold]
#[inline(never)]
fn named_event_cold(cs: &'static Callsite, ty: u8) -> u32 {
    // Every event takes a stack (`TACHYON_CALLSTACK`): taken here, on the thread, skipping
    // this function's frame (the hot path is inline in the caller).
    let depth = crate::callstack::default_depth();
    let mut pcs = [0u64; crate::callstack::MAX_DEPTH];
    let n = if depth != 0 {
        crate::callstack::capture(&mut pcs[..depth], 1)
    } else {
        0
    };
    let ts = clock::now();
    let en = Enabled { id: cs.id() };
    with_state(|st| {
        if n == 0 {
            st.named_event_slow(cs, en, ty, ts);
        } else {
            let iid = st.intern_callstack(ts, &pcs[..n]);
            st.event(ts, cs, en, ty, None, None, |cx| cx.callstack_iid(iid));
        }
        st.session()
    })
    .unwrap_or(0)
}

#[cold]
#[inline(never)]
fn slice_end_cold(session: u32) {
    let ts = clock::now();
    with_state(|st| st.slice_end_slower(session, ts));
}

/// The uuid of thread `tid`'s track (what its sequence's descriptors and defaults name).
pub(crate) fn thread_track_uuid(tid: i64) -> u64 {
    global::mix64(global::process().uuid ^ (tid as u64).rotate_left(17))
}

/// The name thread `tid` has on the trace, for the crash handler's helper: found without
/// waiting (a lock the crashed thread may hold is skipped), `None` when unknown.
pub(crate) fn thread_name_of(tid: i64) -> Option<String> {
    let all: Vec<Arc<ThreadSlot>> = SLOTS.try_lock().ok()?.clone();
    all.iter().find_map(|slot| {
        let st = slot.try_lock(Holder::Drainer)?;
        (st.tid == tid).then(|| st.thread_name.clone()).flatten()
    })
}

/// Drops this thread's writer (it flushes): a session that stops does this on its own thread.
/// Does not create the state.
pub(crate) fn release_thread_writer() {
    if SLOT.with(|s| s.get()).is_null() {
        return;
    }
    with_state(|s| {
        s.writer = None;
        s.epoch = 0;
    });
}

impl ThreadState {
    #[cold]
    fn new() -> Self {
        let tid = current_tid();
        let clock = *clock::clock();
        ThreadState {
            clock,
            ticks: clock.converter(),
            epoch: 0,
            pin: None,
            writer: None,
            incremental: true,
            generation: 0,
            generation_room: GENERATION_ROOM_BASE,
            last_ts: 0,
            next_snapshot: 0,
            next_clock_snapshot: 0,
            // Room for the first thousand callsites without growing.
            seen: vec![Interned::default(); 1024],
            dyn_names: HashMap::new(),
            next_dyn_iid: DYN_IID_BASE,
            tracks_seen: HashMap::new(),
            tid,
            track_uuid: thread_track_uuid(tid),
            thread_name: std::thread::current().name().map(str::to_owned),
            callstacks: CallstackInterner::new(),
            callstacks_generation: 0,
            group_rank: None,
            ext_keys: HashMap::new(),
            ext_templates: HashMap::default(),
        }
    }

    /// Whether an event at `ts` may use the sequence's incremental state as it is: same epoch,
    /// time moving forward, no snapshot due. (A loss since the generation started is the
    /// writer's to tell: `TraceWriter::try_write_event` refuses until `mark_synced`.)
    #[inline(always)]
    fn in_window(&self, ts: u64) -> bool {
        self.epoch == self.epoch_now() && ts >= self.last_ts && ts < self.next_snapshot
    }

    /// [`EPOCH`], or the epoch the state is pinned to while it encodes a finished session's
    /// queued events.
    #[inline(always)]
    fn epoch_now(&self) -> u64 {
        self.pin.unwrap_or_else(|| EPOCH.load(Ordering::Relaxed))
    }

    /// The fast paths' [`in_window`](Self::in_window): [`fast_window_delta`] in the state's
    /// session. The delta since the last packet, if the event may take the fast path.
    #[inline(always)]
    fn fast_delta(&self, ts: u64) -> Option<u64> {
        fast_window_delta(ts, self.last_ts, self.next_snapshot)
            .filter(|_| self.epoch == self.epoch_now())
    }

    #[inline(always)]
    fn seen(&self, id: u64) -> bool {
        self.seen
            .get(id as usize)
            .is_some_and(|e| e.generation == self.generation)
    }

    /// The template of callsite `id` if it is interned in this generation.
    #[inline(always)]
    fn template(&self, id: u64) -> Option<&Template> {
        self.seen
            .get(id as usize)
            .filter(|e| e.generation == self.generation)
            .map(|e| &e.template)
    }

    fn mark_seen(&mut self, id: u64, template: Template) {
        let i = id as usize;
        if i >= self.seen.len() {
            self.seen.resize(i + 256, Interned::default());
        }
        self.seen[i] = Interned {
            generation: self.generation,
            template,
        };
    }

    /// Writes a slice end at `ts` through the writer's fast path; false (nothing written) if it
    /// is not available.
    #[inline(always)]
    fn try_write_slice_end(&mut self, ts: u64, delta: u64) -> bool {
        let last_ts = &mut self.last_ts;
        self.writer.as_mut().is_some_and(|w| {
            w.try_write_short_event(&encode::SLICE_END_PREFIX, delta, || *last_ts = ts)
        })
    }

    // === The three hot events ===

    /// Encodes the events of the thread's queue, in order (see [`named_event`] and
    /// [`slice_end`] for a record's word); the number encoded.
    ///
    /// Every queued event was pushed while the queue was open for `epoch` (`with_state` opens it
    /// for the state's epoch only, and only the lock holder changes that epoch, after draining).
    /// The state follows that epoch while it encodes them, whatever [`EPOCH`] says meanwhile:
    /// a session that ends (a stop, a crash) or a clear of the incremental state while the
    /// queue drains must not take the writer or the sequence's state away from events recorded
    /// before it, nor put them into the next session's writer.
    fn drain_queue(st: &mut Guard<'_, ThreadState>) -> usize {
        Self::drain_queue_as(st, false)
    }

    /// [`drain_queue`](Self::drain_queue); with `give_up` (a drainer, not the queue's own
    /// thread), each run's ring lines are flushed from the caches once encoded, so that the
    /// thread's next lap of stores does not wait for this core's copies
    /// (`queue::give_lines_up`).
    fn drain_queue_as(st: &mut Guard<'_, ThreadState>, give_up: bool) -> usize {
        st.pin = Some(st.epoch);
        let n = st.drain_runs(give_up, ThreadState::replay_all);
        st.pin = None;
        n
    }

    /// Encodes a run of queued events, in order: as many as [`replay_run`](Self::replay_run)
    /// takes at a time, and each event it does not take through [`replay`](Self::replay).
    fn replay_all(&mut self, mut records: &[Record]) {
        self.ticks = self.clock.converter();
        while !records.is_empty() {
            let mut n = self.replay_run(records);
            if n == 0 {
                // A run of lock holds (`ext.rs`), the same way.
                n = self.replay_lock_run(records);
            }
            if n == 0 {
                if let Some(first) = records.first() {
                    self.replay(*first);
                }
                n = 1;
            }
            records = records.get(n..).unwrap_or_default();
        }
    }

    /// Encodes the longest prefix of `records` that the fast paths of slice begins, instants
    /// and slice ends take, through the writer's run path
    /// ([`TraceWriter::write_event_run`]); the number encoded. The same packets as
    /// [`replay`](Self::replay) would write one at a time, with what a run has in common checked
    /// once: the state pinned to its session (as [`drain_queue`](Self::drain_queue) leaves it),
    /// the writer's fast path open. Per event: the timestamp delta within the fast path's window
    /// (three varint bytes, before the next clock snapshot), a slice end of the state's session,
    /// a begin's or instant's template interned in this generation.
    fn replay_run(&mut self, records: &[Record]) -> usize {
        if self.epoch != self.epoch_now() {
            return 0;
        }
        let session = session_of(self.epoch);
        let ThreadState {
            ticks,
            last_ts,
            next_snapshot,
            seen,
            generation,
            writer,
            ..
        } = self;
        let Some(w) = writer.as_mut() else {
            return 0;
        };
        let (ticks, next_snapshot, generation) = (*ticks, *next_snapshot, *generation);
        const SLICE_END_WORDS: [u64; 3] = prefix_words(&encode::SLICE_END_EVENT_PREFIX);
        // The clock's line for the run (one range check and a multiply a record), taken again
        // from the converter when a record falls outside it.
        let mut line = ticks.linear(records.first().map_or(0, |r| r.ticks));
        // Locals, not the state's fields, while the run is written: kept in registers.
        let (mut i, mut last) = (0, *last_ts);
        w.write_event_run::<{ encode::EVENT_PREFIX }, 3>(|| {
            let record = records.get(i)?;
            let ts = match line.ns(record.ticks) {
                Some(ts) => ts,
                None => {
                    line = ticks.linear(record.ticks);
                    ticks.ns(record.ticks)
                }
            };
            let delta = fast_window_delta(ts, last, next_snapshot)?;
            let word = record.word.addr();
            let ty = (word & 3) as u8;
            let prefix = if ty == TYPE_SLICE_END {
                if (word >> 2) as u32 != session {
                    return None;
                }
                SLICE_END_WORDS
            } else if ty == 0 {
                // A lock record: `replay`'s.
                return None;
            } else {
                // SAFETY: as in `replay`: a begin's or an instant's word is a
                // `&'static Callsite` with the event type in its low bits.
                let cs: &'static Callsite = unsafe { &*record.word.map_addr(|a| a & !3).cast() };
                let e = seen
                    .get(cs.id() as usize)
                    .filter(|e| e.generation == generation)?;
                prefix_words(e.template.event_prefix())
            };
            last = ts;
            i += 1;
            Some((prefix, delta))
        });
        *last_ts = last;
        i
    }

    /// Encodes one queued event (the state pinned to its epoch: [`drain_queue`]) through the
    /// fast path if it can take it, else as the event's slow path would have written it at that
    /// time.
    ///
    /// [`drain_queue`]: Self::drain_queue
    fn replay(&mut self, record: Record) {
        let ts = self.ticks.ns(record.ticks);
        let ty = (record.word.addr() & 3) as u8;
        if ty == 0 {
            // A whole lock hold, or the end of one that waited (`ext.rs`).
            self.replay_lock(record.word.addr() as u64, record.ticks);
            return;
        }
        if ty == TYPE_SLICE_END {
            let session = (record.word.addr() >> 2) as u32;
            if !self.slice_end_fast(session, ts) {
                self.slice_end_slower(session, ts);
            }
            return;
        }
        // SAFETY: a begin's or an instant's word is a `&'static Callsite` (aligned to 8, so its
        // low bits are free) with the event type in those bits (`named_event`).
        let cs: &'static Callsite = unsafe { &*record.word.map_addr(|a| a & !3).cast() };
        let id = cs.id();
        if !self.named_event_fast(id, ts) {
            self.named_event_slow(cs, Enabled { id }, ty, ts);
        }
    }

    /// The fast path of [`named_event`]: the callsite's template at `ts` straight into the
    /// chunk, if the state and the writer allow it (false: nothing written).
    #[inline(always)]
    fn named_event_fast(&mut self, id: u64, ts: u64) -> bool {
        let Some(delta) = self.fast_delta(ts) else {
            return false;
        };
        // Field by field: the template is read in place while the writer is borrowed. The
        // clock is updated before the write, so `ts` need not be kept across it.
        let generation = self.generation;
        if let (Some(e), Some(w)) = (self.seen.get(id as usize), self.writer.as_mut()) {
            let last_ts = &mut self.last_ts;
            if e.generation == generation
                && w.try_write_event(e.template.event_prefix(), delta, || *last_ts = ts)
            {
                return true;
            }
        }
        false
    }

    #[cold]
    #[inline(never)]
    fn named_event_slow(&mut self, cs: &'static Callsite, en: Enabled, ty: u8, ts: u64) {
        if let Some(t) = self.template(en.id).copied() {
            if self.write_template_slow(&t, ts) {
                return;
            }
        }
        self.event(ts, cs, en, ty, None, None, |_| {});
    }

    /// When only the writer's fast path was unavailable (a chunk to switch, a flush to make,
    /// not enough room) and the state is fine, writes the template's packet through the
    /// writer's general path: the same bytes, one unnested packet (so it never leaves a size
    /// field to patch in a chunk it continues from). False when the state needs the general
    /// path (`sync`).
    fn write_template_slow(&mut self, template: &Template, ts: u64) -> bool {
        if !self.in_window(ts) {
            return false;
        }
        let delta = ts - self.last_ts;
        let Some(w) = self.writer.as_mut().filter(|w| w.is_synced()) else {
            return false;
        };
        w.write_small_packet(&template.with_timestamp(delta));
        self.last_ts = ts;
        true
    }

    /// The fast path of [`slice_end`] (false: nothing written).
    #[inline(always)]
    fn slice_end_fast(&mut self, session: u32, ts: u64) -> bool {
        match self.fast_delta(ts) {
            Some(delta) => session_of(self.epoch) == session && self.try_write_slice_end(ts, delta),
            None => false,
        }
    }

    #[cold]
    #[inline(never)]
    fn slice_end_slower(&mut self, session: u32, ts: u64) {
        if session_of(self.epoch) == session && self.write_template_slow(&encode::SLICE_END, ts) {
            return;
        }
        self.slice_end_slow(session, ts, None);
    }

    /// A sample of a static counter, now.
    #[inline(always)]
    pub(crate) fn counter(&mut self, cs: &'static Callsite, en: Enabled, value: CounterSample) {
        let ts = self.clock.now();
        // The template already holds the track uuid: only the slow path computes it.
        if self.in_window(ts) {
            if let (Some(t), Some(w)) = (
                self.seen
                    .get(en.id as usize)
                    .filter(|e| e.generation == self.generation),
                self.writer.as_mut(),
            ) {
                if w.is_synced() {
                    // As `write_template_slow`: the block's bytes through the writer's general
                    // path if its fast path is not available.
                    let block = t.template.with_counter_value(value, ts - self.last_ts);
                    w.write_small_packet(&block);
                    self.last_ts = ts;
                    return;
                }
            }
        }
        self.counter_static_slow(cs, en, value, ts);
    }

    #[cold]
    #[inline(never)]
    fn counter_static_slow(
        &mut self,
        cs: &'static Callsite,
        en: Enabled,
        value: CounterSample,
        ts: u64,
    ) {
        let unit = match cs.kind {
            CallsiteKind::Counter(u) => u,
            CallsiteKind::Event => Unit::None,
        };
        let track = TrackRef {
            uuid: global::counter_track_uuid(cs.name_hash),
            name: cs.name,
            unit: Some(unit),
        };
        self.counter_slow(Some(en.id), track, value, ts);
    }

    // === The general (slow) path ===

    /// Makes the state current for the session and generation, opening the thread's writer
    /// and starting a generation when needed. False when there is nothing to write into.
    ///
    /// True also while the writer drops: the event is then written into its scratch chunk,
    /// where it is counted lost (as one packet, the event's own), and no generation starts
    /// until a packet can reach the buffer again (`restart`).
    #[cold]
    #[inline(never)]
    fn sync(&mut self, ts: u64) -> bool {
        let epoch = self.epoch_now();
        let session = session_of(epoch);
        if session != session_of(self.epoch) {
            // A new session (or none): the old writer flushes as it drops.
            self.release_writer();
            self.epoch = epoch;
            if session == 0 {
                return false;
            }
            let Some(handle) = global::current_session(session) else {
                return false;
            };
            self.incremental = handle.incremental_timestamps;
            // Failure (every writer id taken) leaves this thread silent for the session.
            self.writer = handle
                .arbiter
                .create_trace_writer(handle.target_buffer)
                .ok();
            if self.writer.is_none() {
                return false;
            }
            // The generation starts at the event's time (the oldest event of the queue being
            // replayed), so every event after it on the sequence is in order; but not before
            // the latest packet of the sequence's previous owner: a writer id released by an
            // exiting thread is handed out again and continues that thread's packet sequence,
            // and a clock snapshot older than the previous owner's is rejected by readers
            // (Perfetto: `invalid_clock_snapshots`). An event older than that floor (read
            // before the other thread's last packets) is stamped at it (`write_timed`).
            let floor = self
                .writer
                .as_ref()
                .map_or(0, |w| take_sequence_floor(w.arbiter().id(), w.writer_id()));
            self.last_ts = floor;
            return self.restart(epoch, ts.max(floor));
        }
        let Some(writer) = self.writer.as_mut() else {
            return false;
        };
        if writer.arbiter().is_closed() {
            self.release_writer();
            return false;
        }
        // A packet lost since the generation was set up (or no generation on this writer yet):
        // the reader no longer trusts the sequence's incremental state, and a new generation
        // must come first.
        if !writer.is_synced() {
            return self.restart(epoch, ts);
        }
        if epoch != self.epoch {
            // An incremental-state clear: nothing was lost, so the current generation is still
            // valid on the sequence and the new one may wait for a chunk with room for it
            // (events go on in the current one meanwhile).
            if !writer.try_make_room(self.generation_room) {
                return true;
            }
            self.epoch = epoch;
            return self.start_generation(ts) || self.restart(epoch, ts);
        }
        // Both timestamp modes write the periodic snapshots (they discipline the trace clock,
        // and incremental timestamps also restart from them).
        // A snapshot that does not fit waits for the next chunk, as above.
        if ts >= self.next_clock_snapshot && writer.try_make_room(SNAPSHOT_ROOM) {
            self.write_packet(|p| write_global_snapshot(p, &Snapshot::take()));
            self.next_clock_snapshot = ts.saturating_add(SNAPSHOT_PERIOD_NS);
            if self.incremental {
                self.next_snapshot = self.next_clock_snapshot;
            }
        }
        true
    }

    /// Starts a generation after a loss (or on a new writer), with the first packet that
    /// reaches the buffer: the reader drops the sequence's interned data and incremental clock
    /// at the packet marked `previous_packet_dropped`, so that packet must be the generation's
    /// first, and every later one must follow a complete generation start.
    ///
    /// While the writer drops (the shared memory buffer is full) the generation does not start:
    /// its packets would be lost too, each event of the episode would set it up again for
    /// nothing and count five packets lost instead of one. `TraceWriter::make_room` tells
    /// whether the next packet will reach the buffer, and makes the writer's retry of the
    /// buffer happen before the generation is written rather than in the middle of it.
    ///
    /// Returns whether the event goes on: true when the generation started, and when the event
    /// is going to be dropped anyway (the writer counts it).
    #[cold]
    #[inline(never)]
    fn restart(&mut self, epoch: u64, ts: u64) -> bool {
        // A generation start fails only when it does not fit in a fresh chunk and no next chunk
        // is free: after a failure the writer drops, and tries again only when its scratch
        // chunk is full. Bounded all the same.
        for _ in 0..3 {
            let room = self.generation_room;
            let Some(writer) = self.writer.as_mut() else {
                return false;
            };
            if !writer.make_room(room) {
                // The event's packet will be lost, and counted: write it (into the scratch chunk)
                // so the writer's retries keep their pace.
                return true;
            }
            self.epoch = epoch;
            if self.start_generation(ts) {
                return true;
            }
        }
        // The event must not reach the buffer before a generation start: count it lost.
        if let Some(writer) = self.writer.as_mut() {
            writer.skip_packet();
        }
        false
    }

    /// Writes a generation start at `ts` (see the module docs); false if one of its packets
    /// was lost (the writer is dropping then, and the rest is not written).
    #[cold]
    fn start_generation(&mut self, ts: u64) -> bool {
        // In order with what the sequence holds already.
        let ts = ts.max(self.last_ts);
        let Some(writer) = self.writer.as_ref() else {
            return false;
        };
        let dropped_before = writer.packets_dropped();
        let lost = |s: &Self| {
            s.writer
                .as_ref()
                .is_none_or(|w| w.packets_dropped() != dropped_before)
        };
        self.generation = self.generation.wrapping_add(1).max(1);
        self.dyn_names.clear();
        self.next_dyn_iid = DYN_IID_BASE;
        self.tracks_seen.clear();
        let snapshot = Snapshot::take();
        let incremental = self.incremental;
        let track_uuid = self.track_uuid;
        self.write_packet(|p| write_global_snapshot(p, &snapshot));
        self.write_packet(|p| {
            p.set_timestamp(ts);
            p.set_timestamp_clock_id(TRACE_CLOCK_ID);
            p.set_sequence_flags(SEQ_INCREMENTAL_STATE_CLEARED | SEQ_NEEDS_INCREMENTAL_STATE);
            {
                let mut d = p.set_trace_packet_defaults();
                d.set_timestamp_clock_id(if incremental {
                    INCREMENTAL_CLOCK_ID
                } else {
                    TRACE_CLOCK_ID
                });
                d.set_track_event_defaults().set_track_uuid(track_uuid);
            }
            if incremental {
                let mut s = p.set_clock_snapshot();
                {
                    let mut c = s.add_clocks();
                    c.set_clock_id(TRACE_CLOCK_ID);
                    c.set_timestamp(ts);
                }
                let mut c = s.add_clocks();
                c.set_clock_id(INCREMENTAL_CLOCK_ID);
                c.set_timestamp(ts);
                c.set_is_incremental(true);
            }
        });
        self.last_ts = ts;
        self.next_clock_snapshot = ts.saturating_add(SNAPSHOT_PERIOD_NS);
        self.next_snapshot = if incremental {
            self.next_clock_snapshot
        } else {
            0
        };
        if lost(self) {
            return false;
        }
        let process = global::process();
        let process_name = global::process_name();
        self.write_descriptor(ts, |d| {
            d.set_uuid(process.uuid);
            let mut pd = d.set_process();
            pd.set_pid(process.pid);
            pd.set_process_name(&process_name);
            for arg in &process.cmdline {
                pd.add_cmdline(arg);
            }
        });
        if lost(self) {
            return false;
        }
        self.write_thread_descriptor(ts);
        if lost(self) {
            return false;
        }
        if let Some(w) = self.writer.as_mut() {
            w.mark_synced();
        }
        self.generation_room = GENERATION_ROOM_BASE
            + STRING_ROOM
            + process_name.len()
            + process
                .cmdline
                .iter()
                .map(|a| STRING_ROOM + a.len())
                .sum::<usize>()
            + self
                .thread_name
                .as_ref()
                .map_or(0, |n| STRING_ROOM + n.len());
        true
    }

    fn write_thread_descriptor(&mut self, ts: u64) {
        let (uuid, pid, tid) = (self.track_uuid, global::process().pid, self.tid);
        let name = self.thread_name.take();
        let rank = self.group_rank;
        if rank.is_some() {
            // Perfetto orders threads by their tracks' `sibling_order_rank` only when the root
            // track (uuid 0) asks for it; threads without a hint rank 0.
            self.write_descriptor(ts, |d| {
                d.set_uuid(0);
                d.set_thread_ordering(track_descriptor::ThreadOrdering::Explicit);
            });
        }
        self.write_descriptor(ts, |d| {
            d.set_uuid(uuid);
            if let Some(r) = rank {
                d.set_sibling_order_rank(r);
            }
            let mut t = d.set_thread();
            t.set_pid(pid);
            t.set_tid(tid);
            if let Some(n) = &name {
                t.set_thread_name(n);
            }
        });
        self.thread_name = name;
    }

    /// Sets the thread's name on the trace (re-emits its descriptor if tracing; a generation
    /// start after a loss writes it anyway).
    pub(crate) fn set_thread_name(&mut self, name: &str) {
        self.thread_name = Some(name.to_owned());
        // Lock holds are named after the thread: their pre-encoded packets are stale now.
        self.ext_templates.clear();
        if self.writer.is_some() && self.epoch == EPOCH.load(Ordering::Relaxed) {
            let ts = clock::now();
            // Not while dropping: the generation start that ends the episode writes the name.
            if self.sync(ts) && self.writer.as_ref().is_some_and(|w| !w.is_dropping()) {
                self.write_thread_descriptor(ts);
            }
        }
    }

    /// [`TraceWriter::make_room`] for a descriptor the event about to be written needs: false
    /// when the descriptor would be lost, so it is not written (it would count as a lost packet,
    /// and the next generation start re-emits what is needed). The event follows either way,
    /// and is the packet that is lost then (counted; a drop marker the writer may have left in
    /// its last chunk stands for it). Never a retry of the buffer while dropping: that belongs
    /// to `restart`, before a generation start.
    fn room_for_descriptor(&mut self, len: usize) -> bool {
        self.writer
            .as_mut()
            .is_some_and(|w| !w.is_dropping() && w.make_room(len))
    }

    /// A packet through the generated writers.
    fn write_packet(&mut self, f: impl FnOnce(&mut TracePacket<'_>)) {
        if let Some(w) = self.writer.as_mut() {
            w.write_packet(f);
        }
    }

    /// A packet through the generated writers at `ts`: the timestamp as a delta on the
    /// incremental clock, or absolute on the trace clock without incremental timestamps, and
    /// `SEQ_NEEDS_INCREMENTAL_STATE`; `f` writes the rest.
    ///
    /// Never before the sequence's latest packet: a sequence's timestamps only move forward.
    /// An event older than that (read before its generation started, which happens only when
    /// the sequence's previous owner wrote later packets: see `sync`) is stamped at it.
    fn write_timed(&mut self, ts: u64, f: impl FnOnce(&mut TracePacket<'_>)) {
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        let (last, incremental) = (self.last_ts, self.incremental);
        let ts = ts.max(last);
        w.write_packet(|p| {
            if incremental {
                p.set_timestamp(ts - last);
            } else {
                p.set_timestamp(ts);
                p.set_timestamp_clock_id(TRACE_CLOCK_ID);
            }
            p.set_sequence_flags(SEQ_NEEDS_INCREMENTAL_STATE);
            f(p);
        });
        self.last_ts = ts;
    }

    /// Drops the writer (it flushes), leaving the latest timestamp of its sequence for the
    /// next owner of its id (`sync`).
    fn release_writer(&mut self) {
        if let Some(w) = self.writer.take() {
            record_sequence_floor(w.arbiter().id(), w.writer_id(), self.last_ts);
        }
    }

    /// A track descriptor packet at `ts`.
    fn write_descriptor(&mut self, ts: u64, f: impl FnOnce(&mut TrackDescriptor<'_>)) {
        self.write_timed(ts, |p| f(&mut p.set_track_descriptor()));
    }

    /// Emits the descriptor of `track` once per generation.
    fn ensure_track(&mut self, track: TrackRef<'_>, static_id: Option<u64>, ts: u64) {
        let done = match static_id {
            Some(id) => self.seen(id),
            None => self.tracks_seen.get(&track.uuid) == Some(&self.generation),
        };
        let unit_name = match track.unit {
            Some(Unit::Named(n)) => STRING_ROOM + n.len(),
            _ => 0,
        };
        if done
            || !self.room_for_descriptor(
                DESCRIPTOR_ROOM_BASE + STRING_ROOM + track.name.len() + unit_name,
            )
        {
            return;
        }
        let parent = global::process().uuid;
        self.write_descriptor(ts, |d| {
            d.set_uuid(track.uuid);
            d.set_name(track.name);
            d.set_parent_uuid(parent);
            if let Some(unit) = track.unit {
                let mut c = d.set_counter();
                match unit {
                    Unit::None => {}
                    Unit::Count => c.set_unit(counter_descriptor::Unit::Count),
                    Unit::Bytes => c.set_unit(counter_descriptor::Unit::SizeBytes),
                    Unit::TimeNs => c.set_unit(counter_descriptor::Unit::TimeNs),
                    Unit::Named(n) => c.set_unit_name(n),
                }
            }
        });
        match static_id {
            Some(id) => self.mark_seen(id, Template::counter(track.uuid)),
            None => {
                self.tracks_seen.insert(track.uuid, self.generation);
            }
        }
    }

    /// Any event: interning, timestamp, track, name, and what `fill` adds (arguments, flows).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn event(
        &mut self,
        ts: u64,
        cs: &'static Callsite,
        en: Enabled,
        ty: u8,
        track: Option<TrackRef<'_>>,
        dyn_name: Option<&str>,
        fill: impl FnOnce(&mut EventContext<'_, '_>),
    ) {
        if !self.sync(ts) {
            return;
        }
        if let Some(t) = track {
            self.ensure_track(t, None, ts);
        }
        let intern_callsite = !self.seen(en.id);
        let (dyn_iid, intern_dyn) = match dyn_name {
            Some(name) => match self.dyn_names.get(name) {
                Some(&iid) => (Some(iid), false),
                None => {
                    let iid = self.next_dyn_iid;
                    self.next_dyn_iid += 1;
                    self.dyn_names.insert(name.into(), iid);
                    (Some(iid), true)
                }
            },
            None => (None, false),
        };
        self.write_timed(ts, |p| {
            if intern_callsite || intern_dyn {
                let mut i = p.set_interned_data();
                if intern_callsite {
                    if !cs.name.is_empty() {
                        let mut n = i.add_event_names();
                        n.set_iid(en.id);
                        n.set_name(cs.name);
                    }
                    if let Some(cat) = cs.category {
                        let mut c = i.add_event_categories();
                        c.set_iid(en.id);
                        c.set_name(cat);
                    }
                    {
                        let mut l = i.add_source_locations();
                        l.set_iid(en.id);
                        l.set_file_name(cs.file);
                        l.set_function_name(cs.module_path);
                        l.set_line_number(cs.line);
                    }
                    for (k, arg) in cs.arg_names.iter().enumerate() {
                        let mut a = i.add_debug_annotation_names();
                        a.set_iid(en.id + 1 + k as u64);
                        a.set_name(arg);
                    }
                }
                if let (true, Some(iid), Some(name)) = (intern_dyn, dyn_iid, dyn_name) {
                    let mut n = i.add_event_names();
                    n.set_iid(iid);
                    n.set_name(name);
                }
            }
            let mut e = p.set_track_event();
            if cs.category.is_some() {
                e.add_category_iids(en.id);
            }
            e.set_type_raw(ty as i32);
            if ty != encode::TYPE_SLICE_END {
                e.set_name_iid(dyn_iid.unwrap_or(en.id));
                e.set_source_location_iid(en.id);
            }
            if let Some(t) = track {
                e.set_track_uuid(t.uuid);
            }
            let mut cx = EventContext {
                event: &mut e,
                arg_base: en.id + 1,
                next_arg: 0,
                arg_count: cs.arg_names.len() as u64,
            };
            fill(&mut cx);
        });
        if intern_callsite {
            let template = Template::named_event(ty, en.id, cs.category.is_some());
            self.mark_seen(en.id, template);
        }
    }

    /// A slice end, through the generated writers, on `track` (`None`: this thread's).
    #[cold]
    #[inline(never)]
    pub(crate) fn slice_end_slow(&mut self, session: u32, ts: u64, track: Option<TrackRef<'_>>) {
        if !self.sync(ts) || session_of(self.epoch) != session {
            return;
        }
        if let Some(t) = track {
            self.ensure_track(t, None, ts);
        }
        self.write_timed(ts, |p| {
            let mut e = p.set_track_event();
            e.set_type(track_event::Type::SliceEnd);
            if let Some(t) = track {
                e.set_track_uuid(t.uuid);
            }
        });
    }

    /// A counter sample through the generated writers (descriptor first if needed); `static_id`
    /// is the id of a `counter!` callsite, whose template this interns.
    #[cold]
    #[inline(never)]
    pub(crate) fn counter_slow(
        &mut self,
        static_id: Option<u64>,
        track: TrackRef<'_>,
        value: CounterSample,
        ts: u64,
    ) {
        if !self.sync(ts) {
            return;
        }
        self.ensure_track(track, static_id, ts);
        self.write_timed(ts, |p| {
            let mut e = p.set_track_event();
            e.set_type(track_event::Type::Counter);
            e.set_track_uuid(track.uuid);
            match value {
                CounterSample::Int(v) => e.set_counter_value(v),
                CounterSample::Double(v) => e.set_double_counter_value(v),
            }
        });
    }

    /// The session this state writes into (0: none).
    #[inline(always)]
    pub(crate) fn session(&self) -> u32 {
        session_of(self.epoch)
    }

    /// Interns the stack `pcs` (innermost first) on this sequence and returns its callstack
    /// iid; what the sequence has not seen in this generation (mappings, frames, the stack) is
    /// written first, in a packet of its own at `ts`. 0 when nothing was written (no session,
    /// or the packet was lost: the next event starts a new generation then).
    pub(crate) fn intern_callstack(&mut self, ts: u64, pcs: &[u64]) -> u64 {
        if pcs.is_empty() || !self.sync(ts) {
            return 0;
        }
        if self.callstacks_generation != self.generation {
            self.callstacks.clear();
            self.callstacks_generation = self.generation;
        }
        let iid = self.callstacks.intern(pcs);
        if self.callstacks.has_pending() {
            let dropped = self.writer.as_ref().map(TraceWriter::packets_dropped);
            let mut table = std::mem::take(&mut self.callstacks);
            self.write_timed(ts, |p| table.write_pending(&mut p.set_interned_data()));
            self.callstacks = table;
            if self.writer.as_ref().map(TraceWriter::packets_dropped) != dropped {
                self.callstacks.clear();
                return 0;
            }
        }
        iid
    }

    /// A CPU sample (`PerfSample`) with its interned stack, at `boottime_ns` on
    /// `BUILTIN_CLOCK_BOOTTIME` (the perf clock the sampler asks the kernel for).
    pub(crate) fn perf_sample(&mut self, boottime_ns: u64, sample: &crate::sampling::Sample<'_>) {
        let ts = clock::now();
        let iid = self.intern_callstack(ts, sample.pcs);
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        w.write_packet(|p| {
            p.set_timestamp(boottime_ns);
            p.set_timestamp_clock_id(crate::sampling::BOOTTIME_CLOCK_ID);
            p.set_sequence_flags(SEQ_NEEDS_INCREMENTAL_STATE);
            let mut s = p.set_perf_sample();
            s.set_cpu(sample.cpu);
            s.set_pid(sample.pid);
            s.set_tid(sample.tid);
            s.set_cpu_mode_raw(sample.cpu_mode);
            s.set_timebase_count(sample.period);
            if iid != 0 {
                s.set_callstack_iid(iid);
            }
            if sample.lost != 0 {
                s.set_kernel_records_lost(sample.lost);
            }
        });
    }
}

/// What an event's macro adds to it: arguments (debug annotations with interned names) and
/// flows.
pub struct EventContext<'a, 'w> {
    event: &'a mut TrackEvent<'w>,
    arg_base: u64,
    next_arg: u64,
    arg_count: u64,
}

impl std::fmt::Debug for EventContext<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventContext")
            .field("next_arg", &self.next_arg)
            .finish_non_exhaustive()
    }
}

impl EventContext<'_, '_> {
    /// The next argument, in the order of the callsite's argument names.
    #[inline]
    pub fn arg<V: super::ArgValue + ?Sized>(&mut self, value: &V) {
        if self.next_arg < self.arg_count {
            let mut a = self.event.add_debug_annotations();
            a.set_name_iid(self.arg_base + self.next_arg);
            value.write_arg(&mut a);
        }
        self.next_arg += 1;
    }

    /// The argument at `index` in the callsite's argument names (for callers whose values come
    /// in any order or with gaps, such as `tracing`'s fields); an index past them is ignored.
    #[inline]
    pub fn arg_at<V: super::ArgValue + ?Sized>(&mut self, index: usize, value: &V) {
        if (index as u64) < self.arg_count {
            let mut a = self.event.add_debug_annotations();
            a.set_name_iid(self.arg_base + index as u64);
            value.write_arg(&mut a);
        }
    }

    /// Links this event to the flow (`flow_ids`): the flow's arrow runs through it.
    #[inline]
    pub fn flow(&mut self, flow: super::Flow) {
        self.event.add_flow_ids(flow.id());
    }

    /// Ends the flow at this event (`terminating_flow_ids`).
    #[inline]
    pub fn terminating_flow(&mut self, flow: super::Flow) {
        self.event.add_terminating_flow_ids(flow.id());
    }

    /// A `callstack` item: the stack was captured before the event began (see
    /// [`zone_begin_stack`](crate::__rt::zone_begin_stack)); nothing to add here.
    #[doc(hidden)]
    #[inline(always)]
    pub fn callstack(&mut self, _depth: usize) {}

    /// The event's call stack, interned on the sequence (`callstack_iid`; 0: none).
    #[inline]
    pub(crate) fn callstack_iid(&mut self, iid: u64) {
        if iid != 0 {
            self.event.set_callstack_iid(iid);
        }
    }
}

/// `ClockSnapshot` of the trace clock against the kernel's clocks, plus the trace clock's
/// reading once more as the sequence-scoped [`SNAPSHOT_SET_CLOCK_ID`].
///
/// Why the extra clock: readers (Perfetto's `ClockTracker`, `tachyon-processor`) group
/// snapshots by their set of clock ids and require every clock of a set to move forward in file
/// order, rejecting the snapshot otherwise (`invalid_clock_snapshots`; in Perfetto a trace clock
/// that goes back is also marked non-monotonic and can no longer be converted). Every sequence
/// writes these snapshots, and the service reads sequences out interleaved, not in time order:
/// with one shared set, the second thread of a trace routinely had its snapshot rejected. A
/// sequence-scoped id makes the set distinct per sequence (the reader qualifies 64–127 with the
/// sequence id), and one sequence's snapshots are in time order.
fn write_global_snapshot(p: &mut TracePacket<'_>, s: &Snapshot) {
    let mut cs = p.set_clock_snapshot();
    for (id, ts) in s.clocks() {
        let mut c = cs.add_clocks();
        c.set_clock_id(id);
        c.set_timestamp(ts);
    }
    let mut c = cs.add_clocks();
    c.set_clock_id(SNAPSHOT_SET_CLOCK_ID);
    c.set_timestamp(s.trace_ns);
}

#[cfg(target_os = "linux")]
fn current_tid() -> i64 {
    extern "C" {
        fn gettid() -> i32;
    }
    // SAFETY: gettid has no preconditions and cannot fail (glibc ≥ 2.30, musl ≥ 1.2.2).
    unsafe { gettid() as i64 }
}

#[cfg(not(target_os = "linux"))]
fn current_tid() -> i64 {
    use std::sync::atomic::AtomicI64;
    static NEXT: AtomicI64 = AtomicI64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod drain_pace_tests {
    use super::*;

    /// Empty passes double the nap up to the longest; any events bring it back to the
    /// shortest, a busy pass to none.
    #[test]
    fn the_nap_grows_only_while_every_queue_is_empty() {
        let mut nap = DRAIN_NAP;
        let mut naps = Vec::new();
        for _ in 0..6 {
            nap = drain_nap(0, nap, true).expect("an empty pass naps");
            naps.push(nap.as_micros());
        }
        assert_eq!(naps, [200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(drain_nap(1, DRAIN_NAP_LONG, true), Some(DRAIN_NAP));
        assert_eq!(
            drain_nap(DRAIN_FLOOD - 1, DRAIN_NAP_LONG, true),
            Some(DRAIN_NAP)
        );
        assert_eq!(
            drain_nap(DRAIN_FLOOD, DRAIN_NAP, true),
            Some(DRAIN_NAP_FLOOD)
        );
        assert_eq!(
            drain_nap(DRAIN_BUSY - 1, DRAIN_NAP_LONG, true),
            Some(DRAIN_NAP_FLOOD)
        );
        assert_eq!(drain_nap(DRAIN_BUSY, DRAIN_NAP_LONG, true), None);
        // One CPU: no flood nap, and round at once only after a quarter of the queue.
        assert_eq!(drain_nap(0, DRAIN_NAP, false), Some(2 * DRAIN_NAP));
        assert_eq!(drain_nap(DRAIN_BUSY, DRAIN_NAP, false), Some(DRAIN_NAP));
        assert_eq!(
            drain_nap(DRAIN_BUSY_ONE_CPU - 1, DRAIN_NAP, false),
            Some(DRAIN_NAP)
        );
        assert_eq!(drain_nap(DRAIN_BUSY_ONE_CPU, DRAIN_NAP, false), None);
    }

    /// `run_as_batch` changes the calling thread's policy only: a thread that asks runs as a
    /// batch thread, the thread that spawned it keeps its own.
    #[test]
    #[cfg(target_os = "linux")]
    #[cfg_attr(miri, ignore = "sched_setscheduler and /proc are not modelled")]
    fn batch_policy_is_per_thread() {
        /// `stat`'s `policy` field (the 41st) of the calling thread.
        fn policy() -> String {
            let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .unwrap()
                .1
                .split_whitespace()
                .collect();
            fields[38].to_owned()
        }
        let before = policy();
        let child = std::thread::spawn(|| (run_as_batch(), policy()))
            .join()
            .unwrap();
        assert_eq!(child, (true, libc::SCHED_BATCH.to_string()));
        assert_eq!(
            policy(),
            before,
            "the spawning thread's policy is unchanged"
        );
    }
}

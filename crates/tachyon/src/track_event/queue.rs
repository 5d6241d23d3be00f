//! A thread's event queue: the hot path's half of the SDK, as in Tracy's client. The thread
//! stores a 16-byte record (what happened, the raw counter reading) and moves on; whoever holds
//! the slot's lock encodes the records into Perfetto packets later, in order, with the
//! thread's state: the thread itself on its next slow path or when the queue is full, the
//! drainer thread while tracing, or a flush or stop.
//!
//! A [`Slot`] holds the state (behind a spin lock taken with one compare-and-swap) and a
//! single-producer single-consumer ring of records:
//!
//! - The producer is the owning thread, with no lock: [`Slot::try_push_with`] writes the record in
//!   the ring, then publishes its position with a release store (a plain store on x86-64).
//! - The consumer is whoever holds the lock ([`Guard::drain_runs`]): it reads the records up to
//!   the published position (acquire) and hands the space back with a release store, which the
//!   producer loads only when its cached bound runs out.
//!
//! This module is the only one that touches the ring's memory and the state's cell.

use std::cell::Cell;
use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One event: what it is (a pointer to its callsite with the event type in the low bits, or a
/// plain number; see `state.rs`), and the counter's raw reading.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(16))]
pub(crate) struct Record {
    pub(crate) word: *const u8,
    pub(crate) ticks: u64,
}

/// Records per thread (256 KiB, allocated with the thread's state on its first event): a burst
/// this long never waits for encoding.
pub(crate) const CAPACITY: usize = 16384;

const _: () = assert!(CAPACITY.is_power_of_two());

/// The producer looks at its queue's fill level every this many records, on its cold path (its
/// bound on `pos` is never further ahead): an eighth of the queue.
pub(crate) const WAKE_STEP: usize = CAPACITY / 8;
/// At a look, a queue holding this many records or more wakes the drainer if it is in a long
/// nap ([`wake_drainer`]): a burst after a quiet spell gets the drainer while seven eighths of
/// the queue are still free, instead of filling it and being encoded by its own thread.
pub(crate) const WAKE_FILL: usize = CAPACITY / 8;

/// A consumer hands the ring's space back every this many records (and at the end of its
/// drain), not only once it has encoded everything it found: a producer whose queue filled
/// while the drainer works through it (the drainer wakes to find up to the whole queue, and
/// encodes an event in about 10 ns on the other core) gets room again within about 10 µs,
/// instead of waiting for the whole drain, its own thread stopped meanwhile (see
/// [`Slot::refresh`]).
pub(crate) const RELEASE_STEP: usize = CAPACITY / 16;

/// The drainer thread, once started: what [`wake_drainer`] unparks.
pub(crate) static DRAINER: std::sync::OnceLock<std::thread::Thread> = std::sync::OnceLock::new();

/// Set by the drainer while it takes a long nap (its queues were empty): only then does a
/// filling queue wake it. A busy drainer's short naps end by its own timer: a wake-up sent from
/// a busy traced thread tends to queue the drainer behind that thread on its core, where it
/// waits while the queue fills, so a wake from the hot side is kept for the start of a burst.
pub(crate) static DRAINER_NAPS_LONG: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Ends the drainer's long nap, if it takes one: a `futex` wake. No lock and no allocation:
/// safe in a signal handler that traces.
#[cold]
#[inline(never)]
fn wake_drainer() {
    if DRAINER_NAPS_LONG.swap(false, Ordering::Relaxed) {
        if let Some(t) = DRAINER.get() {
            t.unpark();
        }
    }
}

/// Four of the ring's cells: a cache line.
#[repr(C, align(64))]
struct Line([UnsafeCell<Record>; RECORDS_PER_LINE]);

const RECORDS_PER_LINE: usize = 4;
const LINES: usize = CAPACITY / RECORDS_PER_LINE;
const _: () = assert!(
    std::mem::size_of::<Record>() == 16,
    "four records make a line"
);
const _: () =
    assert!(std::mem::size_of::<Line>() == RECORDS_PER_LINE * std::mem::size_of::<Record>());
const _: () = assert!(CAPACITY % RECORDS_PER_LINE == 0);

/// A value alone on its cache line: the producer's and the consumer's positions do not share
/// one, so publishing a record does not steal the line the consumer reads from.
#[repr(align(64))]
struct Padded<T>(T);

/// The owning thread's side of the ring; only that thread reads or writes it.
#[repr(C)]
pub(crate) struct Producer {
    /// Records written so far (wrapping: the ring index is `pos % CAPACITY`).
    pos: usize,
    /// The ring's first cell: the producer's own copy of the slot's pointer, so that a push
    /// reads nothing from a line another thread writes.
    cells: *const UnsafeCell<Record>,
    /// `pos` may grow up to this: the consumer's position, as last read, plus the capacity,
    /// or [`WAKE_STEP`] past where the producer last looked, whichever comes first (see
    /// [`Slot::refresh`]).
    limit: usize,
    /// What `state.rs` keeps beside the ring for its hot path (the epoch the queue is open
    /// for, the session, the clock).
    pub(crate) hot: Hot,
}

/// The hot path's own fields, set by the owner under the lock (see `state.rs`).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct Hot {
    /// The `EPOCH` value records are accepted for; 0: none (the thread has no writer, or
    /// its state has not caught up with the session).
    pub(crate) epoch: u64,
    /// The session of `epoch` (what a zone's begin returns).
    pub(crate) session: u32,
    /// The clock's source and scale, copied: the hot path reads the counter with it.
    pub(crate) clock: crate::clock::Clock,
}

/// Who holds a slot's lock. A drainer waits for another drainer (which runs no user code and
/// finishes soon) but never for the owner: the owner may be evaluating an event's arguments,
/// which can block on anything, and while it holds the lock its queue is empty anyway (it
/// drained it on taking the lock, and pushes nothing until it lets go).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Holder {
    Owner = 1,
    Drainer = 2,
}

const FREE: u8 = 0;

/// A thread's state and its queue; shared (in an `Arc`) between the thread and the drainers.
///
/// Laid out by line: what the consumer writes (`head`), what the producer publishes
/// (`tail`), the producer's own fields, then the lock and the state, which the consumer writes
/// as it encodes. Of the slot, a push reads and writes only the producer's line, `tail`'s and
/// the ring's cells, so an encoding drainer never takes a line the push needs: a producer
/// field on a line the drainer writes (the lock's, or the state's) would have to come back
/// from the other core at the next push.
#[repr(C)]
pub(crate) struct Slot<S> {
    /// Records consumed.
    head: Padded<AtomicUsize>,
    /// Records published.
    tail: Padded<AtomicUsize>,
    producer: Padded<UnsafeCell<Producer>>,
    /// The ring's [`LINES`] lines (owned: allocated as a boxed slice in [`new`](Self::new),
    /// freed in `drop`), so that it starts on a line and a run of records that ends on a line's
    /// end ends that line (see [`give_lines_up`]). Reached as cells through
    /// [`cells`](Self::cells); the producer writes through its own copy of this pointer,
    /// [`Producer::cells`]. A raw pointer, not a `Box`: moving a `Box` (into the slot, the slot
    /// into its `Arc`) would assert it is the only pointer to the ring, and the producer's copy
    /// must stay valid.
    ring: std::ptr::NonNull<Line>,
    /// [`FREE`] or the [`Holder`].
    lock: AtomicU8,
    state: UnsafeCell<S>,
}

// SAFETY: `state` is only reached through a `Guard`, which exists only while `lock` is held by
// its creator (an acquire compare-and-swap from false; released with a release store on drop),
// so one thread at a time has it, and `S: Send` lets it be that thread. `producer` is only
// reached by the owning thread (`producer`'s contract). The ring's cells are written by the
// producer only at positions in `tail..head + CAPACITY` and read by the consumer only at
// positions in `head..tail`, disjoint; `tail`'s release store and acquire load order each
// record's writes before its reads, and `head`'s order each read before the cell's reuse.
// `ring` and `Producer::cells` point into the ring, which the slot owns and which lives as long
// as it does; they are only dereferenced under the rules above.
unsafe impl<S: Send> Sync for Slot<S> {}
// SAFETY: as above; nothing in the slot is tied to the thread that created it.
unsafe impl<S: Send> Send for Slot<S> {}

impl<S> Slot<S> {
    pub(crate) fn new(state: S, hot: Hot) -> Slot<S> {
        let empty = || {
            UnsafeCell::new(Record {
                word: std::ptr::null(),
                ticks: 0,
            })
        };
        let ring: Box<[Line]> = (0..LINES)
            .map(|_| Line(std::array::from_fn(|_| empty())))
            .collect();
        // Freed in `drop`, from this pointer and `LINES`.
        let ring = std::ptr::NonNull::from(Box::leak(ring)).cast::<Line>();
        Slot {
            head: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(0)),
            producer: Padded(UnsafeCell::new(Producer {
                pos: 0,
                cells: ring.as_ptr().cast_const().cast(),
                limit: WAKE_STEP,
                hot,
            })),
            ring,
            lock: AtomicU8::new(FREE),
            state: UnsafeCell::new(state),
        }
    }

    /// The ring's `CAPACITY` cells, in order.
    fn cells(&self) -> &[UnsafeCell<Record>] {
        // SAFETY: `ring` points at `LINES` initialised lines the slot owns until it drops,
        // each `RECORDS_PER_LINE` cells laid out in a row with no padding (`repr(C)`, its size
        // asserted above), in a slice of lines with no gap between them: one array of
        // `CAPACITY` cells, borrowed for as long as the slot is.
        unsafe { std::slice::from_raw_parts(self.ring.as_ptr().cast_const().cast(), CAPACITY) }
    }

    /// The producer's side.
    ///
    /// # Safety
    ///
    /// Only the slot's owning thread calls this, and never while an earlier result is alive:
    /// the result is the only reference to the producer.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn producer(&self) -> &mut Producer {
        // SAFETY: the caller's contract: one thread, one reference at a time.
        unsafe { &mut *self.producer.0.get() }
    }

    /// Appends a record (its word made from the counter's reading now: an event may carry a
    /// duration up to now) if the queue is open for `epoch` (the current `EPOCH`) and has
    /// room: the queue's session. Otherwise, or when `word` returns `None`, writes nothing.
    ///
    /// # Safety
    ///
    /// As [`producer`](Self::producer): only the owning thread, with no producer reference
    /// alive.
    #[inline(always)]
    pub(crate) unsafe fn try_push_with(
        &self,
        epoch: u64,
        word: impl FnOnce(u64) -> Option<*const u8>,
    ) -> Option<u32> {
        // SAFETY: the caller's contract.
        unsafe { self.try_push_at(epoch, None, word) }
    }

    /// As [`try_push_with`](Self::try_push_with), stamped with `ticks` when given (a reading
    /// of the same clock this thread took earlier, with nothing pushed since: the queue's
    /// readings stay in order), else with the counter's reading now.
    ///
    /// # Safety
    ///
    /// As [`producer`](Self::producer).
    #[inline(always)]
    pub(crate) unsafe fn try_push_at(
        &self,
        epoch: u64,
        ticks: Option<u64>,
        word: impl FnOnce(u64) -> Option<*const u8>,
    ) -> Option<u32> {
        // SAFETY: the caller's contract.
        let p = unsafe { self.producer() };
        if p.hot.epoch != epoch || (p.pos == p.limit && !self.refresh(p)) {
            return None;
        }
        let ts = match ticks {
            Some(ts) => ts,
            None => match p.hot.clock.counter_ticks() {
                Some(ts) => ts,
                None => ticks_out_of_line(&p.hot.clock),
            },
        };
        let word = word(ts)?;
        let pos = p.pos;
        // SAFETY: `cells` points at the first of the ring's `CAPACITY` cells, which the slot
        // owns and frees only when it drops (see `Slot::ring`), and the index is masked below
        // `CAPACITY`.
        let cell = unsafe { &*p.cells.add(pos & (CAPACITY - 1)) };
        // SAFETY: `pos < limit <= head + CAPACITY`, and `pos >= tail` (the producer publishes
        // only what it wrote): the consumer reads no cell in `tail..head + CAPACITY` (see the
        // `Sync` impl), so this one is the producer's alone until `tail` passes it.
        unsafe { cell.get().write(Record { word, ticks: ts }) };
        // From the local: the record's stores might alias `p.pos` for all the compiler knows,
        // and reading it back would cost a load.
        let pos = pos.wrapping_add(1);
        p.pos = pos;
        self.tail.0.store(pos, Ordering::Release);
        Some(p.hot.session)
    }

    /// Reads the consumer's position again: whether there is room now. Called every
    /// [`WAKE_STEP`] records and when the queue looks full; wakes the drainer from a long nap
    /// when the queue holds [`WAKE_FILL`] records or more. A full queue that a drainer is
    /// draining gets room every [`RELEASE_STEP`] records: the producer waits for that, as it
    /// would wait for the drainer's lock on its slow path, but resumes after one step instead
    /// of after the whole drain.
    #[cold]
    #[inline(never)]
    fn refresh(&self, p: &mut Producer) -> bool {
        let mut room = self.room(p);
        if room == 0 {
            room = self.wait_while_drained(p);
        }
        if CAPACITY - room >= WAKE_FILL && DRAINER_NAPS_LONG.load(Ordering::Relaxed) {
            wake_drainer();
        }
        p.limit = p.pos.wrapping_add(room.min(WAKE_STEP));
        room != 0
    }

    /// The ring's free cells, as the producer sees them now.
    #[inline(always)]
    fn room(&self, p: &Producer) -> usize {
        // `head <= pos <= head + CAPACITY`: the room is at most the capacity.
        self.head
            .0
            .load(Ordering::Acquire)
            .wrapping_add(CAPACITY)
            .wrapping_sub(p.pos)
    }

    /// The queue is full: while a drainer holds the lock, it is encoding these records and
    /// hands their cells back every [`RELEASE_STEP`]; waits for the first such step. The room
    /// then (0: no drainer held the lock, or it let go with nothing consumed; the caller's
    /// slow path takes over). Waits as [`Backoff`] does.
    #[cold]
    fn wait_while_drained(&self, p: &Producer) -> usize {
        let mut backoff = Backoff::new(256);
        loop {
            // Acquire: a drainer's last store of `head` comes before its unlock.
            if self.lock.load(Ordering::Acquire) != Holder::Drainer as u8 {
                return self.room(p);
            }
            let room = self.room(p);
            if room != 0 {
                return room;
            }
            backoff.wait();
        }
    }

    /// Records published and not consumed yet (a hint: the producer may be adding more).
    pub(crate) fn pending(&self) -> usize {
        self.tail
            .0
            .load(Ordering::Relaxed)
            .wrapping_sub(self.head.0.load(Ordering::Relaxed))
    }

    /// The lock for `by`, if no one holds it.
    #[inline]
    pub(crate) fn try_lock(&self, by: Holder) -> Option<Guard<'_, S>> {
        self.lock
            .compare_exchange(FREE, by as u8, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            // Lazily: a guard built and dropped on failure would unlock the holder's lock.
            .then(|| Guard {
                slot: self,
                _not_sync: PhantomData,
            })
    }

    /// The lock for the owner, waiting for a drainer that holds it (it drains at most
    /// [`CAPACITY`] records, or waits for a chunk no longer than the writer's policy allows).
    #[inline]
    pub(crate) fn lock(&self) -> Guard<'_, S> {
        if let Some(g) = self.try_lock(Holder::Owner) {
            return g;
        }
        self.lock_slow(Holder::Owner)
            .unwrap_or_else(|| unreachable!("only the owner takes the lock as the owner"))
    }

    /// The lock for a drainer, waiting for another drainer but not for the owner (see
    /// [`Holder`]): `None` when the owner holds it.
    pub(crate) fn lock_unless_owner(&self) -> Option<Guard<'_, S>> {
        self.try_lock(Holder::Drainer)
            .or_else(|| self.lock_slow(Holder::Drainer))
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(&self, by: Holder) -> Option<Guard<'_, S>> {
        let mut backoff = Backoff::new(64);
        loop {
            match self.lock.load(Ordering::Relaxed) {
                FREE => {
                    if let Some(g) = self.try_lock(by) {
                        return Some(g);
                    }
                }
                h if h == Holder::Owner as u8 && by == Holder::Drainer => return None,
                _ => {}
            }
            backoff.wait();
        }
    }
}

/// A drainer that takes longer than this to hand back a step of the ring (about 10 µs of
/// encoding while it runs) or to let go of the lock has lost its core: the waiting thread
/// sleeps in [`STALL_NAP`]s from then on instead of yielding.
const STALL: Duration = Duration::from_micros(50);
const STALL_NAP: Duration = Duration::from_micros(20);

/// How a thread waits for a drainer that holds what it needs (the ring's cells, the slot's
/// lock): a few spins, then yields, and once the wait passes [`STALL`], short sleeps. A
/// drainer that holds the lock while it waits for a core (the other core taken by another
/// process or by the service thread) would otherwise be waited for by a thread spinning at full
/// speed on the one core the drainer could run on (`sched_yield` only gives the core to a
/// thread already queued on it): the sleep leaves that core idle, and an idle core pulls a
/// waiting thread over from a busy one at once, so the drainer runs here meanwhile.
/// `clock_gettime`, `sched_yield` and `nanosleep` are async-signal-safe: a signal handler that
/// traces may wait here.
struct Backoff {
    spins: u32,
    spin_limit: u32,
    since: Option<Instant>,
}

impl Backoff {
    fn new(spin_limit: u32) -> Backoff {
        Backoff {
            spins: 0,
            spin_limit,
            since: None,
        }
    }

    fn wait(&mut self) {
        if self.spins < self.spin_limit {
            self.spins += 1;
            std::hint::spin_loop();
            return;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() < STALL {
            std::thread::yield_now();
        } else {
            std::thread::sleep(STALL_NAP);
        }
    }
}

/// A clock source other than the architecture's counter (a call to `clock_gettime`).
#[cold]
#[inline(never)]
fn ticks_out_of_line(clock: &crate::clock::Clock) -> u64 {
    clock.ticks()
}

/// The slot's lock, held: the state, and the consumer's side of the ring.
pub(crate) struct Guard<'a, S> {
    slot: &'a Slot<S>,
    /// Not `Sync`: the guard hands out `&S`, which only `S: Sync` may share between threads.
    _not_sync: PhantomData<Cell<()>>,
}

impl<S> Guard<'_, S> {
    /// Hands every published record, in order, with the state, to `f`; the number handed.
    /// The ring's space is given back to the producer at the end. (The drainer takes runs:
    /// [`drain_runs`](Self::drain_runs).)
    #[cfg(test)]
    pub(crate) fn drain(&mut self, mut f: impl FnMut(&mut S, Record)) -> usize {
        self.drain_runs(false, |state, run| run.iter().for_each(|r| f(state, *r)))
    }
}

impl<S> Guard<'_, S> {
    /// As [`drain`](Self::drain), a run at a time: hands `f` the records published when it
    /// starts as slices of the ring, in order, at most [`RELEASE_STEP`] long (a slice ends
    /// where the records wrap round the ring's end too), and gives each slice's cells back to
    /// the producer as soon as `f` is done with it; the number handed. For an encoder that
    /// checks once what a run of records has in common.
    ///
    /// With `give_up`, each slice's lines are flushed from every cache once `f` is done with
    /// it ([`give_lines_up`]): for a consumer on another thread than the producer's.
    pub(crate) fn drain_runs(
        &mut self,
        give_up: bool,
        mut f: impl FnMut(&mut S, &[Record]),
    ) -> usize {
        let slot = self.slot;
        let tail = slot.tail.0.load(Ordering::Acquire);
        let mut head = slot.head.0.load(Ordering::Relaxed);
        let n = tail.wrapping_sub(head);
        while head != tail {
            let at = head & (CAPACITY - 1);
            let len = tail.wrapping_sub(head).min(CAPACITY - at).min(RELEASE_STEP);
            let cells = &slot.cells()[at..at + len];
            // SAFETY: the cells are those of positions `head..head + len`, within
            // `head..tail`, which the producer wrote before its release store of `tail`
            // (loaded above with acquire) and writes again only after `head` passes them (the
            // store below, after `f` is done with the slice): nothing writes them while the
            // slice lives. `UnsafeCell<Record>` has the layout of `Record`. Only the lock
            // holder consumes, and this guard holds the lock.
            let records =
                unsafe { std::slice::from_raw_parts(cells.as_ptr().cast::<Record>(), len) };
            // SAFETY: the lock is held (see `deref_mut`).
            f(unsafe { &mut *slot.state.get() }, records);
            if give_up {
                give_lines_up(records);
            }
            head = head.wrapping_add(len);
            slot.head.0.store(head, Ordering::Release);
        }
        n
    }
}

/// Flushes from every cache (`clflushopt`, where the CPU has it) the ring's lines that end
/// within `records`, a run the consumer is done with ([`lines_done`]). The line the run ends in,
/// when it ends mid-line, may hold the next record the producer writes, and goes with the next
/// run; the line it starts in, when it starts mid-line, had its first cells handed back with
/// the run before, which the producer may be writing again if the queue was nearly full (the
/// flush then costs it a miss, never a value: a flush changes no memory).
///
/// Why: the producer writes each cell again one lap later. A line the consumer read stays
/// shared between the two cores' caches, and the producer's store to it then waits at the
/// head of its store buffer for the other core to drop its copy, which no prefetcher starts
/// early (the line is present, only not writable). On the project's VM a thread pushing a
/// record per counter read ran at 35 ns a record instead of 10 in some periods, whatever the
/// consumer's speed (docs/data-path.md). A flushed line is absent instead: the store misses,
/// and the hardware prefetcher fetches the lines of a sequential store stream ahead of it.
fn give_lines_up(records: &[Record]) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        if !has_clflushopt() {
            return;
        }
        let range = records.as_ptr_range();
        for line in lines_done(range.start as usize, range.end as usize) {
            // SAFETY: `clflushopt` writes a line back if it is dirty and drops it from the
            // caches: memory's contents stay as they are, so no reader or writer of these
            // cells sees a change. The line holds at least one of `records`' bytes, so it is
            // within the ring's allocation (which starts on a line), which is mapped.
            unsafe {
                std::arch::asm!("clflushopt [{}]", in(reg) line, options(nostack, preserves_flags));
            }
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = records;
}

/// The addresses of the lines that end within the bytes `start..end`: from the line `start` is
/// in to the last whole line before `end`, a line's size apart.
fn lines_done(start: usize, end: usize) -> std::iter::StepBy<std::ops::Range<usize>> {
    const LINE: usize = std::mem::size_of::<Line>();
    (start & !(LINE - 1)..end & !(LINE - 1)).step_by(LINE)
}

/// Whether the CPU has `clflushopt` (CPUID leaf 7, sub-leaf 0, EBX bit 23), asked once.
#[cfg(all(target_arch = "x86_64", not(miri)))]
fn has_clflushopt() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        use std::arch::x86_64::{__cpuid_count, __get_cpuid_max};
        // SAFETY: `cpuid` is on every x86-64 CPU and only reads identification registers;
        // leaf 7 is asked only when the maximum basic leaf reaches it. (Safe to call since
        // Rust 1.87; `unsafe` for the crate's older minimum version.)
        #[allow(unused_unsafe)]
        unsafe {
            __get_cpuid_max(0).0 >= 7 && __cpuid_count(7, 0).ebx & (1 << 23) != 0
        }
    })
}

impl<S> Drop for Slot<S> {
    fn drop(&mut self) {
        let lines = std::ptr::slice_from_raw_parts_mut(self.ring.as_ptr(), LINES);
        // SAFETY: `ring` came from `Box::leak` of a boxed slice of `LINES` lines in `new`, and
        // this is the only place that takes it back, once; the producer's copy dies with the
        // slot (no push runs on a slot being dropped: the owner holds a reference meanwhile).
        drop(unsafe { Box::from_raw(lines) });
    }
}

impl<S> Deref for Guard<'_, S> {
    type Target = S;

    fn deref(&self) -> &S {
        // SAFETY: the guard holds the lock: no other reference to the state exists.
        unsafe { &*self.slot.state.get() }
    }
}

impl<S> DerefMut for Guard<'_, S> {
    fn deref_mut(&mut self) -> &mut S {
        // SAFETY: the guard holds the lock, and `&mut self` makes this the only reference
        // through it.
        unsafe { &mut *self.slot.state.get() }
    }
}

impl<S> Drop for Guard<'_, S> {
    fn drop(&mut self) {
        self.slot.lock.store(FREE, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    const EPOCH: u64 = 5 << 32;

    fn hot() -> Hot {
        Hot {
            epoch: EPOCH,
            session: 5,
            clock: crate::clock::Clock::BOOTTIME,
        }
    }

    fn word(i: usize) -> *const u8 {
        std::ptr::without_provenance(i)
    }

    /// `try_push_with` from the test's producer thread.
    fn push<S>(slot: &Slot<S>, i: usize, epoch: u64) -> Option<u32> {
        // SAFETY: each test pushes from one thread only, and holds no producer reference.
        unsafe { slot.try_push_with(epoch, |_| Some(word(i))) }
    }

    #[test]
    fn records_come_out_in_order_and_the_ring_refuses_when_full() {
        let slot = Slot::new(Vec::new(), hot());
        for i in 0..CAPACITY {
            assert_eq!(push(&slot, i, EPOCH), Some(5));
        }
        assert_eq!(push(&slot, 0, EPOCH), None, "full");
        assert_eq!(slot.pending(), CAPACITY);
        let mut g = slot.lock();
        assert!(slot.try_lock(Holder::Drainer).is_none(), "the lock is held");
        assert!(
            slot.try_lock(Holder::Drainer).is_none(),
            "a failed try_lock leaves it held"
        );
        assert!(
            slot.lock_unless_owner().is_none(),
            "a drainer does not wait for the owner"
        );
        assert_eq!(
            g.drain(|v: &mut Vec<usize>, r| v.push(r.word.addr())),
            CAPACITY
        );
        assert_eq!(*g, (0..CAPACITY).collect::<Vec<_>>());
        drop(g);
        assert_eq!(push(&slot, 1, EPOCH + 1), None, "closed");
        assert_eq!(push(&slot, 7, EPOCH), Some(5), "room again");
        assert_eq!(slot.lock().drain(|_, r| assert_eq!(r.word.addr(), 7)), 1);
    }

    /// The lines a run gives up: those that end within it, from the line it starts in; none
    /// for a run inside one line.
    #[test]
    fn a_run_gives_up_the_lines_that_end_within_it() {
        let lines = |start, end| lines_done(start, end).collect::<Vec<_>>();
        // Line-aligned start and end: every line.
        assert_eq!(lines(0x1000, 0x10c0), [0x1000, 0x1040, 0x1080]);
        // Ending mid-line: that line stays (the producer may write its next cell).
        assert_eq!(lines(0x1000, 0x10d0), [0x1000, 0x1040, 0x1080]);
        // Starting mid-line: that line goes (its first cells were consumed before).
        assert_eq!(lines(0x1010, 0x1080), [0x1000, 0x1040]);
        // Inside one line, or empty: nothing.
        assert_eq!(lines(0x1010, 0x1030), Vec::<usize>::new());
        assert_eq!(lines(0x1040, 0x1040), Vec::<usize>::new());
        // A run ending at the ring's end (a line's end) gives up its last line.
        assert_eq!(lines(0x13f0, 0x1400), [0x13c0]);
    }

    /// Runs hand out every record once, in order, split where the ring wraps.
    #[test]
    fn runs_come_out_in_order_across_the_wrap() {
        let slot = Slot::new(Vec::new(), hot());
        let mut next = 0;
        let mut runs = Vec::new();
        for round in 0..3 {
            let n = CAPACITY / 2 + 3 + round;
            for i in next..next + n {
                assert!(push(&slot, i, EPOCH).is_some());
            }
            let mut g = slot.lock();
            let handed = g.drain_runs(false, |v: &mut Vec<usize>, run| {
                runs.push(run.len());
                v.extend(run.iter().map(|r| r.word.addr()));
            });
            assert_eq!(handed, n);
            assert_eq!(*g, (0..next + n).collect::<Vec<_>>());
            next += n;
        }
        assert!(
            runs.len() > 3,
            "a drain across the wrap comes in two runs: {runs:?}"
        );
        assert_eq!(
            slot.lock()
                .drain_runs(false, |_, _| panic!("nothing queued")),
            0
        );
    }

    /// A drain hands the ring's cells back a step at a time: while the consumer still holds
    /// the lock and works on the rest, a full queue has room again after the first step.
    #[test]
    fn a_drain_gives_room_back_before_it_ends() {
        let slot = Slot::new((), hot());
        for i in 0..CAPACITY {
            assert!(push(&slot, i, EPOCH).is_some());
        }
        assert_eq!(
            push(&slot, 0, EPOCH),
            None,
            "full, and no drainer holds the lock"
        );
        let mut g = slot.try_lock(Holder::Drainer).unwrap();
        let mut runs = Vec::new();
        let mut pushed = 0;
        let handed = g.drain_runs(false, |_, run| {
            runs.push(run.len());
            if runs.len() == 2 {
                // The first step's cells are the producer's again (this thread is both here:
                // it pushes no more than that room, which a real owner, never the drainer of
                // its own queue while it pushes, would wait for).
                for i in 0..RELEASE_STEP {
                    pushed += usize::from(push(&slot, CAPACITY + i, EPOCH).is_some());
                }
            }
        });
        assert_eq!(handed, CAPACITY, "what was published when the drain began");
        assert!(runs.iter().all(|&n| n <= RELEASE_STEP), "{runs:?}");
        assert_eq!(
            pushed, RELEASE_STEP,
            "one step's room while the drain went on"
        );
        drop(g);
        assert_eq!(slot.pending(), RELEASE_STEP);
    }

    /// A producer whose queue is full while a drainer works through it waits for the drainer's
    /// first step instead of giving up (its slow path would encode on its own thread).
    #[test]
    fn a_full_queue_waits_for_the_drainer_at_work() {
        let slot = Arc::new(Slot::new(0usize, hot()));
        for i in 0..CAPACITY {
            assert!(push(&slot, i, EPOCH).is_some());
        }
        let locked = Arc::new(Barrier::new(2));
        let consumer = {
            let (slot, locked) = (Arc::clone(&slot), Arc::clone(&locked));
            std::thread::spawn(move || {
                let mut g = slot.try_lock(Holder::Drainer).unwrap();
                locked.wait();
                // Give the producer time to find its queue full (not needed for the
                // assertion: a push after the drain's first step succeeds anyway).
                std::thread::sleep(std::time::Duration::from_millis(20));
                g.drain(|seen, _| *seen += 1)
            })
        };
        locked.wait();
        assert_eq!(
            push(&slot, CAPACITY, EPOCH),
            Some(5),
            "the push waits for room while the drainer holds the lock"
        );
        assert_eq!(consumer.join().unwrap(), CAPACITY);
    }

    /// A producer thread and a consumer thread that drains whenever it gets the lock, as the
    /// drainer does (giving each run's lines up): every record arrives once, in order, across
    /// many wraps of the ring.
    #[test]
    fn a_concurrent_consumer_sees_every_record_once_in_order() {
        let n = if cfg!(miri) { 300 } else { 200_000 };
        let slot = Arc::new(Slot::new(0usize, hot()));
        let consumer = {
            let slot = Arc::clone(&slot);
            std::thread::spawn(move || loop {
                if let Some(mut g) = slot.try_lock(Holder::Drainer) {
                    g.drain_runs(true, |seen, run| {
                        for r in run {
                            assert_eq!(r.word.addr(), *seen);
                            *seen += 1;
                        }
                    });
                    if *g == n {
                        return;
                    }
                }
                std::thread::yield_now();
            })
        };
        let mut i = 0;
        while i < n {
            if push(&slot, i, EPOCH).is_some() {
                i += 1;
            } else {
                std::thread::yield_now();
            }
        }
        consumer.join().unwrap();
    }
}

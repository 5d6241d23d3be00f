//! The recording side of the tracking allocator: per-thread record rings, the thread-local
//! state (reentrancy guard, sampler, zone stack), the sampled-address filter.
//!
//! Nothing here allocates through the global allocator: rings come from `System` directly (or
//! are the static orphan ring), the thread-local state is a `const` `thread_local!` of a type
//! without `Drop` (so it is reachable at any time, also while the thread's TLS destructors
//! run), and thread exit is learnt from a `pthread` key destructor, which glibc runs after the
//! Rust TLS destructors.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, UnsafeCell};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use crate::track_event::Callsite;

/// Deepest zone stack a site records (deeper zones are counted in the depth but not kept:
/// their allocations are attributed to the deepest zone kept).
pub const MAX_ZONES: usize = 32;

pub(crate) const KIND_ALLOC: u64 = 1;
pub(crate) const KIND_FREE: u64 = 2;
pub(crate) const KIND_POOL_ALLOC: u64 = 3;
pub(crate) const KIND_POOL_FREE: u64 = 4;
pub(crate) const KIND_POOL_DISCARD: u64 = 5;
/// In a free's `meta`: the address was found through the overflow filter, not the sampled
/// table (the tracker decrements the filter when it matches a sampled block).
pub(crate) const FREE_FROM_FILTER: u64 = 1 << 24;
/// In an allocation's `meta`: the same thread freed the block right after (no other record of
/// the thread between); the record stands for the allocation and its free, at one reading
/// ([`Ring::flag_pair`]).
pub(crate) const PAIR_FREED: u64 = 1 << 25;
/// With [`PAIR_FREED`]: the free was found through the overflow filter ([`FREE_FROM_FILTER`]).
pub(crate) const PAIR_VIA_FILTER: u64 = 1 << 26;
/// In a free's `meta`: the free of a block whose allocation the tracker claimed before the
/// thread could mark it [`PAIR_FREED`]; its `size` is the allocation's reading. The tracker
/// drops it when it saw the mark after all ([`Ring::settle`]).
pub(crate) const LATE_FREE: u64 = 1 << 27;

/// [`HookState::active`] values: what the hook records (the low byte; a sampled session's
/// word also carries its generation above it, [`sampled_mode`]).
pub(crate) const OFF: u32 = 0;
pub(crate) const EXACT: u32 = 1;
pub(crate) const SAMPLED: u32 = 2;
/// Set while a session starts: the next allocation through [`Tracked`](super::Tracked) sets
/// [`INSTALLED`].
pub(crate) const PROBE: u32 = 0x80;

/// Whether the mode word is a sampled session's (whatever its generation).
#[inline(always)]
pub(crate) fn is_sampled(mode: u32) -> bool {
    mode as u8 == SAMPLED as u8
}

/// Sampled sessions started so far (the generation in their mode words).
static SAMPLED_SESSIONS: AtomicU32 = AtomicU32::new(0);

/// The mode word of a new sampled session: [`SAMPLED`] with the session's generation in bits
/// 8..32 (never 0). A thread's countdown is armed for one mode word ([`Local::armed`]), so a
/// new session's word re-arms every thread at its next allocation, at no cost to the fast
/// path: the countdown's test compares the mode with the armed word instead of with
/// [`SAMPLED`]. The generation wraps after 2^24 - 1 sessions; a thread that allocated nothing
/// through exactly that many sessions keeps its countdown (a valid draw, of an older interval).
pub(crate) fn sampled_mode() -> u32 {
    loop {
        let g = SAMPLED_SESSIONS
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1)
            & 0x00ff_ffff;
        if g != 0 {
            return SAMPLED | g << 8;
        }
    }
}

/// What the hook reads on every call: the mode, and beside it the table of sampled addresses a
/// sampled free looks at (one static, so the program's code, which reaches another crate's
/// statics through the GOT, loads its address once for both).
#[repr(C)]
pub(crate) struct HookState {
    /// The mode ([`OFF`], [`EXACT`], [`SAMPLED`], with [`PROBE`]): the one load the hook
    /// makes when nothing is recorded. On a cache line of its own (every thread reads it on
    /// every call; the table's slots are written at samples). A 32-bit word, as the modes are:
    /// a byte would be zero-extended after its load before the hook's compares.
    active: Line<AtomicU32>,
    /// Sampled addresses ("Sampled addresses" below).
    table: [AtomicU64; 1 << TABLE_BITS],
}

impl HookState {
    /// The mode now (relaxed: the hook's one load).
    #[inline(always)]
    pub(crate) fn mode(&self) -> u32 {
        self.active.load(Ordering::Relaxed)
    }

    /// Sets the mode (session start and stop; relaxed: an allocation that a change overtakes
    /// is recorded as if it came just before or after).
    pub(crate) fn set_mode(&self, mode: u32) {
        self.active.store(mode, Ordering::Relaxed);
    }
}

pub(crate) static HOOK: HookState = HookState {
    active: Line(AtomicU32::new(OFF)),
    table: [const { AtomicU64::new(0) }; 1 << TABLE_BITS],
};
/// [`Tracked`](super::Tracked) is the global allocator (seen during a probe).
pub(crate) static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Allocations that returned null.
pub(crate) static FAILED: AtomicU64 = AtomicU64::new(0);
/// Events not recorded because the thread was already inside the hook or is the tracker.
pub(crate) static UNTRACKED: AtomicU64 = AtomicU64::new(0);
/// Records dropped because a ring stayed full (or no ring could be had).
pub(crate) static LOST: AtomicU64 = AtomicU64::new(0);

/// One event: 32 bytes. `meta` = kind (bits 0..8) | pool (8..24) | site (32..64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) addr: u64,
    /// Bytes (sampled: the bytes the sample stands for).
    pub(crate) size: u64,
    /// Raw clock counter reading (`Clock::ticks`).
    pub(crate) ticks: u64,
    pub(crate) meta: u64,
}

impl Record {
    #[cfg(test)]
    const ZERO: Record = Record {
        addr: 0,
        size: 0,
        ticks: 0,
        meta: 0,
    };

    pub(crate) fn kind(&self) -> u64 {
        self.meta & 0xff
    }

    pub(crate) fn pool(&self) -> u16 {
        (self.meta >> 8) as u16
    }

    pub(crate) fn site(&self) -> u32 {
        (self.meta >> 32) as u32
    }
}

/// Records per ring: 256 KiB per thread (zeroed pages from the system: a thread that records
/// little touches little of it).
/// (Under Miri, 64: the same code, with ring tests that run in seconds.)
pub(crate) const RING_CAP: usize = if cfg!(miri) { 64 } else { 8192 };

/// How long a thread waits for room in its full ring before it drops the record (counted).
const FULL_RING_WAIT: std::time::Duration = std::time::Duration::from_millis(100);
/// One sleep of a thread waiting for room.
const ROOM_WAIT: std::time::Duration = std::time::Duration::from_micros(500);

/// Threads sleeping in [`Ring::wait_for_room`], and what they sleep on.
static WAITING: AtomicU32 = AtomicU32::new(0);
static ROOM_LOCK: Mutex<()> = Mutex::new(());
static ROOM_CV: Condvar = Condvar::new();

/// The tracker's side, after a pass took records: wakes the threads waiting for room.
pub(crate) fn room_made() {
    // Orders the pass's stores of `tail` before the read of `WAITING` (the waiter orders its
    // increment before its read of `tail` the same way).
    std::sync::atomic::fence(Ordering::SeqCst);
    if WAITING.load(Ordering::SeqCst) > 0 {
        drop(ROOM_LOCK.lock().unwrap_or_else(|e| e.into_inner()));
        ROOM_CV.notify_all();
    }
}

const RING_FREE: u8 = 0;
const RING_OWNED: u8 = 1;
const RING_EXITED: u8 = 2;

/// A cache line of its own: the producer's and the consumer's indices apart, so the
/// consumer's stores of `tail` do not take the line the producer writes `head` in.
#[repr(align(64))]
pub(crate) struct Line<T>(T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Producer {
    head: AtomicUsize,
    seen_tail: AtomicUsize,
}

/// The consumer's line: what it has taken (`tail`), the allocation it claimed
/// ([`Ring::settle`]), and the claimed allocation it saw marked freed (only the consumer
/// reads those two).
struct Consumer {
    tail: AtomicUsize,
    /// Index + 1 of the newest record the consumer took while it was an allocation not marked
    /// [`PAIR_FREED`] (the producer reads it after marking, [`Ring::flag_pair`]).
    claimed: AtomicUsize,
    late_addr: AtomicU64,
    late_ticks: AtomicU64,
}

/// A ring slot: a [`Record`] in atomics (relaxed: plain loads and stores). The producer writes
/// all four words before it publishes the slot (release of `head`), and afterwards only
/// `meta`, while the slot holds its newest record ([`Ring::flag_pair`]); the consumer reads
/// them after it acquired `head`.
struct Slot {
    addr: AtomicU64,
    size: AtomicU64,
    ticks: AtomicU64,
    meta: AtomicU64,
}

impl Slot {
    const fn zero() -> Slot {
        Slot {
            addr: AtomicU64::new(0),
            size: AtomicU64::new(0),
            ticks: AtomicU64::new(0),
            meta: AtomicU64::new(0),
        }
    }

    #[inline(always)]
    fn store(&self, r: &Record) {
        self.addr.store(r.addr, Ordering::Relaxed);
        self.size.store(r.size, Ordering::Relaxed);
        self.ticks.store(r.ticks, Ordering::Relaxed);
        self.meta.store(r.meta, Ordering::Relaxed);
    }

    #[inline(always)]
    fn load(&self) -> Record {
        Record {
            addr: self.addr.load(Ordering::Relaxed),
            size: self.size.load(Ordering::Relaxed),
            ticks: self.ticks.load(Ordering::Relaxed),
            meta: self.meta.load(Ordering::Relaxed),
        }
    }
}

/// A single-producer (the owning thread) single-consumer (the tracker) ring of records.
pub(crate) struct Ring {
    /// Producer's line: where it writes next (`head`), and the consumer's `tail` as last read (only
    /// read again when the ring looks half full: most pushes touch no shared line but the
    /// slot's).
    prod: Line<Producer>,
    cons: Line<Consumer>,
    owner: AtomicU8,
    tid: AtomicI32,
    buf: [Slot; RING_CAP],
}

impl Ring {
    const fn new() -> Ring {
        Ring {
            prod: Line(Producer {
                head: AtomicUsize::new(0),
                seen_tail: AtomicUsize::new(0),
            }),
            cons: Line(Consumer {
                tail: AtomicUsize::new(0),
                claimed: AtomicUsize::new(0),
                late_addr: AtomicU64::new(0),
                late_ticks: AtomicU64::new(0),
            }),
            owner: AtomicU8::new(RING_OWNED),
            tid: AtomicI32::new(0),
            buf: [const { Slot::zero() }; RING_CAP],
        }
    }

    /// Appends `rec`; waits (yielding, bounded) while the ring is full and a tracker drains it;
    /// `false` if it stayed full.
    #[inline(always)]
    fn push(&self, rec: Record, may_wait: bool) -> bool {
        let h = self.prod.head.load(Ordering::Relaxed);
        let seen = self.prod.seen_tail.load(Ordering::Relaxed);
        if h.wrapping_sub(seen) >= RING_CAP / 2 {
            return self.push_slow(rec, may_wait);
        }
        self.put(h, rec);
        true
    }

    /// Stores `rec` in slot `h` and publishes it.
    #[inline(always)]
    fn put(&self, h: usize, rec: Record) {
        // Slot `h` is outside what the consumer reads (below `head`); `h - tail < RING_CAP`
        // (checked by the callers against a `tail` read at or before now: `tail` only grows).
        self.buf[h % RING_CAP].store(&rec);
        self.prod.head.store(h.wrapping_add(1), Ordering::Release);
    }

    /// Producer: the newest record (index `h`, an allocation) has its block freed now, by
    /// this thread: marks it ([`PAIR_FREED`] | `bits`) instead of pushing a free. Returns
    /// whether the consumer claimed it meanwhile ([`Ring::settle`]), in which case it may
    /// have missed the mark and the caller pushes a [`LATE_FREE`].
    ///
    /// A store-load pair against the consumer's ([`settle`](Ring::settle)): mark, then read
    /// `claimed`; the consumer stores `claimed`, then reads the mark. The producer's side is
    /// a compiler fence; the consumer's [`heavy_barrier`] makes it a full one on every
    /// thread, so at least one of the two sees the other's store.
    #[inline(always)]
    fn flag_pair(&self, h: usize, bits: u64) -> bool {
        let m = &self.buf[h % RING_CAP].meta;
        m.store(m.load(Ordering::Relaxed) | bits, Ordering::Relaxed);
        light_barrier();
        self.cons.claimed.load(Ordering::Relaxed) == h.wrapping_add(1)
    }

    /// The ring looked half full with the `tail` last read: read it again, wake the tracker,
    /// and wait when it is really full.
    #[cold]
    #[inline(never)]
    fn push_slow(&self, rec: Record, may_wait: bool) -> bool {
        let h = self.prod.head.load(Ordering::Relaxed);
        let mut t = self.cons.tail.load(Ordering::Acquire);
        self.prod.seen_tail.store(t, Ordering::Relaxed);
        let used = h.wrapping_sub(t);
        if used >= RING_CAP / 2 {
            wake_tracker();
        }
        if used >= RING_CAP {
            // Wait for the tracker, bounded: it may need a lock this thread holds (an
            // allocation made under one of the SDK's locks), so waiting forever could deadlock.
            // The thread sleeps until the tracker has taken records (not a spin of yields: on
            // a busy machine those take the CPU the tracker needs to make room).
            let mut since: Option<std::time::Instant> = None;
            loop {
                if !may_wait || !TRACKER_RUNNING.load(Ordering::Relaxed) {
                    LOST.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
                let start = *since.get_or_insert_with(std::time::Instant::now);
                if start.elapsed() > FULL_RING_WAIT {
                    LOST.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
                wake_tracker();
                self.wait_for_room(h);
                t = self.cons.tail.load(Ordering::Acquire);
                if h.wrapping_sub(t) < RING_CAP {
                    self.prod.seen_tail.store(t, Ordering::Relaxed);
                    break;
                }
            }
        }
        self.put(h, rec);
        true
    }

    /// Sleeps until the tracker has taken records from this full ring (`head` = `h`), at most
    /// [`ROOM_WAIT`] (a wake-up lost to a race costs that much, no more).
    #[cold]
    fn wait_for_room(&self, h: usize) {
        WAITING.fetch_add(1, Ordering::SeqCst);
        let g = ROOM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        // Checked under the lock and after `WAITING` went up: the tracker moves `tail`, then
        // reads `WAITING` and takes the lock before it notifies, so either this sees the new
        // `tail` or the notification comes after this thread waits.
        if h.wrapping_sub(self.cons.tail.load(Ordering::SeqCst)) >= RING_CAP {
            let _ = ROOM_CV.wait_timeout(g, ROOM_WAIT);
        }
        WAITING.fetch_sub(1, Ordering::SeqCst);
    }

    /// Copies the published records into `out` and takes them (consumer side). With `pairs`
    /// (producers mark allocations freed right after, [`flag_pair`](Ring::flag_pair)), an
    /// allocation that is the newest record and not marked stays un-taken: it is returned
    /// (its index) for [`settle`](Ring::settle), and its copy is `out`'s last record.
    fn drain_into(&self, out: &mut Vec<Record>, pairs: bool) -> (usize, Option<usize>) {
        let t = self.cons.tail.load(Ordering::Relaxed);
        let h = self.prod.head.load(Ordering::Acquire);
        let n = h.wrapping_sub(t);
        out.reserve(n);
        let mut i = t;
        while i != h {
            out.push(self.buf[i % RING_CAP].load());
            i = i.wrapping_add(1);
        }
        if pairs && n > 0 {
            let last = out[out.len() - 1];
            if last.kind() == KIND_ALLOC && last.meta & PAIR_FREED == 0 {
                // Slot `h - 1` is not given back yet: the producer cannot reuse it before
                // `settle` has read it again.
                self.cons.tail.store(h.wrapping_sub(1), Ordering::Release);
                return (n, Some(h.wrapping_sub(1)));
            }
        }
        self.cons.tail.store(h, Ordering::Release);
        (n, None)
    }

    /// Consumer, first half of taking the open allocation at index `i`
    /// ([`drain_into`](Ring::drain_into)): claims it. Then [`heavy_barrier`], then
    /// [`settle`](Ring::settle).
    fn claim(&self, i: usize) {
        self.cons
            .claimed
            .store(i.wrapping_add(1), Ordering::Relaxed);
    }

    /// Consumer, second half: reads the claimed allocation's `meta` again (after the
    /// barrier: a mark the producer made before it read `claimed` is seen here, and a mark
    /// made after it saw the claim comes with a [`LATE_FREE`] record instead), takes the slot
    /// and returns the `meta`. A mark seen here is remembered (`late`) so the consumer drops
    /// the [`LATE_FREE`] the producer may push as well.
    fn settle(&self, i: usize, addr: u64, ticks: u64) -> u64 {
        let m = self.buf[i % RING_CAP].meta.load(Ordering::Relaxed);
        if m & PAIR_FREED != 0 {
            self.cons.late_addr.store(addr, Ordering::Relaxed);
            self.cons.late_ticks.store(ticks, Ordering::Relaxed);
        }
        self.cons.tail.store(i.wrapping_add(1), Ordering::Release);
        m
    }

    /// Consumer: whether `r`, the first record taken after a [`settle`](Ring::settle) saw a
    /// mark, is the [`LATE_FREE`] that duplicates it (forgotten either way: only the record
    /// right after a claimed one can be its late free).
    fn is_duplicate(&self, r: &Record) -> bool {
        let (a, t) = (
            self.cons.late_addr.swap(0, Ordering::Relaxed),
            self.cons.late_ticks.swap(0, Ordering::Relaxed),
        );
        r.meta & LATE_FREE != 0 && r.kind() == KIND_FREE && r.addr == a && r.size == t && a != 0
    }
}

/// Every ring ever made (they are reused, never freed).
const MAX_RINGS: usize = 1024;
static RINGS: [AtomicPtr<Ring>; MAX_RINGS] = [const { AtomicPtr::new(ptr::null_mut()) }; MAX_RINGS];

/// The ring of threads that have none (exited, or no ring could be made), behind a spin lock.
static ORPHAN: Ring = Ring::new();
static ORPHAN_LOCK: AtomicBool = AtomicBool::new(false);

/// Whether a tracker drains the rings (producers only wait for a full ring then).
pub(crate) static TRACKER_RUNNING: AtomicBool = AtomicBool::new(false);
static WAKE: AtomicBool = AtomicBool::new(false);
static WAKE_LOCK: Mutex<()> = Mutex::new(());
pub(crate) static WAKE_CV: Condvar = Condvar::new();

/// Asks the tracker for a pass now (at most once per pass: a lock taken and released and a
/// futex wake; no allocation). Taking the lock orders the wake after the tracker's check of
/// `WAKE`, so the wake cannot fall between that check and its wait.
fn wake_tracker() {
    // A load first: while the tracker is behind, every push lands here, and a swap of a
    // request already pending would take the line from the tracker each time.
    if !WAKE.load(Ordering::Relaxed) && !WAKE.swap(true, Ordering::AcqRel) {
        drop(WAKE_LOCK.lock());
        WAKE_CV.notify_one();
    }
}

/// The tracker's wait: until woken or `timeout`, unless a wake is already pending.
pub(crate) fn wait_for_work(timeout: std::time::Duration) {
    let g = WAKE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !WAKE.load(Ordering::Acquire) {
        let _ = WAKE_CV.wait_timeout(g, timeout);
    }
}

/// The tracker's side: clears the wake request before a pass.
pub(crate) fn take_wake() -> bool {
    WAKE.swap(false, Ordering::AcqRel)
}

/// A ring as the tracker sees it.
pub(crate) struct RingView {
    pub(crate) ring: &'static Ring,
}

impl RingView {
    pub(crate) fn tid(&self) -> i32 {
        self.ring.tid.load(Ordering::Relaxed)
    }

    /// Copies the ring's records into `out` and takes them; an allocation left open (the
    /// newest record, which its thread may still mark freed) is returned for [`settle`],
    /// its copy at `out`'s end. A [`LATE_FREE`] that duplicates a mark [`settle`] saw is
    /// copied with `meta` 0 (no kind: skipped).
    pub(crate) fn drain_into(&self, out: &mut Vec<Record>) -> (usize, Option<Open>) {
        // Only a thread's own ring has marks (not the orphan ring).
        let pairs = PAIR_FLAGS.load(Ordering::Relaxed) && !ptr::eq(self.ring, &ORPHAN);
        let from = out.len();
        let (n, open) = self.ring.drain_into(out, pairs);
        if n > 0 && self.ring.is_duplicate(&out[from]) {
            out[from].meta = 0;
        }
        let open = open.map(|index| Open {
            ring: self.ring,
            index,
            pos: out.len() - 1,
        });
        (n, open)
    }

    /// After a drain: an exited thread's ring becomes free for the next thread once empty.
    pub(crate) fn recycle_if_exited(&self) {
        let r = self.ring;
        if r.owner.load(Ordering::Acquire) == RING_EXITED
            && r.prod.head.load(Ordering::Acquire) == r.cons.tail.load(Ordering::Relaxed)
        {
            r.owner.store(RING_FREE, Ordering::Release);
        }
    }
}

/// An allocation a drain left open: its ring, its index there, its copy's place in the batch.
pub(crate) struct Open {
    ring: &'static Ring,
    index: usize,
    pos: usize,
}

/// Takes the allocations the drains left open, with one [`heavy_barrier`] for all: each is
/// claimed, then read again, and its copy in `batch` gets the `meta` read (marked
/// [`PAIR_FREED`] if its thread freed it meanwhile).
pub(crate) fn settle(open: &[Open], batch: &mut [Record]) {
    if open.is_empty() {
        return;
    }
    for o in open {
        o.ring.claim(o.index);
    }
    heavy_barrier();
    for o in open {
        let r = &mut batch[o.pos];
        r.meta = o.ring.settle(o.index, r.addr, r.ticks);
    }
}

/// Whether threads mark an allocation freed right after instead of pushing a free
/// ([`Ring::flag_pair`]): on when [`heavy_barrier`] is available (set at session start).
pub(crate) static PAIR_FLAGS: AtomicBool = AtomicBool::new(false);

#[cfg(all(target_os = "linux", not(miri)))]
mod membarrier {
    // From <linux/membarrier.h>.
    pub(super) const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    pub(super) const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    pub(super) fn call(cmd: libc::c_int) -> bool {
        // SAFETY: membarrier(2) takes two integers and a CPU id (unused: flags 0); it reads
        // and writes no memory of the caller's.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) == 0 }
    }
}

/// Registers the process for [`heavy_barrier`]; whether it is available.
pub(crate) fn register_barrier() -> bool {
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        membarrier::call(membarrier::REGISTER_PRIVATE_EXPEDITED)
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    {
        // Without membarrier the producer's side would need a full fence per mark: no marks.
        false
    }
}

/// The producer's side of the asymmetric store-load barrier ([`Ring::flag_pair`]): keeps the
/// compiler from moving the mark after the read of `claimed`; [`heavy_barrier`] does the rest.
#[inline(always)]
fn light_barrier() {
    #[cfg(all(target_os = "linux", not(miri)))]
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    #[cfg(not(all(target_os = "linux", not(miri))))]
    std::sync::atomic::fence(Ordering::SeqCst);
}

/// The consumer's side: a full memory barrier on every running thread of the process
/// (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`), so each thread's [`light_barrier`] acts
/// as a full fence against this one. Without membarrier (Miri, not Linux) a fence, matched by
/// a fence in [`light_barrier`].
fn heavy_barrier() {
    #[cfg(all(target_os = "linux", not(miri)))]
    if !membarrier::call(membarrier::PRIVATE_EXPEDITED) {
        // Registered at session start, so not expected; should it fail, threads stop marking
        // (a mark made now may be missed: counted as lost).
        PAIR_FLAGS.store(false, Ordering::Relaxed);
        LOST.fetch_add(1, Ordering::Relaxed);
    }
    std::sync::atomic::fence(Ordering::SeqCst);
}

/// Every ring, the orphan ring first.
pub(crate) fn rings() -> impl Iterator<Item = RingView> {
    std::iter::once(RingView { ring: &ORPHAN }).chain(
        RINGS
            .iter()
            .map(|s| s.load(Ordering::Acquire))
            .take_while(|p| !p.is_null())
            .map(|p| {
                // SAFETY: rings in `RINGS` are never freed.
                let ring = unsafe { &*p };
                RingView { ring }
            }),
    )
}

// === Thread exit ===

extern "C" {
    fn pthread_key_create(
        key: *mut u32,
        dtor: Option<unsafe extern "C" fn(*mut std::ffi::c_void)>,
    ) -> i32;
    fn pthread_setspecific(key: u32, value: *const std::ffi::c_void) -> i32;
}

const KEY_UNSET: u32 = u32::MAX;
const KEY_BUSY: u32 = u32::MAX - 1;
static KEY: AtomicU32 = AtomicU32::new(KEY_UNSET);

/// The key whose destructor gives a thread's ring back (created once, without allocating
/// through Rust).
fn exit_key() -> Option<u32> {
    loop {
        match KEY.load(Ordering::Acquire) {
            KEY_UNSET => {
                if KEY
                    .compare_exchange(KEY_UNSET, KEY_BUSY, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    let mut k = 0u32;
                    // SAFETY: `k` is a valid out pointer; `ring_exit` is a plain extern "C" fn
                    // that lives for the whole program.
                    let rc = unsafe { pthread_key_create(&mut k, Some(ring_exit)) };
                    let v = if rc == 0 && k < KEY_BUSY {
                        k
                    } else {
                        KEY_BUSY - 1
                    };
                    KEY.store(v, Ordering::Release);
                }
            }
            KEY_BUSY => std::hint::spin_loop(),
            k if k == KEY_BUSY - 1 => return None,
            k => return Some(k),
        }
    }
}

/// `pthread` key destructor: the thread is exiting (its Rust TLS destructors have run). Later
/// events of this thread go to the orphan ring.
unsafe extern "C" fn ring_exit(p: *mut std::ffi::c_void) {
    let _ = LOCAL.try_with(|l| {
        l.ring.set(ptr::null());
        l.state.set(STATE_EXITED);
        l.last_alloc.set(NO_BLOCK);
        l.last_free.set(NO_BLOCK);
    });
    if !p.is_null() {
        // SAFETY: the value set for the key is this thread's ring, never freed.
        let ring = unsafe { &*(p as *const Ring) };
        ring.owner.store(RING_EXITED, Ordering::Release);
    }
}

fn current_tid() -> i32 {
    #[cfg(target_os = "linux")]
    {
        extern "C" {
            fn gettid() -> i32;
        }
        // SAFETY: gettid has no preconditions.
        unsafe { gettid() }
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}

/// A free ring for this thread (reused or new), registered for its exit; null if none.
fn claim_ring() -> *const Ring {
    let tid = current_tid();
    let mut found: *mut Ring = ptr::null_mut();
    for slot in &RINGS {
        let p = slot.load(Ordering::Acquire);
        if p.is_null() {
            break;
        }
        // SAFETY: registered rings are never freed.
        let r = unsafe { &*p };
        if r.owner
            .compare_exchange(RING_FREE, RING_OWNED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            found = p;
            break;
        }
    }
    if found.is_null() {
        let layout = Layout::new::<Ring>();
        // SAFETY: the layout is not zero-sized. All-zero bytes are a valid `Ring` (atomics
        // and records of zeros).
        let p = unsafe { System.alloc_zeroed(layout) }.cast::<Ring>();
        if p.is_null() {
            return ptr::null();
        }
        // SAFETY: `p` is a valid, exclusively owned `Ring`.
        unsafe { (*p).owner.store(RING_OWNED, Ordering::Relaxed) };
        let mut placed = false;
        for slot in &RINGS {
            if slot
                .compare_exchange(ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                placed = true;
                break;
            }
        }
        if !placed {
            // SAFETY: `p` came from `System.alloc_zeroed` with this layout and was never shared.
            unsafe { System.dealloc(p.cast(), layout) };
            return ptr::null();
        }
        found = p;
    }
    // SAFETY: `found` is a registered ring this thread now owns.
    let ring = unsafe { &*found };
    ring.tid.store(tid, Ordering::Relaxed);
    match exit_key() {
        // SAFETY: a valid key; the value is the ring, which outlives the thread.
        Some(k) if unsafe { pthread_setspecific(k, found.cast()) } == 0 => {}
        // No exit notification: the ring stays this thread's (a leak of one ring, at worst).
        _ => {}
    }
    found
}

// === Thread-local state ===

const STATE_FRESH: u8 = 0;
const STATE_RING: u8 = 1;
const STATE_EXITED: u8 = 2;

// `repr(C)`: the two fields sampled mode's fast path reads come first, on one cache line.
#[repr(C)]
struct Local {
    /// Sampler: bytes left to the next sample (an allocation of at least this many reaches
    /// it), at most the interval: the rest is in `reserve` ([`set_countdown`]). Unsigned, so
    /// the fast path's test is the subtraction's borrow. Only read while `armed` is the mode.
    to_sample: Cell<u64>,
    /// The sampled session's mode word ([`sampled_mode`]) the countdown was drawn for (0:
    /// none): the fast path counts down only while the mode is this word.
    armed: Cell<u32>,
    state: Cell<u8>,
    /// Inside the hook, or the tracker's thread: events are not recorded.
    busy: Cell<bool>,
    ring: Cell<*const Ring>,
    /// Bytes to the next sample beyond `to_sample`.
    reserve: Cell<u64>,
    rng: Cell<u64>,
    /// The sampler's next gaps drawn ahead ([`draw_ahead`]): `spare[spare_next..SPARE]` are
    /// the next ones, in order (`spare_next` = [`SPARE`]: none).
    spare: [Cell<u64>; SPARE],
    spare_next: Cell<usize>,
    /// Open zones (callsite addresses) and the interned path of each prefix.
    depth: Cell<u32>,
    interned: Cell<u32>,
    zones: [Cell<usize>; MAX_ZONES],
    paths: [Cell<u32>; MAX_ZONES],
    /// The last native stack this thread interned: its hash and site (a repeated stack skips
    /// the shared table and its lock).
    last_stack: Cell<(u64, u32)>,
    /// The walk id ([`callstack::capture_with_id`](crate::callstack::capture_with_id)) and
    /// zone path `last_stack` was made from (0: none): a walk with that id and path has that
    /// site, without hashing its frames.
    last_walk: Cell<(u64, u32)>,
    /// Where [`stack_site_walk`] builds a stack's key (the zone path, then the frames): here
    /// rather than on the stack, where it would be zeroed on every walk. Only used with `busy`
    /// set, so never by two calls at once.
    stack_key: UnsafeCell<[u64; crate::callstack::MAX_DEPTH + 1]>,
    /// The block this thread's latest record allocated and that record's counter reading,
    /// while no other record of the thread followed it ([`NO_BLOCK`] otherwise): its free can
    /// take that reading instead of a new one ([`free_ticks`]).
    last_alloc: Cell<(u64, u64)>,
    /// The block this thread's latest record freed (or marked freed) and that record's
    /// reading, while no other record of the thread followed it ([`NO_BLOCK`] otherwise): an
    /// allocation of the same block next can take that reading ([`exact_alloc`]).
    last_free: Cell<(u64, u64)>,
    /// Allocations in a row that took the reading of the free before them.
    reused: Cell<u32>,
}

/// Allocations in a row that may take the reading of the free before them (then one reads the
/// counter again): in a loop that allocates and frees one block, the recorded times lag by at
/// most this many iterations.
const MAX_REUSED: u32 = 32;

/// `Local::last_alloc` when the latest record was not an allocation.
const NO_BLOCK: (u64, u64) = (u64::MAX, 0);

thread_local! {
    static LOCAL: Local = const {
        Local {
            to_sample: Cell::new(0),
            armed: Cell::new(0),
            state: Cell::new(STATE_FRESH),
            reserve: Cell::new(0),
            busy: Cell::new(false),
            ring: Cell::new(ptr::null()),
            rng: Cell::new(0),
            spare: [const { Cell::new(0) }; SPARE],
            spare_next: Cell::new(SPARE),
            depth: Cell::new(0),
            interned: Cell::new(0),
            zones: [const { Cell::new(0) }; MAX_ZONES],
            paths: [const { Cell::new(0) }; MAX_ZONES],
            last_stack: Cell::new((0, 0)),
            last_walk: Cell::new((0, 0)),
            stack_key: UnsafeCell::new([0; crate::callstack::MAX_DEPTH + 1]),
            last_alloc: Cell::new(NO_BLOCK),
            last_free: Cell::new(NO_BLOCK),
            reused: Cell::new(0),
        }
    };
}

/// Marks this thread as the tracker's: nothing it allocates is recorded.
pub(crate) fn set_untracked_thread() {
    let _ = LOCAL.try_with(|l| l.busy.set(true));
}

/// Runs `f` with this thread's recording suspended (the zone-path interner).
fn with_guard<R>(l: &Local, f: impl FnOnce() -> R) -> R {
    let was = l.busy.replace(true);
    let r = f();
    l.busy.set(was);
    r
}

/// Appends `rec` to the thread's ring (or the orphan ring); `true` when it is now the newest
/// record of the thread's own ring.
fn push(l: &Local, rec: Record) -> bool {
    match l.state.get() {
        STATE_RING => {
            // SAFETY: a non-null ring in `STATE_RING` is this thread's, never freed.
            return unsafe { &*l.ring.get() }.push(rec, true);
        }
        STATE_FRESH => {
            let r = claim_ring();
            if !r.is_null() {
                l.ring.set(r);
                l.state.set(STATE_RING);
                // SAFETY: as above.
                return unsafe { &*r }.push(rec, true);
            }
            l.state.set(STATE_EXITED);
        }
        _ => {}
    }
    // The orphan ring, under its spin lock (bounded: a holder is never interrupted by this
    // thread's own hook, whose guard is set).
    let mut spins = 0u32;
    while ORPHAN_LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins > 100_000 {
            LOST.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        std::hint::spin_loop();
    }
    ORPHAN.push(rec, false);
    ORPHAN_LOCK.store(false, Ordering::Release);
    false
}

/// The tracker's latest pass began at this counter reading (set before it drains a ring; the
/// session's start before the first pass).
pub(crate) static PASS_TICKS: AtomicU64 = AtomicU64::new(u64::MAX);

#[inline(always)]
fn ticks() -> u64 {
    let c = crate::clock::clock();
    match c.counter_ticks() {
        Some(t) => t,
        None => c.ticks(),
    }
}

/// The site of an event now: the interned path of the open zones (0: none).
fn site(l: &Local) -> u32 {
    let depth = (l.depth.get() as usize).min(MAX_ZONES);
    if depth == 0 {
        return 0;
    }
    let done = l.interned.get() as usize;
    if done < depth {
        with_guard(l, || {
            let mut parent = if done == 0 {
                0
            } else {
                l.paths[done - 1].get()
            };
            for i in done..depth {
                parent = super::sites::intern_path(parent, l.zones[i].get());
                l.paths[i].set(parent);
            }
        });
        l.interned.set(depth as u32);
    }
    l.paths[depth - 1].get()
}

// === Native call stacks ===

/// Frames a recorded allocation's stack keeps (0: sites are zone paths). Set per session.
pub(crate) static STACK_DEPTH: AtomicU8 = AtomicU8::new(0);

/// Native stacks that could not be kept (the stack table was full, or the stack could not be
/// walked): those allocations are attributed to their zone path instead.
pub(crate) static STACKS_MISSED: AtomicU64 = AtomicU64::new(0);

/// The site of an allocation now: with stacks on, the interned (zone path, native stack) of
/// the caller, else `path` (the zone path). Runs with the thread's guard set, so what the
/// unwinder or the interner allocate (the unwinder's per-thread cache, once; the table's
/// growth) passes through untracked. The hook runs after the inner allocator returned (or
/// before it frees), never inside it, so calling it again from here is sound.
///
/// The walk is not inlined, and the hook's entry points (`on_alloc_counted`, `record_pool`) are
/// not either: skipping those two frames leaves the stack starting at the allocator shim that
/// called [`Tracked`](super::Tracked).
#[inline(always)]
fn stack_site(l: &Local, path: u32) -> u32 {
    let depth = STACK_DEPTH.load(Ordering::Relaxed) as usize;
    if depth == 0 {
        return path;
    }
    stack_site_walk(l, path, depth)
}

#[inline(never)]
fn stack_site_walk(l: &Local, path: u32, depth: usize) -> u32 {
    debug_assert!(l.busy.get());
    // SAFETY: `stack_key` is only borrowed here, with the thread's guard (`busy`) set, which
    // keeps out every other entry into the hook on this thread (a signal handler's included:
    // it sees `busy` and records nothing), so this is the only reference for its lifetime.
    let key = unsafe { &mut *l.stack_key.get() };
    let (last_hash, last_site) = l.last_stack.get();
    let (last_walk, last_path) = l.last_walk.get();
    // The walk that made `last_stack`, when this one is under the same zones: the capture
    // need not copy its frames again if it finds it unchanged.
    let known = if last_path == path && last_site != 0 {
        last_walk
    } else {
        0
    };
    let (n, walk) = crate::callstack::capture_with_id(
        &mut key[1..=depth.min(crate::callstack::MAX_DEPTH)],
        2,
        known,
    );
    if n == 0 {
        STACKS_MISSED.fetch_add(1, Ordering::Relaxed);
        return path;
    }
    if walk != 0 && walk == known {
        // The same frames as the walk that made `last_stack` (the thread's kept walk, found
        // unchanged), under the same zones: the same key (the frames were not copied).
        return last_site;
    }
    key[0] = path as u64;
    let key = &key[..=n];
    let hash = super::sites::stack_hash(key);
    if last_hash == hash && last_site != 0 {
        l.last_walk.set((walk, path));
        return last_site;
    }
    match super::sites::intern_stack(key) {
        Some(id) => {
            l.last_stack.set((hash, id));
            l.last_walk.set((walk, path));
            id
        }
        None => {
            l.last_walk.set((0, 0));
            STACKS_MISSED.fetch_add(1, Ordering::Relaxed);
            path
        }
    }
}

// === Sampled addresses ===
//
// Sampled mode must record the free of every sampled block and should record no other free.
// A sampled block's address goes into a direct-mapped table of addresses (one slot per hash);
// its free finds it there, clears the slot itself and is recorded. When the slot is taken by
// another sampled block, the address is counted in the overflow filter instead (a counting
// filter: a free whose count is non-zero is recorded, and the tracker decrements the count
// when such a free matches a sampled block), and the slot gets its [`OVERFLOWED`] bit (kept
// until the session ends), so only frees that hash to such a slot look at the filter. The
// common free costs a multiplication, one load and a compare.

const TABLE_BITS: u32 = 16;

/// In a table slot: some sampled block that hashes here went to the overflow filter (an
/// address's bit 0 is free: blocks the hook sees are at least 2-aligned, and an odd address
/// only ever misses its slot, which costs a filter load, never a wrong answer).
const OVERFLOWED: u64 = 1;

/// The address's hash: its top bits index the table, the bits below them the filter (one
/// multiplication for both lookups of a free).
#[inline(always)]
fn addr_hash(addr: u64) -> u64 {
    addr.wrapping_mul(0xd6e8_feb8_6659_fd93)
}

#[inline(always)]
fn table_slot(hash: u64) -> &'static AtomicU64 {
    &HOOK.table[(hash >> (64 - TABLE_BITS)) as usize]
}

/// A sampled block at `addr`: into its table slot when that is empty, else into the overflow
/// filter (counted before the slot is marked, so a free that sees the mark sees the count).
fn sampled_add(addr: u64) {
    let hash = addr_hash(addr);
    let slot = table_slot(hash);
    let v = slot.load(Ordering::Relaxed);
    // An empty slot keeps its mark.
    if v & !OVERFLOWED != 0
        || slot
            .compare_exchange(v, addr | v, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        filter_add(addr);
        slot.fetch_or(OVERFLOWED, Ordering::Release);
    }
}

/// A free in sampled mode: `Some(meta flags)` if it must be recorded.
#[inline(always)]
fn sampled_free(addr: u64) -> Option<u64> {
    let slot = table_slot(addr_hash(addr));
    let v = slot.load(Ordering::Relaxed);
    // `addr` is never 0 (a block being freed), so an empty slot never matches.
    if v & !OVERFLOWED == addr {
        return Some(sampled_take(slot));
    }
    if v & OVERFLOWED == 0 {
        return None;
    }
    // The hash again (not kept from above: keeping it costs the common case a register copy).
    sampled_overflow(addr)
}

/// The free of the sampled block in `slot`: empties the slot, keeping its [`OVERFLOWED`] mark.
/// An atomic read-modify-write, not a store: another thread may set the mark meanwhile. The
/// address itself changes only here: other threads' adds only fill an empty slot, and no other
/// free of this address runs now (the block is live until this free reaches the inner
/// allocator, after this).
#[cold]
#[inline(never)]
fn sampled_take(slot: &AtomicU64) -> u64 {
    slot.fetch_and(OVERFLOWED, Ordering::Relaxed);
    0
}

/// A free whose slot is marked [`OVERFLOWED`]: recorded when the filter counts its hash.
#[cold]
#[inline(never)]
fn sampled_overflow(addr: u64) -> Option<u64> {
    // Acquire: pairs with the mark's release, so the count made before it is seen.
    std::sync::atomic::fence(Ordering::Acquire);
    (filter_slot(addr_hash(addr)).load(Ordering::Relaxed) != 0).then_some(FREE_FROM_FILTER)
}

const FILTER_BITS: u32 = 16;
static FILTER: [AtomicU8; 1 << FILTER_BITS] = [const { AtomicU8::new(0) }; 1 << FILTER_BITS];

/// The filter's count for `hash` ([`addr_hash`]): the `FILTER_BITS` bits below the table's.
#[inline(always)]
fn filter_slot(hash: u64) -> &'static AtomicU8 {
    let h = (hash >> (64 - TABLE_BITS - FILTER_BITS)) & ((1 << FILTER_BITS) - 1);
    &FILTER[h as usize]
}

fn filter_add(addr: u64) {
    let s = filter_slot(addr_hash(addr));
    let _ = s.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        (v < u8::MAX).then(|| v + 1)
    });
}

/// The tracker: a sampled block at `addr` is gone (a saturated count stays).
pub(crate) fn filter_remove(addr: u64) {
    let s = filter_slot(addr_hash(addr));
    let _ = s.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        (v != 0 && v != u8::MAX).then(|| v - 1)
    });
}

/// Empties the table and the filter (a session starts; no thread records meanwhile).
pub(crate) fn filter_clear() {
    for s in &FILTER {
        s.store(0, Ordering::Relaxed);
    }
    for s in &HOOK.table {
        s.store(0, Ordering::Relaxed);
    }
}

// === The hook's entry points ===

/// Sampler state shared by all threads: the mean interval and the seed (set before a sampled
/// session's mode word, [`sampled_mode`], is).
pub(crate) static SAMPLE_INTERVAL: AtomicU64 = AtomicU64::new(4096);
pub(crate) static SAMPLE_SEED: AtomicU64 = AtomicU64::new(0);
static THREAD_COUNTER: AtomicU64 = AtomicU64::new(0);

/// An allocation of `size` bytes at `addr` happened (after the inner allocator returned);
/// `mode` is not [`OFF`]. Sampled mode's common case (the countdown not run out) is one
/// thread-local subtraction. The allocator's `alloc` makes the two steps apart
/// ([`alloc_not_sampled`] before the inner allocator runs, [`on_alloc_counted`] after, out of
/// line); this is both, for `realloc` and the tests.
#[inline(always)]
pub(crate) fn on_alloc(mode: u32, addr: *mut u8, size: usize) -> *mut u8 {
    if alloc_not_sampled(mode, size) {
        return addr;
    }
    on_alloc_counted(mode, addr, size)
}

/// Sampled mode's countdown (`mode` is not [`OFF`]): `true` when an allocation of `size` bytes
/// does not reach the next sample (the countdown is lowered by `size`; nothing else to do), in
/// the other modes `false`, and `false` too when the thread's countdown was drawn for another
/// session (or none): [`sample_weight`] draws it for this one. One compare with the
/// thread-local armed word (where a compare with [`SAMPLED`] would be) and one thread-local
/// subtraction; it runs before the inner allocator (a failed allocation, which the countdown
/// then counts, is not recorded in sampled mode either way unless it is sampled).
#[inline(always)]
pub(crate) fn alloc_not_sampled(mode: u32, size: usize) -> bool {
    LOCAL
        .try_with(|l| {
            // Only a sampled session's word is ever armed (exact mode, a probe: `false`).
            if l.armed.get() != mode {
                return false;
            }
            // One `sub` and its flags: no borrow and not zero.
            let left = l.to_sample.get();
            let skip = left > size as u64;
            if skip {
                l.to_sample.set(left - size as u64);
            }
            skip
        })
        .unwrap_or(true)
}

/// Sampled mode, after [`alloc_not_sampled`] said no (`mode` is not [`OFF`]): `true` when the
/// allocation only runs out the fast path's part of the countdown (capped at the interval,
/// [`set_countdown`]) and the reserve takes it on without reaching the sample: the countdown
/// is moved on here and nothing is recorded, which is what [`sample_weight`] would do, before
/// the inner allocator runs and without the recording path's calls (about 0.6 such allocations
/// per sample). `false` for everything else (a sample, an allocation of at least the interval,
/// a countdown not armed for `mode`, the hook busy): the recording path decides.
#[inline(always)]
pub(crate) fn countdown_moves_on(mode: u32, size: usize) -> bool {
    // Exact mode records every allocation: no countdown, and no thread-local lookup for it.
    if !is_sampled(mode) {
        return false;
    }
    LOCAL
        .try_with(|l| {
            let reserve = l.reserve.get();
            if reserve == 0 || l.armed.get() != mode || l.busy.get() {
                return false;
            }
            let interval = sample_interval();
            let size = size as u64;
            let countdown = countdown_of(l);
            if size >= interval || countdown <= size {
                return false;
            }
            set_countdown(l, countdown - size, interval);
            true
        })
        .unwrap_or(false)
}

/// The allocation at `addr` after [`alloc_not_sampled`] said it is recorded (in sampled mode,
/// the countdown ran out: a sample is drawn). Returns `addr`.
#[inline(never)]
pub(crate) fn on_alloc_counted(mode: u32, addr: *mut u8, size: usize) -> *mut u8 {
    record_alloc(mode, addr, size);
    addr
}

// Inlined: `on_alloc_counted` stays the one frame the stack capture skips above
// `stack_site_walk`.
#[inline(always)]
fn record_alloc(mode: u32, addr: *mut u8, size: usize) {
    if mode == EXACT
        && !addr.is_null()
        && LOCAL
            .try_with(|l| exact_alloc(l, addr as u64, size as u64))
            .unwrap_or(false)
    {
        return;
    }
    if mode & PROBE != 0 {
        INSTALLED.store(true, Ordering::Relaxed);
        if mode == PROBE {
            return;
        }
    }
    if addr.is_null() {
        FAILED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let _ = LOCAL.try_with(|l| {
        if l.busy.get() {
            UNTRACKED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut weight = size as u64;
        if mode & SAMPLED != 0 {
            weight = sample_weight(l, size as u64, mode);
            if weight == 0 {
                return;
            }
        }
        l.busy.set(true);
        if mode & SAMPLED != 0 {
            sampled_add(addr as u64);
        }
        let site = stack_site(l, site(l));
        let now = ticks();
        let own = push(
            l,
            Record {
                addr: addr as u64,
                size: weight,
                ticks: now,
                meta: KIND_ALLOC | (site as u64) << 32,
            },
        );
        l.last_alloc
            .set(if own { (addr as u64, now) } else { NO_BLOCK });
        l.last_free.set(NO_BLOCK);
        l.busy.set(false);
    });
}

/// Exact mode's common allocation, with as little as possible between its counter reading
/// and the return: the thread has its ring with room, its zone path is interned (or it is in
/// no zone) and no stack is walked. `false`: not done, the general path records it.
#[inline(always)]
fn exact_alloc(l: &Local, addr: u64, size: u64) -> bool {
    if l.busy.get() || l.state.get() != STATE_RING || STACK_DEPTH.load(Ordering::Relaxed) != 0 {
        return false;
    }
    let depth = (l.depth.get() as usize).min(MAX_ZONES);
    let site = if depth == 0 {
        0
    } else if l.interned.get() as usize >= depth {
        l.paths[depth - 1].get()
    } else {
        return false;
    };
    // Set before the ring's `head` is read: an event of a signal handler that interrupts
    // from here on is not recorded, so `head` cannot move under this push.
    l.busy.set(true);
    // SAFETY: a non-null ring in `STATE_RING` is this thread's, never freed.
    let ring = unsafe { &*l.ring.get() };
    let h = ring.prod.head.load(Ordering::Relaxed);
    if h.wrapping_sub(ring.prod.seen_tail.load(Ordering::Relaxed)) >= RING_CAP / 2 {
        l.busy.set(false);
        return false;
    }
    // The reading: the free's before it when that freed this very block (the thread's own
    // block back from the allocator: the common loop that allocates, uses and frees one block)
    // since the tracker's latest pass began, at most `MAX_REUSED` times in a row; else a new
    // one. Order is kept: no other thread had an event of this address in between (between
    // this thread's free and this allocation the block sat in the allocator, which handed it
    // back to this thread; an allocator without per-thread caches could hand it to another
    // thread and back within that window, which the tracker would count as an implicit free
    // and an unseen free, docs/memory.md), and in this thread's ring the reading does not go
    // back. A pass drains what is older than its start, so a reading from before the latest
    // pass is not taken again.
    let (freed, at) = l.last_free.replace(NO_BLOCK);
    let reused = l.reused.get();
    let now = if freed == addr && reused < MAX_REUSED && at >= PASS_TICKS.load(Ordering::Relaxed) {
        l.reused.set(reused + 1);
        at
    } else {
        l.reused.set(0);
        ticks()
    };
    ring.put(
        h,
        Record {
            addr,
            size,
            ticks: now,
            meta: KIND_ALLOC | (site as u64) << 32,
        },
    );
    l.last_alloc.set((addr, now));
    l.busy.set(false);
    true
}

/// Whether a free of `addr` needs [`on_free`]: with the mode [`OFF`] (or a probe) never; in
/// exact mode always; in
/// sampled mode when the address's table slot is not empty (a hash, one load and a test: most
/// frees stop here). A slot that holds another sampled block, or that is marked
/// [`OVERFLOWED`], sends the free to [`on_free`], which compares the address and asks the
/// filter ([`sampled_free`]): only live sampled blocks take slots (a program with a thousand
/// of them fills 1.5 % of the 65 536), so the exact compare is left to the few frees that find
/// one. Inlined into the allocator's `dealloc`, which calls
/// nothing else on this path, so it keeps no registers across a call.
#[inline(always)]
pub(crate) fn free_needs_hook(mode: u32, addr: *mut u8) -> bool {
    if is_sampled(mode) {
        table_slot(addr_hash(addr as u64)).load(Ordering::Relaxed) != 0
    } else {
        mode & EXACT != 0
    }
}

/// The block at `addr` (`size` bytes) is about to be freed (before the inner allocator runs,
/// so the address cannot be handed out again before this record is in the ring). In sampled
/// mode it is recorded when the table holds it (which this takes out) or the filter counts it;
/// [`free_needs_hook`] has filtered out the rest.
#[inline(always)]
pub(crate) fn on_free(mode: u32, addr: *mut u8, size: usize) {
    let flags = if is_sampled(mode) {
        match sampled_free(addr as u64) {
            Some(f) => f,
            None => return,
        }
    } else if mode & EXACT != 0 {
        0
    } else {
        return;
    };
    on_free_slow(addr, size, flags, mode);
}

/// A free right after its block's allocation (the thread's newest record allocated it) costs
/// no record: the allocation is marked freed ([`Ring::flag_pair`]), at the allocation's
/// reading. Without marks (no membarrier) it is a free record that takes the allocation's
/// reading when that was made since the tracker's latest pass began, else a new reading.
/// Reading the counter costs more than the rest of an exact-mode event on some machines (a
/// virtual machine's `rdtsc`), and a short-lived block freed right after its allocation is the
/// common case.
///
/// Order is kept: between its allocation and its free a block is live, so no event of that
/// address (on any thread) falls between them; an event of the address after the free comes
/// after the block went back to the allocator and takes a new reading, later than the
/// allocation's. The free's time is early by at most the block's life, which is within one
/// tracker pass (a pass that takes the allocation before the mark claims it, and the free
/// then comes as its own record at a new reading).
///
/// In sampled mode (`mode`), a thread sampling in this session draws its next gap here when
/// it is not drawn yet ([`draw_ahead`]: after this free's locked table update, which is the
/// last one before the thread's next sample when the block is its own, freed right after).
#[inline(never)]
fn on_free_slow(addr: *mut u8, size: usize, flags: u64, mode: u32) {
    let _ = LOCAL.try_with(|l| {
        if l.busy.get() {
            UNTRACKED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        l.busy.set(true);
        let (last, at) = l.last_alloc.replace(NO_BLOCK);
        if last == addr as u64 && PAIR_FLAGS.load(Ordering::Relaxed) {
            // The thread's newest record allocated this block (it is in the thread's own
            // ring: `last_alloc` is set only then, and reset when the thread exits): mark it
            // instead of pushing a free, unless the tracker claimed it meanwhile.
            // SAFETY: `last_alloc` is set only while `ring` is this thread's, never freed.
            let ring = unsafe { &*l.ring.get() };
            let h = ring.prod.head.load(Ordering::Relaxed).wrapping_sub(1);
            let bits = if flags & FREE_FROM_FILTER != 0 {
                PAIR_FREED | PAIR_VIA_FILTER
            } else {
                PAIR_FREED
            };
            if ring.flag_pair(h, bits) {
                // Maybe too late: a free of its own, at a new reading (after the pass that
                // claimed the allocation began), that the tracker drops if it saw the mark.
                let now = ticks();
                let own = push(
                    l,
                    Record {
                        addr: addr as u64,
                        size: at,
                        ticks: now,
                        meta: KIND_FREE | flags | LATE_FREE,
                    },
                );
                l.last_free
                    .set(if own { (addr as u64, now) } else { NO_BLOCK });
            } else {
                l.last_free.set((addr as u64, at));
            }
        } else {
            let now = if last == addr as u64 && at >= PASS_TICKS.load(Ordering::Relaxed) {
                at
            } else {
                ticks()
            };
            let own = push(
                l,
                Record {
                    addr: addr as u64,
                    size: size as u64,
                    ticks: now,
                    meta: KIND_FREE | flags,
                },
            );
            l.last_free
                .set(if own { (addr as u64, now) } else { NO_BLOCK });
        }
        if l.armed.get() == mode {
            draw_ahead(l);
        }
        l.busy.set(false);
    });
}

/// A pool event ([`Pool`](super::Pool)); pools are recorded exactly in every mode but off.
/// Never inlined: the call-stack capture skips this frame and [`stack_site`]'s.
#[inline(never)]
pub(crate) fn record_pool(kind: u64, pool: u16, addr: u64, size: u64) {
    if HOOK.mode() & (EXACT | SAMPLED) == 0 {
        return;
    }
    let _ = LOCAL.try_with(|l| {
        if l.busy.get() {
            UNTRACKED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        l.busy.set(true);
        let site = if kind == KIND_POOL_ALLOC {
            stack_site(l, site(l))
        } else {
            0
        };
        push(
            l,
            Record {
                addr,
                size,
                ticks: ticks(),
                meta: kind | (pool as u64) << 8 | (site as u64) << 32,
            },
        );
        l.last_alloc.set(NO_BLOCK);
        l.last_free.set(NO_BLOCK);
        l.busy.set(false);
    });
}

/// The sampling interval in bytes (at least 1).
#[inline(always)]
fn sample_interval() -> u64 {
    SAMPLE_INTERVAL.load(Ordering::Relaxed).max(1)
}

/// Bytes left before the next sample: the fast path's countdown and the reserve behind it, at
/// most `i64::MAX` (the sampler counts in i64).
#[inline(always)]
fn countdown_of(l: &Local) -> u64 {
    l.to_sample
        .get()
        .saturating_add(l.reserve.get())
        .min(i64::MAX as u64)
}

/// heapprofd's sampler: the bytes this allocation stands for (0: not sampled). Called when
/// the countdown ran out, or was armed for another session than `mode`'s (the first
/// allocation of a thread in a sampled session): then the thread's generator is seeded from
/// the session's seed and its countdown drawn anew, and the allocation counts against that.
#[cold]
fn sample_weight(l: &Local, size: u64, mode: u32) -> u64 {
    let interval = sample_interval();
    if l.armed.get() != mode {
        l.armed.set(mode);
        let n = THREAD_COUNTER.fetch_add(1, Ordering::Relaxed);
        l.rng.set(super::sampler::thread_seed(
            SAMPLE_SEED.load(Ordering::Relaxed),
            n,
        ));
        l.spare_next.set(SPARE);
        set_countdown(l, next_gap(l, interval), interval);
    }
    if size >= interval {
        // Large allocations are always taken, at their size (the countdown is not touched).
        return size;
    }
    // In i64 (`countdown_of` keeps the cast exact; a countdown is a few intervals in practice).
    let mut left = countdown_of(l) as i64 - size as i64;
    let mut weight = 0;
    while left <= 0 {
        left = left.saturating_add(next_gap(l, interval).min(i64::MAX as u64) as i64);
        weight += interval;
    }
    // `left` > 0 here. Without a crossing, only the cap ran out: the countdown goes on.
    set_countdown(l, left as u64, interval);
    weight
}

/// Sets the thread's countdown to `bytes`: at most `interval` of them where the fast path
/// counts down ([`alloc_not_sampled`]), the rest in reserve. So every allocation of at least
/// `interval` bytes reaches [`sample_weight`], which always takes it; and an allocation that
/// runs the capped part out without reaching the sample only moves the countdown on there
/// (about 0.6 such calls per sample, as a gap is `interval` × an exponential draw).
#[inline(always)]
fn set_countdown(l: &Local, bytes: u64, interval: u64) {
    let fast = bytes.min(interval);
    l.to_sample.set(fast);
    l.reserve.set(bytes - fast);
}

/// Gaps [`draw_ahead`] draws at a time.
const SPARE: usize = 4;

/// The thread's next gap of the sampler: the next one drawn ahead when there is one
/// ([`draw_ahead`]), else drawn now. Either way the gaps are the generator's sequence, drawn
/// in order.
#[inline(always)]
fn next_gap(l: &Local, interval: u64) -> u64 {
    let i = l.spare_next.get();
    if i < SPARE {
        l.spare_next.set(i + 1);
        return l.spare[i].get();
    }
    draw_gap(l, interval)
}

fn draw_gap(l: &Local, interval: u64) -> u64 {
    let mut rng = l.rng.get();
    let g = super::sampler::next_gap(&mut rng, interval);
    l.rng.set(rng);
    g
}

/// Draws the thread's next [`SPARE`] gaps ahead of the samples that take them, when the ones
/// drawn before are used up. A draw is a long chain of dependent float operations that
/// nothing waits for until a later sample: called where no locked instruction follows soon
/// (the free of a sample's block on its own thread, after that free's table update), the
/// processor runs it beside the allocations that follow instead of holding the next locked
/// instruction until it is done; and the chains of four draws (after the generator's short
/// integer steps) run side by side, in about the time of one.
#[inline(always)]
fn draw_ahead(l: &Local) {
    if l.spare_next.get() >= SPARE {
        let interval = sample_interval();
        for s in &l.spare {
            s.set(draw_gap(l, interval));
        }
        l.spare_next.set(0);
    }
}

// === Zones (sites) ===

/// Whether zones are pushed on the per-thread stack (memory tracking runs).
pub(crate) static ZONES_ON: AtomicBool = AtomicBool::new(false);

/// A zone began on this thread (the zone macros call this when [`ZONES_ON`]).
pub(crate) fn zone_push(cs: &'static Callsite) {
    let _ = LOCAL.try_with(|l| {
        let d = l.depth.get() as usize;
        if d < MAX_ZONES {
            l.zones[d].set(ptr::from_ref(cs) as usize);
            if (l.interned.get() as usize) > d {
                l.interned.set(d as u32);
            }
        }
        l.depth.set(d as u32 + 1);
    });
}

/// The innermost zone of this thread ended.
pub(crate) fn zone_pop() {
    let _ = LOCAL.try_with(|l| {
        let d = l.depth.get().saturating_sub(1);
        l.depth.set(d);
        if l.interned.get() > d {
            l.interned.set(d);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by the tests that use the process-wide table and filter: one of them empties
    /// both ([`filter_clear`]), which would wipe another's entries mid-test.
    static TABLE_TESTS: Mutex<()> = Mutex::new(());

    fn table_lock() -> std::sync::MutexGuard<'static, ()> {
        TABLE_TESTS.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn ring_keeps_order_and_reports_full() {
        let ring = Box::new(Ring::new());
        for i in 0..RING_CAP as u64 {
            assert!(ring.push(
                Record {
                    addr: i,
                    ..Record::ZERO
                },
                false
            ));
        }
        let lost = LOST.load(Ordering::Relaxed);
        assert!(!ring.push(Record::ZERO, false));
        assert!(LOST.load(Ordering::Relaxed) > lost);
        let mut out = Vec::new();
        assert_eq!(ring.drain_into(&mut out, false), (RING_CAP, None));
        assert!(out.iter().enumerate().all(|(i, r)| r.addr == i as u64));
        assert!(ring.push(Record::ZERO, false));
    }

    #[test]
    fn ring_drains_across_its_end() {
        let ring = Box::new(Ring::new());
        let mut out = Vec::new();
        let mut next = 0u64;
        // Three rounds that start at different offsets, the later ones wrapping.
        for n in [RING_CAP / 2 + 3, RING_CAP - 1, RING_CAP] {
            for _ in 0..n {
                assert!(ring.push(
                    Record {
                        addr: next,
                        ..Record::ZERO
                    },
                    false
                ));
                next += 1;
            }
            out.clear();
            assert_eq!(ring.drain_into(&mut out, false), (n, None));
            let first = next - n as u64;
            assert!(out.iter().zip(first..).all(|(r, i)| r.addr == i));
        }
    }

    /// The mark of an allocation freed right after: seen in the drain when made before it;
    /// made after a drain left the allocation open, seen by `settle` (and a late free the
    /// producer pushes is dropped) or not seen (and the late free stands); the claimed slot
    /// is not reused before it is settled.
    #[test]
    fn marks_are_seen_once_whenever_they_are_made() {
        let ring = Box::new(Ring::new());
        let alloc = |addr: u64, ticks: u64| Record {
            addr,
            ticks,
            meta: KIND_ALLOC,
            ..Record::ZERO
        };
        let late_free = |addr: u64, size: u64, ticks: u64| Record {
            addr,
            size,
            ticks,
            meta: KIND_FREE | LATE_FREE,
        };
        let newest = |ring: &Ring| ring.prod.head.load(Ordering::Relaxed).wrapping_sub(1);
        let mut out = Vec::new();
        // Marked before the drain: one record, taken whole.
        assert!(ring.push(alloc(0x10, 1), false));
        assert!(!ring.flag_pair(newest(&ring), PAIR_FREED));
        assert_eq!(ring.drain_into(&mut out, true), (1, None));
        assert_ne!(out[0].meta & PAIR_FREED, 0);
        // Unmarked at the drain: left open; its slot stays the producer's to mark...
        out.clear();
        assert!(ring.push(alloc(0x20, 2), false));
        let (n, open) = ring.drain_into(&mut out, true);
        assert_eq!(n, 1);
        let i = open.expect("an open allocation");
        ring.claim(i);
        // ...and the producer, marking after the claim, learns it may be late.
        assert!(ring.flag_pair(newest(&ring), PAIR_FREED));
        assert!(ring.push(late_free(0x20, 2, 3), false));
        heavy_barrier();
        let m = ring.settle(i, 0x20, 2);
        assert_ne!(m & PAIR_FREED, 0, "the mark is seen after the barrier");
        out.clear();
        assert_eq!(ring.drain_into(&mut out, true), (1, None));
        assert!(ring.is_duplicate(&out[0]), "the late free is dropped");
        // Unmarked at the settle: the late free stands.
        out.clear();
        assert!(ring.push(alloc(0x30, 4), false));
        let (_, open) = ring.drain_into(&mut out, true);
        let i = open.expect("open");
        ring.claim(i);
        heavy_barrier();
        assert_eq!(ring.settle(i, 0x30, 4) & PAIR_FREED, 0);
        assert!(ring.flag_pair(newest(&ring), PAIR_FREED));
        assert!(ring.push(late_free(0x30, 4, 5), false));
        out.clear();
        assert_eq!(ring.drain_into(&mut out, true), (1, None));
        assert!(!ring.is_duplicate(&out[0]), "a free the tracker must apply");
        // An open slot is not given back before it is settled.
        out.clear();
        assert!(ring.push(alloc(0x40, 6), false));
        let (_, open) = ring.drain_into(&mut out, true);
        assert!(open.is_some());
        for a in 0..RING_CAP as u64 - 1 {
            assert!(ring.push(alloc(0x100 + a, 10 + a), false));
        }
        assert!(
            !ring.push(alloc(2, 2), false),
            "the open slot is still held"
        );
    }

    /// What a signal handler (or the tracker's own interner) allocating while its thread is
    /// inside the hook amounts to: the nested event is counted, not recorded, and the thread's
    /// state is intact afterwards.
    #[test]
    fn nested_events_are_counted_not_recorded() {
        LOCAL.with(|l| {
            let before = UNTRACKED.load(Ordering::Relaxed);
            let state = l.state.get();
            l.busy.set(true);
            on_alloc(EXACT, ptr::without_provenance_mut(0x1000), 64);
            on_free(EXACT, ptr::without_provenance_mut(0x1000), 64);
            record_pool(KIND_POOL_ALLOC, 1, 0x10, 8);
            l.busy.set(false);
            assert!(UNTRACKED.load(Ordering::Relaxed) >= before + 2);
            // Nothing was pushed: no ring was claimed for this thread.
            assert_eq!(l.state.get(), state);
        });
        // A failed allocation (null) is counted, never recorded.
        let failed = FAILED.load(Ordering::Relaxed);
        on_alloc(EXACT, ptr::null_mut(), 1 << 40);
        assert!(FAILED.load(Ordering::Relaxed) > failed);
    }

    /// A free right after its block's allocation takes the allocation's reading; a free after
    /// another record, or after a tracker pass began, takes a new one.
    #[test]
    fn a_free_right_after_its_allocation_shares_its_reading() {
        let saved = PASS_TICKS.swap(0, Ordering::Relaxed);
        let (a, b) = (0x7100_0000usize, 0x7200_0000usize);
        on_alloc(EXACT, ptr::without_provenance_mut(a), 64);
        on_free(EXACT, ptr::without_provenance_mut(a), 64);
        on_alloc(EXACT, ptr::without_provenance_mut(a), 64);
        on_alloc(EXACT, ptr::without_provenance_mut(b), 32);
        on_free(EXACT, ptr::without_provenance_mut(a), 64);
        on_alloc(EXACT, ptr::without_provenance_mut(b), 16);
        PASS_TICKS.store(u64::MAX, Ordering::Relaxed);
        on_free(EXACT, ptr::without_provenance_mut(b), 16);
        PASS_TICKS.store(saved, Ordering::Relaxed);
        let mut out = Vec::new();
        LOCAL.with(|l| {
            assert_eq!(l.state.get(), STATE_RING);
            // SAFETY: this thread's ring, never freed.
            unsafe { &*l.ring.get() }.drain_into(&mut out, false);
        });
        let out: Vec<(u64, u64, u64)> = out.iter().map(|r| (r.kind(), r.addr, r.ticks)).collect();
        assert_eq!(out.len(), 7, "{out:?}");
        let kinds: Vec<u64> = out.iter().map(|r| r.0).collect();
        assert_eq!(kinds, [1, 2, 1, 1, 2, 1, 2]);
        assert_eq!(
            out[1].2, out[0].2,
            "free right after: the allocation's reading"
        );
        assert!(
            out[4].2 >= out[3].2,
            "free after another record: a new reading"
        );
        assert!(out.windows(2).all(|w| w[0].2 <= w[1].2), "{out:?}");
        // After a pass began (here: a pass start above every reading), a new reading.
        assert!(out[6].2 >= out[5].2);
        if crate::clock::clock().counter_ticks().is_some() {
            // A counter read twice never gives the same value.
            assert_ne!(out[4].2, out[3].2);
            assert_ne!(out[6].2, out[5].2);
        }
    }

    /// An allocation of the block the thread's newest record freed takes that free's reading
    /// (at most `MAX_REUSED` times in a row, and only since the tracker's latest pass began);
    /// an allocation of another block takes a new one.
    #[test]
    fn an_allocation_of_the_block_just_freed_takes_the_frees_reading() {
        let saved = PASS_TICKS.swap(0, Ordering::Relaxed);
        let (a, b) = (0x7300_0000usize, 0x7400_0000usize);
        let alloc = |x: usize| on_alloc(EXACT, ptr::without_provenance_mut(x), 64);
        let free = |x: usize| on_free(EXACT, ptr::without_provenance_mut(x), 64);
        alloc(a);
        free(a);
        alloc(a);
        free(a);
        alloc(b);
        free(b);
        PASS_TICKS.store(u64::MAX, Ordering::Relaxed);
        alloc(b);
        free(b);
        // Drained as it goes: the ring holds 64 records under Miri.
        let mut out = Vec::new();
        let drain = |out: &mut Vec<Record>| {
            LOCAL.with(|l| {
                // SAFETY: this thread's ring, never freed.
                unsafe { &*l.ring.get() }.drain_into(out, false);
            })
        };
        drain(&mut out);
        PASS_TICKS.store(0, Ordering::Relaxed);
        let rounds = 2 * MAX_REUSED as usize + 2;
        for i in 0..rounds {
            alloc(a);
            free(a);
            if i % 16 == 15 {
                drain(&mut out);
            }
        }
        PASS_TICKS.store(saved, Ordering::Relaxed);
        drain(&mut out);
        let t: Vec<u64> = out.iter().map(|r| r.ticks).collect();
        assert_eq!(out.len(), 8 + 2 * rounds, "{out:?}");
        assert!(t.windows(2).all(|w| w[0] <= w[1]), "{t:?}");
        assert_eq!(t[2], t[0], "the same block again: the free's reading");
        let counter = crate::clock::clock().counter_ticks().is_some();
        if counter {
            assert_ne!(t[4], t[3], "another block: a new reading");
            assert_ne!(t[6], t[5], "a pass began after the free: a new reading");
            // A run of reuses ends after MAX_REUSED: the loop's allocations took at least
            // two new readings.
            let allocs: Vec<u64> = t[8..].iter().step_by(2).copied().collect();
            let mut runs = allocs.clone();
            runs.dedup();
            assert!(runs.len() >= 2, "{allocs:?}");
            assert!(runs.len() < allocs.len(), "some reuse: {allocs:?}");
        }
    }

    /// A sampled session's first allocation on a thread draws the thread's countdown for that
    /// session, even while a countdown drawn in an earlier session (with a far larger
    /// interval) has bytes left: it never runs on into the new session.
    #[test]
    fn a_new_session_rearms_the_countdown() {
        let _t = table_lock();
        let saved = SAMPLE_INTERVAL.load(Ordering::Relaxed);
        let (first, second) = (sampled_mode(), sampled_mode());
        assert_ne!(first, second);
        assert!(is_sampled(first) && is_sampled(second));
        assert!(first & (EXACT | PROBE) == 0 && second & (EXACT | PROBE) == 0);
        // A session sampling every 2^40 bytes: its first allocation arms the countdown, which
        // then lets 64-byte allocations through (the fast path).
        SAMPLE_INTERVAL.store(1 << 40, Ordering::Relaxed);
        assert!(!alloc_not_sampled(first, 64), "not armed yet");
        LOCAL.with(|l| assert_eq!(sample_weight(l, 64, first), 0));
        for _ in 0..1000 {
            assert!(alloc_not_sampled(first, 64));
        }
        // The next session samples every byte: its first allocation goes to the sampler (not
        // counted down by the fast path), which re-arms the thread and takes it.
        SAMPLE_INTERVAL.store(1, Ordering::Relaxed);
        assert!(!alloc_not_sampled(second, 64), "re-armed, not counted down");
        LOCAL.with(|l| {
            assert_eq!(sample_weight(l, 64, second), 64, "every byte a sample");
            assert_eq!(l.armed.get(), second);
        });
        assert!(
            !alloc_not_sampled(second, 64),
            "interval 1: every allocation"
        );
        // Exact mode and a probe never count down, whatever the thread is armed for.
        assert!(!alloc_not_sampled(EXACT, 64));
        assert!(!alloc_not_sampled(PROBE, 64));
        SAMPLE_INTERVAL.store(saved, Ordering::Relaxed);
    }

    /// Every allocation of at least the interval reaches the sampler, which takes it at its
    /// size, whatever the countdown stands at (the fast path's part of it is at most an
    /// interval); the smaller ones between them are sampled as before.
    #[test]
    fn allocations_of_the_interval_always_reach_the_sampler() {
        let _t = table_lock();
        let saved = SAMPLE_INTERVAL.swap(4096, Ordering::Relaxed);
        let mode = sampled_mode();
        let n: u64 = if cfg!(miri) { 300 } else { 20_000 };
        let (mut large, mut small) = (0u64, 0u64);
        let alloc = |size: u64| {
            if alloc_not_sampled(mode, size as usize) {
                0
            } else {
                LOCAL.with(|l| sample_weight(l, size, mode))
            }
        };
        for _ in 0..n {
            small += alloc(1000);
            large += alloc(4096);
        }
        SAMPLE_INTERVAL.store(saved, Ordering::Relaxed);
        assert_eq!(large, n * 4096);
        if !cfg!(miri) {
            // 20 MB in 1000-byte blocks, sampled every 4096 bytes: about 4880 samples (sd 70).
            let samples = small / 4096;
            assert!((4500..5300).contains(&samples), "{samples}");
        }
    }

    /// The countdown moved on before the inner allocator ([`countdown_moves_on`], the
    /// allocator's slow branch) gives the samples the recording path alone gives: the same
    /// weights at the same allocations, from the same draws.
    #[test]
    fn moving_the_countdown_on_early_keeps_the_samples() {
        let _t = table_lock();
        let saved = SAMPLE_INTERVAL.swap(4096, Ordering::Relaxed);
        let n = if cfg!(miri) { 500 } else { 50_000 };
        let sizes = [64u64, 1000, 24, 3000, 4096, 200, 9000, 640];
        let run = |early: bool| -> (Vec<u64>, u32) {
            let mode = sampled_mode();
            LOCAL.with(|l| {
                // Arms the countdown for `mode`, then starts both runs from one state.
                sample_weight(l, 1, mode);
                l.rng.set(super::super::sampler::thread_seed(5, 0));
                l.spare_next.set(SPARE);
                set_countdown(l, next_gap(l, 4096), 4096);
            });
            let mut moved = 0;
            let weights = (0..n)
                .map(|i| {
                    let size = sizes[(i * 7 + i / 3) % sizes.len()];
                    if alloc_not_sampled(mode, size as usize) {
                        0
                    } else if early && countdown_moves_on(mode, size as usize) {
                        moved += 1;
                        0
                    } else {
                        LOCAL.with(|l| sample_weight(l, size, mode))
                    }
                })
                .collect();
            (weights, moved)
        };
        let (plain, _) = run(false);
        let (early, moved) = run(true);
        SAMPLE_INTERVAL.store(saved, Ordering::Relaxed);
        assert!(moved > 0, "the reserve never took an allocation on");
        assert_eq!(plain, early);
    }

    #[test]
    fn zone_stack_survives_unbalanced_pops() {
        zone_pop();
        LOCAL.with(|l| assert_eq!(l.depth.get(), 0));
    }

    #[test]
    fn filter_counts_saturate() {
        let _table = table_lock();
        let a = 0xdead_bee0u64;
        filter_add(a);
        filter_add(a);
        filter_remove(a);
        assert_ne!(filter_slot(addr_hash(a)).load(Ordering::Relaxed), 0);
        filter_remove(a);
        assert_eq!(filter_slot(addr_hash(a)).load(Ordering::Relaxed), 0);
        for _ in 0..300 {
            filter_add(a);
        }
        filter_remove(a);
        assert_eq!(filter_slot(addr_hash(a)).load(Ordering::Relaxed), u8::MAX);
        filter_slot(addr_hash(a)).store(0, Ordering::Relaxed);
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "131 072 stores: slow under Miri, no unsafe code involved"
    )]
    fn clearing_empties_table_and_filter() {
        let _table = table_lock();
        let a = 0x5555_0000u64;
        filter_add(a);
        table_slot(addr_hash(a)).store(a, Ordering::Relaxed);
        filter_clear();
        assert_eq!(filter_slot(addr_hash(a)).load(Ordering::Relaxed), 0);
        assert_eq!(table_slot(addr_hash(a)).load(Ordering::Relaxed), 0);
    }

    #[test]
    fn sampled_table_finds_its_addresses_once() {
        let _table = table_lock();
        let (a, b) = (0x7000_1230u64, 0x7000_9990u64);
        sampled_add(a);
        assert_eq!(sampled_free(a), Some(0));
        // Freed: a second free of the same address (reuse, unsampled) is not recorded unless
        // the filter holds it.
        if filter_slot(addr_hash(a)).load(Ordering::Relaxed) == 0 {
            assert_eq!(sampled_free(a), None);
        }
        // A colliding address goes through the filter, and marks the slot.
        let slot = table_slot(addr_hash(b));
        slot.store(0xdead_0000, Ordering::Relaxed);
        if filter_slot(addr_hash(b)).load(Ordering::Relaxed) == 0 {
            assert_eq!(sampled_free(b), None, "an unmarked slot: no filter lookup");
        }
        sampled_add(b);
        assert_eq!(slot.load(Ordering::Relaxed), 0xdead_0000 | OVERFLOWED);
        assert_eq!(sampled_free(b), Some(FREE_FROM_FILTER));
        filter_remove(b);
        // The slot's own block is freed: the slot is empty, still marked, and takes the next
        // block that hashes to it.
        assert_eq!(sampled_take(slot), 0);
        assert_eq!(slot.load(Ordering::Relaxed), OVERFLOWED);
        sampled_add(b);
        assert_eq!(slot.load(Ordering::Relaxed), b | OVERFLOWED);
        assert_eq!(sampled_free(b), Some(0));
        slot.store(0, Ordering::Relaxed);
    }

    /// The free's inline check ([`free_needs_hook`]) never misses a sampled block (no false
    /// negatives), and a free it sends on because another block holds the slot is not
    /// recorded ([`sampled_free`] compares the address).
    #[test]
    #[cfg_attr(
        miri,
        ignore = "searches up to 2^24 addresses for a shared slot: slow under Miri, no unsafe code involved"
    )]
    fn free_check_misses_no_sampled_block() {
        let _table = table_lock();
        let a = 0x5555_0000_4440u64;
        // Another address in the same slot (different filter bits), found by search.
        let same_slot = |x: u64| ptr::eq(table_slot(addr_hash(x)), table_slot(addr_hash(a)));
        let b = (1..1u64 << 24)
            .map(|i| a + 16 * i)
            .find(|&x| same_slot(x))
            .expect("an address sharing the slot");
        let slot = table_slot(addr_hash(a));
        assert_eq!(slot.load(Ordering::Relaxed), 0);
        assert!(!free_needs_hook(
            SAMPLED,
            ptr::without_provenance_mut(a as usize)
        ));
        sampled_add(a);
        assert!(free_needs_hook(
            SAMPLED,
            ptr::without_provenance_mut(a as usize)
        ));
        // `b` is not sampled: the check sends it on (the slot is taken), the compare drops it.
        assert!(free_needs_hook(
            SAMPLED,
            ptr::without_provenance_mut(b as usize)
        ));
        if filter_slot(addr_hash(b)).load(Ordering::Relaxed) == 0 {
            assert_eq!(sampled_free(b), None);
        }
        assert_eq!(slot.load(Ordering::Relaxed), a, "a's entry is untouched");
        assert_eq!(sampled_free(a), Some(0));
        // Empty again: neither goes out of line.
        assert!(!free_needs_hook(
            SAMPLED,
            ptr::without_provenance_mut(a as usize)
        ));
        assert!(!free_needs_hook(
            SAMPLED,
            ptr::without_provenance_mut(b as usize)
        ));
        // Exact mode sends every free on; off mode is filtered by the caller (`mode != OFF`).
        assert!(free_needs_hook(
            EXACT,
            ptr::without_provenance_mut(b as usize)
        ));
    }
}

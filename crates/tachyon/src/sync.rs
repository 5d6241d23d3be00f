//! Locks that show up in the trace: [`Mutex`] and [`RwLock`] wrap std's with the same API
//! (guards, poisoning), and [`LockMark`] instruments a lock the program already has.
//!
//! Each lock gets a track of its own, under the process, named after the lock. Every hold is a
//! slice on it, named after the holding thread (category `tachyon.lock`; the first hold of a
//! track in each generation of the writing thread's sequence carries the argument `lock_id`,
//! which ties the track to the waits);
//! shared (read) holds go on a track per holding thread under the lock's track (named
//! `shared: <thread>`), so overlapping readers never break the nesting of slices. A thread
//! that had to wait gets a `wait for <lock>` slice on its own track, from the moment it started
//! waiting to the moment it obtained the lock, and a flow arrow from the hold it waited for
//! (the releasing thread sees the waiter and hands it the flow).
//!
//! Cost: an acquisition first *tries* the lock; when it gets it at once (the common case) it
//! tests the category and reads the clock's counter into the guard (one reading: the wait's
//! start is the moment it obtained the lock), nothing else. The release reads the counter,
//! unlocks, then queues one 16-byte record on the thread's event queue carrying both readings
//! (a zone queues two: its begin and its end), looking up the lock's index only then; the
//! drainer thread writes the hold's begin and end from it, as it writes a zone's: each packet
//! from the lock's pre-encoded bytes and a timestamp delta (`state_ext.rs`). Only an
//! acquisition that has to wait takes the slow path: it reads the clock before and after
//! blocking and writes the wait and the hold's begin at once; its release queues the end.
//!
//! ```
//! tachyon::start(tachyon::Config::in_memory())?;
//! let queue = tachyon::sync::Mutex::new_named("queue", Vec::new());
//! queue.lock().unwrap().push(1);
//! let table = tachyon::sync::RwLock::new(0u32); // named by its callsite, "file.rs:line"
//! assert_eq!(*table.read().unwrap(), 0);
//! tachyon::shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Honest limits: a hold that did not wait shows on the trace once it has ended, so one still
//! running when the session stops, or whose guard was leaked with `mem::forget`, is not on
//! it (one that waited shows from the moment it obtained the lock, to the end of the trace if
//! it never ends); a lock traced for the first time after 2^27 others in the
//! process is not traced; names longer than [`MAX_NAME_LEN`] bytes are cut, with a marker.

use std::borrow::Cow;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::panic::Location;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{LockResult, PoisonError, TryLockError, TryLockResult};

use crate::track_event::state::ext::{self, MAX_LOCK_INDEX};
use crate::track_event::{global, Callsite, CallsiteKind, Flow};

/// Names (of locks, frame sets, plots) are cut to this many bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// The callsite whose category (`tachyon.lock`) turns lock tracing on and off.
static HOLD: Callsite = Callsite::new(
    "",
    Some(ext::CAT_LOCK),
    file!(),
    line!(),
    module_path!(),
    &[],
    CallsiteKind::Event,
);

/// `s`, cut to at most `max` bytes at a character boundary, with a marker saying so.
pub(crate) fn clip(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = max.saturating_sub(32);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…[cut {} bytes]", &s[..end], s.len() - end))
}

#[derive(Debug)]
enum LockName {
    Static(&'static str),
    Owned(Box<str>),
    Callsite(&'static Location<'static>),
}

/// What the trace needs of one lock; the instrumented locks embed it.
struct LockInfo {
    name: LockName,
    /// 0: no index yet; `u32::MAX`: none to give (too many locks); else index + 1.
    index: AtomicU32,
    /// Threads blocked in an acquisition of this lock (they asked for a flow).
    waiters: AtomicU32,
    /// A flow id the last releaser left for a waiter (0: none).
    handoff: AtomicU64,
}

impl fmt::Debug for LockInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockInfo")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

/// Every traced lock's name, by index (kept for the process's life: events queued for a lock
/// may be encoded after it is dropped).
static NAMES: std::sync::Mutex<Vec<Box<str>>> = std::sync::Mutex::new(Vec::new());

fn names() -> std::sync::MutexGuard<'static, Vec<Box<str>>> {
    NAMES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lock track uuids keep this many bits: a 7-byte varint, so that a hold's begin packet fits
/// the drainer's fast path (`state_ext.rs`). Among a process's few thousand locks at most, a
/// collision of two of them (or with a thread's 64-bit uuid) has odds below one in 10^8.
const LOCK_UUID_BITS: u32 = 49;

/// The track uuid of lock `index`.
pub(crate) fn lock_uuid(index: u32) -> u64 {
    global::mix64(
        global::process().uuid ^ (u64::from(index) + 1).wrapping_mul(0x6c6f_636b_0000_0001),
    ) >> (64 - LOCK_UUID_BITS)
}

/// The track uuid of a thread's shared holds of the lock whose track is `lock`, under it
/// (`thread` is the thread's own track uuid).
pub(crate) fn shared_hold_uuid(lock: u64, thread: u64) -> u64 {
    global::mix64(lock ^ thread.rotate_left(23)) >> (64 - LOCK_UUID_BITS)
}

/// The interning id lock holds use on each thread's sequence for their category and their
/// holder's name (`state_ext.rs`): the static id of the callsite that turns lock tracing on,
/// which writes no event of its own. `None` before that callsite was first checked.
pub(crate) fn lock_callsite_id() -> Option<u64> {
    Some(HOLD.id()).filter(|&id| id != 0)
}

/// The name of lock `index`.
pub(crate) fn lock_name(index: u32) -> String {
    names()
        .get(index as usize)
        .map_or_else(|| format!("lock {index}"), |n| n.to_string())
}

impl LockInfo {
    const fn new(name: LockName) -> LockInfo {
        LockInfo {
            name,
            index: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            handoff: AtomicU64::new(0),
        }
    }

    fn name(&self) -> Cow<'_, str> {
        match &self.name {
            LockName::Static(s) => clip(s, MAX_NAME_LEN),
            LockName::Owned(s) => clip(s, MAX_NAME_LEN),
            LockName::Callsite(l) => Cow::Owned(format!("{}:{}", l.file(), l.line())),
        }
    }

    /// The lock's index if lock tracing is on now (registering the lock on its first traced
    /// use).
    #[inline(always)]
    fn traced(&self) -> Option<u32> {
        if !crate::COMPILED_IN {
            return None;
        }
        HOLD.check()?;
        self.index()
    }

    /// The lock's index, registering it on its first traced use; `None`: not traced (too
    /// many locks).
    #[inline(always)]
    fn index(&self) -> Option<u32> {
        match self.index.load(Ordering::Relaxed) {
            0 => self.register(),
            u32::MAX => None,
            i => Some(i - 1),
        }
    }

    #[cold]
    #[inline(never)]
    fn register(&self) -> Option<u32> {
        let mut names = names();
        // Another thread may have registered it meanwhile (under the same lock).
        match self.index.load(Ordering::Relaxed) {
            0 => {}
            u32::MAX => return None,
            i => return Some(i - 1),
        }
        let index = names.len() as u32;
        if index >= MAX_LOCK_INDEX - 1 {
            self.index.store(u32::MAX, Ordering::Relaxed);
            return None;
        }
        names.push(self.name().into());
        self.index.store(index + 1, Ordering::Relaxed);
        Some(index)
    }

    /// An acquisition that did not wait: the clock's counter now (the wait's start and the
    /// moment the lock was obtained, one reading), recorded with the release. Only the
    /// category is tested here: the lock's index is looked up when the record is queued,
    /// after the unlock.
    #[inline(always)]
    fn hold(&self) -> Hold {
        if crate::COMPILED_IN && HOLD.check().is_some() {
            Hold::since(crate::clock::clock().ticks())
        } else {
            Hold::NONE
        }
    }

    /// Blocks in `acquire` as a waiter, then records the wait and the hold.
    #[cold]
    #[inline(never)]
    fn wait<R>(&self, shared: bool, acquire: impl FnOnce() -> R) -> (R, Hold) {
        let traced = self.traced();
        if traced.is_some() {
            self.waiters.fetch_add(1, Ordering::Relaxed);
        }
        let from = crate::clock::now();
        let r = acquire();
        let Some(index) = traced else {
            return (r, Hold::NONE);
        };
        let obtained = crate::clock::now();
        self.waiters.fetch_sub(1, Ordering::Relaxed);
        let flow = self.handoff.swap(0, Ordering::Relaxed);
        let session =
            ext::lock_contended(index, shared, from, obtained, (flow != 0).then_some(flow));
        (r, Hold::waited(session))
    }

    /// Releases the lock at the end of `hold`: drops `inner` (std's guard; `()` for a
    /// [`LockHold`], whose lock the program releases itself).
    ///
    /// Only the test inline: the guard's drop stays small enough for the compiler to inline
    /// it, so the guard lives in registers and reaches [`unlock_traced`](Self::unlock_traced)
    /// in them (with more inline, the drop became a call taking the guard through memory,
    /// its fields copied with wide loads over narrow stores: ~15% more per hold).
    #[inline(always)]
    fn unlock<G>(&self, hold: Hold, shared: bool, inner: G) {
        if hold.0 == 0 {
            drop(inner);
        } else {
            self.unlock_traced(hold, shared, inner);
        }
    }

    /// [`unlock`](Self::unlock) of a traced hold. One that did not wait, with no thread
    /// waiting for the lock: the clock's counter read just before the unlock, the record
    /// queued just after it (the queue's stores then do not hold up the unlock's atomic,
    /// which waits for the stores before it to drain; with the record queued before the
    /// unlock and the index looked up at the acquisition, a hold cost ~7% more).
    /// Anything else is written before the unlock.
    #[inline(never)]
    fn unlock_traced<G>(&self, hold: Hold, shared: bool, inner: G) {
        if hold.0 & Hold::WAITED != 0 || self.waiters.load(Ordering::Relaxed) != 0 {
            self.release_slow(hold, shared);
            drop(inner);
            return;
        }
        let end = crate::clock::clock().ticks();
        drop(inner);
        // A lock's index is looked up here, after the unlock, and given at its first traced
        // release (or wait): the acquisition only tests the category.
        if let Some(index) = self.index() {
            ext::lock_hold_complete(index, shared, hold.0, end);
        }
    }

    /// The end of a hold that waited (its begin is on the trace), or of one a thread waits
    /// for now (a flow leaves it for the waiter).
    #[cold]
    #[inline(never)]
    fn release_slow(&self, hold: Hold, shared: bool) {
        let Some(index) = self.index() else {
            return;
        };
        let session = hold.session();
        let end = crate::clock::clock().ticks();
        // The waiter may have left meanwhile (a `LockWait` dropped): no flow then.
        if self.waiters.load(Ordering::Relaxed) == 0 {
            if session == 0 {
                ext::lock_complete_cold(index, shared, hold.0, end, None);
            } else {
                ext::lock_release(session, index, shared);
            }
            return;
        }
        let flow = Flow::new().id();
        self.handoff.store(flow, Ordering::Relaxed);
        if session == 0 {
            ext::lock_complete_cold(index, shared, hold.0, end, Some(flow));
        } else {
            ext::lock_release_with_flow(session, index, shared, flow);
        }
    }
}

/// A traced hold in one word (a guard is four words): 0, not traced; with [`Hold::WAITED`]
/// set, a hold that waited, whose begin went to the session in the low 32 bits; otherwise the
/// clock's counter when the hold began (it did not wait). The lock's index is the lock's own
/// (`LockInfo::index`, given at its first traced release or wait and never changed).
#[derive(Clone, Copy, Debug)]
struct Hold(u64);

impl Hold {
    const NONE: Hold = Hold(0);

    /// The top bit: counter readings never reach it (2^63 ticks are decades).
    const WAITED: u64 = 1 << 63;

    /// A hold that did not wait, begun at counter reading `ticks`.
    #[inline(always)]
    fn since(ticks: u64) -> Hold {
        Hold((ticks & !Hold::WAITED).max(1))
    }

    /// A hold that waited, its begin recorded in `session` (0: not recorded).
    fn waited(session: u32) -> Hold {
        if session == 0 {
            Hold::NONE
        } else {
            Hold(Hold::WAITED | u64::from(session))
        }
    }

    /// The session of a hold that waited; 0 for one that did not.
    fn session(self) -> u32 {
        if self.0 & Hold::WAITED != 0 {
            self.0 as u32
        } else {
            0
        }
    }
}

// === Mutex ===

/// [`std::sync::Mutex`] whose holds and waits are recorded (see the [module docs](self)).
pub struct Mutex<T: ?Sized> {
    info: LockInfo,
    inner: std::sync::Mutex<T>,
}

impl<T> Mutex<T> {
    /// A mutex named after the place that creates it (`file.rs:line`).
    #[track_caller]
    pub const fn new(value: T) -> Mutex<T> {
        Mutex {
            info: LockInfo::new(LockName::Callsite(Location::caller())),
            inner: std::sync::Mutex::new(value),
        }
    }

    /// A mutex with this name on the trace.
    pub const fn new_named(name: &'static str, value: T) -> Mutex<T> {
        Mutex {
            info: LockInfo::new(LockName::Static(name)),
            inner: std::sync::Mutex::new(value),
        }
    }

    /// A mutex with a name made at run time.
    pub fn with_name(name: impl Into<String>, value: T) -> Mutex<T> {
        Mutex {
            info: LockInfo::new(LockName::Owned(name.into().into_boxed_str())),
            inner: std::sync::Mutex::new(value),
        }
    }

    /// The value, consuming the mutex ([`std::sync::Mutex::into_inner`]).
    pub fn into_inner(self) -> LockResult<T> {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Acquires the mutex, waiting if another thread holds it ([`std::sync::Mutex::lock`]).
    #[inline]
    pub fn lock(&self) -> LockResult<MutexGuard<'_, T>> {
        match self.inner.try_lock() {
            Ok(g) => Ok(self.guard(g, self.info.hold())),
            Err(TryLockError::Poisoned(p)) => {
                let g = self.guard(p.into_inner(), self.info.hold());
                Err(PoisonError::new(g))
            }
            Err(TryLockError::WouldBlock) => self.lock_contended(),
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) -> LockResult<MutexGuard<'_, T>> {
        let (r, hold) = self.info.wait(false, || self.inner.lock());
        match r {
            Ok(g) => Ok(self.guard(g, hold)),
            Err(p) => Err(PoisonError::new(self.guard(p.into_inner(), hold))),
        }
    }

    /// Acquires the mutex if no one holds it ([`std::sync::Mutex::try_lock`]).
    pub fn try_lock(&self) -> TryLockResult<MutexGuard<'_, T>> {
        match self.inner.try_lock() {
            Ok(g) => Ok(self.guard(g, self.info.hold())),
            Err(TryLockError::Poisoned(p)) => {
                let g = self.guard(p.into_inner(), self.info.hold());
                Err(TryLockError::Poisoned(PoisonError::new(g)))
            }
            Err(TryLockError::WouldBlock) => Err(TryLockError::WouldBlock),
        }
    }

    #[inline(always)]
    fn guard<'a>(&'a self, inner: std::sync::MutexGuard<'a, T>, hold: Hold) -> MutexGuard<'a, T> {
        MutexGuard {
            inner: ManuallyDrop::new(inner),
            info: &self.info,
            hold,
        }
    }

    /// Whether a holder panicked ([`std::sync::Mutex::is_poisoned`]).
    pub fn is_poisoned(&self) -> bool {
        self.inner.is_poisoned()
    }

    /// Clears the poison ([`std::sync::Mutex::clear_poison`]).
    pub fn clear_poison(&self) {
        self.inner.clear_poison();
    }

    /// The value, through `&mut` (no locking: nothing recorded).
    pub fn get_mut(&mut self) -> LockResult<&mut T> {
        self.inner.get_mut()
    }

    /// The lock's name on the trace.
    pub fn name(&self) -> Cow<'_, str> {
        self.info.name()
    }
}

impl<T: Default> Default for Mutex<T> {
    #[track_caller]
    fn default() -> Self {
        Mutex::new(T::default())
    }
}

impl<T> From<T> for Mutex<T> {
    /// A mutex named after the place that creates it (as [`Mutex::new`]).
    #[track_caller]
    fn from(value: T) -> Self {
        Mutex::new(value)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("name", &self.info.name())
            .field("inner", &&self.inner)
            .finish()
    }
}

/// The guard of a [`Mutex`]: the hold ends when it drops (recorded just before the lock is
/// released).
#[must_use = "if unused the Mutex will immediately unlock"]
pub struct MutexGuard<'a, T: ?Sized + 'a> {
    // Dropped in `Drop::drop` below, between reading the release's time and queuing it.
    inner: ManuallyDrop<std::sync::MutexGuard<'a, T>>,
    info: &'a LockInfo,
    hold: Hold,
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

impl<T: ?Sized> Drop for MutexGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: `inner` is taken here only, once: the guard is being dropped and never
        // touches it again (`unlock` drops std's guard, which releases the lock).
        let inner = unsafe { ManuallyDrop::take(&mut self.inner) };
        self.info.unlock(self.hold, false, inner);
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

// === RwLock ===

/// [`std::sync::RwLock`] whose holds and waits are recorded; read holds are shared holds.
pub struct RwLock<T: ?Sized> {
    info: LockInfo,
    inner: std::sync::RwLock<T>,
}

impl<T> RwLock<T> {
    /// A lock named after the place that creates it (`file.rs:line`).
    #[track_caller]
    pub const fn new(value: T) -> RwLock<T> {
        RwLock {
            info: LockInfo::new(LockName::Callsite(Location::caller())),
            inner: std::sync::RwLock::new(value),
        }
    }

    /// A lock with this name on the trace.
    pub const fn new_named(name: &'static str, value: T) -> RwLock<T> {
        RwLock {
            info: LockInfo::new(LockName::Static(name)),
            inner: std::sync::RwLock::new(value),
        }
    }

    /// A lock with a name made at run time.
    pub fn with_name(name: impl Into<String>, value: T) -> RwLock<T> {
        RwLock {
            info: LockInfo::new(LockName::Owned(name.into().into_boxed_str())),
            inner: std::sync::RwLock::new(value),
        }
    }

    /// The value, consuming the lock.
    pub fn into_inner(self) -> LockResult<T> {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Shared access, waiting for a writer ([`std::sync::RwLock::read`]).
    #[inline]
    pub fn read(&self) -> LockResult<RwLockReadGuard<'_, T>> {
        match self.inner.try_read() {
            Ok(g) => Ok(self.read_guard(g, self.info.hold())),
            Err(TryLockError::Poisoned(p)) => {
                let g = self.read_guard(p.into_inner(), self.info.hold());
                Err(PoisonError::new(g))
            }
            Err(TryLockError::WouldBlock) => self.read_contended(),
        }
    }

    #[cold]
    #[inline(never)]
    fn read_contended(&self) -> LockResult<RwLockReadGuard<'_, T>> {
        let (r, hold) = self.info.wait(true, || self.inner.read());
        match r {
            Ok(g) => Ok(self.read_guard(g, hold)),
            Err(p) => Err(PoisonError::new(self.read_guard(p.into_inner(), hold))),
        }
    }

    /// Exclusive access, waiting for every other holder ([`std::sync::RwLock::write`]).
    #[inline]
    pub fn write(&self) -> LockResult<RwLockWriteGuard<'_, T>> {
        match self.inner.try_write() {
            Ok(g) => Ok(self.write_guard(g, self.info.hold())),
            Err(TryLockError::Poisoned(p)) => {
                let g = self.write_guard(p.into_inner(), self.info.hold());
                Err(PoisonError::new(g))
            }
            Err(TryLockError::WouldBlock) => self.write_contended(),
        }
    }

    #[cold]
    #[inline(never)]
    fn write_contended(&self) -> LockResult<RwLockWriteGuard<'_, T>> {
        let (r, hold) = self.info.wait(false, || self.inner.write());
        match r {
            Ok(g) => Ok(self.write_guard(g, hold)),
            Err(p) => Err(PoisonError::new(self.write_guard(p.into_inner(), hold))),
        }
    }

    /// Shared access if no writer holds the lock.
    pub fn try_read(&self) -> TryLockResult<RwLockReadGuard<'_, T>> {
        match self.inner.try_read() {
            Ok(g) => Ok(self.read_guard(g, self.info.hold())),
            Err(TryLockError::Poisoned(p)) => {
                let g = self.read_guard(p.into_inner(), self.info.hold());
                Err(TryLockError::Poisoned(PoisonError::new(g)))
            }
            Err(TryLockError::WouldBlock) => Err(TryLockError::WouldBlock),
        }
    }

    /// Exclusive access if no one holds the lock.
    pub fn try_write(&self) -> TryLockResult<RwLockWriteGuard<'_, T>> {
        match self.inner.try_write() {
            Ok(g) => Ok(self.write_guard(g, self.info.hold())),
            Err(TryLockError::Poisoned(p)) => {
                let g = self.write_guard(p.into_inner(), self.info.hold());
                Err(TryLockError::Poisoned(PoisonError::new(g)))
            }
            Err(TryLockError::WouldBlock) => Err(TryLockError::WouldBlock),
        }
    }

    fn read_guard<'a>(
        &'a self,
        inner: std::sync::RwLockReadGuard<'a, T>,
        hold: Hold,
    ) -> RwLockReadGuard<'a, T> {
        RwLockReadGuard {
            inner: ManuallyDrop::new(inner),
            info: &self.info,
            hold,
        }
    }

    fn write_guard<'a>(
        &'a self,
        inner: std::sync::RwLockWriteGuard<'a, T>,
        hold: Hold,
    ) -> RwLockWriteGuard<'a, T> {
        RwLockWriteGuard {
            inner: ManuallyDrop::new(inner),
            info: &self.info,
            hold,
        }
    }

    /// Whether a writer panicked.
    pub fn is_poisoned(&self) -> bool {
        self.inner.is_poisoned()
    }

    /// Clears the poison.
    pub fn clear_poison(&self) {
        self.inner.clear_poison();
    }

    /// The value, through `&mut` (no locking: nothing recorded).
    pub fn get_mut(&mut self) -> LockResult<&mut T> {
        self.inner.get_mut()
    }

    /// The lock's name on the trace.
    pub fn name(&self) -> Cow<'_, str> {
        self.info.name()
    }
}

impl<T: Default> Default for RwLock<T> {
    #[track_caller]
    fn default() -> Self {
        RwLock::new(T::default())
    }
}

impl<T> From<T> for RwLock<T> {
    /// A lock named after the place that creates it (as [`RwLock::new`]).
    #[track_caller]
    fn from(value: T) -> Self {
        RwLock::new(value)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.info.name())
            .field("inner", &&self.inner)
            .finish()
    }
}

/// A shared hold of an [`RwLock`].
#[must_use = "if unused the RwLock will immediately unlock"]
pub struct RwLockReadGuard<'a, T: ?Sized + 'a> {
    // Dropped in `Drop::drop` below, between reading the release's time and queuing it.
    inner: ManuallyDrop<std::sync::RwLockReadGuard<'a, T>>,
    info: &'a LockInfo,
    hold: Hold,
}

impl<T: ?Sized> Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T: ?Sized> Drop for RwLockReadGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: `inner` is taken here only, once: the guard is being dropped and never
        // touches it again (`unlock` drops std's guard, which releases the lock).
        let inner = unsafe { ManuallyDrop::take(&mut self.inner) };
        self.info.unlock(self.hold, true, inner);
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLockReadGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for RwLockReadGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

/// An exclusive hold of an [`RwLock`].
#[must_use = "if unused the RwLock will immediately unlock"]
pub struct RwLockWriteGuard<'a, T: ?Sized + 'a> {
    // Dropped in `Drop::drop` below, between reading the release's time and queuing it.
    inner: ManuallyDrop<std::sync::RwLockWriteGuard<'a, T>>,
    info: &'a LockInfo,
    hold: Hold,
}

impl<T: ?Sized> Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T: ?Sized> DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

impl<T: ?Sized> Drop for RwLockWriteGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: `inner` is taken here only, once: the guard is being dropped and never
        // touches it again (`unlock` drops std's guard, which releases the lock).
        let inner = unsafe { ManuallyDrop::take(&mut self.inner) };
        self.info.unlock(self.hold, false, inner);
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLockWriteGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for RwLockWriteGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

// === LockMark ===

/// Instruments a lock the program already has (Tracy's `LockMark`): tell it when a thread
/// starts waiting, when it obtained the lock and when it releases it.
///
/// ```
/// # tachyon::start(tachyon::Config::in_memory())?;
/// use tachyon::sync::LockMark;
/// static MARK: LockMark = LockMark::new("legacy lock");
/// let lock = std::sync::Mutex::new(0);
///
/// let g = match lock.try_lock() {
///     Ok(g) => { let hold = MARK.acquired(); (g, hold) }
///     Err(_) => { let wait = MARK.wait(); let g = lock.lock().unwrap(); (g, wait.acquired()) }
/// };
/// drop(g.1); // the hold ends: before the lock is released
/// drop(g.0);
/// # tachyon::shutdown()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct LockMark {
    info: LockInfo,
}

impl LockMark {
    /// A mark with this name on the trace.
    pub const fn new(name: &'static str) -> LockMark {
        LockMark {
            info: LockInfo::new(LockName::Static(name)),
        }
    }

    /// A mark with a name made at run time.
    pub fn with_name(name: impl Into<String>) -> LockMark {
        LockMark {
            info: LockInfo::new(LockName::Owned(name.into().into_boxed_str())),
        }
    }

    /// The lock was obtained at once, exclusively.
    #[inline]
    pub fn acquired(&self) -> LockHold<'_> {
        self.hold(self.info.hold(), false)
    }

    /// The lock was obtained at once, shared.
    #[inline]
    pub fn acquired_shared(&self) -> LockHold<'_> {
        self.hold(self.info.hold(), true)
    }

    /// This thread starts waiting for the lock (call it just before blocking).
    pub fn wait(&self) -> LockWait<'_> {
        let index = self.info.traced();
        if index.is_some() {
            self.info.waiters.fetch_add(1, Ordering::Relaxed);
        }
        LockWait {
            mark: self,
            index,
            from: crate::clock::now(),
        }
    }

    fn hold(&self, hold: Hold, shared: bool) -> LockHold<'_> {
        LockHold {
            mark: self,
            hold,
            shared,
            _not_send: std::marker::PhantomData,
        }
    }
}

/// A thread waiting for a [`LockMark`]'s lock: say when it got it.
#[must_use = "say when the lock was obtained with `acquired`"]
#[derive(Debug)]
pub struct LockWait<'a> {
    mark: &'a LockMark,
    index: Option<u32>,
    from: u64,
}

impl<'a> LockWait<'a> {
    /// The lock is held now, exclusively: records the wait and the hold.
    pub fn acquired(self) -> LockHold<'a> {
        self.finish(false)
    }

    /// The lock is held now, shared.
    pub fn acquired_shared(self) -> LockHold<'a> {
        self.finish(true)
    }

    fn finish(self, shared: bool) -> LockHold<'a> {
        let this = std::mem::ManuallyDrop::new(self);
        let info = &this.mark.info;
        let hold = match this.index {
            Some(index) => {
                let obtained = crate::clock::now();
                info.waiters.fetch_sub(1, Ordering::Relaxed);
                let flow = info.handoff.swap(0, Ordering::Relaxed);
                Hold::waited(ext::lock_contended(
                    index,
                    shared,
                    this.from,
                    obtained,
                    (flow != 0).then_some(flow),
                ))
            }
            None => Hold::NONE,
        };
        this.mark.hold(hold, shared)
    }
}

impl Drop for LockWait<'_> {
    /// The wait ended without the lock (nothing is recorded).
    fn drop(&mut self) {
        if self.index.is_some() {
            self.mark.info.waiters.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A hold of a [`LockMark`]'s lock: it ends when this drops (drop it before releasing the
/// lock). Not `Send`: a hold ends on the thread that began it.
#[must_use = "the hold ends when this is dropped"]
#[derive(Debug)]
pub struct LockHold<'a> {
    mark: &'a LockMark,
    hold: Hold,
    shared: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl LockHold<'_> {
    /// Ends the hold now.
    pub fn release(self) {}
}

impl Drop for LockHold<'_> {
    fn drop(&mut self) {
        self.mark.info.unlock(self.hold, self.shared, ());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_cuts_at_a_character_boundary_with_a_marker() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("", 0), "");
        let s = "é".repeat(1000); // 2000 bytes
        let c = clip(&s, 100);
        assert!(c.len() <= 100 + 32, "{}", c.len());
        assert!(c.ends_with("…[cut 1932 bytes]"), "{c}");
        assert!(c.starts_with("éé"));
        // Tiny limits still give a valid string.
        for max in 0..40 {
            let c = clip("😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀", max);
            assert!(c.contains("[cut"), "{max}: {c}");
        }
    }

    #[test]
    fn locks_work_untraced_with_std_semantics() {
        let m = Mutex::new(1);
        assert!(m.name().contains("sync.rs:"), "{}", m.name());
        *m.lock().unwrap() += 1;
        let g = m.lock().unwrap();
        assert!(matches!(m.try_lock(), Err(TryLockError::WouldBlock)));
        drop(g);
        assert_eq!(m.into_inner().unwrap(), 2);
        let rw = RwLock::new_named("rw", 5);
        let (a, b) = (rw.read().unwrap(), rw.try_read().unwrap());
        assert_eq!(*a + *b, 10);
        assert!(matches!(rw.try_write(), Err(TryLockError::WouldBlock)));
        drop((a, b));
        *rw.write().unwrap() = 6;
        assert_eq!(*rw.read().unwrap(), 6);
        let mut named = Mutex::with_name(String::from("n"), 0);
        *named.get_mut().unwrap() = 3;
        assert_eq!(named.name(), "n");
        // std's conversions and formatting.
        let from = Mutex::from(7);
        assert!(from.name().contains("sync.rs:"), "{}", from.name());
        assert_eq!(from.lock().unwrap().to_string(), "7");
        let rw = RwLock::from(String::from("text"));
        assert_eq!(rw.read().unwrap().to_string(), "text");
        assert_eq!(format!("{}", rw.write().unwrap()), "text");
    }
}

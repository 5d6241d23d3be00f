//! Process-wide state: the callsite registry, the epoch every thread compares against, the
//! running session (its backend), and the process's identity on the trace.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::callsite::{Callsite, Enabled, DISABLED, ENABLED, STATE_MASK};
use super::categories::CategoryFilter;
use super::encode::MAX_STATIC_IID;
use crate::writer::SmbArbiter;

/// `session << 32 | clear generation`. A thread's state is valid for one epoch: a new session
/// (new writer) or an incremental-state clear (re-emit everything) changes it. Session 0 is
/// "none". Read with one relaxed load per event.
pub(crate) static EPOCH: AtomicU64 = AtomicU64::new(0);

pub(crate) fn session_of(epoch: u64) -> u32 {
    (epoch >> 32) as u32
}

struct Registry {
    callsites: Vec<&'static Callsite>,
    /// Next free interning id (ids are never reused: a callsite keeps its id across sessions).
    next_id: u64,
    /// The running session's filter, `None` without one.
    filter: Option<CategoryFilter>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    callsites: Vec::new(),
    next_id: 1,
    filter: None,
});

/// A poisoned lock only means a panic elsewhere while holding it; the data is still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn state_word(id: u64, cs: &Callsite, filter: Option<&CategoryFilter>) -> u64 {
    let on = filter.is_some_and(|f| f.is_enabled(cs.category, &[]));
    (id << 2) | if on { ENABLED } else { DISABLED }
}

/// First use of a callsite: give it ids and evaluate it against the session's filter.
pub(crate) fn register(cs: &'static Callsite) -> Option<Enabled> {
    let mut reg = lock(&REGISTRY);
    let mut v = cs.state.load(Ordering::Relaxed);
    if v & STATE_MASK == 0 {
        let id = reg.next_id;
        if id + cs.id_count() > MAX_STATIC_IID {
            // Out of ids (hundreds of millions of callsites): this one stays disabled for good
            // (it is not in the registry, so no filter enables it).
            v = DISABLED;
        } else {
            reg.next_id += cs.id_count();
            reg.callsites.push(cs);
            v = state_word(id, cs, reg.filter.as_ref());
        }
        cs.state.store(v, Ordering::Relaxed);
    }
    (v & STATE_MASK == ENABLED).then_some(Enabled { id: v >> 2 })
}

/// Installs (or removes) the session's category filter and re-evaluates every callsite.
pub(crate) fn set_filter(filter: Option<CategoryFilter>) {
    let mut reg = lock(&REGISTRY);
    reg.filter = filter;
    let reg = &*reg;
    for cs in &reg.callsites {
        let id = cs.state.load(Ordering::Relaxed) >> 2;
        cs.state
            .store(state_word(id, cs, reg.filter.as_ref()), Ordering::Relaxed);
    }
}

/// What threads need from the running session to create their writer.
#[derive(Clone, Debug)]
pub(crate) struct SessionHandle {
    pub(crate) session: u32,
    pub(crate) arbiter: Arc<SmbArbiter>,
    pub(crate) target_buffer: u16,
    /// Timestamps as deltas on the sequence-scoped incremental clock (the default).
    pub(crate) incremental_timestamps: bool,
}

static CURRENT: Mutex<Option<SessionHandle>> = Mutex::new(None);

/// The running session, if it is the one `session` names.
pub(crate) fn current_session(session: u32) -> Option<SessionHandle> {
    lock(&CURRENT)
        .as_ref()
        .filter(|h| h.session == session)
        .cloned()
}

/// Makes `handle` the running session: threads pick it up at their next event.
pub(crate) fn install(handle: SessionHandle, filter: CategoryFilter) {
    let session = handle.session;
    *lock(&CURRENT) = Some(handle);
    set_filter(Some(filter));
    EPOCH.store((session as u64) << 32, Ordering::Relaxed);
}

/// No session any more: threads drop (flush) their writers at their next event. The callsites
/// keep their state until [`disable_callsites`]: the session stops in between, so that threads
/// still tracing reach their state and let go of their writers (see `shutdown`).
pub(crate) fn end_session() {
    EPOCH.store(0, Ordering::Relaxed);
    *lock(&CURRENT) = None;
}

/// Every callsite reads disabled (after [`end_session`], once the session has stopped).
pub(crate) fn disable_callsites() {
    set_filter(None);
}

/// Asks every thread to clear its incremental state at its next event (re-emit interned
/// data, descriptors and clock snapshots on its sequence).
pub(crate) fn clear_incremental_state() {
    let _ = EPOCH.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |e| {
        (session_of(e) != 0).then(|| (e & !0xffff_ffff) | ((e as u32).wrapping_add(1) as u64))
    });
}

/// A new session number (never 0).
pub(crate) fn next_session_number() -> u32 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) as u32;
    n.max(1)
}

// === The process on the trace ===

/// The process's identity: pid, its track uuid, its name.
#[derive(Debug)]
pub(crate) struct ProcessInfo {
    pub(crate) pid: i32,
    /// Track uuid of the process; counter and named tracks xor their name hash into it.
    pub(crate) uuid: u64,
    pub(crate) cmdline: Vec<String>,
}

pub(crate) fn process() -> &'static ProcessInfo {
    static INFO: OnceLock<ProcessInfo> = OnceLock::new();
    INFO.get_or_init(|| {
        let pid = std::process::id() as i32;
        // Unique per process even when pids are reused across machines or runs: mix in the
        // start time.
        let salt = crate::clock::realtime_ns();
        let uuid = mix64(((pid as u64) << 32) ^ salt ^ 0x7461_6368_796f_6e00) | 1;
        ProcessInfo {
            pid,
            uuid,
            cmdline: std::env::args().collect(),
        }
    })
}

/// The uuid of the process's counter track whose name hashes (FNV-1a 64) to `name_hash`:
/// `counter!` and `CounterTrack` with the same name share it.
pub(crate) fn counter_track_uuid(name_hash: u64) -> u64 {
    process().uuid ^ name_hash
}

static PROCESS_NAME: Mutex<Option<String>> = Mutex::new(None);

/// The process name on the trace: set explicitly, else the executable's file name.
pub(crate) fn process_name() -> String {
    if let Some(n) = lock(&PROCESS_NAME).clone() {
        return n;
    }
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .or_else(|| process().cmdline.first().cloned())
        .unwrap_or_else(|| "unknown".into())
}

/// Sets the process name every sequence describes (re-emitted at once).
pub fn set_process_name(name: &str) {
    *lock(&PROCESS_NAME) = Some(name.to_owned());
    clear_incremental_state();
}

/// A 64-bit finalizer (splitmix64): spreads ids into uuids.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

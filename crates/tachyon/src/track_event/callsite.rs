//! Static callsites: what the macros know at compile time about one event, and the one atomic
//! word that says whether it is enabled.

use std::sync::atomic::{AtomicU64, Ordering};

/// Low two bits of [`Callsite::state`]: bit 1 "registered", bit 0 "enabled" (so the enabled
/// test is one bit test of the word in memory).
pub(crate) const UNREGISTERED: u64 = 0;
pub(crate) const DISABLED: u64 = 2;
pub(crate) const ENABLED: u64 = 3;
pub(crate) const STATE_MASK: u64 = 3;
const ENABLED_BIT: u64 = ENABLED & !DISABLED;

/// What a counter's values measure (`CounterDescriptor.unit`, or a free-form `unit_name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// No unit.
    None,
    /// A count of things.
    Count,
    /// Bytes.
    Bytes,
    /// Nanoseconds.
    TimeNs,
    /// Any other unit, by name (e.g. `"jobs/s"`).
    Named(&'static str),
}

/// What kind of event a callsite emits.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallsiteKind {
    /// Slices and instants.
    Event,
    /// Samples on the process-scoped counter track named like the callsite.
    Counter(Unit),
}

/// One instrumentation point, a `static` the macros declare: its name, category, source
/// location and argument names, and whether it is enabled in the current session.
///
/// The state word packs the callsite's id (the base of its interning ids, assigned when it
/// first runs) with two bits: not yet registered, disabled, enabled. Checking it is one relaxed
/// load; it changes only when a session starts or stops, under the registry's lock.
#[derive(Debug)]
pub struct Callsite {
    pub(crate) name: &'static str,
    pub(crate) category: Option<&'static str>,
    pub(crate) file: &'static str,
    pub(crate) line: u32,
    pub(crate) module_path: &'static str,
    pub(crate) arg_names: &'static [&'static str],
    pub(crate) kind: CallsiteKind,
    /// FNV-1a of the name: counter track uuids (xor the process's uuid).
    pub(crate) name_hash: u64,
    pub(crate) state: AtomicU64,
}

/// An enabled callsite's ids: `id` interns its event name, category and source location;
/// `id + 1 + i` its `i`-th argument name.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enabled {
    pub(crate) id: u64,
}

impl Callsite {
    /// A callsite (used by the macros).
    #[doc(hidden)]
    pub const fn new(
        name: &'static str,
        category: Option<&'static str>,
        file: &'static str,
        line: u32,
        module_path: &'static str,
        arg_names: &'static [&'static str],
        kind: CallsiteKind,
    ) -> Self {
        Callsite {
            name,
            category,
            file,
            line,
            module_path,
            arg_names,
            kind,
            name_hash: fnv1a64(name.as_bytes()),
            state: AtomicU64::new(UNREGISTERED),
        }
    }

    /// `Some` when events of this callsite are recorded now: one relaxed load (the first call
    /// registers the callsite, under a lock).
    #[inline(always)]
    pub fn check(&'static self) -> Option<Enabled> {
        let v = self.state.load(Ordering::Relaxed);
        if v & ENABLED_BIT != 0 {
            Some(Enabled { id: v >> 2 })
        } else if v & STATE_MASK == DISABLED {
            None
        } else {
            self.register()
        }
    }

    /// The callsite's id, once it has one (it never changes then: the hot paths load it again
    /// instead of keeping the one [`check`](Self::check) returned in a register).
    #[inline(always)]
    pub(crate) fn id(&self) -> u64 {
        self.state.load(Ordering::Relaxed) >> 2
    }

    #[cold]
    #[inline(never)]
    fn register(&'static self) -> Option<Enabled> {
        super::global::register(self)
    }

    /// The event name ("" for dynamically named events).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The category, if any.
    pub fn category(&self) -> Option<&'static str> {
        self.category
    }

    /// Ids this callsite takes: its own and one per argument name.
    pub(crate) fn id_count(&self) -> u64 {
        1 + self.arg_names.len() as u64
    }
}

/// 64-bit FNV-1a, at compile time for static names.
pub(crate) const fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

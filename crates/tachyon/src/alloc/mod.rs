//! Memory profiling: a tracking global allocator, live-heap counter tracks, heap profiles in
//! Perfetto's `ProfilePacket` format, named pools for custom allocators.
//!
//! Install [`Tracked`] as the program's global allocator; while a session runs with
//! [`Config::memory`](crate::Config::memory) on (the default: [`MemoryMode::Exact`]), every
//! allocation, reallocation and free is recorded with its address, size, thread, time and
//! site (the zones open on the thread, innermost last):
//!
//! ```no_run
//! use std::alloc::System;
//!
//! #[global_allocator]
//! static ALLOC: tachyon::alloc::Tracked<System> = tachyon::alloc::Tracked::new(System);
//!
//! fn main() -> std::io::Result<()> {
//!     tachyon::start(tachyon::Config::default())?;
//!     {
//!         let _zone = tachyon::zone!("load");
//!         let v = vec![0u8; 1 << 20]; // attributed to the zone "load"
//!         std::mem::forget(v); // shows as unreleased at the end
//!     }
//!     let report = tachyon::shutdown()?.expect("a session");
//!     println!("{}", report.memory.expect("tracking was on"));
//!     Ok(())
//! }
//! ```
//!
//! # How it records
//!
//! The allocator's hook never allocates and never calls into the tracer. With no session (or
//! the mode off) it costs one relaxed load of a global byte. Otherwise it appends a 32-byte
//! record (kind, address, size, raw counter reading, site) to a ring of its thread's (Tracy's
//! per-thread queue, `local.rs`): memory taken from the system allocator directly, reused when
//! the thread exits (a `pthread` key destructor gives it back, after the thread's Rust TLS
//! destructors have run). A free right after its block's allocation on the same thread (the
//! common short-lived block) appends nothing: it marks the allocation's record freed, and the
//! tracker takes each ring's newest record, which may still be marked, through an asymmetric
//! barrier (`membarrier`; `local.rs`). A background thread, `tachyon-memory` (`tracker.rs`), drains the
//! rings every millisecond (sooner when a ring is half full), merges them in time order, keeps
//! the live-allocation table (address → size, site) and per-site totals, and writes:
//!
//! - a counter track per heap: `Heap` (the global allocator) and `Heap: NAME` per [`pool`],
//!   bytes live over time;
//! - heap profiles (`ProfilePacket`, heapprofd's format, cumulative per call stack) every
//!   [`MemoryConfig::dump_period`] and at the end of the session, which the Perfetto UI shows as
//!   "unreleased" and "total allocated" flame graphs and trace processors import into
//!   `heap_profile_allocation`.
//!
//! The tracker's own thread is never tracked (its tables grow through the same allocator with
//! the thread's reentrancy guard set), nor is an allocation made while the thread is already
//! inside the hook (a signal handler that allocates, the zone-path interner); those are
//! counted ([`MemorySummary::untracked`]).
//!
//! In [`MemoryMode::Sampled`] mode allocations are sampled as heapprofd does: a Poisson
//! process over allocated bytes with mean interval `BYTES` (each thread draws exponential
//! gaps), a sampled allocation stands for `interval × crossings` bytes, and one of at least
//! `interval` bytes is always taken at its size. Frees are recorded only for addresses in the
//! table of sampled addresses or counted in its overflow filter; the common free costs a hash
//! and one load (the table's slot, which also says whether the filter holds anything for it).
//!
//! Sites are native call stacks when [`MemoryConfig::callstack_depth`] asks for them (by
//! default 32 frames on each sampled allocation; none in exact mode, where a stack walk per
//! allocation would cost more than the rest of the hook): the hook walks its caller's stack
//! with [`callstack::capture`](crate::callstack::capture) (guard set, no lock of the
//! unwinder's: its tables are built at session start) and interns (zones, frames) into a site
//! id. The dumps write them as heapprofd does: mappings of the loaded binaries (path, build
//! id), frames at binary-relative addresses that `tachyon-symbolize` names, so the Perfetto UI
//! shows flame graphs of functions. Otherwise sites are the zones open on the allocating
//! thread (one frame per zone name, outermost first; up to [`MAX_ZONES`] deep); an allocation
//! outside any zone has the one frame `(no zone)`.
//!
//! # Bad input
//!
//! A free of an address never seen (allocated before tracking started, by another allocator,
//! or by the tracker) is counted and ignored: the live heap never goes negative. A
//! reallocation is a free and an allocation (also in place); a failed one (null) keeps the old
//! block. A zero-size request is recorded like any other; a failed allocation (null) is
//! counted, not recorded.

mod hook;
// Memory tracking records into in-process sessions (`start_session` is called for those only):
// without the `in-process` feature its session side is compiled but unused.
#[cfg_attr(not(feature = "in-process"), allow(dead_code))]
mod live;
#[cfg_attr(not(feature = "in-process"), allow(dead_code))]
mod local;
#[cfg_attr(not(feature = "in-process"), allow(dead_code))]
mod profile;
#[cfg_attr(not(feature = "in-process"), allow(dead_code))]
mod sampler;
#[cfg_attr(not(feature = "in-process"), allow(dead_code))]
mod sites;
#[cfg_attr(not(feature = "in-process"), allow(dead_code))]
mod tracker;

use std::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub use hook::Tracked;
pub use local::MAX_ZONES;
pub use tracker::{HeapSummary, MemorySummary, SiteSummary};

#[cfg(feature = "in-process")]
pub(crate) use tracker::{start_session, stop_session};

/// Whether zones are tracked as allocation sites now (one relaxed load; the zone macros ask).
#[inline(always)]
pub(crate) fn zones_on() -> bool {
    cfg!(feature = "memory") && local::ZONES_ON.load(Ordering::Relaxed)
}

pub(crate) use local::{zone_pop, zone_push};

/// Heap name of the global allocator in heap profiles.
pub const GLOBAL_HEAP: &str = "rust.global";

/// What the tracking allocator records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryMode {
    /// Nothing: the allocator passes every call through.
    Off,
    /// Every allocation and free (Tracy's way).
    Exact,
    /// A Poisson sample of the allocated bytes with this mean interval (heapprofd's way).
    Sampled {
        /// Mean bytes between samples (≥ 1).
        interval: u64,
    },
}

impl MemoryMode {
    /// `off`, `exact` or `sampled:BYTES` (`BYTES` as `4096`, `64K`, `1M`).
    pub fn parse(v: &str) -> Result<MemoryMode, String> {
        let v = v.trim();
        let lower = v.to_ascii_lowercase();
        match lower.as_str() {
            "off" | "0" | "none" => return Ok(MemoryMode::Off),
            "exact" | "on" | "1" => return Ok(MemoryMode::Exact),
            "sampled" => {
                return Ok(MemoryMode::Sampled {
                    interval: DEFAULT_SAMPLING_INTERVAL,
                })
            }
            _ => {}
        }
        if let Some(bytes) = lower.strip_prefix("sampled:") {
            return crate::init::parse_size("TACHYON_MEMORY", bytes)
                .map(|n| MemoryMode::Sampled { interval: n as u64 })
                .map_err(|e| e.0);
        }
        Err(format!(
            "TACHYON_MEMORY={v:?}: expected off, exact or sampled:BYTES"
        ))
    }
}

/// `TACHYON_MEMORY_CALLSTACK`: a depth from 0 to [`callstack::MAX_DEPTH`](crate::callstack::MAX_DEPTH).
pub(crate) fn parse_stack_depth(v: &str) -> Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(d) if d <= crate::callstack::MAX_DEPTH => Ok(d),
        _ => Err(format!(
            "TACHYON_MEMORY_CALLSTACK={v:?}: expected a depth from 0 to {}",
            crate::callstack::MAX_DEPTH
        )),
    }
}

/// heapprofd's default sampling interval.
pub const DEFAULT_SAMPLING_INTERVAL: u64 = 4096;

/// Memory profiling settings ([`Config::memory`](crate::Config::memory)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryConfig {
    /// What is recorded (only when [`Tracked`] is the global allocator).
    pub mode: MemoryMode,
    /// A heap profile every this often (`TACHYON_MEMORY_DUMP_MS`); one is always written at
    /// the end of the session.
    pub dump_period: Option<Duration>,
    /// The live-heap counter gets at most one sample per this period, plus the period's peak
    /// when it was higher (`Duration::ZERO`: every change).
    pub counter_period: Duration,
    /// Seed of the sampler's random gaps (`None`: from the clock).
    pub seed: Option<u64>,
    /// Frames of native call stack each recorded allocation keeps (`TACHYON_MEMORY_CALLSTACK`,
    /// at most [`callstack::MAX_DEPTH`](crate::callstack::MAX_DEPTH); 0: sites are zones).
    /// `None`: the mode's default, [`DEFAULT_SAMPLED_STACK_DEPTH`] when sampled (only sampled
    /// allocations walk the stack) and 0 when exact (a walk per allocation costs more than
    /// the rest of the hook; ask for a depth to have it).
    pub callstack_depth: Option<usize>,
}

/// Stack depth of sampled allocations unless [`MemoryConfig::callstack_depth`] says otherwise.
pub const DEFAULT_SAMPLED_STACK_DEPTH: usize = 32;

impl MemoryConfig {
    /// The stack depth this configuration records (the mode's default when unset).
    pub fn stack_depth(&self) -> usize {
        let d = match (self.callstack_depth, self.mode) {
            (Some(d), _) => d,
            (None, MemoryMode::Sampled { .. }) => DEFAULT_SAMPLED_STACK_DEPTH,
            (None, _) => 0,
        };
        d.min(crate::callstack::MAX_DEPTH)
    }
}

impl Default for MemoryConfig {
    /// Exact, no periodic dumps, counter samples at most every 100 µs.
    fn default() -> Self {
        MemoryConfig {
            mode: MemoryMode::Exact,
            dump_period: None,
            counter_period: Duration::from_micros(100),
            seed: None,
            callstack_depth: None,
        }
    }
}

/// Whether [`Tracked`] is the process's global allocator (known once a session has started;
/// `false` before).
pub fn is_installed() -> bool {
    local::INSTALLED.load(Ordering::Relaxed)
}

/// A named memory pool for a custom allocator or an arena: tell it what you hand out and take
/// back; it gets its own live-heap counter track and heap profile (`heap_name` = the pool's
/// name). Works whether or not [`Tracked`] is installed; records only while a session runs with
/// memory tracking on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool {
    id: u16,
}

/// The pool with this name (the same name gives the same pool). At most 65 534 pools; further
/// names share the last one.
pub fn pool(name: &str) -> Pool {
    Pool {
        id: sites::pool_id(name),
    }
}

impl Pool {
    /// `size` bytes at `addr` were handed out.
    #[inline]
    pub fn alloc(&self, addr: usize, size: usize) {
        local::record_pool(local::KIND_POOL_ALLOC, self.id, addr as u64, size as u64);
    }

    /// The block at `addr` was taken back (its size is what `alloc` said).
    #[inline]
    pub fn free(&self, addr: usize) {
        local::record_pool(local::KIND_POOL_FREE, self.id, addr as u64, 0);
    }

    /// Everything the pool handed out is gone at once (an arena reset).
    pub fn discard(&self) {
        local::record_pool(local::KIND_POOL_DISCARD, self.id, 0, 0);
    }

    /// The pool's name.
    pub fn name(&self) -> String {
        sites::pool_name(self.id)
    }
}

impl fmt::Display for MemoryMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryMode::Off => f.write_str("off"),
            MemoryMode::Exact => f.write_str("exact"),
            MemoryMode::Sampled { interval } => write!(f, "sampled:{interval}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!(MemoryMode::parse("off"), Ok(MemoryMode::Off));
        assert_eq!(MemoryMode::parse("EXACT"), Ok(MemoryMode::Exact));
        assert_eq!(
            MemoryMode::parse("sampled:64K"),
            Ok(MemoryMode::Sampled { interval: 65536 })
        );
        assert_eq!(
            MemoryMode::parse("sampled"),
            Ok(MemoryMode::Sampled { interval: 4096 })
        );
        assert_eq!(parse_stack_depth(" 16"), Ok(16));
        assert!(parse_stack_depth("65")
            .unwrap_err()
            .contains("TACHYON_MEMORY_CALLSTACK"));
        assert!(parse_stack_depth("deep").is_err());
        let sampled = MemoryConfig {
            mode: MemoryMode::Sampled { interval: 64 },
            ..MemoryConfig::default()
        };
        assert_eq!(sampled.stack_depth(), DEFAULT_SAMPLED_STACK_DEPTH);
        assert_eq!(MemoryConfig::default().stack_depth(), 0);
        let deep = MemoryConfig {
            callstack_depth: Some(1000),
            ..MemoryConfig::default()
        };
        assert_eq!(deep.stack_depth(), crate::callstack::MAX_DEPTH);
        let e = MemoryMode::parse("sampled:lots").unwrap_err();
        assert!(e.contains("TACHYON_MEMORY"), "{e}");
        assert!(MemoryMode::parse("always").is_err());
    }
}

//! Tachyon's trace processor: imports a Perfetto protobuf trace (Tachyon's own or any other
//! tool's; plain, gzip-compressed, or with `compressed_packets` inside) into an embedded SQLite
//! database whose tables and columns carry Perfetto's trace processor names, so existing
//! queries work unchanged. The large tables (`slice`, `args`) stay in compact in-memory form
//! and SQLite reads them through virtual tables; a trace whose import would not fit in the
//! machine's memory is refused up front ([`Error::OutOfMemory`]).
//!
//! ```
//! use tachyon_processor::{Options, TraceProcessor, Value};
//!
//! // A one-packet trace: an instant "hello" at t = 1000 on the default track.
//! // (Trace.packet { trusted_packet_sequence_id: 1, timestamp: 1000,
//! //   track_event { type: TYPE_INSTANT, name: "hello" } })
//! let trace = b"\x0a\x11\x50\x01\x40\xe8\x07\x5a\x0a\x48\x03\xba\x01\x05hello";
//! let tp = TraceProcessor::from_bytes(trace, &Options::default())?;
//! let result = tp.query("SELECT ts, dur, name FROM slice")?;
//! assert_eq!(result.rows[0], [Value::Integer(1000), Value::Integer(0), Value::Text("hello".into())]);
//! # Ok::<(), tachyon_processor::Error>(())
//! ```
//!
//! # What is imported
//!
//! * **TrackEvent**: slices (begin/end matched per track with depth, `parent_id`, `dur`, and
//!   `dur = -1` for slices that never ended), instants (`dur = 0`), counters (including
//!   incremental counters, unit multipliers and extra counter values), flows (`flow_ids`,
//!   `terminating_flow_ids`), debug annotations as args (nested dictionaries and arrays become
//!   `debug.a.b` and `debug.arr[0]`), source locations, and names and categories through
//!   interning.
//! * **Track, thread and process descriptors** with their hierarchy (`track`, `thread_track`,
//!   `process_track`, `counter_track`, `thread_counter_track`, `process_counter_track`,
//!   `thread`, `process`).
//! * **System probes** (`linux.process_stats`, `linux.sys_stats`): `ProcessTree` processes and
//!   threads (`process.parent_upid`, `name`, `cmdline`, `uid`; thread names, merged with the
//!   descriptors' by Perfetto's precedence) and `SysStats` counters on Perfetto's tracks
//!   (`MemTotal`…, `cpu.times.*` in `cpu_counter_track`, `num_forks`, …).
//! * **Per-sequence incremental state** exactly as Perfetto: interned data and
//!   TracePacketDefaults per `trusted_packet_sequence_id`; `SEQ_INCREMENTAL_STATE_CLEARED`
//!   resets it; packets with `SEQ_NEEDS_INCREMENTAL_STATE` are skipped while it is invalid (at
//!   the start and after `previous_packet_dropped`) and counted.
//! * **Clocks**: ClockSnapshots convert any clock (builtin, sequence-scoped 64–127, custom,
//!   incremental, with `unit_multiplier_ns`) to the trace clock; with no snapshot at all, raw
//!   timestamps are trace time.
//! * **TraceStats** become `stats` rows with Perfetto's names, indexes and severities, beside
//!   the importer's own counts. Malformed input is imported as far as it goes and the rest is
//!   counted in `stats`; the importer never panics on input.
//!
//! Events are sorted by timestamp before parsing, fully by default; [`SortMode::Windowed`]
//! follows Perfetto's incremental extraction for streamed traces.
//!
//! SQL functions: `extract_arg(arg_set_id, key)`.
// `unsafe` is allowed in `sql::vtab` (SQLite's virtual table interface) and `trim` (`malloc_trim`)
// only.
#![deny(unsafe_code)]
#![deny(missing_docs)]

// The import, by stage (data flows down the list; each stage imports only those below it,
// and the driver, `processor`, all of them): bytes → `tokenize` → `sort` → `importers` →
// `storage` → `sql`. ARCHITECTURE.md has the map.
/// A xorshift64 generator for the crate's randomized tests (fixed seeds, so a failure repeats).
#[cfg(test)]
pub(crate) fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// An argument value of any kind from one random word, drawn from a small value space so
/// values repeat: the arg tables' randomized tests.
#[cfg(test)]
pub(crate) fn random_arg_value(x: u64) -> storage::ArgValue {
    use storage::ArgValue;
    let v = (x >> 20) % 3000;
    match x % 7 {
        0 => ArgValue::Int(v as i64),
        1 => ArgValue::UInt(v),
        2 => ArgValue::Real(v as f64),
        3 => ArgValue::Str(v as u32),
        4 => ArgValue::Bool(v & 1 != 0),
        5 => ArgValue::Pointer(v),
        _ => ArgValue::Json(v as u32),
    }
}

mod importers;
mod sort;
mod sql;
mod storage;
mod tokenize;

// The driver and what it reports.
mod crashes;
mod error;
mod frames;
mod heap_report;
mod locks;
mod memory;
mod messages;
mod processor;
pub mod profiles;
mod trim;
mod zones;

pub use crashes::{Crash, CRASH_CATEGORY};
pub use error::Error;
pub use frames::FrameStats;
pub use heap_report::{HeapReport, HeapSite};
pub use locks::LockStats;
pub use messages::{priority_name, MessageStats};
pub use processor::{
    is_complete_statement, Options, Progress, QueryResult, SortMode, StatRow, TraceProcessor, Value,
};
pub use storage::stats::{Severity, Source};
pub use zones::ZoneStats;

/// Not an API (for the `lazy_views` fuzz target): whether the importer's hand-written decoders
/// of its per-event messages read `bytes` as the generated views do; `Err` names the first
/// difference.
#[doc(hidden)]
pub use tokenize::lazy::agrees_with_views as lazy_decoders_agree_with_views;

/// Not an API (for the import bench): walks a trace with the importer's own decoders, reading
/// the fields its `decode_only` baseline reads with the generated views; returns a checksum.
#[doc(hidden)]
pub use tokenize::lazy::decode_walk as lazy_decode_walk;

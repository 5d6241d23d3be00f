//! Tachyon's client SDK: what an instrumented process links to record Perfetto traces (open
//! them in [ui.perfetto.dev](https://ui.perfetto.dev), query them with `tachyon query`).
//!
//! What a program does first: start a session, record zones and counters, shut down.
//!
//! ```
//! // `tachyon::init()` starts from the environment instead: TACHYON_OUT (the file, default
//! // `trace.pftrace`), TACHYON_CATEGORIES, ..., or system mode when a `tachyon traced` daemon
//! // listens (`tachyon record -- ./my-program` sets that up). Here, a trace kept in memory.
//! tachyon::start(tachyon::Config::in_memory())?;
//!
//! fn parse(input: &str) -> usize {
//!     let _zone = tachyon::zone!("parse", bytes = input.len()); // a slice until the guard drops
//!     input.split_whitespace().count()
//! }
//! for (i, line) in ["a b c", "d e"].iter().enumerate() {
//!     let _frame = tachyon::zone!("io", "line", index = i); // category "io"
//!     let words = parse(line);
//!     tachyon::counter!("words", words); // a counter track
//!     tachyon::instant!("line done");
//! }
//!
//! let report = tachyon::shutdown()?.expect("a session was running");
//! assert_eq!(report.writers.packets_dropped, 0);
//! assert!(!report.trace.is_empty()); // with `Config::from_env()` or `init()`: written to a file
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - Instrumentation: [`zone!`], [`instant!`], [`counter!`], [`begin!`] / [`instant_on!`] on a
//!   [`Track`], [`Flow`]s between events, [`set_thread_name`]. A disabled callsite costs one
//!   relaxed load; with the cargo feature `enabled` off (`default-features = false`, as libraries
//!   should depend on Tachyon) every macro compiles to nothing.
//! - Sessions: [`start`] with a [`Config`], [`init`] from the environment (with an exit hook that
//!   writes the trace), [`shutdown`] for the [`Report`].
//! - Call stacks: `zone!(.., callstack)`, `TACHYON_CALLSTACK`, capture and interning in
//!   [`callstack`]; CPU sampling (`Config::sampling_hz`) in [`sampling`].
//! - Cargo features: `enabled` (default: the macros record), `in-process` (default: the
//!   service as a thread of this process, writing the trace itself), `memory` (default:
//!   allocations attributed to zones), `dwarf-unwind` (default: call stacks unwound with
//!   `framehop` over `.eh_frame`), `system` (default: system mode, into a `tachyon traced`
//!   daemon; brings `rustix`), `capture` (default: live capture by `tachyon capture`; brings
//!   `lz4_flex`), `macros` (`#[tachyon::instrument]`, brings the proc-macro stack), `deflate`
//!   (`Config::compress`; brings `miniz_oxide`), `log-bridge` (`log` records on the trace),
//!   `symbolize` (symbols appended when a session ends; brings `addr2line`). Without
//!   `in-process` a program traces only into a daemon or to a capture, and [`init`] with
//!   neither at hand starts nothing; `docs/client-crate.md` has the trees.
//! - For other instrumentation libraries (the `tracing` Layer in `tracing-tachyon`):
//!   [`integration`]. For those who build backends: the writer API (arbiter, trace writers, commit
//!   sinks, sessions) in [`backend`]; the trace clock in [`clock`].
//!
//! The service side (copying committed chunks into central buffers, reading packets out) is
//! `tachyon-service`. It runs as a thread of this process, or in a `tachyon traced` daemon that
//! owns the trace of many processes (system mode: set `TACHYON_PRODUCER_SOCK`, see [`init`]);
//! or the process streams its trace to `tachyon capture` while it runs (live capture: set
//! `TACHYON_LISTEN`, see `docs/capture.md`).
//!
//! When the process crashes (a fatal signal, a panic), the [`crash`] handler records the crash
//! in the trace and saves it before the process dies as it would have.
#![deny(missing_docs)]

pub mod alloc;
pub mod backend;
pub mod callstack;
#[cfg(feature = "capture")]
mod capture;
pub mod clock;
mod cpu_usage;
pub mod crash;
mod init;
#[cfg(feature = "log-bridge")]
pub mod log_bridge;
// CPU sampling runs in in-process sessions: without that backend its runtime is unused.
#[cfg_attr(not(feature = "in-process"), allow(dead_code))]
pub mod sampling;
#[cfg(feature = "in-process")]
mod session;
pub mod sync;
#[cfg(feature = "system")]
mod system;
// With no backend at all (neither `in-process` nor `system`) nothing starts a session: the
// session side of the instrumentation is compiled but unused.
#[cfg_attr(not(any(feature = "in-process", feature = "system")), allow(dead_code))]
mod track_event;
mod writer;

pub use init::{init, is_active, shutdown, start, Backend, Config, ConfigError, Report};
pub use tachyon_abi::FillPolicy;
/// The function attribute: a [`zone!`] around every call of the function (cargo feature
/// `macros`).
#[cfg(feature = "macros")]
pub use tachyon_macros::instrument;
pub use track_event::integration;
#[doc(hidden)]
pub use track_event::message as __message;
pub use track_event::message::MAX_MESSAGE_LEN;
pub use track_event::{
    __rt, set_process_name, set_thread_name, ArgValue, Callsite, CallsiteKind, CategoryFilter,
    CounterSample, CounterTrack, CounterValue, Enabled, EventContext, Flow, Track, TrackSlice,
    Unit, ZoneGuard, COMPILED_IN,
};
pub use track_event::{frame, set_thread_name_with_hint, Level, Plot, PlotKind};

// Types that appear in `Config` and `Report`; the rest of the writer API is in `backend`.
#[cfg(feature = "system")]
pub use backend::SystemReport;
pub use backend::{ArbiterStats, BufferExhaustedPolicy};
// Live capture: waiting for a capture, and what the backend reports.
#[cfg(feature = "capture")]
pub use capture::{wait_for_capture, CaptureReport, EXIT_SEND_BUDGET};

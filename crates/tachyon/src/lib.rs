//! Tachyon's client SDK: what an instrumented process links to record Perfetto traces.
//!
//! This release holds the trace clock ([`clock`]), the instrumentation macros and the session
//! entry points ([`start`], [`init`], [`shutdown`]); the low-level writer API (arbiter, trace
//! writers, commit sinks, sessions) is in [`backend`].
//!
//! The service side (copying committed chunks into central buffers, reading packets out) is
//! `tachyon-service`. It runs as a thread of this process, or in a `tachyon traced` daemon that
//! owns the trace of many processes (system mode: set `TACHYON_PRODUCER_SOCK`, see [`init`]).
#![deny(missing_docs)]

pub mod backend;
pub mod clock;
mod cpu_usage;
mod init;
#[cfg(feature = "log-bridge")]
pub mod log_bridge;
mod session;
pub mod sync;
mod system;
mod track_event;
mod writer;

pub use init::{init, is_active, shutdown, start, Backend, Config, ConfigError, Report};
/// The function attribute: a [`zone!`] around every call of the function.
pub use tachyon_macros::instrument;
pub use tachyon_service::FillPolicy;
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
pub use backend::{ArbiterStats, BufferExhaustedPolicy, SystemReport};

//! Tachyon's client SDK: what an instrumented process links to record Perfetto traces.
//!
//! This release holds the writer side of the data path, the trace clock ([`clock`]) and the
//! in-process session ([`InProcessSession`]); categories, macros and interning come on top:
//!
//! - [`SmbArbiter`] shares a shared memory buffer (SMB) between the process's writers, without a
//!   lock: chunks are taken with compare-and-swaps on the buffer's page headers.
//! - [`TraceWriter`] (one per thread, one packet sequence) serializes each trace packet with
//!   protozero straight into its chunk; packets that do not fit continue in the next chunk, and
//!   sizes that land in chunks already handed off travel as patches. When the buffer is full it
//!   stalls briefly or drops, as its [`BufferExhaustedPolicy`] says, counts every lost packet and
//!   marks the loss in the trace. It never aborts and never waits without bound.
//! - Writers hand chunks to the service through a [`CommitSink`]; [`commit_channel`] is the
//!   in-process one.
//! - [`SmbArbiter::with_thread_writer`] keeps one writer per thread and flushes it when the
//!   thread exits.
//!
//! ```
//! use std::sync::Arc;
//! use tachyon::{commit_channel, ArbiterConfig, OwnedSmb, PageSize, SmbArbiter};
//!
//! let smb = Arc::new(OwnedSmb::new(64 * 1024, PageSize::Kib4)?);
//! let (sink, commits) = commit_channel();
//! // SAFETY: nothing in this process scrapes chunks while they are being written.
//! let arbiter = unsafe { SmbArbiter::new(Arc::clone(&smb), ArbiterConfig::default(), sink) };
//! let mut writer = arbiter.create_trace_writer(0)?;
//! writer.write_packet(|packet| packet.set_timestamp(42));
//! writer.flush(); // hands the partly filled chunk to the service
//! let commit = commits.try_recv()?.expect("one commit");
//! assert_eq!(commit.chunks_to_move.len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The service side (copying committed chunks into central buffers, reading packets out) is
//! `tachyon-service`. It runs as a thread of this process ([`InProcessSession`]), or in a
//! `tachyon traced` daemon that owns the trace of many processes ([`SystemSession`], system
//! mode: set `TACHYON_PRODUCER_SOCK`, see [`init`]).
#![deny(missing_docs)]

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
pub use track_event::{
    __rt, set_process_name, set_thread_name, ArgValue, Callsite, CallsiteKind, CategoryFilter,
    CounterSample, CounterTrack, CounterValue, Enabled, EventContext, Flow, Track, TrackSlice,
    Unit, ZoneGuard, COMPILED_IN,
};
pub use track_event::{frame, set_thread_name_with_hint, Level, Plot, PlotKind};

pub use session::{InProcessSession, SessionOptions, StopReport};
pub use system::{SystemReport, SystemSession, DAEMON_CONNECT_BUDGET};
pub use tachyon_abi::{CommitRequest, OwnedSmb, PageLayout, PageSize, SharedMemoryAbi};
pub use tachyon_service::SessionConfig;
pub use writer::{
    commit_channel, default_layout, ArbiterConfig, ArbiterError, ArbiterStats,
    BufferExhaustedPolicy, ChannelCommitSink, CommitReceiver, CommitSink, Disconnected, SmbArbiter,
    SmbMemory, TracePacketHandle, TraceWriter, WriterStats, DEFAULT_STALL_THEN_DROP_TIMEOUT,
    DEFAULT_STALL_TIMEOUT, PREVIOUS_PACKET_DROPPED_SMB_FULL, SCRATCH_CHUNK_SIZE,
};

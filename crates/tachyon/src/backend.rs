//! The low-level writer API, for those who build backends: the pieces [`start`](crate::start)
//! assembles, usable on their own.
//!
//! Instrumented programs do not need this module: [`start`](crate::start) / [`init`](crate::init)
//! and the macros cover them. It is for a service, a probe or a test that writes trace packets
//! itself.
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
//! - [`InProcessSession`] runs the service as a thread of this process; [`SystemSession`]
//!   connects to a `tachyon traced` daemon (system mode); [`CaptureServer`] streams to
//!   `tachyon capture` (live capture).
//!
//! ```
//! use std::sync::Arc;
//! use tachyon::backend::{commit_channel, ArbiterConfig, OwnedSmb, PageSize, SmbArbiter};
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

#[cfg(feature = "capture")]
pub use crate::capture::CaptureServer;
#[cfg(feature = "in-process")]
pub use crate::session::{InProcessSession, SessionOptions, StopReport};
#[cfg(feature = "system")]
pub use crate::system::{SystemReport, SystemSession, DAEMON_CONNECT_BUDGET};
pub use crate::writer::{
    commit_channel, default_layout, ArbiterConfig, ArbiterError, ArbiterStats,
    BufferExhaustedPolicy, ChannelCommitSink, CommitReceiver, CommitSink, Disconnected, SmbArbiter,
    SmbMemory, TracePacketHandle, TraceWriter, WriterStats, DEFAULT_STALL_THEN_DROP_TIMEOUT,
    DEFAULT_STALL_TIMEOUT, PREVIOUS_PACKET_DROPPED_SMB_FULL, SCRATCH_CHUNK_SIZE,
};
pub use tachyon_abi::FillPolicy;
pub use tachyon_abi::{CommitRequest, OwnedSmb, PageLayout, PageSize, SharedMemoryAbi};
#[cfg(feature = "in-process")]
pub use tachyon_service::SessionConfig;

//! The client side of the data path: trace writers serializing packets into the shared memory
//! buffer, the arbiter sharing the buffer out, and commits to the service.
//!
//! ```text
//!  thread ── TraceWriter ──protozero──▶ chunk (BeingWritten) in the SMB
//!                │  chunk full / flush / patches ready
//!                ▼
//!           CommitSink ── CommitRequest{chunks_to_move, chunks_to_patch} ──▶ service
//! ```
//!
//! - `arbiter.rs`: [`SmbArbiter`] (lock-free chunk acquisition, writer ids, policies).
//! - `trace_writer.rs`: [`TraceWriter`] and [`TracePacketHandle`] (fragments, count inflation,
//!   patches, drops); the rustdoc of `TraceWriter` describes the exact behaviour.
//! - `patch_list.rs`: patch slots for size fields in chunks already handed off.
//! - `commit.rs`: [`CommitSink`] and the channel the in-process service reads.
//! - `thread_local.rs`: one writer per thread, flushed when the thread exits.

mod arbiter;
mod commit;
mod patch_list;
mod thread_local;
mod trace_writer;

pub use arbiter::{
    default_layout, ArbiterConfig, ArbiterError, ArbiterStats, BufferExhaustedPolicy, SmbArbiter,
    SmbMemory, DEFAULT_STALL_THEN_DROP_TIMEOUT, DEFAULT_STALL_TIMEOUT,
};
pub use commit::{commit_channel, ChannelCommitSink, CommitReceiver, CommitSink, Disconnected};
pub use trace_writer::{
    TracePacketHandle, TraceWriter, WriterStats, PREVIOUS_PACKET_DROPPED_SMB_FULL,
    SCRATCH_CHUNK_SIZE,
};

//! Tachyon's tracing service core: the central [`TraceBuffer`] that chunks from producers are
//! copied into, with Perfetto's semantics — `RING_BUFFER` or `DISCARD`, per-sequence order,
//! packets reassembled from fragments and emitted only whole, patches, scraping — and exact
//! accounting of every packet that could not be emitted.
//!
//! ```
//! use tachyon_service::{ChunkToCopy, FillPolicy, TraceBuffer};
//!
//! let mut buf = TraceBuffer::new(64 * 1024, FillPolicy::RingBuffer);
//! // A chunk with two packets, each behind a 1-byte fragment header.
//! let payload = [3, b'a', b'b', b'c', 1, b'd'];
//! buf.copy_chunk(&ChunkToCopy {
//!     producer: 1, writer: 1, chunk_id: 0, num_fragments: 2, flags: 0,
//!     payload: &payload, complete: true,
//! });
//! let mut packets = Vec::new();
//! buf.read_packets(true, |_, fragments| packets.push(fragments.concat()));
//! assert_eq!(packets, [b"abc".to_vec(), b"d".to_vec()]);
//! assert_eq!(buf.losses().total(), 0);
//! ```
// `unsafe` only in `populate` (the `madvise` calls).
#![deny(unsafe_code)]
#![deny(missing_docs)]

mod chunk_index;
mod commit;
#[cfg(feature = "deflate")]
mod compress;
mod fast_hash;
mod inprocess;
mod populate;
mod readout;
mod session;
mod stats;
mod trace_buffer;

pub use commit::{apply_commit, scrape, scrape_with, CommitStats, ProducerState};
pub use inprocess::{CommitPump, CommitSource, InProcessService, ProducerHooks, PUMP_STEP};
pub use readout::{
    validate_packet, write_record, InvalidPacket, PacketWriter, ProducerIdentity,
    RESERVED_PACKET_FIELDS, SERVICE_SEQUENCE_ID,
};
pub use session::{
    BufferSpec, Compression, ConfigError, DataSourceSpec, ProducerFilter, ServiceCore,
    ServiceWideStats, SessionConfig, SessionStats, DEFAULT_DATA_SOURCE_STOP_TIMEOUT,
    DEFAULT_FILE_WRITE_PERIOD, DEFAULT_FLUSH_TIMEOUT, MIN_FILE_WRITE_PERIOD, STREAM_STEP_CHUNKS,
};
pub use stats::{BufferStats, LossCounters};
/// A patch for [`TraceBuffer::try_patch_chunk`] (the shared ABI vocabulary).
pub use tachyon_abi::Patch;
pub use trace_buffer::{
    data_loss, ChunkId, ChunkToCopy, FillPolicy, PacketInfo, ProducerId, TraceBuffer, WriterId,
    CHUNK_NEEDS_PATCHING, FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK,
    LAST_PACKET_CONTINUES_ON_NEXT_CHUNK, PACKET_SIZE_DROP_PACKET,
};

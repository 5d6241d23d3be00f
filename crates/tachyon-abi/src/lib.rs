//! The shared memory buffer (SMB) between a Tachyon producer and the tracing service, byte for
//! byte compatible with Perfetto's shared memory ABI.
//!
//! Every producer shares one SMB with the service. Producer threads acquire *chunks* of it,
//! serialize trace packets straight into them, and mark them complete; the service acquires
//! complete chunks, copies them into its central buffer and frees them. The two sides never
//! lock each other: each chunk's state lives in two bits of its page's header word, and every
//! transition is a compare-and-swap on that word.
//!
//! - [`SharedMemoryAbi`]: the producer's view (partition pages, acquire/complete chunks).
//! - [`ServiceView`]: the service's view of the same memory, written by an **untrusted**
//!   producer: every load is atomic and bounds-checked, every impossible value an [`AbiError`].
//! - [`OwnedSmb`]: a buffer allocated in-process; a memfd mapping is viewed through the
//!   `unsafe` `from_raw_parts` constructors.
//! - Plain-value encodings: [`PageHeader`], [`HeaderBitmap`], [`ChunkHeader`], [`Packets`],
//!   [`ChunkFlags`], and [`Fragments`] to split a copied payload into packets.
//!
//! # Layout
//!
//! All integers are little-endian. Offsets are in bytes.
//!
//! ```text
//!  SMB: size = num_pages * page_size (<= 32 MiB), base 4 KiB aligned
//!  +-------------+-------------+-------------+-----+---------------+
//!  |   page 0    |   page 1    |   page 2    | ... | page N-1      |   page_size: 4, 8, 16
//!  +-------------+-------------+-------------+-----+---------------+   or 32 KiB
//!
//!  Page, split in K chunks (layout DivK), chunk_size = ((page_size - 8) / K) & !3
//!  0            8              8+cs            8+2cs        8+K*cs      page_size
//!  +------------+--------------+---------------+-----+------+---------+
//!  | page hdr   |   chunk 0    |   chunk 1     | ... | K-1  | unused  |
//!  +------------+--------------+---------------+-----+------+---------+
//!
//!  Page header (8 bytes)
//!  0                                   4                         8
//!  +-----------------------------------+-------------------------+
//!  | header_bitmap (atomic u32)        | reserved (u32)          |
//!  +-----------------------------------+-------------------------+
//!   bit 31      reserved, 0
//!   bits 28-30  layout: 0 not partitioned, 1 Div1, 2 Div2, 3 Div4, 4 Div7, 5 Div14
//!               (6, 7 reserved)
//!   bits 2i..2i+1  state of chunk i, i = 0..13:
//!               0 Free, 1 BeingWritten, 2 BeingRead, 3 Complete
//!
//!  Chunk (chunk_size bytes, 4-aligned)
//!  0                  4              6              8
//!  +------------------+--------------+--------------+-------------------------------+
//!  | chunk_id (u32)   | writer_id    | packets      | payload (chunk_size - 8)      |
//!  |                  | (u16)        | (u16)        |                               |
//!  +------------------+--------------+--------------+-------------------------------+
//!   packets: bits 0-9 count (<= 1023), bits 10-15 flags:
//!            1 first packet continues from chunk_id - 1
//!            2 last packet continues on chunk_id + 1
//!            4 needs patching (size fields arrive out of band)
//!
//!  Payload: one fragment per counted packet
//!  +--------+--------------+--------+------------+-----+--------+---------+
//!  | size 0 | fragment 0   | size 1 | fragment 1 | ... | size n | ...     |
//!  +--------+--------------+--------+------------+-----+--------+---------+
//!   size: varint of 1..4 bytes (usually the 4-byte redundant form, 0x80-padded);
//!         2^28 - 1 = the writer dropped this packet, ignore the rest of the chunk
//! ```
//!
//! Chunk transitions (and who makes them):
//!
//! ```text
//!  Free --(producer)--> BeingWritten --(producer)--> Complete --(service)--> BeingRead
//!    ^                                                                          |
//!    +-------------------------------(service)---------------------------------+
//! ```
//!
//! The service may also copy BeingWritten chunks without changing their state ("scraping",
//! [`ServiceView::scrape_chunk`]): the producer bumps the packet count *before* each packet, so
//! all counted packets but the last are finished.
//!
//! # Example
//!
//! ```
//! use tachyon_abi::{
//!     encode_fragment_header, ChunkHeader, Fragment, OwnedSmb, PageLayout, PageSize,
//! };
//!
//! let smb = OwnedSmb::new(64 * 1024, PageSize::Kib4)?;
//! // Producer: take a chunk of page 0 (splitting the page in 4) for writer 1, chunk id 0.
//! let producer = smb.producer();
//! let header = ChunkHeader::new(1, 0);
//! let mut chunk = producer.try_acquire_any_chunk_for_writing(0, PageLayout::Div4, header)?;
//! chunk.increment_packet_count()?;
//! chunk.write_payload(0, &encode_fragment_header(3).unwrap())?;
//! chunk.write_payload(4, b"abc")?;
//! producer.release_chunk_as_complete(chunk)?;
//! // Service: take the complete chunk, copy it out, free it, then parse the copy.
//! let service = smb.service();
//! let read = service.try_acquire_chunk_for_reading(0, 0)?;
//! let copy = read.copy()?;
//! service.release_chunk_as_free(read)?;
//! assert_eq!(copy.fragments().collect::<Result<Vec<_>, _>>()?, [Fragment::Data(b"abc")]);
//! # Ok::<(), tachyon_abi::AbiError>(())
//! ```
//!
//! # Compatibility
//!
//! The bytes are the promise: the layout above matches Perfetto's
//! `include/perfetto/ext/tracing/core/shared_memory_abi.h`, so Perfetto producers and services
//! can share a buffer with Tachyon ones. The Rust API may change between versions.
//! Little-endian targets only, as Perfetto.
//!
//! Built with `--cfg loom`, the crate's atomics come from loom (see `tests/loom.rs`).

#![deny(missing_docs)]

#[cfg(target_endian = "big")]
compile_error!("the shared memory ABI is little-endian; big-endian targets are not supported");

mod commit;
mod error;
mod fragment;
mod layout;
mod owned;
mod producer;
mod raw;
mod service;
mod smb;
mod sync;

pub use commit::{ChunkToMove, ChunkToPatch, CommitRequest, Patch};
pub use error::AbiError;
pub use fragment::{
    decode_fragment_header, encode_fragment_header, Fragment, Fragments,
    DROP_PACKET_FRAGMENT_HEADER,
};
pub use layout::{
    chunk_size, ChunkFlags, ChunkHeader, ChunkState, HeaderBitmap, Packets, PageHeader, PageLayout,
    PageSize, ALL_CHUNKS_COMPLETE, ALL_CHUNKS_MASK, CAS_RETRY_ATTEMPTS, CHUNK_ALIGNMENT,
    CHUNK_HEADER_SIZE, CHUNK_STATE_BITS, CHUNK_STATE_MASK, DEFAULT_SMB_SIZE, FRAGMENT_HEADER_SIZE,
    LAYOUT_MASK, LAYOUT_SHIFT, MAX_CHUNKS_PER_PAGE, MAX_PACKET_COUNT, MAX_PAGE_SIZE, MAX_SMB_SIZE,
    MAX_WRITER_ID, MAX_WRITER_PACKET_COUNT, MIN_PAGE_SIZE, NUM_CHUNKS_FOR_LAYOUT,
    PACKET_COUNT_BITS, PACKET_SIZE_DROP_PACKET, PAGE_HEADER_SIZE, RESERVED_BITMAP_BIT,
    SMB_ALIGNMENT,
};
pub use owned::OwnedSmb;
pub use producer::{Chunk, SharedMemoryAbi};
pub use service::{ChunkCopy, ReadChunk, ReadChunks, ServiceView};

/// How a full central buffer behaves (Perfetto's `BufferConfig.FillPolicy`). The service's
/// vocabulary, here so that a producer's configuration can name it without the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FillPolicy {
    /// Overwrite the oldest chunks (the default).
    RingBuffer,
    /// Keep the oldest data; refuse everything once full.
    Discard,
}

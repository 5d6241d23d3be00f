//! The one error type of the crate.

use core::fmt;

use crate::layout::{ChunkState, PageLayout};

/// Why an operation on the shared memory buffer, or the decoding of something read from it,
/// failed.
///
/// Producer memory is untrusted, so every variant can be caused by a hostile or buggy peer; none
/// is a reason to panic. Variants carry the offending values for logs and stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbiError {
    // --- geometry ---
    /// The page size is not 4, 8, 16 or 32 KiB.
    InvalidPageSize {
        /// The rejected size in bytes.
        page_size: usize,
    },
    /// The buffer size is 0, not a multiple of the page size, or above
    /// [`MAX_SMB_SIZE`](crate::MAX_SMB_SIZE).
    InvalidBufferSize {
        /// The rejected size in bytes.
        size: usize,
        /// The page size it was checked against.
        page_size: usize,
    },
    /// The buffer does not start on a 4 KiB boundary.
    MisalignedBuffer {
        /// The buffer's address.
        addr: usize,
    },
    /// A page index at or past the number of pages.
    PageOutOfRange {
        /// The rejected index.
        page_idx: usize,
        /// Pages in the buffer.
        num_pages: usize,
    },
    /// A chunk index at or past the number of chunks of the page's current layout.
    ChunkOutOfRange {
        /// The rejected index.
        chunk_idx: usize,
        /// Chunks in the page's current layout (0 if the page is not partitioned).
        num_chunks: usize,
    },

    // --- page header ---
    /// The page header bitmap names layout 6 or 7, which are reserved.
    InvalidLayout {
        /// The 3-bit layout field.
        bits: u32,
    },
    /// Bit 31 of the page header bitmap, reserved, is set.
    ReservedBitSet {
        /// The whole bitmap.
        bitmap: u32,
    },
    /// An unpartitioned page has chunk states set.
    StateWithoutLayout {
        /// The whole bitmap.
        bitmap: u32,
    },
    /// A chunk the layout does not have is in a state other than free.
    StateBeyondLayout {
        /// The whole bitmap.
        bitmap: u32,
    },

    // --- transitions ---
    /// The page is not partitioned, so it has no chunk to acquire.
    PageNotPartitioned,
    /// The chunk is not in the state the transition starts from (another thread took it, or the
    /// peer broke the protocol).
    UnexpectedState {
        /// The state the transition needs.
        expected: ChunkState,
        /// The state found.
        found: ChunkState,
    },
    /// The page was re-partitioned while one of its chunks was held: only a peer breaking the
    /// protocol can do that.
    LayoutChanged {
        /// The layout the chunk was acquired under.
        expected: PageLayout,
        /// The raw layout field found now.
        found_bits: u32,
    },
    /// No free chunk in the page.
    NoFreeChunk,
    /// A page that must be read whole has a chunk still being written.
    ChunkBeingWritten {
        /// The first such chunk.
        chunk_idx: usize,
    },
    /// The page header kept changing under the compare-and-swap
    /// ([`CAS_RETRY_ATTEMPTS`](crate::CAS_RETRY_ATTEMPTS) attempts).
    Contention,
    /// A chunk handle was passed to a view of a different buffer.
    ForeignChunk,

    // --- chunk header and payload ---
    /// Writer id 0, or above [`MAX_WRITER_ID`](crate::MAX_WRITER_ID).
    InvalidWriterId {
        /// The rejected id.
        writer_id: u16,
    },
    /// Flags outside the three the ABI defines.
    UnknownChunkFlags {
        /// The 6-bit flags field.
        flags: u8,
    },
    /// The packet count claims more fragments than the payload can hold (each takes at least
    /// one byte).
    PacketCountTooLarge {
        /// The claimed count.
        count: u16,
        /// The chunk's payload size.
        payload_size: usize,
    },
    /// A continuation flag on a chunk with no packets.
    ContinuationWithoutPackets {
        /// The 6-bit flags field.
        flags: u8,
    },
    /// Incrementing the packet count would overflow its 10 bits.
    PacketCountOverflow,
    /// A payload access outside the chunk's payload.
    PayloadOutOfBounds {
        /// Offset of the access within the payload.
        offset: usize,
        /// Length of the access.
        len: usize,
        /// The chunk's payload size.
        payload_size: usize,
    },
    /// A destination buffer smaller than the chunk's payload.
    DestinationTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes offered.
        got: usize,
    },

    // --- fragments ---
    /// The packet count says a fragment starts at `offset`, but the payload ends there.
    MissingFragment {
        /// Index of the missing fragment.
        index: u16,
        /// Payload offset where its header should start.
        offset: usize,
    },
    /// A fragment size varint runs past the end of the payload.
    TruncatedFragmentHeader {
        /// Payload offset of the header.
        offset: usize,
    },
    /// A fragment size varint is longer than 4 bytes.
    OverlongFragmentHeader {
        /// Payload offset of the header.
        offset: usize,
    },
    /// A fragment runs past the end of the payload (and its size is not the drop sentinel).
    FragmentOutOfBounds {
        /// Payload offset of the fragment's data.
        offset: usize,
        /// The size the header claims.
        size: u32,
        /// Bytes left in the payload from `offset`.
        available: usize,
    },
}

impl fmt::Display for AbiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AbiError::InvalidPageSize { page_size } => {
                write!(f, "page size {page_size} is not 4, 8, 16 or 32 KiB")
            }
            AbiError::InvalidBufferSize { size, page_size } => write!(
                f,
                "buffer size {size} is not a non-zero multiple of the page size {page_size} \
                 within the 32 MiB limit"
            ),
            AbiError::MisalignedBuffer { addr } => {
                write!(f, "buffer at {addr:#x} is not 4 KiB aligned")
            }
            AbiError::PageOutOfRange {
                page_idx,
                num_pages,
            } => {
                write!(f, "page {page_idx} out of range ({num_pages} pages)")
            }
            AbiError::ChunkOutOfRange {
                chunk_idx,
                num_chunks,
            } => {
                write!(
                    f,
                    "chunk {chunk_idx} out of range (the page layout has {num_chunks})"
                )
            }
            AbiError::InvalidLayout { bits } => write!(f, "page layout {bits} is reserved"),
            AbiError::ReservedBitSet { bitmap } => {
                write!(f, "page header {bitmap:#010x} has the reserved bit 31 set")
            }
            AbiError::StateWithoutLayout { bitmap } => {
                write!(
                    f,
                    "page header {bitmap:#010x} has chunk states but no layout"
                )
            }
            AbiError::StateBeyondLayout { bitmap } => write!(
                f,
                "page header {bitmap:#010x} has states for chunks its layout does not have"
            ),
            AbiError::PageNotPartitioned => write!(f, "page is not partitioned"),
            AbiError::UnexpectedState { expected, found } => {
                write!(f, "chunk is {found:?}, expected {expected:?}")
            }
            AbiError::LayoutChanged {
                expected,
                found_bits,
            } => write!(
                f,
                "page layout changed to {found_bits} while a {expected:?} chunk was held"
            ),
            AbiError::NoFreeChunk => write!(f, "no free chunk in the page"),
            AbiError::ChunkBeingWritten { chunk_idx } => {
                write!(f, "chunk {chunk_idx} of the page is still being written")
            }
            AbiError::Contention => write!(f, "too much contention on the page header"),
            AbiError::ForeignChunk => write!(f, "chunk belongs to another buffer"),
            AbiError::InvalidWriterId { writer_id } => write!(f, "invalid writer id {writer_id}"),
            AbiError::UnknownChunkFlags { flags } => write!(f, "unknown chunk flags {flags:#x}"),
            AbiError::PacketCountTooLarge {
                count,
                payload_size,
            } => write!(
                f,
                "packet count {count} cannot fit in a {payload_size}-byte payload"
            ),
            AbiError::ContinuationWithoutPackets { flags } => {
                write!(
                    f,
                    "continuation flags {flags:#x} on a chunk without packets"
                )
            }
            AbiError::PacketCountOverflow => write!(f, "packet count would exceed 1023"),
            AbiError::PayloadOutOfBounds {
                offset,
                len,
                payload_size,
            } => write!(
                f,
                "payload access {offset}..{} outside a {payload_size}-byte payload",
                offset.saturating_add(len)
            ),
            AbiError::DestinationTooSmall { needed, got } => {
                write!(f, "destination holds {got} bytes, {needed} needed")
            }
            AbiError::MissingFragment { index, offset } => {
                write!(
                    f,
                    "fragment {index} missing: payload ends at offset {offset}"
                )
            }
            AbiError::TruncatedFragmentHeader { offset } => {
                write!(
                    f,
                    "fragment header at offset {offset} runs past the payload"
                )
            }
            AbiError::OverlongFragmentHeader { offset } => {
                write!(
                    f,
                    "fragment header at offset {offset} is longer than 4 bytes"
                )
            }
            AbiError::FragmentOutOfBounds {
                offset,
                size,
                available,
            } => write!(
                f,
                "fragment of {size} bytes at offset {offset} overruns the payload \
                 ({available} bytes left)"
            ),
        }
    }
}

impl std::error::Error for AbiError {}

//! The byte layout: constants, page sizes, page layouts, chunk states, and the page and chunk
//! headers as plain values.
//!
//! Nothing here touches shared memory. These are the encodings both sides agree on; the views in
//! [`crate::SharedMemoryAbi`] and [`crate::ServiceView`] load and store them atomically.
//!
//! Source of every number: Perfetto's `include/perfetto/ext/tracing/core/shared_memory_abi.h`
//! and `src/tracing/core/shared_memory_abi.cc` (checked against the tree around v58, 2026),
//! plus `include/perfetto/ext/tracing/core/basic_types.h` for the id limits and
//! `src/tracing/service/tracing_service_impl.{h,cc}` for the service-side size limits.

use core::fmt;
use core::mem::{offset_of, size_of};

use crate::error::AbiError;

// === constants ===

/// Size of the page header at the start of every page: `header_bitmap` (u32) + `reserved` (u32).
pub const PAGE_HEADER_SIZE: usize = 8;

/// Size of the chunk header at the start of every chunk:
/// `chunk_id` (u32), `writer_id` (u16), `packets` (u16).
pub const CHUNK_HEADER_SIZE: usize = 8;

/// Chunks start on 4-byte boundaries and their sizes are multiples of 4.
pub const CHUNK_ALIGNMENT: usize = 4;

/// Smallest page, and the unit every page size is a multiple of.
pub const MIN_PAGE_SIZE: usize = 4096;

/// Largest page the service accepts (Perfetto's ABI allows 64 KiB because `Chunk::size` is a
/// u16, but its TraceBuffer caps pages at 32 KiB and `EnsureValidShmSizes` only accepts
/// 4/8/16/32 KiB).
pub const MAX_PAGE_SIZE: usize = 32 * 1024;

/// Default shared memory buffer size (`kDefaultShmSize`).
pub const DEFAULT_SMB_SIZE: usize = 256 * 1024;

/// Largest shared memory buffer the service maps (`kMaxShmSize`).
pub const MAX_SMB_SIZE: usize = 32 * 1024 * 1024;

/// Required alignment of the buffer's base address (Perfetto `CHECK`s 4 KiB).
pub const SMB_ALIGNMENT: usize = 4096;

/// Most chunks a page can hold: 14 two-bit states fill bits 0–27 of the header bitmap.
pub const MAX_CHUNKS_PER_PAGE: usize = 14;

/// Bits per chunk state in the header bitmap (Perfetto's `kChunkShift`).
pub const CHUNK_STATE_BITS: u32 = 2;

/// Mask of one chunk state (Perfetto's `kChunkMask`).
pub const CHUNK_STATE_MASK: u32 = 0b11;

/// Bits 0–27 of the header bitmap: the states of chunks 0..14.
pub const ALL_CHUNKS_MASK: u32 = 0x0FFF_FFFF;

/// Every chunk state bit pair set to `Complete` (3).
pub const ALL_CHUNKS_COMPLETE: u32 = 0x0FFF_FFFF;

/// Bits 28–30 of the header bitmap: the [`PageLayout`].
pub const LAYOUT_MASK: u32 = 0x7000_0000;

/// Shift of the layout field in the header bitmap.
pub const LAYOUT_SHIFT: u32 = 28;

/// Bit 31 of the header bitmap, reserved (always 0 in the current ABI).
pub const RESERVED_BITMAP_BIT: u32 = 0x8000_0000;

/// Number of chunks per layout value 0..=7 (`kNumChunksForLayout`): 6 and 7 are reserved.
pub const NUM_CHUNKS_FOR_LAYOUT: [usize; 8] = [0, 1, 2, 4, 7, 14, 0, 0];

/// Bits of the packet count in the `packets` word.
pub const PACKET_COUNT_BITS: u32 = 10;

/// Largest packet count the 10-bit field holds (`Packets::kMaxCount`).
pub const MAX_PACKET_COUNT: u16 = (1 << PACKET_COUNT_BITS) - 1;

/// Largest packet count a writer uses, so that it can always inflate the count by one.
pub const MAX_WRITER_PACKET_COUNT: u16 = MAX_PACKET_COUNT - 1;

/// Largest valid writer id (`kMaxWriterID`, 2^15 − 1). Writer id 0 is invalid.
pub const MAX_WRITER_ID: u16 = (1 << 15) - 1;

/// Maximum size of the varint that prefixes every fragment (`kPacketHeaderSize`): 4, the size
/// of protozero's reserved length field.
pub const FRAGMENT_HEADER_SIZE: usize = protozero::wire::MESSAGE_LENGTH_FIELD_SIZE;

/// Fragment size meaning "the writer could not finish this packet; drop it"
/// (`kPacketSizeDropPacket` = protozero's `kMaxMessageLength` = 2^28 − 1).
pub const PACKET_SIZE_DROP_PACKET: u32 = protozero::wire::MAX_MESSAGE_LENGTH;

/// Number of compare-and-swap attempts before a page-header transition gives up
/// (`kRetryAttempts`).
pub const CAS_RETRY_ATTEMPTS: u32 = 64;

/// Chunk size for `num_chunks` chunks in a page of `page_size` bytes: the largest multiple of 4
/// that is ≤ `(page_size − 8) / num_chunks` (Perfetto's `GetChunkSize`). 0 chunks → 0.
///
/// ```
/// assert_eq!(tachyon_abi::chunk_size(4096, 14), 292);
/// assert_eq!(tachyon_abi::chunk_size(8192, 7), 1168);
/// ```
#[must_use]
pub const fn chunk_size(page_size: usize, num_chunks: usize) -> usize {
    if num_chunks == 0 || page_size < PAGE_HEADER_SIZE {
        return 0;
    }
    ((page_size - PAGE_HEADER_SIZE) / num_chunks) & !(CHUNK_ALIGNMENT - 1)
}

// === PageSize ===

/// A page size the service accepts: 4, 8, 16 or 32 KiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum PageSize {
    /// 4 KiB, Perfetto's default (`kDefaultShmPageSize`).
    Kib4 = 4096,
    /// 8 KiB.
    Kib8 = 8192,
    /// 16 KiB.
    Kib16 = 16384,
    /// 32 KiB, the largest page the service accepts.
    Kib32 = 32768,
}

impl PageSize {
    /// All accepted page sizes, smallest first.
    pub const ALL: [PageSize; 4] = [
        PageSize::Kib4,
        PageSize::Kib8,
        PageSize::Kib16,
        PageSize::Kib32,
    ];

    /// The page size for `bytes`, if it is one of 4096, 8192, 16384 or 32768.
    pub const fn from_bytes(bytes: usize) -> Result<PageSize, AbiError> {
        match bytes {
            4096 => Ok(PageSize::Kib4),
            8192 => Ok(PageSize::Kib8),
            16384 => Ok(PageSize::Kib16),
            32768 => Ok(PageSize::Kib32),
            _ => Err(AbiError::InvalidPageSize { page_size: bytes }),
        }
    }

    /// The size in bytes.
    #[must_use]
    pub const fn bytes(self) -> usize {
        self as usize
    }

    /// The size of each chunk of a page with this size and `layout` (0 when not partitioned).
    #[must_use]
    pub const fn chunk_size(self, layout: PageLayout) -> usize {
        chunk_size(self.bytes(), layout.num_chunks())
    }
}

// === PageLayout ===

/// How a page is split into chunks: bits 28–30 of the page header bitmap.
///
/// 7 and 14 were picked because `(4096 − 8) / 14 = 292` is already a multiple of 4, so a 4 KiB
/// page split 7 or 14 ways wastes no bytes to alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum PageLayout {
    /// 0: the page is free and not split yet (`kPageNotPartitioned`).
    NotPartitioned = 0,
    /// 1: one chunk (`kPageDiv1`), Perfetto's default.
    Div1 = 1,
    /// 2: two chunks (`kPageDiv2`).
    Div2 = 2,
    /// 3: four chunks (`kPageDiv4`).
    Div4 = 3,
    /// 4: seven chunks (`kPageDiv7`).
    Div7 = 4,
    /// 5: fourteen chunks (`kPageDiv14`).
    Div14 = 5,
}

impl PageLayout {
    /// The layouts that split a page into chunks, fewest chunks first.
    pub const PARTITIONED: [PageLayout; 5] = [
        PageLayout::Div1,
        PageLayout::Div2,
        PageLayout::Div4,
        PageLayout::Div7,
        PageLayout::Div14,
    ];

    /// Decodes a 3-bit layout value; 6 and 7 are reserved and rejected.
    pub const fn from_bits(bits: u32) -> Result<PageLayout, AbiError> {
        match bits {
            0 => Ok(PageLayout::NotPartitioned),
            1 => Ok(PageLayout::Div1),
            2 => Ok(PageLayout::Div2),
            3 => Ok(PageLayout::Div4),
            4 => Ok(PageLayout::Div7),
            5 => Ok(PageLayout::Div14),
            _ => Err(AbiError::InvalidLayout { bits }),
        }
    }

    /// The 3-bit value stored in bits 28–30.
    #[must_use]
    pub const fn bits(self) -> u32 {
        self as u32
    }

    /// How many chunks a page with this layout holds.
    #[must_use]
    pub const fn num_chunks(self) -> usize {
        NUM_CHUNKS_FOR_LAYOUT[self as usize]
    }
}

// === ChunkState ===

/// The two-bit state of one chunk in its page's header bitmap.
///
/// ```text
///   Free ──(producer: acquire for writing)──▶ BeingWritten
///    ▲                                            │
///    │ (service: release as free)                 │ (producer: release as complete)
///    │                                            ▼
///   BeingRead ◀──(service: acquire for reading)── Complete
/// ```
///
/// Those four arrows are the only transitions either view makes. The service may also copy a
/// `BeingWritten` or `Complete` chunk without changing its state ("scraping", on flush).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ChunkState {
    /// 0: the producer may acquire the chunk; the service must not touch it.
    Free = 0,
    /// 1: owned by a producer thread that is writing packets into it.
    BeingWritten = 1,
    /// 2: owned by the service, which is copying it out.
    BeingRead = 2,
    /// 3: the producer is done with it; the service may acquire it for reading.
    Complete = 3,
}

impl ChunkState {
    /// Decodes the low two bits of `bits` (every two-bit value is a state).
    #[must_use]
    pub const fn from_bits(bits: u32) -> ChunkState {
        match bits & CHUNK_STATE_MASK {
            0 => ChunkState::Free,
            1 => ChunkState::BeingWritten,
            2 => ChunkState::BeingRead,
            _ => ChunkState::Complete,
        }
    }

    /// The two-bit value.
    #[must_use]
    pub const fn bits(self) -> u32 {
        self as u32
    }
}

// === HeaderBitmap ===

/// The first word of a page header: chunk states in bits 0–27, layout in bits 28–30, bit 31
/// reserved.
///
/// ```text
///  31 | 30  29  28 | 27 26 | 25 24 | ... | 3  2 | 1  0
///  R  |   layout   | st 13 | st 12 | ... | st 1 | st 0
/// ```
///
/// An all-zero word is a free, unpartitioned page; a page returns to 0 when its last chunk is
/// freed. This is a plain value: decoding it does not check it (see [`HeaderBitmap::validate`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct HeaderBitmap(pub u32);

impl HeaderBitmap {
    /// The bitmap of a free, unpartitioned page.
    pub const FREE: HeaderBitmap = HeaderBitmap(0);

    /// A freshly partitioned page: `layout` set, every chunk `Free`.
    #[must_use]
    pub const fn partitioned(layout: PageLayout) -> HeaderBitmap {
        HeaderBitmap(layout.bits() << LAYOUT_SHIFT)
    }

    /// The raw 3-bit layout field, 0..=7 (6 and 7 are invalid).
    #[must_use]
    pub const fn layout_bits(self) -> u32 {
        (self.0 & LAYOUT_MASK) >> LAYOUT_SHIFT
    }

    /// The layout field, or [`AbiError::InvalidLayout`] for 6 and 7.
    pub const fn layout(self) -> Result<PageLayout, AbiError> {
        PageLayout::from_bits(self.layout_bits())
    }

    /// Number of chunks the layout field claims (0 for unpartitioned and reserved layouts).
    #[must_use]
    pub const fn num_chunks(self) -> usize {
        NUM_CHUNKS_FOR_LAYOUT[self.layout_bits() as usize]
    }

    /// The state bits of chunk `chunk_idx`, or `None` if `chunk_idx ≥ 14`. This reads the bits
    /// whatever the layout says; [`HeaderBitmap::validate`] checks they are consistent.
    #[must_use]
    pub const fn chunk_state(self, chunk_idx: usize) -> Option<ChunkState> {
        if chunk_idx >= MAX_CHUNKS_PER_PAGE {
            return None;
        }
        Some(ChunkState::from_bits(
            self.0 >> (chunk_idx as u32 * CHUNK_STATE_BITS),
        ))
    }

    /// This bitmap with chunk `chunk_idx` set to `state`.
    ///
    /// `chunk_idx` must be < 14 (debug builds assert it; release builds wrap it). Callers pass
    /// indices already checked against the layout.
    #[must_use]
    pub const fn with_chunk_state(self, chunk_idx: usize, state: ChunkState) -> HeaderBitmap {
        debug_assert!(chunk_idx < MAX_CHUNKS_PER_PAGE);
        let shift = (chunk_idx % MAX_CHUNKS_PER_PAGE) as u32 * CHUNK_STATE_BITS;
        HeaderBitmap((self.0 & !(CHUNK_STATE_MASK << shift)) | (state.bits() << shift))
    }

    /// Bit `i` set when chunk `i` exists in the layout and is in `state`.
    #[must_use]
    pub const fn chunks_in_state(self, state: ChunkState) -> u32 {
        let mut mask = 0;
        let mut i = 0;
        let n = self.num_chunks();
        while i < n {
            if (self.0 >> (i as u32 * CHUNK_STATE_BITS)) & CHUNK_STATE_MASK == state.bits() {
                mask |= 1 << i;
            }
            i += 1;
        }
        mask
    }

    /// Bit `i` set when chunk `i` exists in the layout and is not `Free` (Perfetto's
    /// `GetUsedChunks`).
    #[must_use]
    pub const fn used_chunks(self) -> u32 {
        let all = if self.num_chunks() == 0 {
            0
        } else {
            (1u32 << self.num_chunks()) - 1
        };
        all & !self.chunks_in_state(ChunkState::Free)
    }

    /// True when the page is partitioned and every one of its chunks is `Complete`.
    #[must_use]
    pub const fn is_complete(self) -> bool {
        let n = self.num_chunks();
        if n == 0 {
            return false;
        }
        let mask = (1u32 << (n as u32 * CHUNK_STATE_BITS)) - 1;
        self.0 & ALL_CHUNKS_MASK == ALL_CHUNKS_COMPLETE & mask
    }

    /// Checks the bitmap describes a state the protocol can reach and returns its layout.
    ///
    /// Rejected: the reserved bit 31 set ([`AbiError::ReservedBitSet`]); layout 6 or 7
    /// ([`AbiError::InvalidLayout`]); chunk states on an unpartitioned page
    /// ([`AbiError::StateWithoutLayout`]); non-free states for chunks the layout does not have
    /// ([`AbiError::StateBeyondLayout`]).
    pub const fn validate(self) -> Result<PageLayout, AbiError> {
        if self.0 & RESERVED_BITMAP_BIT != 0 {
            return Err(AbiError::ReservedBitSet { bitmap: self.0 });
        }
        let layout = match self.layout() {
            Ok(layout) => layout,
            Err(e) => return Err(e),
        };
        let states = self.0 & ALL_CHUNKS_MASK;
        let n = layout.num_chunks() as u32;
        if n == 0 {
            if states != 0 {
                return Err(AbiError::StateWithoutLayout { bitmap: self.0 });
            }
        } else if n < MAX_CHUNKS_PER_PAGE as u32 && states >> (n * CHUNK_STATE_BITS) != 0 {
            return Err(AbiError::StateBeyondLayout { bitmap: self.0 });
        }
        Ok(layout)
    }
}

impl fmt::Debug for HeaderBitmap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "HeaderBitmap({:#010x}: layout {}, states [",
            self.0,
            self.layout_bits()
        )?;
        for i in 0..self.num_chunks() {
            let state = ChunkState::from_bits(self.0 >> (i as u32 * CHUNK_STATE_BITS));
            let c = match state {
                ChunkState::Free => 'F',
                ChunkState::BeingWritten => 'W',
                ChunkState::BeingRead => 'R',
                ChunkState::Complete => 'C',
            };
            write!(f, "{c}")?;
        }
        write!(f, "])")
    }
}

// === PageHeader ===

/// The 8-byte header at offset 0 of every page, as a plain value.
///
/// In shared memory `header_bitmap` is an atomic u32 that both sides update with
/// compare-and-swap; `reserved` is never written by either side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(C)]
pub struct PageHeader {
    /// Chunk states and layout; see [`HeaderBitmap`].
    pub header_bitmap: HeaderBitmap,
    /// Unused; kept for future page-level flags.
    pub reserved: u32,
}

const _: () = assert!(size_of::<PageHeader>() == PAGE_HEADER_SIZE);
const _: () = assert!(offset_of!(PageHeader, header_bitmap) == 0);
const _: () = assert!(offset_of!(PageHeader, reserved) == 4);

impl PageHeader {
    /// Decodes the little-endian wire form.
    #[must_use]
    pub const fn from_bytes(b: [u8; 8]) -> PageHeader {
        PageHeader {
            header_bitmap: HeaderBitmap(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            reserved: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    /// Encodes the little-endian wire form.
    #[must_use]
    pub const fn to_bytes(self) -> [u8; 8] {
        let a = self.header_bitmap.0.to_le_bytes();
        let b = self.reserved.to_le_bytes();
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    }
}

// === ChunkFlags ===

/// The 6-bit flags field of a chunk's `packets` word. Only bits 0–2 are defined.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct ChunkFlags(pub u8);

impl ChunkFlags {
    /// No flag set.
    pub const NONE: ChunkFlags = ChunkFlags(0);
    /// The first fragment continues a packet from chunk `chunk_id − 1` of the same writer
    /// (`kFirstPacketContinuesFromPrevChunk`).
    pub const FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK: ChunkFlags = ChunkFlags(1 << 0);
    /// The last fragment continues on chunk `chunk_id + 1` of the same writer
    /// (`kLastPacketContinuesOnNextChunk`).
    pub const LAST_PACKET_CONTINUES_ON_NEXT_CHUNK: ChunkFlags = ChunkFlags(1 << 1);
    /// The last fragment has size fields that will be patched out of band; the chunk must not be
    /// read before the patches arrive (`kChunkNeedsPatching`).
    pub const CHUNK_NEEDS_PATCHING: ChunkFlags = ChunkFlags(1 << 2);
    /// The flags the ABI defines (`kFlagsMask`).
    pub const KNOWN: ChunkFlags = ChunkFlags(0b111);
    /// The 6 bits the field can hold.
    pub const FIELD_MASK: u8 = 0b11_1111;

    /// True when every flag of `other` is set in `self`.
    #[must_use]
    pub const fn contains(self, other: ChunkFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// True when only defined flags are set.
    #[must_use]
    pub const fn is_known(self) -> bool {
        self.0 & !ChunkFlags::KNOWN.0 == 0
    }

    /// `self` with the flags of `other` added.
    #[must_use]
    pub const fn union(self, other: ChunkFlags) -> ChunkFlags {
        ChunkFlags(self.0 | other.0)
    }

    /// `self` with the flags of `other` removed.
    #[must_use]
    pub const fn difference(self, other: ChunkFlags) -> ChunkFlags {
        ChunkFlags(self.0 & !other.0)
    }
}

impl core::ops::BitOr for ChunkFlags {
    type Output = ChunkFlags;
    fn bitor(self, rhs: ChunkFlags) -> ChunkFlags {
        self.union(rhs)
    }
}

impl fmt::Debug for ChunkFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(ChunkFlags, &str); 3] = [
            (
                ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK,
                "FIRST_CONTINUES",
            ),
            (
                ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK,
                "LAST_CONTINUES",
            ),
            (ChunkFlags::CHUNK_NEEDS_PATCHING, "NEEDS_PATCHING"),
        ];
        write!(f, "ChunkFlags(")?;
        let mut first = true;
        for (flag, name) in NAMES {
            if self.contains(flag) {
                if !first {
                    write!(f, " | ")?;
                }
                write!(f, "{name}")?;
                first = false;
            }
        }
        let unknown = self.0 & !ChunkFlags::KNOWN.0;
        if unknown != 0 {
            if !first {
                write!(f, " | ")?;
            }
            write!(f, "{unknown:#x}")?;
        } else if first {
            write!(f, "0")?;
        }
        write!(f, ")")
    }
}

// === Packets ===

/// The `packets` word of a chunk header: `count` in bits 0–9, `flags` in bits 10–15.
///
/// Perfetto declares it as a C bitfield `{ uint16_t count : 10; uint16_t flags : 6; }`; GCC and
/// Clang allocate bitfields from the least significant bit on little-endian targets, which gives
/// this encoding. It is encoded by hand here rather than through a bitfield crate.
///
/// The producer increments `count` (release store) *before* it starts writing a packet, so the
/// last counted packet of a chunk that is still being written may be unfinished.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Packets(pub u16);

impl Packets {
    /// No packets, no flags.
    pub const EMPTY: Packets = Packets(0);

    /// Encodes `count` (≤ 1023) and `flags` (6 bits), or `None` if either does not fit.
    #[must_use]
    pub const fn new(count: u16, flags: ChunkFlags) -> Option<Packets> {
        if count > MAX_PACKET_COUNT || flags.0 > ChunkFlags::FIELD_MASK {
            return None;
        }
        Some(Packets(count | (flags.0 as u16) << PACKET_COUNT_BITS))
    }

    /// The packet count, bits 0–9.
    #[must_use]
    pub const fn count(self) -> u16 {
        self.0 & MAX_PACKET_COUNT
    }

    /// The flags, bits 10–15.
    #[must_use]
    pub const fn flags(self) -> ChunkFlags {
        ChunkFlags((self.0 >> PACKET_COUNT_BITS) as u8)
    }
}

impl fmt::Debug for Packets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Packets")
            .field("count", &self.count())
            .field("flags", &self.flags())
            .finish()
    }
}

// === ChunkHeader ===

/// The 8-byte header at offset 0 of every chunk, as a plain value.
///
/// In shared memory:
/// - `chunk_id` and `writer_id` are written by the producer when it acquires the chunk
///   (Free → BeingWritten) and stay fixed until the service frees the chunk, which zeroes them.
/// - `packets` is release-stored by the producer each time it starts a packet or sets a flag, and
///   acquire-loaded by the service, so a service that scrapes a chunk sees every byte of the
///   packets the count covers (except possibly the last, still open one).
///
/// Perfetto declares `chunk_id` an `atomic<u32>` and `writer_id`/`packets` each an
/// `atomic<u16>`. This crate reads and writes bytes 4..8 as one u32 word
/// (`writer_id | packets << 16`): the bytes on the wire are the same, and it avoids racing
/// atomic accesses of different sizes on the same bytes, which Rust's memory model forbids.
/// Only the chunk's current owner writes that word, so storing `writer_id` again with the
/// count is harmless.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(C)]
pub struct ChunkHeader {
    /// Position of the chunk in its writer's sequence; wraps at 2^32 − 1.
    pub chunk_id: u32,
    /// The writer (packet sequence) within the producer, 1..=32767.
    pub writer_id: u16,
    /// Packet count and flags.
    pub packets: Packets,
}

const _: () = assert!(size_of::<ChunkHeader>() == CHUNK_HEADER_SIZE);
const _: () = assert!(core::mem::align_of::<ChunkHeader>() == CHUNK_ALIGNMENT);
const _: () = assert!(offset_of!(ChunkHeader, chunk_id) == 0);
const _: () = assert!(offset_of!(ChunkHeader, writer_id) == 4);
const _: () = assert!(offset_of!(ChunkHeader, packets) == 6);
const _: () = assert!(size_of::<Packets>() == 2);

impl ChunkHeader {
    /// A header for a chunk the writer is about to fill: no packets, no flags.
    #[must_use]
    pub const fn new(writer_id: u16, chunk_id: u32) -> ChunkHeader {
        ChunkHeader {
            chunk_id,
            writer_id,
            packets: Packets::EMPTY,
        }
    }

    /// Decodes the little-endian wire form.
    #[must_use]
    pub const fn from_bytes(b: [u8; 8]) -> ChunkHeader {
        ChunkHeader {
            chunk_id: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            writer_id: u16::from_le_bytes([b[4], b[5]]),
            packets: Packets(u16::from_le_bytes([b[6], b[7]])),
        }
    }

    /// Encodes the little-endian wire form.
    #[must_use]
    pub const fn to_bytes(self) -> [u8; 8] {
        let id = self.chunk_id.to_le_bytes();
        let w = self.writer_id.to_le_bytes();
        let p = self.packets.0.to_le_bytes();
        [id[0], id[1], id[2], id[3], w[0], w[1], p[0], p[1]]
    }

    /// The two 32-bit words as they sit in memory (word 0 = bytes 0..4, word 1 = bytes 4..8).
    #[must_use]
    pub(crate) const fn to_words(self) -> [u32; 2] {
        [self.chunk_id, pack_word1(self.writer_id, self.packets)]
    }

    /// Inverse of [`ChunkHeader::to_words`].
    #[must_use]
    pub(crate) const fn from_words(words: [u32; 2]) -> ChunkHeader {
        ChunkHeader {
            chunk_id: words[0],
            writer_id: words[1] as u16,
            packets: Packets((words[1] >> 16) as u16),
        }
    }

    /// Checks the header of a chunk whose payload is `payload_size` bytes.
    ///
    /// Rejected: writer id 0 or above [`MAX_WRITER_ID`] ([`AbiError::InvalidWriterId`]); flags
    /// outside bits 0–2 ([`AbiError::UnknownChunkFlags`]); a count larger than the number of
    /// fragments the payload can hold, at least one byte each
    /// ([`AbiError::PacketCountTooLarge`]); a continuation flag on a chunk without packets
    /// ([`AbiError::ContinuationWithoutPackets`]).
    pub const fn validate(&self, payload_size: usize) -> Result<(), AbiError> {
        if self.writer_id == 0 || self.writer_id > MAX_WRITER_ID {
            return Err(AbiError::InvalidWriterId {
                writer_id: self.writer_id,
            });
        }
        let flags = self.packets.flags();
        if !flags.is_known() {
            return Err(AbiError::UnknownChunkFlags { flags: flags.0 });
        }
        let count = self.packets.count();
        if count as usize > payload_size {
            return Err(AbiError::PacketCountTooLarge {
                count,
                payload_size,
            });
        }
        let continuation = ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK
            .union(ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK);
        if count == 0 && flags.0 & continuation.0 != 0 {
            return Err(AbiError::ContinuationWithoutPackets { flags: flags.0 });
        }
        Ok(())
    }
}

/// Word 1 of a chunk header (bytes 4..8, little-endian): `writer_id | packets << 16`.
pub(crate) const fn pack_word1(writer_id: u16, packets: Packets) -> u32 {
    writer_id as u32 | (packets.0 as u32) << 16
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn chunk_size_table_matches_perfettos_formula() {
        // (page size, [Div1, Div2, Div4, Div7, Div14]) computed by hand from
        // align4((page_size - 8) / n).
        let table: [(PageSize, [usize; 5]); 4] = [
            (PageSize::Kib4, [4088, 2044, 1020, 584, 292]),
            (PageSize::Kib8, [8184, 4092, 2044, 1168, 584]),
            (PageSize::Kib16, [16376, 8188, 4092, 2336, 1168]),
            (PageSize::Kib32, [32760, 16380, 8188, 4680, 2340]),
        ];
        for (page, sizes) in table {
            for (layout, want) in PageLayout::PARTITIONED.into_iter().zip(sizes) {
                assert_eq!(page.chunk_size(layout), want, "{page:?} {layout:?}");
                assert_eq!(want % CHUNK_ALIGNMENT, 0);
                let used = PAGE_HEADER_SIZE + layout.num_chunks() * want;
                assert!(used <= page.bytes());
                // Nothing bigger would still be aligned and fit.
                assert!(PAGE_HEADER_SIZE + layout.num_chunks() * (want + 4) > page.bytes());
            }
            assert_eq!(page.chunk_size(PageLayout::NotPartitioned), 0);
        }
    }

    #[test]
    fn layout_numbering_is_perfettos() {
        let want = [
            (0, PageLayout::NotPartitioned, 0),
            (1, PageLayout::Div1, 1),
            (2, PageLayout::Div2, 2),
            (3, PageLayout::Div4, 4),
            (4, PageLayout::Div7, 7),
            (5, PageLayout::Div14, 14),
        ];
        for (bits, layout, n) in want {
            assert_eq!(PageLayout::from_bits(bits), Ok(layout));
            assert_eq!(layout.bits(), bits);
            assert_eq!(layout.num_chunks(), n);
        }
        assert_eq!(
            PageLayout::from_bits(6),
            Err(AbiError::InvalidLayout { bits: 6 })
        );
        assert_eq!(
            PageLayout::from_bits(7),
            Err(AbiError::InvalidLayout { bits: 7 })
        );
    }

    #[test]
    fn chunk_state_numbering_is_perfettos() {
        assert_eq!(ChunkState::Free.bits(), 0);
        assert_eq!(ChunkState::BeingWritten.bits(), 1);
        assert_eq!(ChunkState::BeingRead.bits(), 2);
        assert_eq!(ChunkState::Complete.bits(), 3);
        for bits in 0..4 {
            assert_eq!(ChunkState::from_bits(bits).bits(), bits);
        }
    }

    #[test]
    fn page_header_word_div4_chunk2_complete() {
        // Layout Div4 = 3 in bits 28..31; chunk 2's state in bits 4..6; Complete = 3.
        let bitmap =
            HeaderBitmap::partitioned(PageLayout::Div4).with_chunk_state(2, ChunkState::Complete);
        assert_eq!(bitmap.0, 0x3000_0030);
        let header = PageHeader {
            header_bitmap: bitmap,
            reserved: 0,
        };
        assert_eq!(header.to_bytes(), [0x30, 0x00, 0x00, 0x30, 0, 0, 0, 0]);
        assert_eq!(PageHeader::from_bytes(header.to_bytes()), header);
        assert_eq!(bitmap.validate(), Ok(PageLayout::Div4));
        assert_eq!(bitmap.chunk_state(2), Some(ChunkState::Complete));
        assert_eq!(bitmap.chunk_state(0), Some(ChunkState::Free));
        assert_eq!(bitmap.chunk_state(14), None);
        assert_eq!(bitmap.used_chunks(), 0b0100);
        assert_eq!(bitmap.chunks_in_state(ChunkState::Free), 0b1011);
        assert!(!bitmap.is_complete());
    }

    #[test]
    fn page_header_word_div14_all_complete() {
        let mut bitmap = HeaderBitmap::partitioned(PageLayout::Div14);
        for i in 0..14 {
            bitmap = bitmap.with_chunk_state(i, ChunkState::Complete);
        }
        assert_eq!(bitmap.0, 0x5FFF_FFFF);
        assert!(bitmap.is_complete());
        assert_eq!(bitmap.validate(), Ok(PageLayout::Div14));
        let div1 = HeaderBitmap::partitioned(PageLayout::Div1)
            .with_chunk_state(0, ChunkState::BeingWritten);
        assert_eq!(div1.0, 0x1000_0001);
        assert!(!div1.is_complete());
        assert!(div1.with_chunk_state(0, ChunkState::Complete).is_complete());
    }

    #[test]
    fn header_bitmap_validation() {
        assert_eq!(HeaderBitmap(0).validate(), Ok(PageLayout::NotPartitioned));
        assert_eq!(
            HeaderBitmap(0x8000_0000).validate(),
            Err(AbiError::ReservedBitSet {
                bitmap: 0x8000_0000
            })
        );
        assert_eq!(
            HeaderBitmap(0x6000_0000).validate(),
            Err(AbiError::InvalidLayout { bits: 6 })
        );
        assert_eq!(
            HeaderBitmap(0x7000_0000).validate(),
            Err(AbiError::InvalidLayout { bits: 7 })
        );
        assert_eq!(
            HeaderBitmap(0x0000_0001).validate(),
            Err(AbiError::StateWithoutLayout { bitmap: 1 })
        );
        // Div2 has chunks 0 and 1 (bits 0..4); a state for chunk 2 is impossible.
        assert_eq!(
            HeaderBitmap(0x2000_0010).validate(),
            Err(AbiError::StateBeyondLayout {
                bitmap: 0x2000_0010
            })
        );
        assert_eq!(HeaderBitmap(0x2000_000F).validate(), Ok(PageLayout::Div2));
        // Div14 uses all 28 state bits.
        assert_eq!(HeaderBitmap(0x5FFF_FFFF).validate(), Ok(PageLayout::Div14));
    }

    #[test]
    fn chunk_header_count5_flags3_bytes() {
        let header = ChunkHeader {
            chunk_id: 0x0102_0304,
            writer_id: 7,
            packets: Packets::new(5, ChunkFlags(3)).unwrap(),
        };
        // packets = 5 | 3 << 10 = 0x0C05.
        assert_eq!(header.packets.0, 0x0C05);
        assert_eq!(
            header.to_bytes(),
            [0x04, 0x03, 0x02, 0x01, 0x07, 0x00, 0x05, 0x0C]
        );
        assert_eq!(ChunkHeader::from_bytes(header.to_bytes()), header);
        assert_eq!(header.to_words(), [0x0102_0304, 0x0C05_0007]);
        assert_eq!(ChunkHeader::from_words(header.to_words()), header);
        assert_eq!(header.packets.count(), 5);
        assert_eq!(header.packets.flags(), ChunkFlags(3));
        assert!(header
            .packets
            .flags()
            .contains(ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK));
        assert!(header
            .packets
            .flags()
            .contains(ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK));
        assert!(!header
            .packets
            .flags()
            .contains(ChunkFlags::CHUNK_NEEDS_PATCHING));
    }

    #[test]
    fn packets_field_limits() {
        assert_eq!(Packets::new(1023, ChunkFlags(63)), Some(Packets(0xFFFF)));
        assert_eq!(Packets::new(1024, ChunkFlags::NONE), None);
        assert_eq!(Packets::new(0, ChunkFlags(64)), None);
        assert_eq!(
            Packets::new(0, ChunkFlags::CHUNK_NEEDS_PATCHING),
            Some(Packets(0x1000))
        );
        assert_eq!(
            format!("{:?}", ChunkFlags(7)),
            "ChunkFlags(FIRST_CONTINUES | LAST_CONTINUES | NEEDS_PATCHING)"
        );
        assert_eq!(
            format!("{:?}", ChunkFlags(9)),
            "ChunkFlags(FIRST_CONTINUES | 0x8)"
        );
        assert_eq!(format!("{:?}", ChunkFlags(0)), "ChunkFlags(0)");
    }

    #[test]
    fn chunk_header_validation() {
        let ok = ChunkHeader::new(1, 0);
        assert_eq!(ok.validate(284), Ok(()));
        assert_eq!(
            ChunkHeader::new(0, 0).validate(284),
            Err(AbiError::InvalidWriterId { writer_id: 0 })
        );
        assert_eq!(
            ChunkHeader::new(MAX_WRITER_ID + 1, 0).validate(284),
            Err(AbiError::InvalidWriterId {
                writer_id: MAX_WRITER_ID + 1
            })
        );
        let with = |count, flags| ChunkHeader {
            packets: Packets::new(count, ChunkFlags(flags)).unwrap(),
            ..ok
        };
        assert_eq!(
            with(0, 8).validate(284),
            Err(AbiError::UnknownChunkFlags { flags: 8 })
        );
        assert_eq!(with(284, 0).validate(284), Ok(()));
        assert_eq!(
            with(285, 0).validate(284),
            Err(AbiError::PacketCountTooLarge {
                count: 285,
                payload_size: 284
            })
        );
        assert_eq!(
            with(0, 1).validate(284),
            Err(AbiError::ContinuationWithoutPackets { flags: 1 })
        );
        assert_eq!(
            with(0, 2).validate(284),
            Err(AbiError::ContinuationWithoutPackets { flags: 2 })
        );
        assert_eq!(with(0, 4).validate(284), Ok(()));
        assert_eq!(with(1, 7).validate(284), Ok(()));
    }

    #[test]
    fn page_size_from_bytes() {
        for p in PageSize::ALL {
            assert_eq!(PageSize::from_bytes(p.bytes()), Ok(p));
        }
        for bad in [0, 2048, 4095, 12288, 65536] {
            assert_eq!(
                PageSize::from_bytes(bad),
                Err(AbiError::InvalidPageSize { page_size: bad })
            );
        }
    }

    #[test]
    fn limits() {
        assert_eq!(MAX_PACKET_COUNT, 1023);
        assert_eq!(MAX_WRITER_ID, 32767);
        assert_eq!(PACKET_SIZE_DROP_PACKET, 268_435_455);
        assert_eq!(
            ALL_CHUNKS_MASK | LAYOUT_MASK | RESERVED_BITMAP_BIT,
            u32::MAX
        );
        assert_eq!(ALL_CHUNKS_MASK & LAYOUT_MASK, 0);
        assert_eq!(MAX_CHUNKS_PER_PAGE as u32 * CHUNK_STATE_BITS, LAYOUT_SHIFT);
    }
}

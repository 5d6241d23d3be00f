//! The producer's view: partition pages, acquire chunks for writing, fill them, complete them.

use core::fmt;

use crate::error::AbiError;
use crate::layout::{
    ChunkFlags, ChunkHeader, ChunkState, HeaderBitmap, Packets, PageHeader, PageLayout, PageSize,
    MAX_CHUNKS_PER_PAGE, MAX_PACKET_COUNT,
};
use crate::smb::{ChunkRef, SmbCore};
use crate::sync::AtomicU32;

/// The producer side of a shared memory buffer (Perfetto's `SharedMemoryABI`).
///
/// It makes only the producer's transitions: Free → BeingWritten
/// ([`try_acquire_chunk_for_writing`](Self::try_acquire_chunk_for_writing), after
/// [`try_partition_page`](Self::try_partition_page) for a free page) and BeingWritten → Complete
/// ([`release_chunk_as_complete`](Self::release_chunk_as_complete)). All of them are
/// compare-and-swaps on the page's header word, so any number of threads may share one
/// `SharedMemoryAbi` (it is `Copy`) without a lock. The service process may change page words
/// concurrently; every method tolerates that and reports what it found as an error.
#[derive(Clone, Copy)]
pub struct SharedMemoryAbi<'a> {
    core: SmbCore<'a>,
}

impl fmt::Debug for SharedMemoryAbi<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedMemoryAbi")
            .field("size", &self.size())
            .field("page_size", &self.page_size())
            .field("num_pages", &self.num_pages())
            .finish()
    }
}

impl<'a> SharedMemoryAbi<'a> {
    /// A view of `words` (the buffer, `4 · words.len()` bytes) split in pages of `page_size`.
    ///
    /// Errors: the size is 0, not a multiple of the page size, or above
    /// [`MAX_SMB_SIZE`](crate::MAX_SMB_SIZE).
    pub fn new(words: &'a [AtomicU32], page_size: PageSize) -> Result<Self, AbiError> {
        Ok(SharedMemoryAbi {
            core: SmbCore::new(words, page_size)?,
        })
    }

    /// A view of `len` bytes at `ptr`, typically a shared memfd mapping.
    ///
    /// Errors: `ptr` null or not 4-aligned, or the size checks of [`SharedMemoryAbi::new`].
    ///
    /// # Safety
    ///
    /// For the whole of `'a`, `ptr..ptr + len` must stay mapped and valid for reads and writes,
    /// and this process must access it only through this crate's views (or other 4-byte atomic
    /// accesses at 4-aligned offsets), never through references or plain loads and stores that
    /// race with them. Other processes may write to it at any time.
    #[cfg(not(loom))]
    pub unsafe fn from_raw_parts(
        ptr: *mut u8,
        len: usize,
        page_size: PageSize,
    ) -> Result<Self, AbiError> {
        // SAFETY: forwarded verbatim from this function's contract.
        let words = unsafe { crate::raw::words_from_raw_parts(ptr, len)? };
        Self::new(words, page_size)
    }

    pub(crate) fn from_core(core: SmbCore<'a>) -> Self {
        SharedMemoryAbi { core }
    }

    /// Buffer size in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.core.geometry().size()
    }

    /// Page size.
    #[must_use]
    pub fn page_size(&self) -> PageSize {
        self.core.geometry().page_size()
    }

    /// Number of pages.
    #[must_use]
    pub fn num_pages(&self) -> usize {
        self.core.geometry().num_pages()
    }

    /// `Acquire`-loads the header bitmap of a page. Advisory: it may change right after.
    pub fn page_bitmap(&self, page_idx: usize) -> Result<HeaderBitmap, AbiError> {
        self.core.bitmap(page_idx)
    }

    /// Both words of a page header.
    pub fn page_header(&self, page_idx: usize) -> Result<PageHeader, AbiError> {
        self.core.page_header(page_idx)
    }

    /// True when the page is free and unpartitioned (bitmap 0). Advisory.
    pub fn is_page_free(&self, page_idx: usize) -> Result<bool, AbiError> {
        Ok(self.page_bitmap(page_idx)? == HeaderBitmap::FREE)
    }

    /// True when the page is partitioned and all its chunks are complete. Advisory.
    pub fn is_page_complete(&self, page_idx: usize) -> Result<bool, AbiError> {
        Ok(self.page_bitmap(page_idx)?.is_complete())
    }

    /// State of one chunk under the page's current layout. Advisory.
    pub fn chunk_state(&self, page_idx: usize, chunk_idx: usize) -> Result<ChunkState, AbiError> {
        let bitmap = self.page_bitmap(page_idx)?;
        let num_chunks = bitmap.validate()?.num_chunks();
        if num_chunks == 0 {
            return Err(AbiError::PageNotPartitioned);
        }
        if chunk_idx >= num_chunks {
            return Err(AbiError::ChunkOutOfRange {
                chunk_idx,
                num_chunks,
            });
        }
        Ok(bitmap.chunk_state(chunk_idx).unwrap_or(ChunkState::Free))
    }

    /// Bit `i` set when chunk `i` of the page exists and is free (0 for an unpartitioned page).
    /// Advisory.
    pub fn free_chunks(&self, page_idx: usize) -> Result<u32, AbiError> {
        let bitmap = self.page_bitmap(page_idx)?;
        bitmap.validate()?;
        Ok(bitmap.chunks_in_state(ChunkState::Free))
    }

    /// Splits a free page into chunks of `layout` (CAS 0 → layout, every chunk Free).
    ///
    /// `Ok(false)` if the page is not free any more. `layout` must not be
    /// [`PageLayout::NotPartitioned`].
    pub fn try_partition_page(
        &self,
        page_idx: usize,
        layout: PageLayout,
    ) -> Result<bool, AbiError> {
        self.core.try_partition(page_idx, layout)
    }

    /// Takes chunk `chunk_idx` of a partitioned page: Free → BeingWritten, then writes `header`
    /// into it (`chunk_id` and `writer_id` stay fixed from now on; `packets` is usually empty,
    /// or count 1 with [`ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK`] when a packet
    /// continues into this chunk).
    ///
    /// Errors: indices out of range, page not partitioned, chunk not free
    /// ([`AbiError::UnexpectedState`]), an invalid page header, or [`AbiError::Contention`].
    pub fn try_acquire_chunk_for_writing(
        &self,
        page_idx: usize,
        chunk_idx: usize,
        header: ChunkHeader,
    ) -> Result<Chunk<'a>, AbiError> {
        let chunk = self.core.acquire(
            page_idx,
            chunk_idx,
            ChunkState::Free,
            ChunkState::BeingWritten,
        )?;
        chunk.store_header(header);
        Ok(Chunk { inner: chunk })
    }

    /// Takes any free chunk of a page, partitioning it with `layout` first if it is free.
    ///
    /// This is the arbiter's inner step: partition if unpartitioned, then try each free chunk.
    /// [`AbiError::NoFreeChunk`] when none could be taken, including when the page was freed
    /// and re-partitioned by others while this call looked at it.
    pub fn try_acquire_any_chunk_for_writing(
        &self,
        page_idx: usize,
        layout: PageLayout,
        header: ChunkHeader,
    ) -> Result<Chunk<'a>, AbiError> {
        if self.is_page_free(page_idx)? {
            self.try_partition_page(page_idx, layout)?;
        }
        let mut free = self.free_chunks(page_idx)?;
        while free != 0 {
            let chunk_idx = free.trailing_zeros() as usize;
            free &= free - 1;
            if chunk_idx >= MAX_CHUNKS_PER_PAGE {
                break;
            }
            match self.try_acquire_chunk_for_writing(page_idx, chunk_idx, header) {
                Ok(chunk) => return Ok(chunk),
                // Another thread took that chunk: try the next one.
                Err(AbiError::UnexpectedState { .. }) => continue,
                // Since `free_chunks` looked, the service freed the whole page and another
                // thread may have split it differently: this page is not worth chasing.
                Err(AbiError::ChunkOutOfRange { .. } | AbiError::PageNotPartitioned) => break,
                Err(e) => return Err(e),
            }
        }
        Err(AbiError::NoFreeChunk)
    }

    /// Hands a chunk to the service: BeingWritten → Complete. Returns the page bitmap after the
    /// transition (e.g. to see whether the whole page is now complete).
    ///
    /// Errors only if the page word was changed behind the producer's back (a chunk of another
    /// buffer, a re-partitioned page, a state other than BeingWritten) or on
    /// [`AbiError::Contention`]; the chunk then stays as it is.
    pub fn release_chunk_as_complete(&self, chunk: Chunk<'a>) -> Result<HeaderBitmap, AbiError> {
        self.core
            .release(&chunk.inner, ChunkState::BeingWritten, ChunkState::Complete)
    }
}

/// A chunk the producer holds in the BeingWritten state (Perfetto's `SharedMemoryABI::Chunk`).
///
/// Only the holder writes to it. Hand it back with
/// [`SharedMemoryAbi::release_chunk_as_complete`]; a chunk that is dropped instead stays
/// BeingWritten (the service can still scrape it, but never frees it).
#[must_use = "a dropped chunk stays BeingWritten; release it with release_chunk_as_complete"]
#[derive(Debug)]
pub struct Chunk<'a> {
    inner: ChunkRef<'a>,
}

impl Chunk<'_> {
    /// Index of the page holding the chunk.
    #[must_use]
    pub fn page_idx(&self) -> usize {
        self.inner.page_idx()
    }

    /// Index of the chunk in its page.
    #[must_use]
    pub fn chunk_idx(&self) -> usize {
        self.inner.chunk_idx()
    }

    /// Layout of the page the chunk was acquired in.
    #[must_use]
    pub fn layout(&self) -> PageLayout {
        self.inner.layout()
    }

    /// Chunk size in bytes, header included.
    #[must_use]
    pub fn size(&self) -> usize {
        self.inner.size()
    }

    /// Payload size in bytes (size − 8).
    #[must_use]
    pub fn payload_size(&self) -> usize {
        self.inner.payload_size()
    }

    /// The header as it is in memory now.
    #[must_use]
    pub fn header(&self) -> ChunkHeader {
        self.inner.header()
    }

    /// Packet count and flags.
    #[must_use]
    pub fn packets(&self) -> Packets {
        self.inner.packets()
    }

    /// Adds one to the packet count (release store) and returns the new count. Call it
    /// *before* writing the packet's fragment header: a scraping service treats every counted
    /// packet but the last as finished. Calling it again once a packet is finished ("count
    /// inflation") lets scraping see that packet too; the writer then pads with an empty
    /// fragment if it completes the chunk without another packet.
    ///
    /// [`AbiError::PacketCountOverflow`] past 1023.
    pub fn increment_packet_count(&mut self) -> Result<u16, AbiError> {
        let packets = self.inner.packets();
        let count = packets.count() + 1;
        if count > MAX_PACKET_COUNT {
            return Err(AbiError::PacketCountOverflow);
        }
        let next = Packets::new(count, packets.flags()).ok_or(AbiError::PacketCountOverflow)?;
        self.inner.store_packets(next);
        Ok(count)
    }

    /// Sets flags (release store); they stay set until the chunk is freed. Bits beyond the
    /// 6-bit field are ignored.
    pub fn set_flags(&mut self, flags: ChunkFlags) {
        let packets = self.inner.packets();
        let flags = packets
            .flags()
            .union(ChunkFlags(flags.0 & ChunkFlags::FIELD_MASK));
        if let Some(next) = Packets::new(packets.count(), flags) {
            self.inner.store_packets(next);
        }
    }

    /// Clears [`ChunkFlags::CHUNK_NEEDS_PATCHING`], once the chunk's patches are applied in
    /// place (only allowed while the chunk is still held).
    pub fn clear_needs_patching(&mut self) {
        let packets = self.inner.packets();
        let flags = packets.flags().difference(ChunkFlags::CHUNK_NEEDS_PATCHING);
        if let Some(next) = Packets::new(packets.count(), flags) {
            self.inner.store_packets(next);
        }
    }

    /// Writes `bytes` at `offset` in the payload (relaxed atomic stores).
    pub fn write_payload(&mut self, offset: usize, bytes: &[u8]) -> Result<(), AbiError> {
        self.inner.write_payload(offset, bytes)
    }

    /// Reads payload bytes back (relaxed atomic loads).
    pub fn read_payload(&self, offset: usize, dst: &mut [u8]) -> Result<(), AbiError> {
        self.inner.read_payload(offset, dst)
    }

    /// Pointer to the first of [`payload_size`](Self::payload_size) payload bytes, for a writer
    /// that serializes in place.
    ///
    /// Writing through it is `unsafe` for the caller and sound only while no one in this process
    /// reads those bytes concurrently: the chunk is BeingWritten, so the service does not acquire
    /// it, but an in-process service that *scrapes* BeingWritten chunks reads them with atomic
    /// loads, and a plain write racing an atomic load is a data race. In-process, either
    /// do not scrape, or write through [`write_payload`](Self::write_payload). A service in
    /// another process is outside this concern.
    #[cfg(not(loom))]
    #[must_use]
    pub fn payload_ptr(&mut self) -> *mut u8 {
        self.inner.payload_ptr()
    }
}

//! The producer's view: partition pages, acquire chunks for writing, fill them, complete them.

use crate::error::AbiError;
use crate::layout::{
    ChunkFlags, ChunkHeader, ChunkState, HeaderBitmap, Packets, PageLayout, MAX_CHUNKS_PER_PAGE,
    MAX_PACKET_COUNT,
};
use crate::smb::{ChunkRef, SmbCore};

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

crate::smb::smb_view!(SharedMemoryAbi);

impl<'a> SharedMemoryAbi<'a> {
    /// `Acquire`-loads the header bitmap of a page. Advisory: it may change right after.
    pub fn page_bitmap(&self, page_idx: usize) -> Result<HeaderBitmap, AbiError> {
        self.core.bitmap(page_idx)
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
    // Inlined across crates: a trace writer calls this for every packet.
    #[inline]
    pub fn increment_packet_count(&mut self) -> Result<u16, AbiError> {
        self.add_packet_count(1)
    }

    /// Adds `n` to the packet count with one release store and returns the new count: for a
    /// writer that finished `n` packets in a row since its last count update (each covered, as
    /// the one [`increment_packet_count`](Self::increment_packet_count) inflates, only once
    /// written). The bytes written before the call are ordered before the count a scraping
    /// service acquires.
    ///
    /// [`AbiError::PacketCountOverflow`] past 1023 (nothing changed).
    #[inline]
    pub fn add_packet_count(&mut self, n: u16) -> Result<u16, AbiError> {
        self.inner
            .update_packets(|p| {
                (u32::from(p.count()) + u32::from(n) <= u32::from(MAX_PACKET_COUNT))
                    .then_some(Packets(p.0 + n))
            })
            .map(Packets::count)
            .ok_or(AbiError::PacketCountOverflow)
    }

    /// Sets flags (release store); they stay set until the chunk is freed. Bits beyond the
    /// 6-bit field are ignored.
    pub fn set_flags(&mut self, flags: ChunkFlags) {
        let flags = ChunkFlags(flags.0 & ChunkFlags::FIELD_MASK);
        self.inner
            .update_packets(|p| Packets::new(p.count(), p.flags().union(flags)));
    }

    /// Clears [`ChunkFlags::CHUNK_NEEDS_PATCHING`], once the chunk's patches are applied in
    /// place (only allowed while the chunk is still held).
    pub fn clear_needs_patching(&mut self) {
        self.inner.update_packets(|p| {
            Packets::new(
                p.count(),
                p.flags().difference(ChunkFlags::CHUNK_NEEDS_PATCHING),
            )
        });
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

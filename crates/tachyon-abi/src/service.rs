//! The service's view: memory shared with an untrusted producer.
//!
//! The producer can rewrite any byte at any time, including between two loads of the same
//! word. So this view decodes nothing in place: it loads page words atomically and validates
//! them, moves chunks only along the service's two transitions, and copies a chunk out (header
//! first, with `Acquire`, then the payload word by word) before anything parses it. The copy is
//! then checked like any other untrusted input ([`ChunkHeader::validate`], [`Fragments`]).
//! Every index is bounds-checked, every impossible state is an [`AbiError`], and nothing here
//! panics on producer data.

use core::fmt;
use core::ops::Range;

use crate::error::AbiError;
use crate::fragment::Fragments;
use crate::layout::{ChunkHeader, ChunkState, HeaderBitmap, PageLayout};
use crate::smb::{ChunkRef, SmbCore};
use crate::sync::Ordering;

/// The service side of a shared memory buffer, for memory an untrusted producer also writes.
///
/// It makes only the service's transitions: Complete → BeingRead
/// ([`try_acquire_chunk_for_reading`](Self::try_acquire_chunk_for_reading),
/// [`try_acquire_all_chunks_for_reading`](Self::try_acquire_all_chunks_for_reading)) and
/// BeingRead → Free ([`release_chunk_as_free`](Self::release_chunk_as_free)); and it can copy
/// BeingWritten or Complete chunks without changing their state
/// ([`scrape_chunk`](Self::scrape_chunk)).
#[derive(Clone, Copy)]
pub struct ServiceView<'a> {
    core: SmbCore<'a>,
}

crate::smb::smb_view!(ServiceView);

impl<'a> ServiceView<'a> {
    /// The page's header bitmap, validated ([`HeaderBitmap::validate`]).
    pub fn page_bitmap(&self, page_idx: usize) -> Result<HeaderBitmap, AbiError> {
        let bitmap = self.core.bitmap(page_idx)?;
        bitmap.validate()?;
        Ok(bitmap)
    }

    /// The page's current layout, validated.
    pub fn page_layout(&self, page_idx: usize) -> Result<PageLayout, AbiError> {
        self.core.bitmap(page_idx)?.validate()
    }

    /// Byte range of chunk `chunk_idx` of a page under its current layout, within the buffer.
    pub fn chunk_range(&self, page_idx: usize, chunk_idx: usize) -> Result<Range<usize>, AbiError> {
        let layout = self.page_layout(page_idx)?;
        self.core.chunk_byte_range(page_idx, layout, chunk_idx)
    }

    /// Takes a Complete chunk for reading: Complete → BeingRead (CAS, `AcqRel`). From here the
    /// producer must not touch it; copy it out with [`ReadChunk::copy`], then free it.
    ///
    /// This is what the service does for each chunk a producer commits. Errors: indices out of
    /// range, invalid page header, chunk not Complete ([`AbiError::UnexpectedState`]), or
    /// [`AbiError::Contention`].
    pub fn try_acquire_chunk_for_reading(
        &self,
        page_idx: usize,
        chunk_idx: usize,
    ) -> Result<ReadChunk<'a>, AbiError> {
        let inner = self.core.acquire(
            page_idx,
            chunk_idx,
            ChunkState::Complete,
            ChunkState::BeingRead,
        )?;
        Ok(ReadChunk { inner })
    }

    /// Takes every Complete chunk of a page at once, in one CAS, if none of its chunks is being
    /// written; free chunks are left alone (Perfetto's former `TryAcquireAllChunksForReading`).
    ///
    /// Yields only the chunks this call moved to BeingRead (chunks already BeingRead belong to
    /// whoever acquired them). Errors: [`AbiError::ChunkBeingWritten`], an unpartitioned or
    /// invalid page, or [`AbiError::Contention`].
    pub fn try_acquire_all_chunks_for_reading(
        &self,
        page_idx: usize,
    ) -> Result<ReadChunks<'a>, AbiError> {
        let word = self.core.page_word(page_idx)?;
        let mut bitmap = HeaderBitmap(word.load(Ordering::Acquire));
        for _ in 0..crate::layout::CAS_RETRY_ATTEMPTS {
            let layout = bitmap.validate()?;
            if layout == PageLayout::NotPartitioned {
                return Err(AbiError::PageNotPartitioned);
            }
            let writing = bitmap.chunks_in_state(ChunkState::BeingWritten);
            if writing != 0 {
                return Err(AbiError::ChunkBeingWritten {
                    chunk_idx: writing.trailing_zeros() as usize,
                });
            }
            let complete = bitmap.chunks_in_state(ChunkState::Complete);
            let mut next = bitmap;
            for chunk_idx in 0..layout.num_chunks() {
                if complete & (1 << chunk_idx) != 0 {
                    next = next.with_chunk_state(chunk_idx, ChunkState::BeingRead);
                }
            }
            match word.compare_exchange(bitmap.0, next.0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    return Ok(ReadChunks {
                        core: self.core,
                        page_idx,
                        layout,
                        pending: complete,
                    });
                }
                Err(now) => {
                    bitmap = HeaderBitmap(now);
                    crate::sync::yield_now();
                }
            }
        }
        Err(AbiError::Contention)
    }

    /// Gives a chunk back to the producer: zeroes its header (so a later scrape cannot mistake
    /// old contents for a new chunk), then BeingRead → Free; the page returns to unpartitioned
    /// when that was its last non-free chunk. Returns the page bitmap after the transition.
    ///
    /// Errors if the producer broke the protocol while the chunk was held (changed its state or
    /// the page layout), or on [`AbiError::Contention`]; the page is then left as found.
    pub fn release_chunk_as_free(&self, chunk: ReadChunk<'a>) -> Result<HeaderBitmap, AbiError> {
        if !self.core.owns(&chunk.inner) {
            return Err(AbiError::ForeignChunk);
        }
        chunk.inner.store_header(ChunkHeader::default());
        self.core
            .release(&chunk.inner, ChunkState::BeingRead, ChunkState::Free)
    }

    /// Copies a chunk the producer still holds, or has completed, without changing its state:
    /// SMB scraping on flush or on producer disconnect (Perfetto's `ForEachScrapableChunk`).
    ///
    /// `Ok(None)` when there is nothing to take: the chunk is Free or BeingRead, or it is
    /// BeingWritten with fewer than 2 packets (the last counted packet may be unfinished, so
    /// such a chunk has no finished packet yet). The copy's header is validated; its
    /// [`ChunkCopy::fragments`] leaves out the last packet of an incomplete chunk.
    pub fn scrape_chunk(
        &self,
        page_idx: usize,
        chunk_idx: usize,
    ) -> Result<Option<ChunkCopy>, AbiError> {
        let bitmap = self.core.bitmap(page_idx)?;
        let layout = bitmap.validate()?;
        let chunk = self.core.chunk(page_idx, layout, chunk_idx)?;
        let complete = match bitmap.chunk_state(chunk_idx) {
            Some(ChunkState::Complete) => true,
            Some(ChunkState::BeingWritten) => false,
            _ => return Ok(None),
        };
        if !complete && chunk.packets().count() < 2 {
            return Ok(None);
        }
        copy_chunk(&chunk, complete).map(Some)
    }
}

/// A chunk the service holds in the BeingRead state.
///
/// Copy it out with [`copy`](Self::copy) or [`copy_into`](Self::copy_into), then hand it back
/// with [`ServiceView::release_chunk_as_free`]. A dropped `ReadChunk` stays BeingRead, so the
/// producer can never reuse that chunk.
#[must_use = "a dropped chunk stays BeingRead; release it with release_chunk_as_free"]
#[derive(Debug)]
pub struct ReadChunk<'a> {
    inner: ChunkRef<'a>,
}

impl ReadChunk<'_> {
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

    /// Layout of the page when the chunk was acquired.
    #[must_use]
    pub fn layout(&self) -> PageLayout {
        self.inner.layout()
    }

    /// Chunk size in bytes, header included.
    #[must_use]
    pub fn size(&self) -> usize {
        self.inner.size()
    }

    /// Payload size in bytes.
    #[must_use]
    pub fn payload_size(&self) -> usize {
        self.inner.payload_size()
    }

    /// The header as it is in memory now, not validated. Even while the chunk is BeingRead a
    /// hostile producer can change it, so decisions must be made on a copy.
    #[must_use]
    pub fn header(&self) -> ChunkHeader {
        self.inner.header()
    }

    /// Reads `dst.len()` payload bytes at `offset` (relaxed atomic loads), e.g. just the first
    /// fragment header. The bytes are a snapshot; a hostile producer may change them at any time.
    pub fn read_payload(&self, offset: usize, dst: &mut [u8]) -> Result<(), AbiError> {
        self.inner.read_payload(offset, dst)
    }

    /// Copies the payload into `dst[..payload_size]` and returns the header loaded just before,
    /// validated against the payload size.
    pub fn copy_into(&self, dst: &mut [u8]) -> Result<ChunkHeader, AbiError> {
        let header = self.inner.header();
        self.inner.copy_payload(dst)?;
        header.validate(self.inner.payload_size())?;
        Ok(header)
    }

    /// The header as it is in memory now, validated against the payload size: the snapshot
    /// the service decides on (the producer may change the memory itself at any time).
    pub fn validated_header(&self) -> Result<ChunkHeader, AbiError> {
        let header = self.inner.header();
        header.validate(self.inner.payload_size())?;
        Ok(header)
    }

    /// Copies the payload into `dst[..payload_size]` (relaxed atomic loads), e.g. straight
    /// into a central buffer: the bytes are a snapshot, to be parsed only in `dst`.
    pub fn copy_payload_into(&self, dst: &mut [u8]) -> Result<(), AbiError> {
        self.inner.copy_payload(dst)
    }

    /// Copies the chunk (validated header + payload) into a new buffer.
    pub fn copy(&self) -> Result<ChunkCopy, AbiError> {
        copy_chunk(&self.inner, true)
    }
}

/// The chunks moved to BeingRead by [`ServiceView::try_acquire_all_chunks_for_reading`].
///
/// Every chunk it yields must be released; chunks not yet yielded when it is dropped stay
/// BeingRead.
#[must_use = "the acquired chunks stay BeingRead until yielded and released"]
#[derive(Debug)]
pub struct ReadChunks<'a> {
    core: SmbCore<'a>,
    page_idx: usize,
    layout: PageLayout,
    pending: u32,
}

impl<'a> Iterator for ReadChunks<'a> {
    type Item = ReadChunk<'a>;

    fn next(&mut self) -> Option<ReadChunk<'a>> {
        while self.pending != 0 {
            let chunk_idx = self.pending.trailing_zeros() as usize;
            self.pending &= self.pending - 1;
            if let Ok(inner) = self.core.chunk(self.page_idx, self.layout, chunk_idx) {
                return Some(ReadChunk { inner });
            }
        }
        None
    }
}

/// A copy of one chunk, taken out of shared memory: safe to parse at leisure.
#[derive(Clone, PartialEq, Eq)]
pub struct ChunkCopy {
    page_idx: usize,
    chunk_idx: usize,
    complete: bool,
    header: ChunkHeader,
    payload: Vec<u8>,
}

impl fmt::Debug for ChunkCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkCopy")
            .field("page_idx", &self.page_idx)
            .field("chunk_idx", &self.chunk_idx)
            .field("complete", &self.complete)
            .field("header", &self.header)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

impl ChunkCopy {
    /// Page the chunk was copied from.
    #[must_use]
    pub fn page_idx(&self) -> usize {
        self.page_idx
    }

    /// Index of the chunk in its page.
    #[must_use]
    pub fn chunk_idx(&self) -> usize {
        self.chunk_idx
    }

    /// False for a chunk scraped while BeingWritten: its last counted packet may be unfinished.
    #[must_use]
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// The header, loaded (with `Acquire`) before the payload and validated.
    #[must_use]
    pub fn header(&self) -> ChunkHeader {
        self.header
    }

    /// The payload bytes (chunk size − 8).
    #[must_use]
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The finished fragments: all counted ones for a complete chunk, all but the last for a
    /// scraped one.
    pub fn fragments(&self) -> Fragments<'_> {
        let count = self.header.packets.count();
        let count = if self.complete {
            count
        } else {
            count.saturating_sub(1)
        };
        Fragments::new(&self.payload, count)
    }
}

fn copy_chunk(chunk: &ChunkRef<'_>, complete: bool) -> Result<ChunkCopy, AbiError> {
    let mut payload = vec![0; chunk.payload_size()];
    let header = chunk.header();
    chunk.copy_payload(&mut payload)?;
    header.validate(payload.len())?;
    Ok(ChunkCopy {
        page_idx: chunk.page_idx(),
        chunk_idx: chunk.chunk_idx(),
        complete,
        header,
        payload,
    })
}

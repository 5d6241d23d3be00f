//! The core both views share: buffer geometry, locating pages and chunks, the page-header
//! compare-and-swap loops, and word-wise access to one chunk.
//!
//! Everything here is safe code over `&[AtomicU32]` (see `raw.rs` for why that is sound on
//! memory another process writes). Indices that come from callers or from the shared memory are
//! checked before use; slice indexing is only done on indices derived from checked geometry, and
//! even those go through `get` so a logic error would surface as an error, not a panic.
//!
//! Memory orderings (the protocol's happens-before edges):
//! - Producer acquires a chunk: CAS Free → BeingWritten with `AcqRel` on the page word, then
//!   stores the chunk header (`chunk_id` relaxed, then word 1 with `Release`).
//! - Producer starts a packet or sets a flag: `Release` store of header word 1, after the bytes
//!   of the previous packets are written, so a scraping service that `Acquire`-loads word 1 sees
//!   them.
//! - Producer completes: CAS BeingWritten → Complete with `AcqRel`; the service's CAS
//!   Complete → BeingRead (`AcqRel`) synchronizes with it, so every byte of the chunk is
//!   visible to the service.
//! - Service frees: zeroes the chunk header (word 1 with `Release`), then CAS BeingRead → Free
//!   (`AcqRel`); the next producer's acquiring CAS synchronizes with it, so it never sees the
//!   service's reads racing its writes.

use core::ops::Range;

use crate::error::AbiError;
use crate::layout::{
    pack_word1, ChunkHeader, ChunkState, HeaderBitmap, Packets, PageHeader, PageLayout, PageSize,
    ALL_CHUNKS_MASK, CAS_RETRY_ATTEMPTS, CHUNK_HEADER_SIZE, MAX_SMB_SIZE, PAGE_HEADER_SIZE,
};
use crate::sync::{yield_now, AtomicU32, Ordering};

/// Words in a page header and in a chunk header.
const PAGE_HEADER_WORDS: usize = PAGE_HEADER_SIZE / 4;
const CHUNK_HEADER_WORDS: usize = CHUNK_HEADER_SIZE / 4;

// === Geometry ===

/// Page size, page count and per-layout chunk sizes of one buffer; fixed at construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    page_size: PageSize,
    num_pages: usize,
    /// Chunk size in words, indexed by layout bits 0..=5 (0 for unpartitioned).
    chunk_words: [usize; 6],
}

impl Geometry {
    /// Checks a buffer of `size` bytes split in pages of `page_size`.
    pub(crate) fn new(size: usize, page_size: PageSize) -> Result<Geometry, AbiError> {
        let p = page_size.bytes();
        if size == 0 || size % p != 0 || size > MAX_SMB_SIZE {
            return Err(AbiError::InvalidBufferSize { size, page_size: p });
        }
        let mut chunk_words = [0; 6];
        for layout in PageLayout::PARTITIONED {
            chunk_words[layout.bits() as usize] = page_size.chunk_size(layout) / 4;
        }
        Ok(Geometry {
            page_size,
            num_pages: size / p,
            chunk_words,
        })
    }

    pub(crate) fn page_size(&self) -> PageSize {
        self.page_size
    }

    pub(crate) fn num_pages(&self) -> usize {
        self.num_pages
    }

    pub(crate) fn size(&self) -> usize {
        self.num_pages * self.page_size.bytes()
    }

    fn page_words(&self) -> usize {
        self.page_size.bytes() / 4
    }

    fn check_page(&self, page_idx: usize) -> Result<(), AbiError> {
        if page_idx >= self.num_pages {
            return Err(AbiError::PageOutOfRange {
                page_idx,
                num_pages: self.num_pages,
            });
        }
        Ok(())
    }

    /// Word range of chunk `chunk_idx` of page `page_idx` under `layout`, checked against the
    /// layout. The formula keeps every chunk inside its page:
    /// `8 + n · ((page_size − 8) / n & !3) ≤ page_size`.
    fn chunk_words(
        &self,
        page_idx: usize,
        layout: PageLayout,
        chunk_idx: usize,
    ) -> Result<Range<usize>, AbiError> {
        self.check_page(page_idx)?;
        let num_chunks = layout.num_chunks();
        if num_chunks == 0 {
            return Err(AbiError::PageNotPartitioned);
        }
        if chunk_idx >= num_chunks {
            return Err(AbiError::ChunkOutOfRange {
                chunk_idx,
                num_chunks,
            });
        }
        let len = self.chunk_words[layout.bits() as usize];
        let start = page_idx * self.page_words() + PAGE_HEADER_WORDS + chunk_idx * len;
        Ok(start..start + len)
    }
}

// === SmbCore ===

/// The buffer as words plus its geometry: what both views are made of.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SmbCore<'a> {
    words: &'a [AtomicU32],
    geo: Geometry,
}

impl<'a> SmbCore<'a> {
    pub(crate) fn new(words: &'a [AtomicU32], page_size: PageSize) -> Result<Self, AbiError> {
        let geo = Geometry::new(words.len().saturating_mul(4), page_size)?;
        Ok(SmbCore { words, geo })
    }

    /// Pairs `words` with a geometry already checked for their length.
    pub(crate) fn from_checked(words: &'a [AtomicU32], geo: Geometry) -> Self {
        debug_assert_eq!(words.len() * 4, geo.size());
        SmbCore { words, geo }
    }

    pub(crate) fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// The header bitmap word of page `page_idx`.
    pub(crate) fn page_word(&self, page_idx: usize) -> Result<&'a AtomicU32, AbiError> {
        self.geo.check_page(page_idx)?;
        self.words
            .get(page_idx * self.geo.page_words())
            .ok_or(AbiError::PageOutOfRange {
                page_idx,
                num_pages: self.geo.num_pages,
            })
    }

    /// `Acquire`-loads the header bitmap of page `page_idx`.
    pub(crate) fn bitmap(&self, page_idx: usize) -> Result<HeaderBitmap, AbiError> {
        Ok(HeaderBitmap(
            self.page_word(page_idx)?.load(Ordering::Acquire),
        ))
    }

    /// Both words of the page header.
    pub(crate) fn page_header(&self, page_idx: usize) -> Result<PageHeader, AbiError> {
        let header_bitmap = self.bitmap(page_idx)?;
        let reserved = self
            .words
            .get(page_idx * self.geo.page_words() + 1)
            .map_or(0, |w| w.load(Ordering::Relaxed));
        Ok(PageHeader {
            header_bitmap,
            reserved,
        })
    }

    /// Byte range of a chunk within the buffer, for `layout`.
    pub(crate) fn chunk_byte_range(
        &self,
        page_idx: usize,
        layout: PageLayout,
        chunk_idx: usize,
    ) -> Result<Range<usize>, AbiError> {
        let w = self.geo.chunk_words(page_idx, layout, chunk_idx)?;
        Ok(w.start * 4..w.end * 4)
    }

    /// A handle on chunk `chunk_idx` of page `page_idx` under `layout` (no state checked).
    pub(crate) fn chunk(
        &self,
        page_idx: usize,
        layout: PageLayout,
        chunk_idx: usize,
    ) -> Result<ChunkRef<'a>, AbiError> {
        let range = self.geo.chunk_words(page_idx, layout, chunk_idx)?;
        let page_word = self.page_word(page_idx)?;
        let words = self.words.get(range).ok_or(AbiError::ChunkOutOfRange {
            chunk_idx,
            num_chunks: layout.num_chunks(),
        })?;
        Ok(ChunkRef {
            page_word,
            words,
            page_idx,
            chunk_idx,
            layout,
        })
    }

    /// True when `chunk` was made from this buffer (same page header word in memory).
    pub(crate) fn owns(&self, chunk: &ChunkRef<'_>) -> bool {
        self.page_word(chunk.page_idx)
            .is_ok_and(|w| core::ptr::eq(w, chunk.page_word))
    }

    /// CAS 0 → `layout` on a free page. `Ok(false)` if the page was not free.
    pub(crate) fn try_partition(
        &self,
        page_idx: usize,
        layout: PageLayout,
    ) -> Result<bool, AbiError> {
        if layout == PageLayout::NotPartitioned {
            return Err(AbiError::InvalidLayout { bits: 0 });
        }
        let word = self.page_word(page_idx)?;
        let next = HeaderBitmap::partitioned(layout).0;
        Ok(word
            .compare_exchange(0, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok())
    }

    /// Moves chunk `chunk_idx` of page `page_idx` from `from` to `to` (an acquiring transition:
    /// Free → BeingWritten or Complete → BeingRead) and returns a handle on it.
    ///
    /// Fails without retrying if the chunk is not in `from` (someone else owns it); retries the
    /// compare-and-swap, re-checking, when other chunks of the page changed in between.
    pub(crate) fn acquire(
        &self,
        page_idx: usize,
        chunk_idx: usize,
        from: ChunkState,
        to: ChunkState,
    ) -> Result<ChunkRef<'a>, AbiError> {
        let word = self.page_word(page_idx)?;
        let mut bitmap = HeaderBitmap(word.load(Ordering::Acquire));
        for _ in 0..CAS_RETRY_ATTEMPTS {
            let layout = bitmap.validate()?;
            let chunk = self.chunk(page_idx, layout, chunk_idx)?;
            let found = bitmap.chunk_state(chunk_idx).unwrap_or(ChunkState::Free);
            if found != from {
                return Err(AbiError::UnexpectedState {
                    expected: from,
                    found,
                });
            }
            let next = bitmap.with_chunk_state(chunk_idx, to);
            match word.compare_exchange(bitmap.0, next.0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(chunk),
                Err(now) => {
                    bitmap = HeaderBitmap(now);
                    yield_now();
                }
            }
        }
        Err(AbiError::Contention)
    }

    /// Moves a held chunk from `from` to `to` (a releasing transition: BeingWritten → Complete
    /// or BeingRead → Free). Freeing the last non-free chunk of a page resets the whole bitmap to
    /// 0 (unpartitioned). Returns the bitmap after the transition.
    pub(crate) fn release(
        &self,
        chunk: &ChunkRef<'a>,
        from: ChunkState,
        to: ChunkState,
    ) -> Result<HeaderBitmap, AbiError> {
        if !self.owns(chunk) {
            return Err(AbiError::ForeignChunk);
        }
        let word = chunk.page_word;
        let mut bitmap = HeaderBitmap(word.load(Ordering::Relaxed));
        for _ in 0..CAS_RETRY_ATTEMPTS {
            let layout = bitmap.validate()?;
            if layout != chunk.layout {
                return Err(AbiError::LayoutChanged {
                    expected: chunk.layout,
                    found_bits: layout.bits(),
                });
            }
            let found = bitmap
                .chunk_state(chunk.chunk_idx)
                .unwrap_or(ChunkState::Free);
            if found != from {
                return Err(AbiError::UnexpectedState {
                    expected: from,
                    found,
                });
            }
            let mut next = bitmap.with_chunk_state(chunk.chunk_idx, to);
            if to == ChunkState::Free && next.0 & ALL_CHUNKS_MASK == 0 {
                next = HeaderBitmap::FREE;
            }
            match word.compare_exchange(bitmap.0, next.0, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Ok(next),
                Err(now) => {
                    bitmap = HeaderBitmap(now);
                    yield_now();
                }
            }
        }
        Err(AbiError::Contention)
    }
}

// === The views ===

/// What both views ([`crate::SharedMemoryAbi`], [`crate::ServiceView`]) are made of: a
/// `core: SmbCore` field behind the same constructors, geometry getters and `Debug`.
macro_rules! smb_view {
    ($view:ident) => {
        impl core::fmt::Debug for $view<'_> {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.debug_struct(stringify!($view))
                    .field("size", &self.size())
                    .field("page_size", &self.page_size())
                    .field("num_pages", &self.num_pages())
                    .finish()
            }
        }

        impl<'a> $view<'a> {
            /// A view of `words` (the buffer, `4 · words.len()` bytes) split in pages of
            /// `page_size` (nothing in the memory says the page size: whoever sets the buffer up
            /// chooses it and tells the other side).
            ///
            /// Errors: the size is 0, not a multiple of the page size, or above
            /// [`MAX_SMB_SIZE`](crate::MAX_SMB_SIZE).
            pub fn new(
                words: &'a [$crate::sync::AtomicU32],
                page_size: $crate::layout::PageSize,
            ) -> Result<Self, $crate::error::AbiError> {
                Ok($view {
                    core: $crate::smb::SmbCore::new(words, page_size)?,
                })
            }

            /// A view of `len` bytes at `ptr`, typically a shared memfd mapping.
            ///
            /// Errors: `ptr` null or not 4-aligned, or the size checks of `new`.
            ///
            /// # Safety
            ///
            /// For the whole of `'a`, `ptr..ptr + len` must stay mapped and valid for reads and
            /// writes (for a memfd supplied by the other process: seal it against shrinking,
            /// `F_SEAL_SHRINK`, before mapping, or that process could truncate it under us), and
            /// this process must access it only through this crate's views (or other 4-byte
            /// atomic accesses at 4-aligned offsets), never through references or plain loads
            /// and stores that race with them. Other processes may write to it at any time.
            #[cfg(not(loom))]
            pub unsafe fn from_raw_parts(
                ptr: *mut u8,
                len: usize,
                page_size: $crate::layout::PageSize,
            ) -> Result<Self, $crate::error::AbiError> {
                // SAFETY: forwarded verbatim from this function's contract.
                let words = unsafe { $crate::raw::words_from_raw_parts(ptr, len)? };
                Self::new(words, page_size)
            }

            pub(crate) fn from_core(core: $crate::smb::SmbCore<'a>) -> Self {
                $view { core }
            }

            /// Buffer size in bytes.
            #[must_use]
            pub fn size(&self) -> usize {
                self.core.geometry().size()
            }

            /// Page size.
            #[must_use]
            pub fn page_size(&self) -> $crate::layout::PageSize {
                self.core.geometry().page_size()
            }

            /// Number of pages.
            #[must_use]
            pub fn num_pages(&self) -> usize {
                self.core.geometry().num_pages()
            }

            /// Both words of a page header, undecoded (`Acquire` load of the bitmap).
            pub fn page_header(
                &self,
                page_idx: usize,
            ) -> Result<$crate::layout::PageHeader, $crate::error::AbiError> {
                self.core.page_header(page_idx)
            }
        }
    };
}
pub(crate) use smb_view;

// === ChunkRef ===

/// One chunk's words (header + payload) and where it sits. Whether the holder owns it is up to
/// the wrapper type ([`crate::Chunk`], [`crate::ReadChunk`]).
#[derive(Debug)]
pub(crate) struct ChunkRef<'a> {
    page_word: &'a AtomicU32,
    /// The whole chunk: `words[0]` = chunk_id, `words[1]` = writer_id | packets << 16, then the
    /// payload. At least 73 words (4 KiB page split 14 ways).
    words: &'a [AtomicU32],
    page_idx: usize,
    chunk_idx: usize,
    layout: PageLayout,
}

impl<'a> ChunkRef<'a> {
    pub(crate) fn page_idx(&self) -> usize {
        self.page_idx
    }

    pub(crate) fn chunk_idx(&self) -> usize {
        self.chunk_idx
    }

    pub(crate) fn layout(&self) -> PageLayout {
        self.layout
    }

    /// Chunk size in bytes, header included.
    pub(crate) fn size(&self) -> usize {
        self.words.len() * 4
    }

    pub(crate) fn payload_size(&self) -> usize {
        self.size() - CHUNK_HEADER_SIZE
    }

    #[inline]
    fn word(&self, i: usize) -> Option<&'a AtomicU32> {
        self.words.get(i)
    }

    /// Loads the header: word 1 (`packets`) with `Acquire` first, then `chunk_id`.
    pub(crate) fn header(&self) -> ChunkHeader {
        let w1 = self.word(1).map_or(0, |w| w.load(Ordering::Acquire));
        let w0 = self.word(0).map_or(0, |w| w.load(Ordering::Relaxed));
        ChunkHeader::from_words([w0, w1])
    }

    /// `Acquire`-loads the packets word.
    pub(crate) fn packets(&self) -> Packets {
        ChunkHeader::from_words([0, self.word(1).map_or(0, |w| w.load(Ordering::Acquire))]).packets
    }

    /// Stores a whole header, `chunk_id` first, then word 1 with `Release`.
    pub(crate) fn store_header(&self, header: ChunkHeader) {
        let [w0, w1] = header.to_words();
        if let (Some(a), Some(b)) = (self.word(0), self.word(1)) {
            a.store(w0, Ordering::Relaxed);
            b.store(w1, Ordering::Release);
        }
    }

    /// Replaces the packets word with `f(packets)` (`Release` store, writer id kept) and
    /// returns the new value; `None` from `f` leaves the word as it is. Only the chunk's owner
    /// may call this: it is one load + one store, not an atomic read-modify-write, and the load
    /// is `Relaxed` because the owner is the only writer of the word (it reads back its own
    /// last store).
    #[inline]
    pub(crate) fn update_packets(
        &self,
        f: impl FnOnce(Packets) -> Option<Packets>,
    ) -> Option<Packets> {
        let w = self.word(1)?;
        let word1 = w.load(Ordering::Relaxed);
        let next = f(ChunkHeader::from_words([0, word1]).packets)?;
        w.store(pack_word1(word1 as u16, next), Ordering::Release);
        Some(next)
    }

    fn check_payload(&self, offset: usize, len: usize) -> Result<(), AbiError> {
        let payload_size = self.payload_size();
        if offset.checked_add(len).is_none_or(|end| end > payload_size) {
            return Err(AbiError::PayloadOutOfBounds {
                offset,
                len,
                payload_size,
            });
        }
        Ok(())
    }

    /// Writes `bytes` at `offset` in the payload with relaxed atomic stores (read-modify-write of
    /// the partial words at either end; only the owner writes, so that is not a race).
    pub(crate) fn write_payload(&self, offset: usize, bytes: &[u8]) -> Result<(), AbiError> {
        self.check_payload(offset, bytes.len())?;
        let mut pos = CHUNK_HEADER_SIZE + offset;
        let mut src = bytes;
        while let Some(word) = self.word(pos / 4).filter(|_| !src.is_empty()) {
            let at = pos % 4;
            let n = (4 - at).min(src.len());
            let (head, rest) = src.split_at(n);
            let value = if n == 4 {
                u32::from_le_bytes([head[0], head[1], head[2], head[3]])
            } else {
                let mut cur = word.load(Ordering::Relaxed).to_le_bytes();
                cur[at..at + n].copy_from_slice(head);
                u32::from_le_bytes(cur)
            };
            word.store(value, Ordering::Relaxed);
            pos += n;
            src = rest;
        }
        Ok(())
    }

    /// Reads `dst.len()` payload bytes at `offset` with relaxed atomic loads.
    pub(crate) fn read_payload(&self, offset: usize, dst: &mut [u8]) -> Result<(), AbiError> {
        self.check_payload(offset, dst.len())?;
        let mut pos = CHUNK_HEADER_SIZE + offset;
        let mut out = dst;
        while let Some(word) = self.word(pos / 4).filter(|_| !out.is_empty()) {
            let at = pos % 4;
            let n = (4 - at).min(out.len());
            let bytes = word.load(Ordering::Relaxed).to_le_bytes();
            let (head, rest) = core::mem::take(&mut out).split_at_mut(n);
            head.copy_from_slice(&bytes[at..at + n]);
            pos += n;
            out = rest;
        }
        Ok(())
    }

    /// Copies the whole payload into `dst[..payload_size]`, one relaxed word load at a time.
    pub(crate) fn copy_payload(&self, dst: &mut [u8]) -> Result<(), AbiError> {
        let needed = self.payload_size();
        let Some(dst) = dst.get_mut(..needed) else {
            return Err(AbiError::DestinationTooSmall {
                needed,
                got: dst.len(),
            });
        };
        let src = self.words.get(CHUNK_HEADER_WORDS..).unwrap_or_default();
        for (out, word) in dst.chunks_exact_mut(4).zip(src) {
            out.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        Ok(())
    }

    /// Raw pointer to the first payload byte, derived from the whole payload slice so that it
    /// may be used for all `payload_size` bytes.
    #[cfg(not(loom))]
    pub(crate) fn payload_ptr(&self) -> *mut u8 {
        let payload = self.words.get(CHUNK_HEADER_WORDS..).unwrap_or_default();
        payload.as_ptr().cast::<u8>().cast_mut()
    }
}

//! The crate's only `unsafe` code: turning memory into a slice of atomic words.
//!
//! Everything else in the crate sees the shared memory buffer as `&[AtomicU32]` and only ever
//! performs atomic loads, stores and compare-and-swaps on it through safe indexing (so every
//! access is bounds-checked). That is sound even though another process may write any byte at
//! any moment:
//!
//! - A `&AtomicU32` is not a promise that the value stays put: atomics are built on
//!   `UnsafeCell`, so a shared reference to one explicitly allows concurrent modification.
//!   No `&u8`/`&[u8]`/`&mut` reference to the shared bytes is ever created, and no plain
//!   (non-atomic) read of them happens: the service copies chunk bytes out with relaxed atomic
//!   loads, one word at a time, and only then parses the copy.
//! - Every access is 4 bytes wide at a 4-aligned address, including bytes 4..8 of a chunk
//!   header that Perfetto's C++ declares as two `atomic<u16>`s. Rust's memory model forbids
//!   racing atomic accesses of different sizes to the same bytes; within this process there
//!   are none. What a process outside the Rust abstract machine does to the mapping cannot make
//!   our loads undefined: at worst we read garbage, which the validating view rejects.
//!
//! Two helpers construct the slice: [`words_from_raw_parts`] for a mapping the caller vouches
//! for (a memfd), and [`Block`] storage for a buffer this process allocates ([`crate::OwnedSmb`]).
//! Under `cfg(loom)` neither exists: loom atomics are model objects that cannot be overlaid on
//! memory, so the owned buffer is a boxed slice of them instead.

#[cfg(not(loom))]
use crate::error::AbiError;
#[cfg(not(loom))]
use crate::sync::AtomicU32;

/// Words in one 4 KiB [`Block`].
#[cfg(not(loom))]
pub(crate) const BLOCK_WORDS: usize = 1024;

/// 4 KiB of zero-initialized atomic words, aligned to 4 KiB like a page of a mapping, so that a
/// boxed slice of blocks is a valid, page-aligned buffer.
#[cfg(not(loom))]
#[repr(C, align(4096))]
pub(crate) struct Block([AtomicU32; BLOCK_WORDS]);

#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<Block>() == BLOCK_WORDS * 4);
#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<AtomicU32>() == 4);

#[cfg(not(loom))]
impl Block {
    /// `n` zeroed blocks in one allocation.
    pub(crate) fn zeroed(n: usize) -> Box<[Block]> {
        (0..n)
            .map(|_| Block([const { AtomicU32::new(0) }; BLOCK_WORDS]))
            .collect()
    }

    /// The blocks as one slice of words.
    pub(crate) fn as_words(blocks: &[Block]) -> &[AtomicU32] {
        let len = blocks.len() * BLOCK_WORDS;
        // SAFETY: `Block` is `repr(C)` around `[AtomicU32; BLOCK_WORDS]` and its size is exactly
        // `BLOCK_WORDS * 4` (asserted above), so the blocks of the slice are `len` contiguous,
        // initialized `AtomicU32`s inside one allocation, suitably aligned. The pointer comes from
        // the whole `blocks` slice, so its provenance covers all of them, and the returned slice
        // borrows `blocks`, so it cannot outlive the allocation. Shared references to atomics
        // may alias freely.
        unsafe { core::slice::from_raw_parts(blocks.as_ptr().cast::<AtomicU32>(), len) }
    }
}

/// Views `len` bytes at `ptr` as atomic words.
///
/// Checks `ptr` is non-null and 4-aligned and `len` is a multiple of 4; the buffer geometry is
/// checked by the callers.
///
/// # Safety
///
/// For the whole of `'a`:
/// - `ptr..ptr + len` must be one mapping (or allocation) valid for reads and writes, and must
///   stay mapped. For a memfd received from another process that means the service must have
///   sealed it against shrinking (`F_SEAL_SHRINK`) before mapping it, or a truncation could turn
///   our loads into `SIGBUS`.
/// - This process must access the bytes only through atomic operations of 4 bytes at 4-aligned
///   offsets (as this crate does), never through references or plain reads and writes that race
///   with them. Other processes are not constrained.
#[cfg(not(loom))]
pub(crate) unsafe fn words_from_raw_parts<'a>(
    ptr: *mut u8,
    len: usize,
) -> Result<&'a [AtomicU32], AbiError> {
    if ptr.is_null() || (ptr as usize) % core::mem::align_of::<AtomicU32>() != 0 {
        return Err(AbiError::MisalignedBuffer { addr: ptr as usize });
    }
    if len % 4 != 0 {
        return Err(AbiError::InvalidBufferSize {
            size: len,
            page_size: 0,
        });
    }
    // SAFETY: `ptr` is non-null and aligned for `AtomicU32` (checked above). The caller
    // guarantees `ptr..ptr + len` is valid for reads and writes for `'a` and only accessed
    // atomically from this process, which is what `&'a [AtomicU32]` requires (`AtomicU32` has the
    // size and alignment of `u32`, any bit pattern is a valid value, and atomics tolerate
    // concurrent modification). `len / 4` words cover exactly `len` bytes.
    Ok(unsafe { core::slice::from_raw_parts(ptr.cast::<AtomicU32>(), len / 4) })
}

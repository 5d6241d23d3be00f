//! Ready-made buffers for the writer: [`HeapBuffered`] grows on the heap, [`StaticBuffered`]
//! writes into a caller's fixed slice and reports running out of room as an error.

use std::fmt;
use std::marker::PhantomData;
use std::ptr;

use crate::message::{Message, MessageWriter};
use crate::writer::{ContiguousMemoryRange, Delegate, Error, ScatteredStreamWriter};

// === HeapBuffered ===

/// Default size of the first heap slice.
pub const DEFAULT_INITIAL_SLICE_SIZE: usize = 128;
/// Default cap on the size of a heap slice (slices double up to it).
pub const DEFAULT_MAX_SLICE_SIZE: usize = 128 * 1024;

/// One heap allocation the writer writes into.
struct Slice {
    /// From `Box::into_raw`; freed in `HeapDelegate::drop`. Raw rather than a `Box` so that
    /// moving the `Vec` of slices never asserts uniqueness over memory the writer still points
    /// into.
    ptr: *mut u8,
    len: usize,
    /// Bytes holding data (set when the writer leaves the slice).
    used: usize,
}

/// The [`Delegate`] behind [`HeapBuffered`]: zero-filled slices that double in size.
struct HeapDelegate {
    slices: Vec<Slice>,
    next_size: usize,
    max_size: usize,
}

impl HeapDelegate {
    fn record_used(&mut self, used_end: *mut u8) {
        if let Some(last) = self.slices.last_mut() {
            if !used_end.is_null() {
                last.used = used_end as usize - last.ptr as usize;
            }
        }
    }
}

// SAFETY: each slice is a fresh zero-filled allocation of at least `min_len` bytes that nothing
// else references; slices are only freed when the delegate (and so the writer owning it) is
// dropped, so every range and every size field inside one stays valid for the writer's whole
// life (contract points 1 and 2); `annotate_patch` keeps the default (same address).
unsafe impl Delegate for HeapDelegate {
    fn get_new_buffer(
        &mut self,
        used_end: *mut u8,
        min_len: usize,
    ) -> Option<ContiguousMemoryRange> {
        self.record_used(used_end);
        let len = self.next_size.max(min_len);
        self.next_size = (self.next_size * 2).min(self.max_size);
        let ptr = Box::into_raw(vec![0u8; len].into_boxed_slice()) as *mut u8;
        self.slices.push(Slice { ptr, len, used: 0 });
        // SAFETY: `ptr .. ptr + len` is the allocation just made.
        let end = unsafe { ptr.add(len) };
        Some(ContiguousMemoryRange { begin: ptr, end })
    }
}

impl Drop for HeapDelegate {
    fn drop(&mut self) {
        for s in &self.slices {
            // SAFETY: `ptr`/`len` came from `Box::into_raw` of a boxed slice of exactly `len`
            // bytes, and each slice is freed once, here.
            drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(s.ptr, s.len)) });
        }
    }
}

// SAFETY: the slices are plain heap memory owned solely by this delegate.
unsafe impl Send for HeapDelegate {}

/// A message writer that grows into heap slices, then serializes to one `Vec<u8>`.
///
/// Meant for tests, tools and anything off the hot path; the tracing hot path writes into
/// shared memory chunks through its own [`Delegate`].
///
/// ```
/// let mut buf = protozero::HeapBuffered::new();
/// buf.root_message().append_uint32(1, 300);
/// assert_eq!(buf.serialize()?, [0x08, 0xac, 0x02]);
/// # Ok::<(), protozero::Error>(())
/// ```
pub struct HeapBuffered {
    w: ScatteredStreamWriter<HeapDelegate>,
}

impl fmt::Debug for HeapBuffered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeapBuffered")
            .field("written", &self.w.written())
            .field("slices", &self.w.delegate().slices.len())
            .finish()
    }
}

impl Default for HeapBuffered {
    fn default() -> Self {
        Self::new()
    }
}

impl HeapBuffered {
    /// An empty buffer with the default slice sizes (128 B doubling up to 128 KiB).
    pub fn new() -> Self {
        Self::with_slice_sizes(DEFAULT_INITIAL_SLICE_SIZE, DEFAULT_MAX_SLICE_SIZE)
    }

    /// An empty buffer whose first slice is `initial` bytes, doubling up to `max`.
    pub fn with_slice_sizes(initial: usize, max: usize) -> Self {
        let initial = initial.max(1);
        let delegate = HeapDelegate {
            slices: Vec::new(),
            next_size: initial,
            max_size: max.max(initial),
        };
        HeapBuffered {
            w: ScatteredStreamWriter::new(delegate),
        }
    }

    /// A root message writing at the end of what is already in the buffer.
    pub fn root_message(&mut self) -> Message<'_> {
        self.w.root_message()
    }

    /// A root message of a generated type.
    pub fn root<'a, T: MessageWriter<'a>>(&'a mut self) -> T {
        T::from_message(self.root_message())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.w.written()
    }

    /// The first write error, if any.
    pub fn error(&self) -> Option<Error> {
        self.w.error()
    }

    /// The bytes written so far, as one vector (every message is finalized: messages borrow
    /// the buffer, so none can be open here).
    pub fn serialize(&self) -> Result<Vec<u8>, Error> {
        if let Some(e) = self.w.error() {
            return Err(e);
        }
        let mut out = Vec::with_capacity(self.w.written() as usize);
        for slice in self.slices() {
            out.extend_from_slice(slice);
        }
        Ok(out)
    }

    /// The used part of each slice, in order.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> {
        let slices = &self.w.delegate().slices;
        let cur = self.w.write_ptr();
        let last = slices.len().wrapping_sub(1);
        slices.iter().enumerate().map(move |(i, s)| {
            let used = if i == last {
                cur as usize - s.ptr as usize
            } else {
                s.used
            };
            // SAFETY: `s.ptr .. s.ptr + used` is initialized memory of a live allocation owned
            // by the delegate (`used <= len`: the write pointer never passes a slice's end), and
            // no write can happen while `&self` is borrowed.
            unsafe { std::slice::from_raw_parts(s.ptr, used) }
        })
    }
}

// === StaticBuffered ===

/// The [`Delegate`] behind [`StaticBuffered`]: the one range was given at construction.
struct StaticDelegate<'b> {
    _buf: PhantomData<&'b mut [u8]>,
}

// SAFETY: this delegate never hands out a range (the writer was created over the caller's
// exclusively borrowed slice), so there is nothing for it to keep valid beyond that borrow.
unsafe impl Delegate for StaticDelegate<'_> {
    fn get_new_buffer(&mut self, _: *mut u8, _: usize) -> Option<ContiguousMemoryRange> {
        None
    }
}

/// A message writer over a fixed, caller-provided slice (on the stack, in a pool, ...).
///
/// Running out of room is not an abort: the writer records [`Error::BufferExhausted`], drops
/// further writes, and [`finish`](StaticBuffered::finish) returns the error.
///
/// ```
/// let mut storage = [0u8; 16];
/// let mut buf = protozero::StaticBuffered::new(&mut storage);
/// buf.root_message().append_string(1, "hi");
/// assert_eq!(buf.finish()?, &[0x0a, 0x02, b'h', b'i']);
///
/// let mut tiny = [0u8; 2];
/// let mut buf = protozero::StaticBuffered::new(&mut tiny);
/// buf.root_message().append_string(1, "hi");
/// assert_eq!(buf.finish(), Err(protozero::Error::BufferExhausted));
/// # Ok::<(), protozero::Error>(())
/// ```
pub struct StaticBuffered<'b> {
    w: ScatteredStreamWriter<StaticDelegate<'b>>,
    begin: *mut u8,
}

impl fmt::Debug for StaticBuffered<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticBuffered")
            .field("writer", &self.w)
            .finish()
    }
}

impl<'b> StaticBuffered<'b> {
    /// A writer over `buf`.
    #[inline]
    pub fn new(buf: &'b mut [u8]) -> Self {
        let range = ContiguousMemoryRange::from_slice(buf);
        let delegate = StaticDelegate { _buf: PhantomData };
        // SAFETY: `range` covers `buf`, which is exclusively borrowed for 'b, as long as the
        // writer can live; it is the only range this writer will ever use.
        let w = unsafe { ScatteredStreamWriter::with_range(delegate, range) };
        StaticBuffered {
            w,
            begin: range.begin,
        }
    }

    /// A root message writing after what is already in the buffer.
    #[inline]
    pub fn root_message(&mut self) -> Message<'_> {
        self.w.root_message()
    }

    /// A root message of a generated type.
    #[inline]
    pub fn root<'a, T: MessageWriter<'a>>(&'a mut self) -> T {
        T::from_message(self.root_message())
    }

    /// Bytes written so far.
    #[inline]
    pub fn written(&self) -> usize {
        self.w.written() as usize
    }

    /// The first write error, if any.
    pub fn error(&self) -> Option<Error> {
        self.w.error()
    }

    /// The bytes written, or the error if the buffer was too small.
    pub fn finish(&self) -> Result<&[u8], Error> {
        if let Some(e) = self.w.error() {
            return Err(e);
        }
        // SAFETY: `begin .. begin + written` is the initialized prefix of the caller's slice
        // (the writer never moves past its end), borrowed here for no longer than `&self`,
        // during which nothing writes.
        Ok(unsafe { std::slice::from_raw_parts(self.begin, self.w.written() as usize) })
    }
}

//! The scattered stream writer: appends bytes into a sequence of contiguous buffers handed out
//! by a [`Delegate`], and owns the bookkeeping of open nested messages' size fields.
//!
//! # How a write works
//!
//! The writer keeps three pointers into the current buffer: `begin`, `cur` (the write pointer)
//! and `end`. Every append checks `end - cur` against the most it could write and, on the fast
//! path, stores straight through `cur`; it is inlined into the caller and costs a compare and
//! the stores. When the buffer is too small the `#[cold]` slow path copies what fits, asks the
//! delegate for the next buffer ([`Delegate::get_new_buffer`]) and continues there. The owner of
//! the writer can take the same path at a point of its choosing with
//! [`ScatteredStreamWriter::switch_buffer`].
//!
//! # Size fields and patches
//!
//! A nested message starts with its tag and a 4-byte length reserved as a *redundant varint*
//! (`80 80 80 00`), always contiguous inside one buffer (the writer abandons a buffer's last
//! 1–3 bytes rather than split it). The writer keeps a stack with one entry per open nested
//! message: the address of its size field. When the message ends, the size is written there —
//! or, if the whole message is still contiguous in the current buffer and at most 127 bytes
//! long, the payload is moved back 3 bytes and a 1-byte length written instead (the output is
//! then canonical protobuf, as Perfetto's ProtoZero does since 2023).
//!
//! Before the writer leaves a buffer it calls [`Delegate::annotate_patch`] for every open size
//! field inside it: a delegate that hands the buffer off (a tracing chunk committed to the
//! service) returns a stable 4-byte *patch slot* instead, and the size is later written there
//! and shipped out of band. A delegate that keeps its buffers (the heap buffer) returns the same
//! address.
//!
//! A delegate may instead have the writer *carry* the end of the buffer being left (a record
//! that has not ended, e.g. a tracing packet) to the start of the next one
//! ([`Delegate::carry_over`]): the delegate copies the bytes, and the writer moves its write
//! pointer and the open size fields inside them, so those sizes are written in place later and
//! need no patch.
//!
//! # Maintainers: the unsafe contract
//!
//! This module and [`crate::buffers`] are the only places with `unsafe` in the crate. Every raw
//! write goes through `cur`, which is always inside `[begin, end]` of a range that the
//! [`Delegate`] promised to be valid and exclusively ours; size fields are written through
//! addresses that are either inside such a range (and the delegate promised to keep it valid
//! while it is not annotated away) or a patch slot the delegate promised to keep valid.

use std::fmt;
use std::mem::MaybeUninit;
use std::ptr;

use crate::wire::{
    self, MAX_MESSAGE_LENGTH, MAX_SIMPLE_FIELD_SIZE, MAX_TAG_SIZE, MAX_VARINT_SIZE,
    MESSAGE_LENGTH_FIELD_SIZE,
};

/// How many nested messages (and packed fields) can be open at once under one writer.
///
/// The stack of open size fields lives inline in the writer so that the write path never
/// allocates. Tracing messages rarely nest deeper than 8; going past this limit is reported as
/// [`Error::NestingTooDeep`].
pub const MAX_NESTING_DEPTH: usize = 64;

/// The placeholder written into a freshly reserved size field: a redundant varint of 0.
///
/// Writing it (rather than leaving the bytes as they were) means a message whose writer was
/// leaked with `mem::forget` decodes as an empty message instead of garbage.
const SIZE_PLACEHOLDER: [u8; 4] = wire::redundant_varint(0);

/// A contiguous range of writable memory `[begin, end)` handed to the writer by a [`Delegate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContiguousMemoryRange {
    /// First writable byte.
    pub begin: *mut u8,
    /// One past the last writable byte.
    pub end: *mut u8,
}

impl ContiguousMemoryRange {
    /// An empty range (both pointers null): every write takes the slow path.
    pub const fn empty() -> Self {
        ContiguousMemoryRange {
            begin: ptr::null_mut(),
            end: ptr::null_mut(),
        }
    }

    /// The range covering a mutable slice.
    pub fn from_slice(slice: &mut [u8]) -> Self {
        let range = slice.as_mut_ptr_range();
        ContiguousMemoryRange {
            begin: range.start,
            end: range.end,
        }
    }

    /// Number of bytes in the range.
    pub fn len(&self) -> usize {
        self.end as usize - self.begin as usize
    }

    /// Whether the range holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `p .. p + n` lies inside the range.
    #[inline]
    pub fn contains(&self, p: *const u8, n: usize) -> bool {
        let (p, b, e) = (p as usize, self.begin as usize, self.end as usize);
        p >= b && p <= e && e - p >= n
    }
}

/// What a failed write reports. Errors are sticky: after the first one the writer drops every
/// further write, and the owner of the writer (e.g. [`crate::HeapBuffered::serialize`]) returns
/// the error instead of a half-written message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The delegate had no further buffer to give (for a fixed buffer: it is too small).
    BufferExhausted,
    /// A nested message grew past 2^28 − 1 bytes, the most a 4-byte size field can hold.
    MessageTooLarge {
        /// The size the message reached.
        size: u64,
    },
    /// More than [`MAX_NESTING_DEPTH`] nested messages were open at once.
    NestingTooDeep,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BufferExhausted => f.write_str("protozero: the buffer is too small (no further buffer to write into)"),
            Error::MessageTooLarge { size } => write!(
                f,
                "protozero: nested message of {size} bytes exceeds the limit of {MAX_MESSAGE_LENGTH} bytes"
            ),
            Error::NestingTooDeep => {
                write!(f, "protozero: more than {MAX_NESTING_DEPTH} nested messages open at once")
            }
        }
    }
}

impl std::error::Error for Error {}

/// The owner of the memory a [`ScatteredStreamWriter`] writes into.
///
/// # Safety
///
/// The writer stores through the pointers a delegate gives it, so an implementation promises:
///
/// 1. Every range returned by [`get_new_buffer`](Delegate::get_new_buffer) is valid for writes
///    of its whole length, is at least `min_len` bytes long, does not overlap any other range or
///    patch slot it has handed out and not yet taken back, and is accessed by nobody else while
///    the writer uses it.
/// 2. A range stays valid until the next call to `get_new_buffer` (the writer then leaves it)
///    *or longer*: if [`annotate_patch`](Delegate::annotate_patch) returned the same address it
///    was given, the range containing that address must stay valid and untouched by others for
///    as long as the writer exists, because the writer will write the size there later.
/// 3. A patch slot returned by `annotate_patch` (an address other than the one given) is valid
///    for a 4-byte write for as long as the writer exists, or until its first byte has become
///    non-zero (a written size never starts with `0x00`), and overlaps no range.
/// 4. When [`carry_over`](Delegate::carry_over) was given the write pointer `p` and the
///    `get_new_buffer` call that follows gets a `used_end` before `p` (the carry happened), the
///    range it returns, if at least `min_len` bytes long, starts with a copy of the bytes
///    `used_end..p` (the writer keeps writing after them and writes sizes into them).
pub unsafe trait Delegate {
    /// Hands out the next buffer to write into, at least `min_len` bytes long, or `None` if
    /// there is none (the writer then fails with [`Error::BufferExhausted`]). `min_len` is 0
    /// only when the writer's owner asked for it
    /// ([`ScatteredStreamWriter::switch_buffer`]); an empty range must still have a non-null
    /// `begin`.
    ///
    /// `used_end` is the writer's position in the buffer it is leaving: the bytes between that
    /// buffer's start and `used_end` hold data, anything after it is unused. It is null on the
    /// first call.
    fn get_new_buffer(
        &mut self,
        used_end: *mut u8,
        min_len: usize,
    ) -> Option<ContiguousMemoryRange>;

    /// Called, just before the writer leaves the buffer containing it, for the 4-byte size
    /// field of every nested message still open there. Returns where the size must be written
    /// instead: the same address (the delegate keeps the buffer), a stable patch slot (the
    /// delegate hands the buffer off and will ship the patch), or null (the size is dropped;
    /// the delegate accounts for the loss).
    fn annotate_patch(&mut self, size_field: *mut u8) -> *mut u8 {
        size_field
    }

    /// Called first whenever the writer leaves a buffer (before any `annotate_patch`): how many
    /// of the bytes just before `used_end` the next buffer must start with, carried over
    /// instead of left behind. 0 (the default) carries nothing.
    ///
    /// A delegate carries a record that has not ended yet (a tracing packet cut by the end of
    /// a chunk) to keep it whole in one buffer: its open size fields then never need a patch.
    /// When this returns `n > 0`, the writer carries those `n` bytes unless they would split
    /// the 4-byte size field of an open message (it then carries none). Carrying, it does not
    /// annotate the size fields inside them, calls `get_new_buffer` with `used_end` at their
    /// start (`used_end + n` is the write pointer given here) for `min_len + n` bytes, and
    /// moves its write pointer and those size fields by the distance between the old bytes and
    /// the new buffer's start. So the delegate learns from `used_end` whether the carry
    /// happened, and copies the bytes itself, in `get_new_buffer`, while it still owns the
    /// buffer being left (the Safety contract, point 4). `n` above what was written in the
    /// current buffer is taken as all of it.
    fn carry_over(&mut self, used_end: *mut u8, min_len: usize) -> usize {
        let _ = (used_end, min_len);
        0
    }
}

/// An append-only writer over a sequence of buffers from a [`Delegate`].
///
/// Users do not write through it directly: they take a [`crate::Message`] from it (see
/// [`ScatteredStreamWriter::root_message`]) or, more commonly, use [`crate::HeapBuffered`] or
/// [`crate::StaticBuffered`], which own one.
pub struct ScatteredStreamWriter<D: ?Sized + Delegate> {
    /// Write pointer, always inside `[begin, end]`.
    cur: *mut u8,
    /// End of the current range.
    end: *mut u8,
    /// Start of the current range.
    begin: *mut u8,
    /// Bytes written into ranges already left (not counting abandoned tails).
    written_previously: u64,
    /// The first error; once set, the range is empty and every write is dropped.
    error: Option<Error>,
    /// Number of open nested messages (entries `0..depth` of `size_fields` are live).
    depth: usize,
    /// Address of each open nested message's size field (possibly a patch slot, or null when
    /// the size must not be written). Only entries `0..depth` are initialized: leaving the rest
    /// uninitialized saves a 512-byte memset every time a writer is created.
    size_fields: [MaybeUninit<*mut u8>; MAX_NESTING_DEPTH],
    /// Last, so that `ScatteredStreamWriter<D>` can be unsized to `ScatteredStreamWriter<dyn
    /// Delegate>`: messages hold the writer through that one-lifetime, delegate-erased type.
    delegate: D,
}

// SAFETY: the raw pointers only ever point into memory that the delegate hands to this writer
// exclusively (the `Delegate` contract), so moving the writer to another thread moves sole
// access to that memory with it, exactly as moving the delegate itself would.
unsafe impl<D: ?Sized + Delegate + Send> Send for ScatteredStreamWriter<D> {}

impl<D: ?Sized + Delegate> fmt::Debug for ScatteredStreamWriter<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScatteredStreamWriter")
            .field("written", &self.written())
            .field("bytes_available", &self.bytes_available())
            .field("depth", &self.depth)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

// === impl ScatteredStreamWriter (sized delegate) ===

impl<D: Delegate> ScatteredStreamWriter<D> {
    /// A writer that asks `delegate` for its first buffer on the first write.
    pub fn new(delegate: D) -> Self {
        // SAFETY: an empty range has no bytes to write; the first write asks the delegate.
        unsafe { Self::with_range(delegate, ContiguousMemoryRange::empty()) }
    }

    /// A writer that starts writing into `range`.
    ///
    /// # Safety
    ///
    /// `range` must satisfy the [`Delegate`] contract as if `delegate` had returned it from
    /// `get_new_buffer`.
    pub unsafe fn with_range(delegate: D, range: ContiguousMemoryRange) -> Self {
        ScatteredStreamWriter {
            cur: range.begin,
            end: range.end,
            begin: range.begin,
            written_previously: 0,
            error: None,
            depth: 0,
            size_fields: [MaybeUninit::uninit(); MAX_NESTING_DEPTH],
            delegate,
        }
    }

    /// Starts a root message (one without a size field) at the current position.
    pub fn root_message<'w>(&'w mut self) -> crate::Message<'w>
    where
        D: 'w,
    {
        crate::Message::root(self)
    }
}

// === impl ScatteredStreamWriter (any delegate) ===

impl<D: ?Sized + Delegate> ScatteredStreamWriter<D> {
    /// Total bytes written so far, over all buffers (abandoned buffer tails not counted).
    #[inline(always)]
    pub fn written(&self) -> u64 {
        self.written_previously + (self.cur as usize - self.begin as usize) as u64
    }

    /// Bytes left in the current buffer.
    #[inline(always)]
    pub fn bytes_available(&self) -> usize {
        self.end as usize - self.cur as usize
    }

    /// The write pointer.
    pub fn write_ptr(&self) -> *mut u8 {
        self.cur
    }

    /// The current buffer.
    pub fn current_range(&self) -> ContiguousMemoryRange {
        ContiguousMemoryRange {
            begin: self.begin,
            end: self.end,
        }
    }

    /// The first error, if any write has failed.
    pub fn error(&self) -> Option<Error> {
        self.error
    }

    /// Number of nested messages currently open.
    pub fn nesting_depth(&self) -> usize {
        self.depth
    }

    /// The delegate.
    pub fn delegate(&self) -> &D {
        &self.delegate
    }

    /// The delegate, mutably. Whoever owns the writer uses this between messages, e.g. to
    /// account for the bytes written into the current range.
    pub fn delegate_mut(&mut self) -> &mut D {
        &mut self.delegate
    }

    /// Appends `src` verbatim.
    #[inline(always)]
    pub fn write_bytes(&mut self, src: &[u8]) {
        if self.bytes_available() >= src.len() {
            // SAFETY: `cur..cur + len` is inside the current range (checked above), which the
            // delegate contract makes writable and exclusively ours; `src` is a shared borrow
            // and cannot overlap memory the writer owns exclusively.
            unsafe {
                ptr::copy_nonoverlapping(src.as_ptr(), self.cur, src.len());
                self.cur = self.cur.add(src.len());
            }
        } else {
            self.write_bytes_slow(src);
        }
    }

    /// Appends the first `len` bytes of `block` when the whole block fits in the current range,
    /// and returns whether it did (nothing is written otherwise; the caller takes a slower
    /// path). Copying a fixed-size block is one or two vector moves, where a copy of a
    /// run-time length is a call: the bytes past `len` land in free space the next write
    /// overwrites. For small records whose encoding the caller built on the stack.
    #[inline(always)]
    pub fn try_write_block_prefix<const N: usize>(&mut self, block: &[u8; N], len: usize) -> bool {
        if self.bytes_available() < N || len > N {
            return false;
        }
        // SAFETY: `cur..cur + N` is inside the current range (checked above), writable and
        // exclusively ours by the delegate contract; `block` is a shared borrow of other
        // memory; `cur + len` stays inside the range because `len <= N`.
        unsafe {
            ptr::copy_nonoverlapping(block.as_ptr(), self.cur, N);
            self.cur = self.cur.add(len);
        }
        true
    }

    /// Lets `f` encode straight into the current buffer's free bytes (`cur..end`, given as a
    /// slice) and moves the write position past the first `used` of them, `f` returning
    /// `(used, result)` (`used` is capped at the slice's length). For a run of small records
    /// encoded in one loop: the position stays in a register, not in the writer, and the
    /// bytes of the slice past `used` are free space the next write overwrites.
    #[inline(always)]
    pub fn write_in_place<R>(&mut self, f: impl FnOnce(&mut [u8]) -> (usize, R)) -> R {
        let len = self.bytes_available();
        if len == 0 {
            // No range yet (`cur` may be null, which a slice cannot start at) or a full one.
            return f(&mut []).1;
        }
        // SAFETY: `cur..cur + len` is the free part of the current range: valid, writable and
        // exclusively ours by the delegate contract, and not otherwise borrowed while `f` runs
        // (the writer is borrowed mutably for the call).
        let free = unsafe { std::slice::from_raw_parts_mut(self.cur, len) };
        let (used, result) = f(free);
        // SAFETY: `cur + used` stays inside the range: `used` is capped at `len`.
        self.cur = unsafe { self.cur.add(used.min(len)) };
        result
    }

    /// Appends a varint-typed field: tag then value.
    #[inline(always)]
    pub fn write_varint_field(&mut self, tag: u32, value: u64) {
        if self.bytes_available() >= MAX_SIMPLE_FIELD_SIZE {
            // SAFETY: a tag and a varint take at most MAX_SIMPLE_FIELD_SIZE bytes, which fit
            // in the current range (checked above).
            unsafe {
                let p = put_varint(self.cur, tag as u64);
                self.cur = put_varint(p, value);
            }
        } else {
            let mut tmp = [0u8; MAX_SIMPLE_FIELD_SIZE];
            let n = wire::encode_varint(tag as u64, &mut tmp);
            let n = n + wire::encode_varint(value, &mut tmp[n..]);
            self.write_bytes_slow(&tmp[..n]);
        }
    }

    /// Appends a fixed-size field (4 or 8 little-endian bytes after the tag).
    #[inline(always)]
    pub fn write_fixed_field<const N: usize>(&mut self, tag: u32, le_bytes: [u8; N]) {
        if self.bytes_available() >= MAX_TAG_SIZE + N {
            // SAFETY: the tag (≤ MAX_TAG_SIZE bytes) and N bytes fit (checked above).
            unsafe {
                let p = put_varint(self.cur, tag as u64);
                ptr::copy_nonoverlapping(le_bytes.as_ptr(), p, N);
                self.cur = p.add(N);
            }
        } else {
            let mut tmp = [0u8; MAX_TAG_SIZE];
            let n = wire::encode_varint(tag as u64, &mut tmp);
            self.write_bytes_slow(&tmp[..n]);
            self.write_bytes(&le_bytes);
        }
    }

    /// Appends a length-delimited field whose payload is the concatenation of `parts`.
    #[inline(always)]
    pub fn write_length_delimited_field(&mut self, tag: u32, parts: &[&[u8]]) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if let [data] = parts {
            if self.bytes_available() >= MAX_TAG_SIZE + MAX_VARINT_SIZE + len {
                // SAFETY: tag, length varint and payload fit (checked above); `data` is a
                // shared borrow, so it does not overlap the writer's exclusive range.
                unsafe {
                    let p = put_varint(self.cur, tag as u64);
                    let p = put_varint(p, len as u64);
                    ptr::copy_nonoverlapping(data.as_ptr(), p, len);
                    self.cur = p.add(len);
                }
                return;
            }
        }
        let mut tmp = [0u8; MAX_TAG_SIZE + MAX_VARINT_SIZE];
        let n = wire::encode_varint(tag as u64, &mut tmp);
        let n = n + wire::encode_varint(len as u64, &mut tmp[n..]);
        self.write_bytes(&tmp[..n]);
        for part in parts {
            self.write_bytes(part);
        }
    }

    /// Appends a bare varint (no tag), e.g. an element of a packed field.
    #[inline(always)]
    pub fn write_varint(&mut self, value: u64) {
        if self.bytes_available() >= MAX_VARINT_SIZE {
            // SAFETY: a varint takes at most MAX_VARINT_SIZE bytes, which fit (checked above).
            unsafe {
                self.cur = put_varint(self.cur, value);
            }
        } else {
            let mut tmp = [0u8; MAX_VARINT_SIZE];
            let n = wire::encode_varint(value, &mut tmp);
            self.write_bytes_slow(&tmp[..n]);
        }
    }

    /// Writes `tag` and reserves a 4-byte size field after it, pushing it on the stack of open
    /// size fields. Returns the level (1-based stack position, or 0 if nothing was pushed
    /// because the writer has failed) to pass to [`end_nested`](Self::end_nested).
    #[inline(always)]
    pub fn begin_nested(&mut self, tag: u32) -> u32 {
        if self.bytes_available() >= MAX_TAG_SIZE + MESSAGE_LENGTH_FIELD_SIZE
            && self.depth < MAX_NESTING_DEPTH
        {
            // SAFETY: the tag and the 4-byte size field fit in the current range (checked
            // above); `depth < MAX_NESTING_DEPTH` keeps the stack index in bounds.
            unsafe {
                let size_field = put_varint(self.cur, tag as u64);
                ptr::copy_nonoverlapping(SIZE_PLACEHOLDER.as_ptr(), size_field, 4);
                self.cur = size_field.add(MESSAGE_LENGTH_FIELD_SIZE);
                self.size_fields
                    .get_unchecked_mut(self.depth)
                    .write(size_field);
            }
            self.depth += 1;
            self.depth as u32
        } else {
            self.begin_nested_slow(tag)
        }
    }

    /// Ends the nested message opened at `level` whose payload started when
    /// [`written`](Self::written) was `start`: writes its size (compacting it to one byte when
    /// possible) and pops it and anything above it from the stack.
    #[inline(always)]
    pub fn end_nested(&mut self, level: u32, start: u64) {
        if level == 0 || level as usize > self.depth {
            // Nothing was pushed (the writer had failed), or an enclosing message already
            // ended this one (its writer handle was leaked with `mem::forget`).
            return;
        }
        let idx = level as usize - 1;
        // SAFETY: idx < depth <= MAX_NESTING_DEPTH (checked above), and entries below `depth`
        // are initialized (every push writes its entry before incrementing `depth`).
        let size_field = unsafe { self.size_fields.get_unchecked(idx).assume_init() };
        // Anything above `idx` is a nested writer that was leaked rather than dropped; its size
        // stays the zero placeholder.
        self.depth = idx;
        if self.error.is_some() {
            return;
        }
        let size = self.written() - start;
        let in_range = self.cur as usize - self.begin as usize;
        if size <= 127
            && (size as usize) + MESSAGE_LENGTH_FIELD_SIZE <= in_range
            && size_field as usize + MESSAGE_LENGTH_FIELD_SIZE + size as usize == self.cur as usize
        {
            // The size field and the whole payload are contiguous in the current range
            // (`size_field + 4 + size == cur` with `size + 4 <= cur - begin`): compact.
            // SAFETY: `size_field .. cur` lies inside `[begin, cur)` of the current range, as
            // established by the two comparisons above; `ptr::copy` handles the overlap.
            unsafe {
                ptr::copy(
                    size_field.add(MESSAGE_LENGTH_FIELD_SIZE),
                    size_field.add(1),
                    size as usize,
                );
                *size_field = size as u8;
                self.cur = self.cur.sub(MESSAGE_LENGTH_FIELD_SIZE - 1);
            }
        } else if size > MAX_MESSAGE_LENGTH as u64 {
            self.fail(Error::MessageTooLarge { size });
        } else if !size_field.is_null() {
            let bytes = wire::redundant_varint(size as u32);
            // SAFETY: `size_field` is either inside a range the delegate keeps valid while it
            // was not annotated away, or a patch slot valid for 4 bytes (Delegate contract,
            // points 2 and 3); null (a dropped patch) was excluded above.
            unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), size_field, 4) };
        }
    }

    /// Records the first error and empties the range, so that every later write takes the slow
    /// path and is dropped there.
    #[cold]
    pub fn fail(&mut self, error: Error) {
        if self.error.is_none() {
            self.error = Some(error);
        }
        self.written_previously = self.written();
        self.cur = ptr::null_mut();
        self.begin = ptr::null_mut();
        self.end = ptr::null_mut();
    }

    #[cold]
    #[inline(never)]
    fn write_bytes_slow(&mut self, mut src: &[u8]) {
        loop {
            if self.error.is_some() {
                return;
            }
            let n = self.bytes_available().min(src.len());
            // SAFETY: `n` bytes fit in the current range; `src` is a shared borrow.
            unsafe {
                ptr::copy_nonoverlapping(src.as_ptr(), self.cur, n);
                self.cur = self.cur.add(n);
            }
            src = &src[n..];
            if src.is_empty() {
                return;
            }
            self.switch_buffer(1);
        }
    }

    #[cold]
    #[inline(never)]
    fn begin_nested_slow(&mut self, tag: u32) -> u32 {
        if self.depth >= MAX_NESTING_DEPTH {
            self.fail(Error::NestingTooDeep);
        }
        let mut tmp = [0u8; MAX_TAG_SIZE];
        let n = wire::encode_varint(tag as u64, &mut tmp);
        self.write_bytes(&tmp[..n]);
        if self.error.is_none() && self.bytes_available() < MESSAGE_LENGTH_FIELD_SIZE {
            // The size field must be contiguous: abandon this buffer's last bytes.
            self.switch_buffer(MESSAGE_LENGTH_FIELD_SIZE);
        }
        if self.error.is_some() {
            return 0;
        }
        let size_field = self.cur;
        self.write_bytes(&SIZE_PLACEHOLDER);
        self.size_fields[self.depth].write(size_field);
        self.depth += 1;
        self.depth as u32
    }

    /// Leaves the current buffer now and continues in the buffer the delegate returns, exactly
    /// as when a write runs out of room.
    ///
    /// The delegate is asked first how many bytes before the write pointer to carry to the
    /// start of the next buffer ([`Delegate::carry_over`]; none by default). The size fields of
    /// nested messages still open in the rest of the buffer being left go through
    /// [`Delegate::annotate_patch`]; then [`Delegate::get_new_buffer`] is called with
    /// `used_end` = the current write pointer ([`write_ptr`](Self::write_ptr)): nothing is
    /// written into the rest of the buffer being left, which the delegate may use or ignore.
    /// The new buffer must be at least `min_len` bytes long (plus what is carried). `min_len` may be 0, and the
    /// delegate may then return an empty range: the next write switches again. Any range must
    /// have a non-null `begin`, an empty one too: a null range, or one shorter than `min_len`,
    /// fails the writer with [`Error::BufferExhausted`], as `None` does.
    ///
    /// A writer that has failed stays failed: the call then does nothing (the delegate is not
    /// called), as every write after the first error.
    ///
    /// Owners of a writer use this to move to a new buffer at a boundary of their own (e.g. a
    /// tracing writer leaving a chunk between two packets) without writing filler to get there.
    #[cold]
    #[inline(never)]
    pub fn switch_buffer(&mut self, min_len: usize) {
        if self.error.is_some() {
            return;
        }
        let old = self.current_range();
        let used = self.cur as usize - self.begin as usize;
        let mut carry = self.delegate.carry_over(self.cur, min_len).min(used);
        if carry > 0 && self.splits_size_field(self.cur.wrapping_sub(carry)) {
            carry = 0;
        }
        // The bytes that move to the start of the next buffer (empty when nothing is carried).
        let carried = ContiguousMemoryRange {
            begin: self.cur.wrapping_sub(carry),
            end: self.cur,
        };
        // Redirect the size fields of open messages that live in the buffer we leave, before
        // the delegate may hand it off; those in the carried bytes move with them instead.
        for entry in &mut self.size_fields[..self.depth] {
            // SAFETY: entries below `depth` are initialized.
            let size_field = unsafe { entry.assume_init() };
            if !size_field.is_null()
                && old.contains(size_field, MESSAGE_LENGTH_FIELD_SIZE)
                && !(carry > 0 && carried.contains(size_field, MESSAGE_LENGTH_FIELD_SIZE))
            {
                entry.write(self.delegate.annotate_patch(size_field));
            }
        }
        let written = self.written();
        // The carried bytes count as written in the next buffer, where they now are.
        self.written_previously = written - carry as u64;
        let want = min_len.saturating_add(carry);
        match self.delegate.get_new_buffer(carried.begin, want) {
            Some(range) if range.len() >= want && !range.begin.is_null() => {
                if carry > 0 {
                    for entry in &mut self.size_fields[..self.depth] {
                        // SAFETY: entries below `depth` are initialized.
                        let size_field = unsafe { entry.assume_init() };
                        if !size_field.is_null()
                            && carried.contains(size_field, MESSAGE_LENGTH_FIELD_SIZE)
                        {
                            // Same offset from the start of the carried bytes, in the new
                            // range (derived from its pointer): inside its first `carry` bytes.
                            let offset = size_field as usize - carried.begin as usize;
                            entry.write(range.begin.wrapping_add(offset));
                        }
                    }
                }
                self.begin = range.begin;
                self.cur = range.begin.wrapping_add(carry);
                self.end = range.end;
            }
            _ => {
                // Nothing moved: `written()` stays what it was (the old range ends at `cur`).
                self.written_previously = written - used as u64;
                self.fail(Error::BufferExhausted);
            }
        }
    }
}

impl<D: ?Sized + Delegate> ScatteredStreamWriter<D> {
    /// Whether `at` falls strictly inside the size field of an open nested message: a carry
    /// starting there would split the field between two buffers.
    fn splits_size_field(&self, at: *mut u8) -> bool {
        let at = at as usize;
        self.size_fields[..self.depth].iter().any(|entry| {
            // SAFETY: entries below `depth` are initialized.
            let field = unsafe { entry.assume_init() } as usize;
            field < at && at < field.saturating_add(MESSAGE_LENGTH_FIELD_SIZE)
        })
    }
}

/// Writes `v` as a varint at `p` and returns the address after it.
///
/// A plain byte loop: a branch-free variant that spreads the 7-bit groups into one unaligned
/// 8-byte store measured 40% slower on the benchmark (the overlapping stores defeat
/// store-to-load forwarding when the message is read back soon after).
///
/// # Safety
///
/// `p` must be valid for writes of [`wire::varint_size`]`(v)` bytes.
#[inline(always)]
unsafe fn put_varint(mut p: *mut u8, mut v: u64) -> *mut u8 {
    // SAFETY: the caller guarantees room for every byte this loop writes.
    unsafe {
        while v >= 0x80 {
            *p = (v as u8) | 0x80;
            p = p.add(1);
            v >>= 7;
        }
        *p = v as u8;
        p.add(1)
    }
}

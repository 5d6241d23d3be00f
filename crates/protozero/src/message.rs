//! [`Message`]: the append-only message writer every generated message type wraps.

use std::fmt;

use crate::wire::{self, make_tag, WireType};
use crate::writer::{Delegate, ScatteredStreamWriter};

/// The writer type messages hold: any delegate, erased behind one lifetime.
type Stream<'w> = ScatteredStreamWriter<dyn Delegate + 'w>;

/// An append-only protobuf message being written.
///
/// Each `append_*` serializes one field straight into the underlying buffer; nothing is kept
/// in the message but its position. Nested messages are written with
/// [`begin_nested`](Message::begin_nested), which returns a child that **mutably borrows** this
/// message: the compiler rejects writes to a parent while a child is open, which is ProtoZero's
/// "fill nested messages in stack order" rule checked statically. Dropping a child finalizes it
/// (writes its size).
///
/// Like ProtoZero, the writer does not check the schema: setting a singular field twice
/// appends it twice (decoders keep the last value).
///
/// ```
/// use protozero::HeapBuffered;
///
/// let mut buf = HeapBuffered::new();
/// {
///     let mut msg = buf.root_message();
///     let mut nested = msg.begin_nested(3);
///     nested.append_string(1, "foo");
///     nested.append_int32(2, 42);
/// } // `nested` is finalized here, then `msg`.
/// assert_eq!(buf.serialize()?, [0x1a, 0x07, 0x0a, 0x03, b'f', b'o', b'o', 0x10, 0x2a]);
/// # Ok::<(), protozero::Error>(())
/// ```
pub struct Message<'w> {
    w: &'w mut Stream<'w>,
    /// `w.written()` when the payload started.
    start: u64,
    /// Position of this message's size field on the writer's stack (1-based); 0 for a root
    /// message, which has no size field, or when the writer had already failed.
    level: u32,
}

impl fmt::Debug for Message<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("level", &self.level)
            .field("size", &self.size())
            .finish_non_exhaustive()
    }
}

/// Implemented by generated message writers, which are thin wrappers around a [`Message`] with
/// no state of their own.
pub trait MessageWriter<'w>: Sized {
    /// Wraps a message that was just begun.
    fn from_message(msg: Message<'w>) -> Self;
    /// The wrapped message.
    fn as_message(&mut self) -> &mut Message<'w>;
}

impl<'w> MessageWriter<'w> for Message<'w> {
    #[inline(always)]
    fn from_message(msg: Message<'w>) -> Self {
        msg
    }

    #[inline(always)]
    fn as_message(&mut self) -> &mut Message<'w> {
        self
    }
}

impl<'w> Message<'w> {
    /// A message with no size field, starting at the writer's current position.
    pub fn root(w: &'w mut Stream<'w>) -> Self {
        let start = w.written();
        Message { w, start, level: 0 }
    }

    /// Bytes written into this message's payload so far.
    pub fn size(&self) -> u64 {
        self.w.written().saturating_sub(self.start)
    }

    /// The first error of the underlying writer, if any.
    pub fn error(&self) -> Option<crate::Error> {
        self.w.error()
    }

    /// Finalizes the message (writes its size if it is nested) and returns its payload size.
    /// Dropping the message does the same.
    pub fn finalize(self) -> u64 {
        let size = self.size();
        drop(self);
        size
    }

    // === scalars ===

    /// Appends a varint field with a raw 64-bit value (uint64, or any varint type already
    /// converted).
    #[inline(always)]
    pub fn append_varint(&mut self, field_id: u32, value: u64) {
        self.w
            .write_varint_field(make_tag(field_id, WireType::Varint), value);
    }

    /// Appends an `int32` (negative values are sign-extended to 10 bytes, as protobuf requires).
    #[inline(always)]
    pub fn append_int32(&mut self, field_id: u32, value: i32) {
        self.append_varint(field_id, value as i64 as u64);
    }

    /// Appends an `int64`.
    #[inline(always)]
    pub fn append_int64(&mut self, field_id: u32, value: i64) {
        self.append_varint(field_id, value as u64);
    }

    /// Appends a `uint32`.
    #[inline(always)]
    pub fn append_uint32(&mut self, field_id: u32, value: u32) {
        self.append_varint(field_id, value as u64);
    }

    /// Appends a `uint64`.
    #[inline(always)]
    pub fn append_uint64(&mut self, field_id: u32, value: u64) {
        self.append_varint(field_id, value);
    }

    /// Appends a `sint32` (zig-zag).
    #[inline(always)]
    pub fn append_sint32(&mut self, field_id: u32, value: i32) {
        self.append_varint(field_id, wire::zigzag_encode32(value) as u64);
    }

    /// Appends a `sint64` (zig-zag).
    #[inline(always)]
    pub fn append_sint64(&mut self, field_id: u32, value: i64) {
        self.append_varint(field_id, wire::zigzag_encode64(value));
    }

    /// Appends a `bool`.
    #[inline(always)]
    pub fn append_bool(&mut self, field_id: u32, value: bool) {
        self.append_varint(field_id, value as u64);
    }

    /// Appends an enum value (encoded as `int32`).
    #[inline(always)]
    pub fn append_enum(&mut self, field_id: u32, value: i32) {
        self.append_int32(field_id, value);
    }

    /// Appends a `fixed32`.
    #[inline(always)]
    pub fn append_fixed32(&mut self, field_id: u32, value: u32) {
        self.w
            .write_fixed_field(make_tag(field_id, WireType::Fixed32), value.to_le_bytes());
    }

    /// Appends a `fixed64`.
    #[inline(always)]
    pub fn append_fixed64(&mut self, field_id: u32, value: u64) {
        self.w
            .write_fixed_field(make_tag(field_id, WireType::Fixed64), value.to_le_bytes());
    }

    /// Appends an `sfixed32`.
    #[inline(always)]
    pub fn append_sfixed32(&mut self, field_id: u32, value: i32) {
        self.append_fixed32(field_id, value as u32);
    }

    /// Appends an `sfixed64`.
    #[inline(always)]
    pub fn append_sfixed64(&mut self, field_id: u32, value: i64) {
        self.append_fixed64(field_id, value as u64);
    }

    /// Appends a `float`.
    #[inline(always)]
    pub fn append_float(&mut self, field_id: u32, value: f32) {
        self.append_fixed32(field_id, value.to_bits());
    }

    /// Appends a `double`.
    #[inline(always)]
    pub fn append_double(&mut self, field_id: u32, value: f64) {
        self.append_fixed64(field_id, value.to_bits());
    }

    // === length-delimited ===

    /// Appends a `string`.
    #[inline(always)]
    pub fn append_string(&mut self, field_id: u32, value: &str) {
        self.append_bytes(field_id, value.as_bytes());
    }

    /// Appends a `bytes` field (or a string given as bytes).
    #[inline(always)]
    pub fn append_bytes(&mut self, field_id: u32, value: &[u8]) {
        self.w
            .write_length_delimited_field(make_tag(field_id, WireType::LengthDelimited), &[value]);
    }

    /// Appends one length-delimited field whose payload is the concatenation of `parts`,
    /// without joining them first.
    #[inline]
    pub fn append_scattered_bytes(&mut self, field_id: u32, parts: &[&[u8]]) {
        self.w
            .write_length_delimited_field(make_tag(field_id, WireType::LengthDelimited), parts);
    }

    /// Appends bytes that already are encoded protobuf fields of this message.
    #[inline(always)]
    pub fn append_raw_proto_bytes(&mut self, bytes: &[u8]) {
        self.w.write_bytes(bytes);
    }

    // === packed repeated ===

    /// Appends a packed repeated varint field (`int32`, `int64`, `uint32`, `uint64`, `bool`,
    /// enums: convert each value as the matching `append_*` does). The length is reserved and
    /// back-filled like a nested message's, so the values are never buffered.
    #[inline]
    pub fn append_packed_varint<I: IntoIterator<Item = u64>>(&mut self, field_id: u32, values: I) {
        let level = self
            .w
            .begin_nested(make_tag(field_id, WireType::LengthDelimited));
        let start = self.w.written();
        for v in values {
            self.w.write_varint(v);
        }
        self.w.end_nested(level, start);
    }

    /// Appends a packed repeated `sint32` field (zig-zag).
    #[inline]
    pub fn append_packed_sint32<I: IntoIterator<Item = i32>>(&mut self, field_id: u32, values: I) {
        self.append_packed_varint(
            field_id,
            values.into_iter().map(|v| wire::zigzag_encode32(v) as u64),
        );
    }

    /// Appends a packed repeated `sint64` field (zig-zag).
    #[inline]
    pub fn append_packed_sint64<I: IntoIterator<Item = i64>>(&mut self, field_id: u32, values: I) {
        self.append_packed_varint(field_id, values.into_iter().map(wire::zigzag_encode64));
    }

    /// Appends a packed repeated `fixed32` / `sfixed32` / `float` field (values as raw bits).
    #[inline]
    pub fn append_packed_fixed32(&mut self, field_id: u32, values: &[u32]) {
        self.append_packed_fixed(
            field_id,
            values.len() * 4,
            values.iter().map(|v| v.to_le_bytes()),
        );
    }

    /// Appends a packed repeated `fixed64` / `sfixed64` / `double` field (values as raw bits).
    #[inline]
    pub fn append_packed_fixed64(&mut self, field_id: u32, values: &[u64]) {
        self.append_packed_fixed(
            field_id,
            values.len() * 8,
            values.iter().map(|v| v.to_le_bytes()),
        );
    }

    /// Tag, exact length `len`, then the values' bytes: the packed fixed-size fields. Also
    /// used by `gen_support` for the element types other than `u32`/`u64`.
    #[inline(always)]
    pub(crate) fn append_packed_fixed<const N: usize>(
        &mut self,
        field_id: u32,
        len: usize,
        values: impl Iterator<Item = [u8; N]>,
    ) {
        let mut header = [0u8; wire::MAX_TAG_SIZE + wire::MAX_VARINT_SIZE];
        let n = wire::encode_varint(
            make_tag(field_id, WireType::LengthDelimited) as u64,
            &mut header,
        );
        let n = n + wire::encode_varint(len as u64, &mut header[n..]);
        self.w.write_bytes(&header[..n]);
        for v in values {
            self.w.write_bytes(&v);
        }
    }

    // === nesting ===

    /// Begins a nested message as field `field_id`. The child borrows `self` until it is
    /// dropped, which writes its size.
    #[inline(always)]
    pub fn begin_nested(&mut self, field_id: u32) -> Message<'_> {
        let level = self
            .w
            .begin_nested(make_tag(field_id, WireType::LengthDelimited));
        let start = self.w.written();
        Message {
            w: self.w,
            start,
            level,
        }
    }

    /// Begins a nested message of a generated type.
    #[inline(always)]
    pub fn begin_nested_as<'c, T: MessageWriter<'c>>(&'c mut self, field_id: u32) -> T {
        T::from_message(self.begin_nested(field_id))
    }
}

impl Drop for Message<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        if self.level != 0 {
            self.w.end_nested(self.level, self.start);
        }
    }
}

//! A zero-copy, schema-less protobuf decoder for untrusted input.
//!
//! The writer side of this crate is built for speed on trusted data; this module is built for
//! robustness on bytes that may come from anywhere (a trace file, another process's shared
//! memory, a fuzzer). The two share nothing but [`crate::wire`]. The design follows Perfetto's
//! `protozero::ProtoDecoder` (`src/protozero/proto_decoder.cc`) rule for rule, so that a trace
//! that Perfetto's tools accept is accepted here and vice versa.
//!
//! # Layers
//!
//! * [`ProtoDecoder`] walks the fields of one message in wire order. It knows no schema: every
//!   field comes out as a [`Field`] (an id plus a [`FieldValue`]), and the caller picks the
//!   interpretation with a typed accessor such as [`Field::as_sint64`] or [`Field::as_str`].
//!   Nested messages are not entered: [`Field::as_message`] hands back a new decoder over the
//!   payload, so the decoder itself never recurses and a deeply nested input cannot overflow the
//!   stack unless the caller chooses to recurse.
//! * [`PackedVarints`], [`PackedFixed32`] and [`PackedFixed64`] iterate over the elements of a
//!   packed repeated field.
//! * [`TypedDecoder`] indexes the fields of one message by a dense slot number up front, so that
//!   generated message views can answer "what is field 500?" without rescanning. It keeps fixed
//!   arrays of `N` entries and never touches the heap.
//!
//! Nothing here allocates, and nothing copies payloads: strings, bytes and nested messages are
//! slices borrowed from the input for its lifetime `'a`. There is no `unsafe` code.
//!
//! # What is an error, what is skipped
//!
//! A protobuf stream is only self-delimiting field by field: once a tag or a length is wrong,
//! every later byte is garbage, so the decoder stops at the first malformed field and reports a
//! [`DecodeError`]. These are errors:
//!
//! * a varint (tag, value or length) that runs past the end of the buffer
//!   ([`DecodeError::TruncatedVarint`]) or that has more than [`MAX_VARINT_SIZE`] bytes
//!   ([`DecodeError::VarintTooLong`]);
//! * a field id of 0 ([`DecodeError::ZeroFieldId`]);
//! * the obsolete group wire types 3 and 4 and the undefined 6 and 7
//!   ([`DecodeError::InvalidWireType`]): their payload size is unknown, so decoding cannot go on;
//! * a fixed32 or fixed64 value, or a length-delimited payload, that runs past the end of the
//!   buffer ([`DecodeError::TruncatedFixed32`], [`DecodeError::TruncatedFixed64`],
//!   [`DecodeError::PayloadPastEnd`]).
//!
//! When [`ProtoDecoder::read_field`] fails the cursor does not move, so a caller that decodes a
//! buffer that is still being filled can retry from the same place once more bytes arrived.
//!
//! Two kinds of well-formed fields are **skipped** silently, and decoding goes on after them:
//!
//! * a field id above [`MAX_FIELD_ID`] (2^24 − 1). Perfetto's `Field` packs the id in 24 bits;
//!   no Perfetto schema uses larger ids, so such a field can only be an extension or noise.
//! * a length-delimited field whose length is above [`MAX_MESSAGE_LENGTH`] (2^28 − 1) but still
//!   within the buffer. The writer never produces one (its size fields are 4-byte redundant
//!   varints), so such a payload is not ours to interpret; its extent is known, so the fields
//!   after it are still trustworthy.
//!
//! Varints are decoded leniently where that is unambiguous: a redundant encoding such as
//! `87 80 80 00` (the writer's 4-byte size fields) decodes to 7, and a 10-byte varint whose last
//! byte carries bits beyond the 64th has those bits dropped, as Perfetto's `ParseVarInt` and
//! protobuf's C++ `ReadVarint64FromArray` do. (prost and Go's `protowire` reject such a varint
//! instead; no encoder produces one, so accepting it only matters for hostile input, and
//! truncating keeps us in step with Perfetto's tools.)
//!
//! Offsets in a [`DecodeError`] are relative to the slice the failing decoder or iterator was
//! built on (for a nested message, its payload, not the outer buffer).
//!
//! # Example
//!
//! ```
//! use protozero::decoder::ProtoDecoder;
//!
//! // { 1: 150, 2: "hi" }
//! let bytes = [0x08, 0x96, 0x01, 0x12, 0x02, b'h', b'i'];
//! let mut decoder = ProtoDecoder::new(&bytes);
//! let first = decoder.read_field()?.unwrap();
//! assert_eq!((first.id(), first.as_u64()), (1, 150));
//! let second = decoder.read_field()?.unwrap();
//! assert_eq!((second.id(), second.as_str()?), (2, "hi"));
//! assert_eq!(decoder.read_field()?, None);
//! # Ok::<(), protozero::decoder::DecodeError>(())
//! ```

#![forbid(unsafe_code)]

mod field;
mod packed;
pub(crate) mod slots;
mod typed;
mod varint;

use std::fmt;
use std::iter::FusedIterator;

use crate::wire::{WireType, MAX_FIELD_ID, MAX_MESSAGE_LENGTH, MAX_VARINT_SIZE};

pub use field::{Field, FieldValue};
pub use packed::{PackedFixed32, PackedFixed64, PackedVarints};
pub use typed::{RepeatedFields, RepeatedFixed32, RepeatedFixed64, RepeatedVarints, TypedDecoder};

use varint::read_varint;

// === impl DecodeError ===

/// Why a buffer could not be decoded.
///
/// Every variant carries the byte offset of the offending element, relative to the slice the
/// decoder or iterator that reported it was built on: a [`ProtoDecoder`]'s buffer, a packed
/// iterator's payload, a [`TypedDecoder`]'s message (also for its repeated iterators), a
/// string's bytes for [`Field::as_str`]. See the [module docs](crate::decoder) for which
/// malformations are errors and which are skipped.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// A varint (tag, value or length) starting at `offset` runs past the end of the buffer.
    TruncatedVarint {
        /// Offset of the varint's first byte.
        offset: usize,
    },
    /// A varint starting at `offset` has its continuation bit set on all of its first
    /// [`MAX_VARINT_SIZE`] bytes.
    VarintTooLong {
        /// Offset of the varint's first byte.
        offset: usize,
    },
    /// The tag starting at `offset` has field id 0, which protobuf reserves.
    ZeroFieldId {
        /// Offset of the tag's first byte.
        offset: usize,
    },
    /// The tag starting at `offset` has a wire type this decoder cannot skip: 3 and 4 (groups,
    /// obsolete) or 6 and 7 (undefined).
    InvalidWireType {
        /// Offset of the tag's first byte.
        offset: usize,
        /// The low 3 bits of the tag.
        wire_type: u8,
    },
    /// A length-delimited payload that starts at `offset` is longer than what is left of the
    /// buffer.
    PayloadPastEnd {
        /// Offset of the payload's first byte (just after its length varint).
        offset: usize,
        /// The length the field claims.
        len: u64,
    },
    /// A fixed32 value starting at `offset` has fewer than 4 bytes left in the buffer.
    TruncatedFixed32 {
        /// Offset of the value's first byte.
        offset: usize,
    },
    /// A fixed64 value starting at `offset` has fewer than 8 bytes left in the buffer.
    TruncatedFixed64 {
        /// Offset of the value's first byte.
        offset: usize,
    },
    /// A packed fixed32 or fixed64 payload whose size is not a multiple of the element size.
    PackedSizeNotMultiple {
        /// Offset of the incomplete trailing element (the payload's start plus its size rounded
        /// down to a multiple of `element_size`).
        offset: usize,
        /// The element size: 4 or 8.
        element_size: u8,
    },
    /// A string field is not valid UTF-8.
    InvalidUtf8 {
        /// Offset, within the string, of the first byte that is not valid UTF-8.
        offset: usize,
    },
}

impl DecodeError {
    /// The byte offset the error refers to; see each variant for what it points at.
    pub const fn offset(&self) -> usize {
        match *self {
            DecodeError::TruncatedVarint { offset }
            | DecodeError::VarintTooLong { offset }
            | DecodeError::ZeroFieldId { offset }
            | DecodeError::InvalidWireType { offset, .. }
            | DecodeError::PayloadPastEnd { offset, .. }
            | DecodeError::TruncatedFixed32 { offset }
            | DecodeError::TruncatedFixed64 { offset }
            | DecodeError::PackedSizeNotMultiple { offset, .. }
            | DecodeError::InvalidUtf8 { offset } => offset,
        }
    }

    /// The same error with `base` added to its offset, for an error found in a sub-slice that
    /// starts at `base`.
    pub(crate) const fn rebased(mut self, base: usize) -> Self {
        match &mut self {
            DecodeError::TruncatedVarint { offset }
            | DecodeError::VarintTooLong { offset }
            | DecodeError::ZeroFieldId { offset }
            | DecodeError::InvalidWireType { offset, .. }
            | DecodeError::PayloadPastEnd { offset, .. }
            | DecodeError::TruncatedFixed32 { offset }
            | DecodeError::TruncatedFixed64 { offset }
            | DecodeError::PackedSizeNotMultiple { offset, .. }
            | DecodeError::InvalidUtf8 { offset } => *offset += base,
        }
        self
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DecodeError::TruncatedVarint { offset } => {
                write!(f, "truncated varint at offset {offset}")
            }
            DecodeError::VarintTooLong { offset } => {
                write!(
                    f,
                    "varint longer than {MAX_VARINT_SIZE} bytes at offset {offset}"
                )
            }
            DecodeError::ZeroFieldId { offset } => write!(f, "field id 0 at offset {offset}"),
            DecodeError::InvalidWireType { offset, wire_type } => {
                write!(f, "invalid wire type {wire_type} at offset {offset}")
            }
            DecodeError::PayloadPastEnd { offset, len } => write!(
                f,
                "length-delimited payload of {len} bytes at offset {offset} runs past the end"
            ),
            DecodeError::TruncatedFixed32 { offset } => {
                write!(f, "truncated fixed32 at offset {offset}")
            }
            DecodeError::TruncatedFixed64 { offset } => {
                write!(f, "truncated fixed64 at offset {offset}")
            }
            DecodeError::PackedSizeNotMultiple {
                offset,
                element_size,
            } => write!(
                f,
                "packed payload size is not a multiple of {element_size}: \
                 incomplete element at offset {offset}"
            ),
            DecodeError::InvalidUtf8 { offset } => {
                write!(f, "invalid UTF-8 at offset {offset}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

// === impl ProtoDecoder ===

/// Walks the fields of one protobuf message in wire order, without a schema.
///
/// Built over a borrowed byte slice; fields borrow from it. [`read_field`](Self::read_field)
/// returns the next field and advances a cursor; the decoder is also an [`Iterator`] over
/// `Result<Field, DecodeError>` that yields an error once and then ends.
///
/// Fields with an id above [`MAX_FIELD_ID`] and length-delimited fields longer than
/// [`MAX_MESSAGE_LENGTH`] are skipped; see the [module docs](crate::decoder).
#[derive(Clone, Debug)]
pub struct ProtoDecoder<'a> {
    buf: &'a [u8],
    /// The cursor: offset of the next field's tag. Always `<= buf.len()`.
    pos: usize,
    /// Set when the iterator has yielded an error, so that it yields it only once.
    failed: bool,
}

/// What parsing one field produced.
enum Parsed<'a> {
    /// A field, and the offset just past it.
    Field(Field<'a>, usize),
    /// A well-formed field to skip, and the offset just past it.
    Skip(usize),
}

impl<'a> ProtoDecoder<'a> {
    /// A decoder over the message `buf`, with the cursor at its start.
    #[inline]
    pub const fn new(buf: &'a [u8]) -> Self {
        ProtoDecoder {
            buf,
            pos: 0,
            failed: false,
        }
    }

    /// A decoder over `buf` with the cursor at `pos` (clamped to the end).
    #[inline]
    pub(crate) fn with_offset(buf: &'a [u8], pos: usize) -> Self {
        ProtoDecoder {
            buf,
            pos: pos.min(buf.len()),
            failed: false,
        }
    }

    /// Reads the field at the cursor and moves the cursor past it.
    ///
    /// Returns `Ok(None)` at the end of the buffer. Fields that are
    /// [skipped](crate::decoder#what-is-an-error-what-is-skipped) are consumed without being
    /// returned. On error the cursor stays at the start of the malformed field (after any
    /// skipped fields before it), so calling again returns the same error.
    #[inline]
    pub fn read_field(&mut self) -> Result<Option<Field<'a>>, DecodeError> {
        loop {
            if self.pos >= self.buf.len() {
                return Ok(None);
            }
            match parse_field(self.buf, self.pos)? {
                Parsed::Field(field, next) => {
                    self.pos = next;
                    return Ok(Some(field));
                }
                Parsed::Skip(next) => self.pos = next,
            }
        }
    }

    /// The first field with id `id`, scanning from the start of the buffer; the cursor does not
    /// move.
    ///
    /// Returns `None` if no such field comes before the end or before the first malformed
    /// field. For a non-repeated field protobuf says the *last* occurrence wins: use
    /// [`find_last_field`](Self::find_last_field) for that reading.
    pub fn find_field(&self, id: u32) -> Option<Field<'a>> {
        ProtoDecoder::new(self.buf)
            .map_while(Result::ok)
            .find(|f| f.id() == id)
    }

    /// The last field with id `id` before the end or before the first malformed field; the
    /// cursor does not move.
    pub fn find_last_field(&self, id: u32) -> Option<Field<'a>> {
        ProtoDecoder::new(self.buf)
            .map_while(Result::ok)
            .filter(|f| f.id() == id)
            .last()
    }

    /// Moves the cursor back to the start of the buffer (and re-arms the iterator after an
    /// error).
    #[inline]
    pub fn reset(&mut self) {
        self.pos = 0;
        self.failed = false;
    }

    /// The cursor: the offset of the next field to read.
    #[inline]
    pub const fn offset(&self) -> usize {
        self.pos
    }

    /// How many bytes lie after the cursor.
    #[inline]
    pub const fn bytes_left(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The whole buffer this decoder was built on.
    #[inline]
    pub const fn bytes(&self) -> &'a [u8] {
        self.buf
    }
}

impl<'a> Iterator for ProtoDecoder<'a> {
    type Item = Result<Field<'a>, DecodeError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.read_field() {
            Ok(field) => field.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

impl FusedIterator for ProtoDecoder<'_> {}

/// The tag starting at `start` and the offset past it. One-byte tags (field ids below 16, the
/// common case in trace packets) skip the varint reader.
#[inline(always)]
pub(crate) fn read_tag(buf: &[u8], start: usize) -> Result<(u64, usize), DecodeError> {
    match buf.get(start) {
        Some(&b) if b < 0x80 => Ok((u64::from(b), start + 1)),
        _ => read_varint(buf, start),
    }
}

/// The payload of the length-delimited value whose length varint is at `pos`: where it starts
/// and ends, and whether protozero skips it (longer than [`MAX_MESSAGE_LENGTH`]).
#[inline(always)]
pub(crate) fn payload_bounds(buf: &[u8], pos: usize) -> Result<(usize, usize, bool), DecodeError> {
    let (len, payload_start) = read_varint(buf, pos)?;
    let left = buf.len() - payload_start;
    // `left` fits in u64 on every supported target; compare before converting `len` down so a
    // huge length cannot wrap.
    if len > left as u64 {
        return Err(DecodeError::PayloadPastEnd {
            offset: payload_start,
            len,
        });
    }
    let end = payload_start + len as usize;
    Ok((payload_start, end, len > u64::from(MAX_MESSAGE_LENGTH)))
}

/// Parses the field whose tag starts at `start` (`start < buf.len()`).
///
/// The order of checks follows Perfetto's `ParseOneField`: tag, field id 0, wire type, value;
/// only a field that is well-formed can be skipped.
#[inline]
fn parse_field(buf: &[u8], start: usize) -> Result<Parsed<'_>, DecodeError> {
    let (tag, mut pos) = read_tag(buf, start)?;
    let id = tag >> 3;
    if id == 0 {
        return Err(DecodeError::ZeroFieldId { offset: start });
    }
    let wire_bits = (tag & 7) as u8;
    let Some(wire_type) = WireType::from_bits(wire_bits) else {
        return Err(DecodeError::InvalidWireType {
            offset: start,
            wire_type: wire_bits,
        });
    };
    let value = match wire_type {
        WireType::Varint => {
            let (v, next) = read_varint(buf, pos)?;
            pos = next;
            FieldValue::Varint(v)
        }
        WireType::Fixed32 => {
            let Some(bytes) = buf.get(pos..pos + 4) else {
                return Err(DecodeError::TruncatedFixed32 { offset: pos });
            };
            pos += 4;
            let mut le = [0u8; 4];
            le.copy_from_slice(bytes);
            FieldValue::Fixed32(u32::from_le_bytes(le))
        }
        WireType::Fixed64 => {
            let Some(bytes) = buf.get(pos..pos + 8) else {
                return Err(DecodeError::TruncatedFixed64 { offset: pos });
            };
            pos += 8;
            let mut le = [0u8; 8];
            le.copy_from_slice(bytes);
            FieldValue::Fixed64(u64::from_le_bytes(le))
        }
        WireType::LengthDelimited => {
            let (payload_start, end, skipped) = payload_bounds(buf, pos)?;
            if skipped {
                return Ok(Parsed::Skip(end));
            }
            pos = end;
            FieldValue::Bytes(&buf[payload_start..end])
        }
    };
    if id > u64::from(MAX_FIELD_ID) {
        return Ok(Parsed::Skip(pos));
    }
    Ok(Parsed::Field(Field::new(id as u32, value), pos))
}

/// [`parse_field`] without building the value: the id of the field whose tag starts at
/// `start` (`None` for a field that is skipped) and the offset just past it. The same checks
/// in the same order, so the same errors; what [`TypedDecoder::new`] indexes a message with.
#[inline(always)]
pub(crate) fn scan_field(buf: &[u8], start: usize) -> Result<(Option<u32>, usize), DecodeError> {
    let (tag, pos) = read_tag(buf, start)?;
    scan_after_tag(buf, start, tag, pos)
}

/// [`scan_field`] once the tag is read: `tag`, read from `start`, whose value starts at `pos`.
/// What the generated views' dispatch on whole tags falls back to for a tag it has no arm for.
#[inline(always)]
pub(crate) fn scan_after_tag(
    buf: &[u8],
    start: usize,
    tag: u64,
    pos: usize,
) -> Result<(Option<u32>, usize), DecodeError> {
    let id = tag >> 3;
    if id == 0 {
        return Err(DecodeError::ZeroFieldId { offset: start });
    }
    let end = match tag & 7 {
        0 => read_varint(buf, pos)?.1,
        1 => {
            if buf.len() - pos < 8 {
                return Err(DecodeError::TruncatedFixed64 { offset: pos });
            }
            pos + 8
        }
        2 => {
            let (_, end, skipped) = payload_bounds(buf, pos)?;
            if skipped {
                return Ok((None, end));
            }
            end
        }
        5 => {
            if buf.len() - pos < 4 {
                return Err(DecodeError::TruncatedFixed32 { offset: pos });
            }
            pos + 4
        }
        w => {
            return Err(DecodeError::InvalidWireType {
                offset: start,
                wire_type: w as u8,
            })
        }
    };
    if id > u64::from(MAX_FIELD_ID) {
        return Ok((None, end));
    }
    Ok((Some(id as u32), end))
}

#[cfg(test)]
mod tests;

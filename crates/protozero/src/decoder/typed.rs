//! [`TypedDecoder`]: the fields of one message, indexed by slot, for generated message views.
//!
//! Perfetto's `TypedProtoDecoder<MAX_FIELD_ID>` keeps an array indexed by field id, with a heap
//! spill area for repeated fields beyond 100 entries. Here the code generator maps the field ids
//! a message declares to dense slots `0..N`, so the arrays stay small whatever the ids are (a
//! field numbered 500 costs one slot, not 500), and repeated fields are found again by
//! re-scanning the message instead of being copied aside. The result needs no heap at all.
//!
//! A slot is 16 bytes (the offset of the last occurrence, the id, the count): a view is built
//! for every message a reader touches, so the size of this struct — initialized and moved each
//! time — is what decoding a trace costs. Storing decoded `Field`s instead (48 bytes a slot)
//! made decoding a trace-shaped buffer about twice as slow.

use std::iter::FusedIterator;

use super::{
    scan_field, DecodeError, Field, FieldValue, PackedFixed32, PackedFixed64, PackedVarints,
    ProtoDecoder,
};

// === impl TypedDecoder ===

/// The fields of one message, parsed up front and indexed by a dense slot number.
///
/// [`new`](Self::new) walks the whole message once with a [`ProtoDecoder`] and records, for each
/// slot, the offset of the last occurrence, the field id and the number of occurrences, in
/// fixed arrays of `N` entries (no heap allocation). Fields whose id maps to no slot are unknown
/// fields and are skipped. Parsing stops at the first malformed field: the fields before it stay
/// available and [`error`](Self::error) reports what went wrong.
///
/// Slot numbers `>= N` are never out of bounds: the accessors treat them as absent fields.
///
/// ```
/// use protozero::decoder::TypedDecoder;
///
/// // { 1: 5, 500: "x", 1: 6, 7: 0 }
/// let bytes = [0x08, 0x05, 0xa2, 0x1f, 0x01, b'x', 0x08, 0x06, 0x38, 0x00];
/// let msg = TypedDecoder::<2>::new(&bytes, |id| match id {
///     1 => Some(0),
///     500 => Some(1),
///     _ => None,
/// });
/// assert_eq!(msg.get(0).map(|f| f.as_u64()), Some(6)); // the last one wins
/// assert_eq!(msg.count(0), 2);
/// assert_eq!(msg.get(1).unwrap().as_str()?, "x");
/// assert!(msg.error().is_none());
/// # Ok::<(), protozero::decoder::DecodeError>(())
/// ```
#[derive(Clone, Debug)]
pub struct TypedDecoder<'a, const N: usize> {
    buf: &'a [u8],
    /// End of the well-formed prefix of `buf`: its length, or the offset of the malformed field.
    end: usize,
    error: Option<DecodeError>,
    /// Per slot: the offset of the last occurrence's tag (protobuf's "last one wins"); only
    /// meaningful when `count` is non-zero.
    last: [usize; N],
    /// Per slot: the field id that owns it (the first id seen for it).
    ids: [u32; N],
    /// Per slot: the number of occurrences; 0 means absent.
    count: [u32; N],
}

impl<'a, const N: usize> TypedDecoder<'a, N> {
    /// Parses the message `buf`, putting each field whose id `slot_of` maps to `Some(slot)` with
    /// `slot < N` in that slot.
    ///
    /// Ids for which `slot_of` returns `None` or a slot `>= N` are skipped (unknown fields).
    /// `slot_of` should map distinct ids to distinct slots; if two ids share a slot, the slot
    /// belongs to the id seen first in the message and the other id's fields are skipped, so
    /// that [`get`](Self::get), [`count`](Self::count) and [`repeated`](Self::repeated) always
    /// agree.
    pub fn new(buf: &'a [u8], slot_of: impl Fn(u32) -> Option<usize>) -> Self {
        let mut this = TypedDecoder {
            buf,
            end: buf.len(),
            error: None,
            last: [0; N],
            ids: [0; N],
            count: [0; N],
        };
        // One pass with the lean field scanner (no `Field` built): the same fields, skips and
        // errors as walking with a `ProtoDecoder` (whose cursor stays at a malformed field).
        let mut pos = 0;
        while pos < buf.len() {
            let start = pos;
            match scan_field(buf, pos) {
                Ok((id, next)) => {
                    pos = next;
                    let Some(id) = id else { continue };
                    let Some(slot) = slot_of(id).filter(|&slot| slot < N) else {
                        continue;
                    };
                    if this.count[slot] == 0 {
                        this.ids[slot] = id;
                    } else if this.ids[slot] != id {
                        continue;
                    }
                    this.last[slot] = start;
                    // A message holds fewer than 2^32 fields unless it is over 4 GiB of
                    // one-byte fields; saturate rather than wrap if it ever is.
                    this.count[slot] = this.count[slot].saturating_add(1);
                }
                Err(e) => {
                    this.error = Some(e);
                    this.end = start;
                    break;
                }
            }
        }
        this
    }

    /// The error that stopped parsing, if the message is malformed. The fields before the
    /// malformed one are still available.
    #[inline]
    pub fn error(&self) -> Option<DecodeError> {
        self.error
    }

    /// Whether the field in `slot` occurs at least once.
    #[inline]
    pub fn has(&self, slot: usize) -> bool {
        self.count(slot) != 0
    }

    /// The last occurrence of the field in `slot` (protobuf's rule for non-repeated fields: the
    /// last one wins), or `None` if it is absent or `slot >= N`.
    #[inline]
    pub fn get(&self, slot: usize) -> Option<Field<'a>> {
        if self.count(slot) == 0 {
            return None;
        }
        // The field was parsed successfully at this offset when the decoder was built, from the
        // same well-formed prefix, so this cannot fail; `ok()` keeps that a non-panicking fact.
        ProtoDecoder::with_offset(&self.buf[..self.end], self.last[slot])
            .read_field()
            .ok()
            .flatten()
    }

    /// How many times the field in `slot` occurs (0 if `slot >= N`).
    #[inline]
    pub fn count(&self, slot: usize) -> usize {
        self.count.get(slot).copied().unwrap_or(0) as usize
    }

    /// Every occurrence of the field in `slot`, in wire order.
    ///
    /// For a packed repeated field each occurrence is one length-delimited chunk of elements; use
    /// [`repeated_varints`](Self::repeated_varints) and its siblings to get the elements.
    pub fn repeated(&self, slot: usize) -> RepeatedFields<'a> {
        match self.count(slot) {
            0 => RepeatedFields {
                decoder: ProtoDecoder::new(&[]),
                id: 0,
                remaining: 0,
            },
            // A single occurrence is the last one: start there instead of scanning.
            1 => RepeatedFields {
                decoder: ProtoDecoder::with_offset(&self.buf[..self.end], self.last[slot]),
                id: self.ids[slot],
                remaining: 1,
            },
            n => RepeatedFields {
                decoder: ProtoDecoder::new(&self.buf[..self.end]),
                id: self.ids[slot],
                remaining: n,
            },
        }
    }

    /// The elements of a repeated varint field (`int32`, `uint64`, `sint64`, `bool`, enums, ...)
    /// in `slot`, whether it was written packed, unpacked, or both.
    ///
    /// Packed occurrences are expanded in place; varint occurrences are yielded as they are;
    /// fixed32 and fixed64 occurrences, which cannot encode such an element, are skipped as
    /// protobuf parsers skip a field with an unexpected wire type. A malformed packed payload
    /// yields one error (offset relative to [`bytes`](Self::bytes)) and ends the iteration.
    pub fn repeated_varints(&self, slot: usize) -> RepeatedVarints<'a> {
        RepeatedVarints {
            inner: Unified::new(self.repeated(slot)),
        }
    }

    /// The elements of a repeated 4-byte field (`fixed32`, `sfixed32`, `float`) in `slot`, packed
    /// or not; varint and fixed64 occurrences are skipped. See
    /// [`repeated_varints`](Self::repeated_varints).
    pub fn repeated_fixed32(&self, slot: usize) -> RepeatedFixed32<'a> {
        RepeatedFixed32 {
            inner: Unified::new(self.repeated(slot)),
        }
    }

    /// The elements of a repeated 8-byte field (`fixed64`, `sfixed64`, `double`) in `slot`,
    /// packed or not; varint and fixed32 occurrences are skipped. See
    /// [`repeated_varints`](Self::repeated_varints).
    pub fn repeated_fixed64(&self, slot: usize) -> RepeatedFixed64<'a> {
        RepeatedFixed64 {
            inner: Unified::new(self.repeated(slot)),
        }
    }

    /// The whole message this decoder was built on.
    #[inline]
    pub fn bytes(&self) -> &'a [u8] {
        self.buf
    }
}

// === impl RepeatedFields ===

/// Every occurrence of one field of a [`TypedDecoder`], in wire order; see
/// [`TypedDecoder::repeated`].
#[derive(Clone, Debug)]
pub struct RepeatedFields<'a> {
    /// Positioned at or before the next occurrence, over the well-formed prefix of the message.
    decoder: ProtoDecoder<'a>,
    id: u32,
    /// Occurrences not yet yielded.
    remaining: usize,
}

impl<'a> RepeatedFields<'a> {
    /// The next occurrence, with the offset (relative to the message) of its payload's first
    /// byte.
    fn next_with_offset(&mut self) -> Option<(Field<'a>, usize)> {
        while self.remaining > 0 {
            match self.decoder.read_field() {
                Ok(Some(field)) if field.id() == self.id => {
                    self.remaining -= 1;
                    let payload_start = self.decoder.offset() - field.as_bytes().len();
                    return Some((field, payload_start));
                }
                Ok(Some(_)) => {}
                // Unreachable: the `TypedDecoder` counted `remaining` occurrences in this same
                // well-formed prefix. Stop rather than loop if that ever breaks.
                Ok(None) | Err(_) => self.remaining = 0,
            }
        }
        None
    }
}

impl<'a> Iterator for RepeatedFields<'a> {
    type Item = Field<'a>;

    #[inline]
    fn next(&mut self) -> Option<Field<'a>> {
        self.next_with_offset().map(|(field, _)| field)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for RepeatedFields<'_> {}
impl FusedIterator for RepeatedFields<'_> {}

// === impl RepeatedVarints / RepeatedFixed32 / RepeatedFixed64 ===

/// A packed iterator that can also take unpacked occurrences: the glue between
/// [`RepeatedFields`] and the three unified iterators.
pub(crate) trait Elements<'a>: Iterator<Item = Result<Self::Elem, DecodeError>> {
    type Elem;
    fn from_payload(payload: &'a [u8]) -> Self;
    /// The element an unpacked occurrence carries, or `None` for a wire type that cannot.
    fn scalar(value: FieldValue<'a>) -> Option<Self::Elem>;
}

impl<'a> Elements<'a> for PackedVarints<'a> {
    type Elem = u64;
    fn from_payload(payload: &'a [u8]) -> Self {
        PackedVarints::new(payload)
    }
    fn scalar(value: FieldValue<'a>) -> Option<u64> {
        match value {
            FieldValue::Varint(v) => Some(v),
            _ => None,
        }
    }
}

impl<'a> Elements<'a> for PackedFixed32<'a> {
    type Elem = u32;
    fn from_payload(payload: &'a [u8]) -> Self {
        PackedFixed32::new(payload)
    }
    fn scalar(value: FieldValue<'a>) -> Option<u32> {
        match value {
            FieldValue::Fixed32(v) => Some(v),
            _ => None,
        }
    }
}

impl<'a> Elements<'a> for PackedFixed64<'a> {
    type Elem = u64;
    fn from_payload(payload: &'a [u8]) -> Self {
        PackedFixed64::new(payload)
    }
    fn scalar(value: FieldValue<'a>) -> Option<u64> {
        match value {
            FieldValue::Fixed64(v) => Some(v),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
struct Unified<'a, P> {
    fields: RepeatedFields<'a>,
    /// The packed occurrence being expanded, if any.
    packed: Option<P>,
    /// Offset (relative to the message) of `packed`'s payload, to rebase its errors.
    packed_start: usize,
}

impl<'a, P: Elements<'a>> Unified<'a, P> {
    fn new(fields: RepeatedFields<'a>) -> Self {
        Unified {
            fields,
            packed: None,
            packed_start: 0,
        }
    }

    fn next(&mut self) -> Option<Result<P::Elem, DecodeError>> {
        loop {
            if let Some(packed) = &mut self.packed {
                match packed.next() {
                    Some(Ok(v)) => return Some(Ok(v)),
                    Some(Err(e)) => {
                        // One error, then the end, like the packed iterators themselves.
                        self.packed = None;
                        self.fields.remaining = 0;
                        return Some(Err(e.rebased(self.packed_start)));
                    }
                    None => self.packed = None,
                }
            }
            let (field, payload_start) = self.fields.next_with_offset()?;
            match field.value() {
                FieldValue::Bytes(payload) => {
                    self.packed = Some(P::from_payload(payload));
                    self.packed_start = payload_start;
                }
                value => {
                    if let Some(v) = P::scalar(value) {
                        return Some(Ok(v));
                    }
                }
            }
        }
    }
}

macro_rules! unified_iterator {
    ($(#[$doc:meta])* $name:ident, $packed:ident, $elem:ty) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name<'a> {
            inner: Unified<'a, $packed<'a>>,
        }

        impl Iterator for $name<'_> {
            type Item = Result<$elem, DecodeError>;

            #[inline]
            fn next(&mut self) -> Option<Self::Item> {
                self.inner.next()
            }
        }

        impl FusedIterator for $name<'_> {}
    };
}

unified_iterator!(
    /// The elements of a repeated varint field, packed and unpacked occurrences alike, as raw
    /// `u64`s; see [`TypedDecoder::repeated_varints`].
    RepeatedVarints,
    PackedVarints,
    u64
);
unified_iterator!(
    /// The elements of a repeated 4-byte field, packed and unpacked occurrences alike, as raw
    /// `u32`s; see [`TypedDecoder::repeated_fixed32`].
    RepeatedFixed32,
    PackedFixed32,
    u32
);
unified_iterator!(
    /// The elements of a repeated 8-byte field, packed and unpacked occurrences alike, as raw
    /// `u64`s; see [`TypedDecoder::repeated_fixed64`].
    RepeatedFixed64,
    PackedFixed64,
    u64
);

#[cfg(test)]
mod tests;

//! [`Slots`]: what a generated message view keeps of its message after one pass over it.
//!
//! A generated view's `decode` walks the message once, dispatching on each field's whole tag
//! (id and wire type together) into a slot sized for that message: the value itself for a
//! singular scalar (no second read when a getter asks), the offset of the length for a singular
//! string, bytes or message, and for a repeated field only where its occurrences lie (from the
//! first one's tag to the end of the last one), which its iterator walks on demand. A tag with no
//! arm (an unknown field, or a declared one with a wire type that cannot carry its type) is
//! checked and skipped by the same scanner as [`ProtoDecoder`](super::ProtoDecoder), so a
//! message is malformed for a view exactly when it is for the decoder, with the same error.
//!
//! Since the arms only take occurrences with a usable wire type, a singular slot holds the last
//! occurrence *with the right wire type* directly (protobuf's C++ rule, and what the views
//! have always returned) without a second look.
//!
//! The struct holds `S` 8-byte values, `W = ceil(S / 64)` presence words and `R` 16-byte spans,
//! and nothing else: it is built for every message a reader touches, so its size is what
//! creating a view costs.

use std::iter::FusedIterator;

use super::typed::Elements;
use super::{
    payload_bounds, read_tag, read_varint, scan_after_tag, DecodeError, FieldValue, PackedFixed32,
    PackedFixed64, PackedVarints,
};

/// Where a repeated field's occurrences lie in the message: `first` is the tag offset of the
/// first one, `end` the offset just past the last one; `end == 0` when there is none (every
/// occurrence ends past offset 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Span {
    first: usize,
    end: usize,
}

/// The fields of one message as a generated view keeps them; see the [module docs](self).
///
/// `S` singular slots, `W` presence words (`ceil(S / 64)`), `R` repeated slots. Slot numbers
/// out of range read as absent fields (the generated code only passes constants in range).
#[derive(Clone, Debug)]
pub struct Slots<'a, const S: usize, const W: usize, const R: usize> {
    buf: &'a [u8],
    /// Bit `s % 64` of word `s / 64`: singular slot `s` holds an occurrence.
    present: [u64; W],
    /// Per singular slot: the value of a varint, fixed32 (zero-extended) or fixed64 field, or
    /// the offset of a length-delimited field's length varint.
    values: [u64; S],
    spans: [Span; R],
}

impl<'a, const S: usize, const W: usize, const R: usize> Slots<'a, S, W, R> {
    /// No field yet, over the message `buf`.
    #[inline(always)]
    pub fn new(buf: &'a [u8]) -> Self {
        Slots {
            buf,
            present: [0; W],
            values: [0; S],
            spans: [Span::default(); R],
        }
    }

    /// The message.
    #[inline(always)]
    pub fn bytes(&self) -> &'a [u8] {
        self.buf
    }

    #[inline(always)]
    fn set(&mut self, slot: usize, value: u64) {
        if let (Some(v), Some(w)) = (self.values.get_mut(slot), self.present.get_mut(slot / 64)) {
            *v = value;
            *w |= 1 << (slot % 64);
        }
    }

    #[inline(always)]
    fn note(&mut self, rep: usize, start: usize, end: usize) {
        if let Some(span) = self.spans.get_mut(rep) {
            if span.end == 0 {
                span.first = start;
            }
            span.end = end;
        }
    }

    // --- decoding: each takes the offset `at` of the value after the tag and returns the
    // offset past the field, or the error `ProtoDecoder` would report there.

    /// A varint for singular slot `slot`.
    #[inline(always)]
    pub fn varint(&mut self, slot: usize, at: usize) -> Result<usize, DecodeError> {
        let (v, next) = read_varint(self.buf, at)?;
        self.set(slot, v);
        Ok(next)
    }

    /// A fixed32 for singular slot `slot`.
    #[inline(always)]
    pub fn fixed32(&mut self, slot: usize, at: usize) -> Result<usize, DecodeError> {
        let v = fixed32_at(self.buf, at)?;
        self.set(slot, u64::from(v));
        Ok(at + 4)
    }

    /// A fixed64 for singular slot `slot`.
    #[inline(always)]
    pub fn fixed64(&mut self, slot: usize, at: usize) -> Result<usize, DecodeError> {
        let v = fixed64_at(self.buf, at)?;
        self.set(slot, v);
        Ok(at + 8)
    }

    /// A length-delimited field for singular slot `slot` (unless protozero skips it: a payload
    /// above `MAX_MESSAGE_LENGTH`).
    #[inline(always)]
    pub fn len(&mut self, slot: usize, at: usize) -> Result<usize, DecodeError> {
        let (_, end, skipped) = payload_bounds(self.buf, at)?;
        if !skipped {
            self.set(slot, at as u64);
        }
        Ok(end)
    }

    /// A varint occurrence, whose tag is at `start`, of repeated slot `rep`.
    #[inline(always)]
    pub fn rep_varint(
        &mut self,
        rep: usize,
        start: usize,
        at: usize,
    ) -> Result<usize, DecodeError> {
        let (_, next) = read_varint(self.buf, at)?;
        self.note(rep, start, next);
        Ok(next)
    }

    /// A fixed32 occurrence of repeated slot `rep`.
    #[inline(always)]
    pub fn rep_fixed32(
        &mut self,
        rep: usize,
        start: usize,
        at: usize,
    ) -> Result<usize, DecodeError> {
        fixed32_at(self.buf, at)?;
        self.note(rep, start, at + 4);
        Ok(at + 4)
    }

    /// A fixed64 occurrence of repeated slot `rep`.
    #[inline(always)]
    pub fn rep_fixed64(
        &mut self,
        rep: usize,
        start: usize,
        at: usize,
    ) -> Result<usize, DecodeError> {
        fixed64_at(self.buf, at)?;
        self.note(rep, start, at + 8);
        Ok(at + 8)
    }

    /// A length-delimited occurrence of repeated slot `rep` (a packed chunk for a scalar field).
    #[inline(always)]
    pub fn rep_len(&mut self, rep: usize, start: usize, at: usize) -> Result<usize, DecodeError> {
        let (_, end, skipped) = payload_bounds(self.buf, at)?;
        if !skipped {
            self.note(rep, start, end);
        }
        Ok(end)
    }

    // --- reading

    /// Whether singular slot `slot` holds an occurrence.
    #[inline(always)]
    pub fn has(&self, slot: usize) -> bool {
        self.present
            .get(slot / 64)
            .is_some_and(|w| w & (1 << (slot % 64)) != 0)
    }

    /// The raw value in singular slot `slot` (a scalar's bits), if present.
    #[inline(always)]
    pub fn value(&self, slot: usize) -> Option<u64> {
        if self.has(slot) {
            self.values.get(slot).copied()
        } else {
            None
        }
    }

    /// The payload of the length-delimited field in singular slot `slot`, if present.
    #[inline(always)]
    pub fn payload(&self, slot: usize) -> Option<&'a [u8]> {
        let at = usize::try_from(self.value(slot)?).ok()?;
        // Read successfully from the same bytes when the view was decoded: cannot fail, and
        // `ok()` keeps that a non-panicking fact.
        let (start, end, _) = payload_bounds(self.buf, at).ok()?;
        self.buf.get(start..end)
    }

    /// The occurrences of field `id`, the one in repeated slot `rep`, in wire order.
    #[inline(always)]
    pub fn occurrences(&self, rep: usize, id: u32) -> Occurrences<'a> {
        let span = self.spans.get(rep).copied().unwrap_or_default();
        Occurrences {
            buf: self.buf.get(..span.end).unwrap_or_default(),
            pos: span.first,
            id: u64::from(id),
        }
    }
}

#[inline(always)]
fn fixed32_at(buf: &[u8], at: usize) -> Result<u32, DecodeError> {
    match buf.get(at..).and_then(|rest| rest.first_chunk::<4>()) {
        Some(&b) => Ok(u32::from_le_bytes(b)),
        None => Err(DecodeError::TruncatedFixed32 { offset: at }),
    }
}

#[inline(always)]
fn fixed64_at(buf: &[u8], at: usize) -> Result<u64, DecodeError> {
    match buf.get(at..).and_then(|rest| rest.first_chunk::<8>()) {
        Some(&b) => Ok(u64::from_le_bytes(b)),
        None => Err(DecodeError::TruncatedFixed64 { offset: at }),
    }
}

// === Occurrences ===

/// The occurrences of one field in a well-formed message, in wire order: each value, with the
/// offset (in the message) of the payload of a length-delimited one. See
/// [`Slots::occurrences`].
#[derive(Clone, Debug)]
pub struct Occurrences<'a> {
    /// The message up to the end of the field's last occurrence.
    buf: &'a [u8],
    pos: usize,
    id: u64,
}

impl<'a> Occurrences<'a> {
    #[inline]
    fn next_with_offset(&mut self) -> Option<(FieldValue<'a>, usize)> {
        while self.pos < self.buf.len() {
            let start = self.pos;
            // The message was walked whole when the view was decoded, so nothing here fails;
            // should it, the iteration ends (`stop`) rather than loop or panic.
            let Ok((tag, at)) = read_tag(self.buf, start) else {
                return self.stop();
            };
            if tag >> 3 != self.id {
                match scan_after_tag(self.buf, start, tag, at) {
                    Ok((_, next)) => self.pos = next,
                    Err(_) => return self.stop(),
                }
                continue;
            }
            let (value, offset, next) = match tag & 7 {
                0 => match read_varint(self.buf, at) {
                    Ok((v, next)) => (FieldValue::Varint(v), at, next),
                    Err(_) => return self.stop(),
                },
                1 => match fixed64_at(self.buf, at) {
                    Ok(v) => (FieldValue::Fixed64(v), at, at + 8),
                    Err(_) => return self.stop(),
                },
                2 => match payload_bounds(self.buf, at) {
                    Ok((_, end, true)) => {
                        // A payload protozero skips: not an occurrence.
                        self.pos = end;
                        continue;
                    }
                    Ok((s, end, false)) => match self.buf.get(s..end) {
                        Some(b) => (FieldValue::Bytes(b), s, end),
                        None => return self.stop(),
                    },
                    Err(_) => return self.stop(),
                },
                5 => match fixed32_at(self.buf, at) {
                    Ok(v) => (FieldValue::Fixed32(v), at, at + 4),
                    Err(_) => return self.stop(),
                },
                _ => return self.stop(),
            };
            self.pos = next;
            return Some((value, offset));
        }
        None
    }

    #[cold]
    fn stop<T>(&mut self) -> Option<T> {
        self.pos = self.buf.len();
        None
    }

    /// The payloads of the length-delimited occurrences only (strings, bytes, messages), with
    /// a fast path for their whole tag.
    #[inline]
    pub fn payloads(self) -> Payloads<'a> {
        Payloads { inner: self }
    }

    /// The elements of a repeated scalar field: varint occurrences and packed chunks.
    #[inline]
    pub(crate) fn varints(self) -> Scalars<'a, PackedVarints<'a>> {
        Scalars::new(self)
    }

    /// The elements of a repeated 4-byte field: fixed32 occurrences and packed chunks.
    #[inline]
    pub(crate) fn fixed32s(self) -> Scalars<'a, PackedFixed32<'a>> {
        Scalars::new(self)
    }

    /// The elements of a repeated 8-byte field: fixed64 occurrences and packed chunks.
    #[inline]
    pub(crate) fn fixed64s(self) -> Scalars<'a, PackedFixed64<'a>> {
        Scalars::new(self)
    }
}

impl<'a> Iterator for Occurrences<'a> {
    type Item = FieldValue<'a>;

    #[inline]
    fn next(&mut self) -> Option<FieldValue<'a>> {
        self.next_with_offset().map(|(v, _)| v)
    }
}

impl FusedIterator for Occurrences<'_> {}

/// The payloads of the length-delimited occurrences of one field; see
/// [`Occurrences::payloads`].
#[derive(Clone, Debug)]
pub struct Payloads<'a> {
    inner: Occurrences<'a>,
}

impl<'a> Iterator for Payloads<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let o = &mut self.inner;
        let want = (o.id << 3) | 2;
        while o.pos < o.buf.len() {
            // The common case: the next field is the next occurrence (a run of repeated
            // messages), read without the general walk.
            if let Ok((tag, at)) = read_tag(o.buf, o.pos) {
                if tag == want {
                    if let Ok((s, end, skipped)) = payload_bounds(o.buf, at) {
                        o.pos = end;
                        if skipped {
                            continue;
                        }
                        return o.buf.get(s..end);
                    }
                }
            }
            match o.next_with_offset()? {
                (FieldValue::Bytes(b), _) => return Some(b),
                _ => continue,
            }
        }
        None
    }
}

impl FusedIterator for Payloads<'_> {}

/// The elements of a repeated scalar field, packed and unpacked occurrences alike; a malformed
/// packed payload yields one error (its offset relative to the message) and ends the
/// iteration. See [`Occurrences::varints`].
#[derive(Clone, Debug)]
pub(crate) struct Scalars<'a, P> {
    fields: Occurrences<'a>,
    /// The packed occurrence being expanded, if any.
    packed: Option<P>,
    /// Offset (in the message) of `packed`'s payload, to rebase its errors.
    packed_start: usize,
}

impl<'a, P: Elements<'a>> Scalars<'a, P> {
    fn new(fields: Occurrences<'a>) -> Self {
        Scalars {
            fields,
            packed: None,
            packed_start: 0,
        }
    }
}

impl<'a, P: Elements<'a>> Iterator for Scalars<'a, P> {
    type Item = Result<P::Elem, DecodeError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(packed) = &mut self.packed {
                match packed.next() {
                    Some(Ok(v)) => return Some(Ok(v)),
                    Some(Err(e)) => {
                        // One error, then the end, like the packed iterators themselves.
                        self.packed = None;
                        self.fields.pos = self.fields.buf.len();
                        return Some(Err(e.rebased(self.packed_start)));
                    }
                    None => self.packed = None,
                }
            }
            let (value, offset) = self.fields.next_with_offset()?;
            match value {
                FieldValue::Bytes(payload) => {
                    self.packed = Some(P::from_payload(payload));
                    self.packed_start = offset;
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

impl<'a, P: Elements<'a>> FusedIterator for Scalars<'a, P> {}

/// The tag of the field whose tag starts at `start`, and the offset of its value.
#[inline(always)]
pub fn tag(buf: &[u8], start: usize) -> Result<(u64, usize), DecodeError> {
    read_tag(buf, start)
}

/// Checks and skips a field the dispatch has no arm for (its tag `tag` read from `start`, its
/// value at `at`): the offset past it, or the error `ProtoDecoder` reports there.
#[inline]
pub fn skip(buf: &[u8], start: usize, tag: u64, at: usize) -> Result<usize, DecodeError> {
    scan_after_tag(buf, start, tag, at).map(|(_, next)| next)
}

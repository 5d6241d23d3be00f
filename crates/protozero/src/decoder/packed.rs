//! Iterators over the elements of packed repeated fields.
//!
//! A packed field is one length-delimited field whose payload is the elements back to back:
//! varints, or 4- or 8-byte little-endian values. An empty payload has no elements. A malformed
//! payload (a truncated varint, or a size that is not a multiple of the element size) makes the
//! iterator yield one error and then end, like Perfetto's `PackedRepeatedFieldIterator` (which
//! sets its `parse_error` flag and stops).

use std::iter::FusedIterator;

use super::varint::read_varint;
use super::DecodeError;

// === impl PackedVarints ===

/// The elements of a packed repeated varint field (`int32`, `int64`, `uint32`, `uint64`,
/// `sint32`, `sint64`, `bool`, enums), as raw `u64`s.
///
/// Convert each element as the declared type requires: `v as i32` for `int32`,
/// [`zigzag_decode64`](crate::wire::zigzag_decode64) for `sint64`, and so on. Yields
/// [`DecodeError::TruncatedVarint`] or [`DecodeError::VarintTooLong`] once (offsets relative to
/// the payload) if the payload ends inside a varint, then ends.
#[derive(Clone, Debug)]
pub struct PackedVarints<'a> {
    buf: &'a [u8],
    pos: usize,
    failed: bool,
}

impl<'a> PackedVarints<'a> {
    /// An iterator over the varints packed in `payload`.
    #[inline]
    pub const fn new(payload: &'a [u8]) -> Self {
        PackedVarints {
            buf: payload,
            pos: 0,
            failed: false,
        }
    }
}

impl Iterator for PackedVarints<'_> {
    type Item = Result<u64, DecodeError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.buf.len() {
            return None;
        }
        match read_varint(self.buf, self.pos) {
            Ok((v, next)) => {
                self.pos = next;
                Some(Ok(v))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.failed {
            return (0, Some(0));
        }
        let left = self.buf.len() - self.pos;
        // Each element takes at least one byte; a non-empty rest yields at least one item (an
        // element or the error, which may span the whole rest).
        (usize::from(left > 0), Some(left))
    }
}

impl FusedIterator for PackedVarints<'_> {}

// === impl PackedFixed32 / PackedFixed64 ===

/// Shared state of the fixed-width packed iterators.
#[derive(Clone, Debug)]
struct Fixed<'a, const W: usize> {
    /// The whole elements not yet yielded; empty after an error.
    rest: &'a [u8],
    /// The size error to yield before anything else, if the payload size is not a multiple of
    /// `W`.
    error: Option<DecodeError>,
}

impl<'a, const W: usize> Fixed<'a, W> {
    const fn new(payload: &'a [u8]) -> Self {
        if payload.len() % W == 0 {
            Fixed {
                rest: payload,
                error: None,
            }
        } else {
            // Checked up front, as Perfetto does: a payload of the wrong size is not trusted
            // for any of its elements.
            let offset = payload.len() - payload.len() % W;
            Fixed {
                rest: &[],
                error: Some(DecodeError::PackedSizeNotMultiple {
                    offset,
                    element_size: W as u8,
                }),
            }
        }
    }

    #[inline]
    fn next(&mut self) -> Option<Result<[u8; W], DecodeError>> {
        if let Some(e) = self.error.take() {
            return Some(Err(e));
        }
        let (head, tail) = self.rest.split_first_chunk::<W>()?;
        self.rest = tail;
        Some(Ok(*head))
    }

    fn len(&self) -> usize {
        self.rest.len() / W + usize::from(self.error.is_some())
    }
}

/// The elements of a packed repeated 4-byte field (`fixed32`, `sfixed32`, `float`), as raw
/// `u32`s (use `as i32` or [`f32::from_bits`] to convert).
///
/// If the payload size is not a multiple of 4, yields one
/// [`DecodeError::PackedSizeNotMultiple`] and no elements.
#[derive(Clone, Debug)]
pub struct PackedFixed32<'a> {
    inner: Fixed<'a, 4>,
}

impl<'a> PackedFixed32<'a> {
    /// An iterator over the little-endian `u32`s packed in `payload`.
    #[inline]
    pub const fn new(payload: &'a [u8]) -> Self {
        PackedFixed32 {
            inner: Fixed::new(payload),
        }
    }
}

impl Iterator for PackedFixed32<'_> {
    type Item = Result<u32, DecodeError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|r| r.map(u32::from_le_bytes))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.inner.len();
        (n, Some(n))
    }
}

impl ExactSizeIterator for PackedFixed32<'_> {}
impl FusedIterator for PackedFixed32<'_> {}

/// The elements of a packed repeated 8-byte field (`fixed64`, `sfixed64`, `double`), as raw
/// `u64`s (use `as i64` or [`f64::from_bits`] to convert).
///
/// If the payload size is not a multiple of 8, yields one
/// [`DecodeError::PackedSizeNotMultiple`] and no elements.
#[derive(Clone, Debug)]
pub struct PackedFixed64<'a> {
    inner: Fixed<'a, 8>,
}

impl<'a> PackedFixed64<'a> {
    /// An iterator over the little-endian `u64`s packed in `payload`.
    #[inline]
    pub const fn new(payload: &'a [u8]) -> Self {
        PackedFixed64 {
            inner: Fixed::new(payload),
        }
    }
}

impl Iterator for PackedFixed64<'_> {
    type Item = Result<u64, DecodeError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|r| r.map(u64::from_le_bytes))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.inner.len();
        (n, Some(n))
    }
}

impl ExactSizeIterator for PackedFixed64<'_> {}
impl FusedIterator for PackedFixed64<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_payloads_are_empty() {
        assert_eq!(PackedVarints::new(&[]).next(), None);
        assert_eq!(PackedFixed32::new(&[]).next(), None);
        assert_eq!(PackedFixed64::new(&[]).next(), None);
        assert_eq!(PackedFixed32::new(&[]).len(), 0);
    }

    #[test]
    fn varints() {
        // 3, 270, 86942: the protobuf encoding guide's packed example.
        let payload = [0x03, 0x8e, 0x02, 0x9e, 0xa7, 0x05];
        let v: Vec<_> = PackedVarints::new(&payload).collect();
        assert_eq!(v, [Ok(3), Ok(270), Ok(86942)]);
        // Redundant encodings inside a packed payload.
        let v: Vec<_> = PackedVarints::new(&[0x87, 0x80, 0x80, 0x00, 0x01]).collect();
        assert_eq!(v, [Ok(7), Ok(1)]);
    }

    #[test]
    fn truncated_varint_yields_one_error_then_ends() {
        let mut it = PackedVarints::new(&[0x01, 0x96]);
        assert_eq!(it.next(), Some(Ok(1)));
        assert_eq!(
            it.next(),
            Some(Err(DecodeError::TruncatedVarint { offset: 1 }))
        );
        assert_eq!(it.next(), None);
        assert_eq!(it.next(), None);
        assert_eq!(it.size_hint(), (0, Some(0)));
    }

    #[test]
    fn overlong_varint_yields_one_error_then_ends() {
        let mut payload = vec![0x05];
        payload.extend([0xff; 11]);
        let v: Vec<_> = PackedVarints::new(&payload).collect();
        assert_eq!(v, [Ok(5), Err(DecodeError::VarintTooLong { offset: 1 })]);
    }

    #[test]
    fn fixed32() {
        let payload = [1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff];
        let it = PackedFixed32::new(&payload);
        assert_eq!(it.len(), 2);
        let v: Vec<_> = it.collect();
        assert_eq!(v, [Ok(1), Ok(0xffff_fffe)]);
    }

    #[test]
    fn fixed64() {
        let mut payload = 7u64.to_le_bytes().to_vec();
        payload.extend(u64::MAX.to_le_bytes());
        let v: Vec<_> = PackedFixed64::new(&payload).collect();
        assert_eq!(v, [Ok(7), Ok(u64::MAX)]);
    }

    #[test]
    fn fixed_size_not_a_multiple_yields_one_error_and_no_elements() {
        let mut it = PackedFixed32::new(&[1, 0, 0, 0, 2, 0]);
        assert_eq!(it.len(), 1);
        assert_eq!(
            it.next(),
            Some(Err(DecodeError::PackedSizeNotMultiple {
                offset: 4,
                element_size: 4
            }))
        );
        assert_eq!(it.next(), None);
        assert_eq!(it.next(), None);

        let v: Vec<_> = PackedFixed64::new(&[0; 12]).collect();
        assert_eq!(
            v,
            [Err(DecodeError::PackedSizeNotMultiple {
                offset: 8,
                element_size: 8
            })]
        );
        let v: Vec<_> = PackedFixed64::new(&[0; 3]).collect();
        assert_eq!(
            v,
            [Err(DecodeError::PackedSizeNotMultiple {
                offset: 0,
                element_size: 8
            })]
        );
        // A multiple of 4 is not a multiple of 8.
        assert_eq!(PackedFixed32::new(&[0; 12]).count(), 3);
        assert!(PackedFixed64::new(&[0; 4]).next().unwrap().is_err());
    }
}

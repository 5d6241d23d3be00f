//! The bounds-checked varint reader every part of the decoder uses.

use super::DecodeError;
use crate::wire::MAX_VARINT_SIZE;

/// Reads the varint that starts at `start` in `buf`; returns its value and the offset just past
/// it.
///
/// Redundant encodings (`87 80 80 00` is 7) are accepted. A 10th byte may carry bits beyond the
/// 64th; they are dropped, as Perfetto's `ParseVarInt` and protobuf's C++
/// `ReadVarint64FromArray` do (prost rejects them). A varint
/// whose 10th byte still has its continuation bit set is [`DecodeError::VarintTooLong`], even if
/// the buffer ends right there; one that is cut short by the end of the buffer before that is
/// [`DecodeError::TruncatedVarint`].
#[inline]
pub(super) fn read_varint(buf: &[u8], start: usize) -> Result<(u64, usize), DecodeError> {
    let rest = buf.get(start..).unwrap_or_default();
    match rest.first() {
        // Fast path: one-byte varints (small values, short lengths, one-byte tags).
        Some(&b) if b < 0x80 => Ok((u64::from(b), start + 1)),
        Some(_) => match read_varint_word(rest) {
            Some((v, len)) => Ok((v, start + len)),
            None => read_varint_slow(rest, start),
        },
        None => Err(DecodeError::TruncatedVarint { offset: start }),
    }
}

/// A varint of up to 8 bytes at the start of `rest`, read as one little-endian word when 8
/// bytes are left: its value and length. `None` for a longer varint or fewer than 8 bytes
/// left (the byte-by-byte reader has the rules for those). No per-byte bounds checks.
#[inline(always)]
fn read_varint_word(rest: &[u8]) -> Option<(u64, usize)> {
    let x = u64::from_le_bytes(*rest.first_chunk::<8>()?);
    // The high bit of each byte that would end the varint, cleared: the lowest is its end.
    let stops = !x & 0x8080_8080_8080_8080;
    if stops == 0 {
        return None;
    }
    // The bytes up to and including the last one (a mask up to its stop bit).
    let x = x & (stops ^ (stops - 1));
    let len = (stops.trailing_zeros() as usize + 1) / 8;
    // Gather the 7-bit groups: pairs into 14 bits, then 28, then 56.
    let x = (x & 0x007f_007f_007f_007f) | ((x & 0x7f00_7f00_7f00_7f00) >> 1);
    let x = (x & 0x0000_3fff_0000_3fff) | ((x & 0x3fff_0000_3fff_0000) >> 2);
    let x = (x & 0x0000_0000_0fff_ffff) | ((x & 0x0fff_ffff_0000_0000) >> 4);
    Some((x, len))
}

#[inline(never)]
fn read_varint_slow(rest: &[u8], start: usize) -> Result<(u64, usize), DecodeError> {
    let mut value = 0u64;
    for (i, &b) in rest.iter().take(MAX_VARINT_SIZE).enumerate() {
        // `7 * i <= 63`, so the shift never overflows; bits shifted past 64 are dropped.
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Ok((value, start + i + 1));
        }
    }
    if rest.len() >= MAX_VARINT_SIZE {
        Err(DecodeError::VarintTooLong { offset: start })
    } else {
        Err(DecodeError::TruncatedVarint { offset: start })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{encode_varint, redundant_varint};

    #[test]
    fn round_trips_every_bit_width() {
        let mut buf = [0u8; MAX_VARINT_SIZE];
        for shift in 0..64 {
            for v in [1u64 << shift, (1u64 << shift) - 1, u64::MAX >> shift] {
                let n = encode_varint(v, &mut buf);
                assert_eq!(read_varint(&buf[..n], 0), Ok((v, n)), "value {v}");
            }
        }
    }

    #[test]
    fn reads_at_an_offset() {
        let buf = [0xff, 0x96, 0x01, 0x05];
        assert_eq!(read_varint(&buf, 1), Ok((150, 3)));
        assert_eq!(read_varint(&buf, 3), Ok((5, 4)));
        assert_eq!(
            read_varint(&buf, 4),
            Err(DecodeError::TruncatedVarint { offset: 4 })
        );
        // An offset past the end does not panic.
        assert_eq!(
            read_varint(&buf, 9),
            Err(DecodeError::TruncatedVarint { offset: 9 })
        );
    }

    #[test]
    fn redundant_encodings_decode() {
        assert_eq!(read_varint(&[0x87, 0x80, 0x80, 0x00], 0), Ok((7, 4)));
        assert_eq!(read_varint(&[0x80, 0x00], 0), Ok((0, 2)));
        for size in [
            0,
            1,
            127,
            128,
            300,
            1 << 20,
            crate::wire::MAX_MESSAGE_LENGTH,
        ] {
            assert_eq!(
                read_varint(&redundant_varint(size), 0),
                Ok((u64::from(size), 4))
            );
        }
        // Ten bytes, nine of them redundant zero groups.
        let ten = [0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00];
        assert_eq!(read_varint(&ten, 0), Ok((1, 10)));
    }

    #[test]
    fn truncated_varints_are_errors() {
        assert_eq!(
            read_varint(&[], 0),
            Err(DecodeError::TruncatedVarint { offset: 0 })
        );
        assert_eq!(
            read_varint(&[0x80], 0),
            Err(DecodeError::TruncatedVarint { offset: 0 })
        );
        assert_eq!(
            read_varint(&[0x01, 0xff, 0xff, 0xff], 1),
            Err(DecodeError::TruncatedVarint { offset: 1 })
        );
        let nine = [0xff; 9];
        assert_eq!(
            read_varint(&nine, 0),
            Err(DecodeError::TruncatedVarint { offset: 0 })
        );
    }

    #[test]
    fn more_than_ten_bytes_is_an_error() {
        let mut eleven = [0xff; 11];
        eleven[10] = 0x01;
        assert_eq!(
            read_varint(&eleven, 0),
            Err(DecodeError::VarintTooLong { offset: 0 })
        );
        // Ten continuation bytes and nothing after them: still too long, not truncated.
        assert_eq!(
            read_varint(&[0x80; 10], 0),
            Err(DecodeError::VarintTooLong { offset: 0 })
        );
    }

    proptest::proptest! {
        /// The one-word fast path against the byte-by-byte reader, on random bytes at every
        /// offset (past the end too) and on every length of encoded value, plain and with
        /// redundant continuation bytes (up to over-long), whole, truncated and followed by
        /// other bytes.
        #[test]
        fn the_word_fast_path_matches_the_byte_reader(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..24),
            v in proptest::prelude::any::<u64>(),
            shift in 0u32..64,
            pad in 0usize..12,
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..10),
        ) {
            let reference = |buf: &[u8], at: usize| match buf.get(at..) {
                Some(rest) if !rest.is_empty() => read_varint_slow(rest, at),
                _ => Err(DecodeError::TruncatedVarint { offset: at }),
            };
            for at in 0..=bytes.len() + 1 {
                proptest::prop_assert_eq!(read_varint(&bytes, at), reference(&bytes, at));
            }
            let v = v >> shift;
            let mut enc = [0u8; MAX_VARINT_SIZE];
            let n = encode_varint(v, &mut enc);
            let plain = enc[..n].to_vec();
            let mut long = plain.clone();
            if let Some(last) = long.pop() {
                long.push(last | 0x80);
                long.extend(std::iter::repeat_n(0x80, pad.saturating_sub(1)));
                long.push(0);
            }
            for e in [plain, long] {
                for cut in 0..=e.len() {
                    for extra in 0..=tail.len() {
                        let mut buf = e[..cut].to_vec();
                        buf.extend_from_slice(&tail[..extra]);
                        let fast = read_varint(&buf, 0);
                        proptest::prop_assert_eq!(fast, reference(&buf, 0));
                        if cut == e.len() && e.len() <= MAX_VARINT_SIZE {
                            proptest::prop_assert_eq!(fast, Ok((v, e.len())));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tenth_byte_bits_beyond_64_are_dropped() {
        // u64::MAX is nine 0xff then 0x01; a 10th byte of 0x7f carries six extra bits.
        let mut max = [0xff; 10];
        max[9] = 0x01;
        assert_eq!(read_varint(&max, 0), Ok((u64::MAX, 10)));
        max[9] = 0x7f;
        assert_eq!(read_varint(&max, 0), Ok((u64::MAX, 10)));
        // 0x7e: the one bit that lands in the 64th position is 0.
        max[9] = 0x7e;
        assert_eq!(read_varint(&max, 0), Ok((u64::MAX >> 1, 10)));
    }
}

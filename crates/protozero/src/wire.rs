//! Wire-format vocabulary shared by the writer and the decoder: wire types, tags, zig-zag, the
//! redundant varint used for reserved size fields, and the limits ProtoZero enforces.
//!
//! Nothing here touches memory; the writer and the decoder are separate code on purpose (the
//! serialization path is optimized for size and speed, the decoder for robustness), and this
//! module is the only thing they share.

/// Size of a reserved length field: a 4-byte redundant varint.
pub const MESSAGE_LENGTH_FIELD_SIZE: usize = 4;

/// The largest length a 4-byte redundant varint can hold: 2^28 − 1 (256 MiB − 1).
///
/// The writer reports a nested message larger than this as [`crate::Error::MessageTooLarge`];
/// the decoder skips length-delimited fields that claim more.
pub const MAX_MESSAGE_LENGTH: u32 = (1 << 28) - 1;

/// The largest field id the decoder accepts (2^24 − 1, as Perfetto's decoder); fields with a
/// larger id are skipped.
pub const MAX_FIELD_ID: u32 = (1 << 24) - 1;

/// The largest field id protobuf allows (2^29 − 1).
pub const MAX_PROTO_FIELD_ID: u32 = (1 << 29) - 1;

/// The longest valid varint: a 64-bit value in 7-bit groups.
pub const MAX_VARINT_SIZE: usize = 10;

/// The longest encoded tag (field id ≤ 2^29 − 1 plus 3 bits of wire type).
pub const MAX_TAG_SIZE: usize = 5;

/// The longest encoded scalar field: a tag plus a 10-byte varint.
pub const MAX_SIMPLE_FIELD_SIZE: usize = MAX_TAG_SIZE + MAX_VARINT_SIZE;

/// The four wire types protobuf still uses (groups, 3 and 4, are obsolete and rejected).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WireType {
    /// Base-128 varint: int32/64, uint32/64, sint32/64, bool, enum.
    Varint = 0,
    /// 8 little-endian bytes: fixed64, sfixed64, double.
    Fixed64 = 1,
    /// Varint length, then that many bytes: string, bytes, nested messages, packed fields.
    LengthDelimited = 2,
    /// 4 little-endian bytes: fixed32, sfixed32, float.
    Fixed32 = 5,
}

impl WireType {
    /// The wire type for the low 3 bits of a tag, or `None` for the obsolete and reserved ones.
    #[inline]
    pub const fn from_bits(bits: u8) -> Option<WireType> {
        match bits {
            0 => Some(WireType::Varint),
            1 => Some(WireType::Fixed64),
            2 => Some(WireType::LengthDelimited),
            5 => Some(WireType::Fixed32),
            _ => None,
        }
    }
}

/// The tag of a field: `(id << 3) | wire_type`.
#[inline(always)]
pub const fn make_tag(field_id: u32, wire_type: WireType) -> u32 {
    (field_id << 3) | wire_type as u32
}

/// Zig-zag encodes a signed 32-bit value (sint32) so that small magnitudes are small varints.
#[inline(always)]
pub const fn zigzag_encode32(v: i32) -> u32 {
    ((v << 1) ^ (v >> 31)) as u32
}

/// Zig-zag encodes a signed 64-bit value (sint64).
#[inline(always)]
pub const fn zigzag_encode64(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Inverse of [`zigzag_encode32`].
#[inline(always)]
pub const fn zigzag_decode32(v: u32) -> i32 {
    ((v >> 1) as i32) ^ -((v & 1) as i32)
}

/// Inverse of [`zigzag_encode64`].
#[inline(always)]
pub const fn zigzag_decode64(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// The number of bytes `v` takes as a varint (1..=10).
#[inline(always)]
pub const fn varint_size(v: u64) -> usize {
    // Each byte carries 7 bits; `| 1` makes zero take one byte.
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Encodes `v` as a varint at the start of `out` and returns the number of bytes written.
///
/// # Panics
/// If `out` is shorter than [`varint_size`]`(v)`; callers pass a buffer of
/// [`MAX_VARINT_SIZE`] bytes.
#[inline(always)]
pub fn encode_varint(mut v: u64, out: &mut [u8]) -> usize {
    let mut i = 0;
    while v >= 0x80 {
        out[i] = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
    out[i] = v as u8;
    i + 1
}

/// The 4-byte redundant varint encoding of `size` (≤ [`MAX_MESSAGE_LENGTH`]): continuation bits
/// set on bytes 0–2, clear on byte 3. `7` becomes `87 80 80 00`; `0` becomes `80 80 80 00`, so a
/// written size field never starts with `0x00` (patch consumers rely on that).
#[inline(always)]
pub const fn redundant_varint(size: u32) -> [u8; MESSAGE_LENGTH_FIELD_SIZE] {
    [
        (size as u8 & 0x7f) | 0x80,
        ((size >> 7) as u8 & 0x7f) | 0x80,
        ((size >> 14) as u8 & 0x7f) | 0x80,
        (size >> 21) as u8 & 0x7f,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redundant_varint_matches_the_seed() {
        assert_eq!(redundant_varint(7), [0x87, 0x80, 0x80, 0x00]);
        assert_eq!(redundant_varint(0), [0x80, 0x80, 0x80, 0x00]);
        assert_eq!(
            redundant_varint(MAX_MESSAGE_LENGTH),
            [0xff, 0xff, 0xff, 0x7f]
        );
    }

    #[test]
    fn zigzag_round_trips_extremes() {
        for v in [0, 1, -1, i32::MAX, i32::MIN] {
            assert_eq!(zigzag_decode32(zigzag_encode32(v)), v);
        }
        for v in [0, 1, -1, i64::MAX, i64::MIN] {
            assert_eq!(zigzag_decode64(zigzag_encode64(v)), v);
        }
        assert_eq!(zigzag_encode32(-1), 1);
        assert_eq!(zigzag_encode64(1), 2);
    }

    #[test]
    fn varint_size_matches_encoding() {
        let mut buf = [0u8; MAX_VARINT_SIZE];
        for shift in 0..64 {
            for v in [1u64 << shift, (1u64 << shift) - 1, u64::MAX >> shift] {
                assert_eq!(varint_size(v), encode_varint(v, &mut buf), "value {v}");
            }
        }
        assert_eq!(varint_size(0), 1);
        assert_eq!(varint_size(u64::MAX), 10);
    }
}

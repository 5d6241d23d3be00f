//! One decoded field and its typed accessors.

use super::{DecodeError, PackedFixed32, PackedFixed64, PackedVarints, ProtoDecoder};
use crate::wire::{zigzag_decode32, zigzag_decode64, WireType};

/// The raw value of a field, as its wire type carries it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FieldValue<'a> {
    /// Wire type 0: int32/64, uint32/64, sint32/64, bool, enum.
    Varint(u64),
    /// Wire type 1: fixed64, sfixed64, double (the 8 bytes, read little-endian).
    Fixed64(u64),
    /// Wire type 5: fixed32, sfixed32, float (the 4 bytes, read little-endian).
    Fixed32(u32),
    /// Wire type 2: string, bytes, a nested message or a packed repeated field; the payload,
    /// borrowed from the decoded buffer.
    Bytes(&'a [u8]),
}

/// One field of a message: its id and its value, borrowed from the decoded buffer.
///
/// The accessors interpret the value as a protobuf type and never panic. They are lenient, as
/// Perfetto's `protozero::Field` is, because a schema-less decoder cannot know the declared type:
///
/// * the integer, `bool` and float accessors read the value of a varint, fixed32 or fixed64
///   field (a fixed32 is zero-extended to 64 bits first), and return 0 (`false`, `0.0`) for a
///   length-delimited field;
/// * [`as_bytes`](Self::as_bytes), [`as_str`](Self::as_str), [`as_message`](Self::as_message) and
///   the packed iterators see an empty payload for a field that is not length-delimited.
///
/// Check [`wire_type`](Self::wire_type) first when a mismatch must be told apart from a zero.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Field<'a> {
    id: u32,
    value: FieldValue<'a>,
}

impl<'a> Field<'a> {
    /// A field with id `id` and value `value` (for tests and hand-built inputs; the decoders
    /// produce fields with ids in `1..=`[`MAX_FIELD_ID`](crate::wire::MAX_FIELD_ID)).
    #[inline]
    pub const fn new(id: u32, value: FieldValue<'a>) -> Self {
        Field { id, value }
    }

    /// The field id (the tag without its wire type).
    #[inline]
    pub const fn id(&self) -> u32 {
        self.id
    }

    /// The wire type the field was encoded with.
    #[inline]
    pub const fn wire_type(&self) -> WireType {
        match self.value {
            FieldValue::Varint(_) => WireType::Varint,
            FieldValue::Fixed64(_) => WireType::Fixed64,
            FieldValue::Fixed32(_) => WireType::Fixed32,
            FieldValue::Bytes(_) => WireType::LengthDelimited,
        }
    }

    /// The raw value.
    #[inline]
    pub const fn value(&self) -> FieldValue<'a> {
        self.value
    }

    /// The value as `uint64` (also the raw bits of a fixed64 or, zero-extended, of a fixed32);
    /// 0 for a length-delimited field.
    #[inline]
    pub const fn as_u64(&self) -> u64 {
        match self.value {
            FieldValue::Varint(v) | FieldValue::Fixed64(v) => v,
            FieldValue::Fixed32(v) => v as u64,
            FieldValue::Bytes(_) => 0,
        }
    }

    /// The value as `uint32`: the low 32 bits of [`as_u64`](Self::as_u64).
    #[inline]
    pub const fn as_u32(&self) -> u32 {
        self.as_u64() as u32
    }

    /// The value as `int64`: [`as_u64`](Self::as_u64) reinterpreted as two's complement.
    #[inline]
    pub const fn as_i64(&self) -> i64 {
        self.as_u64() as i64
    }

    /// The value as `int32`: the low 32 bits, as protobuf reads an `int32` (whose negative values
    /// are encoded sign-extended to 64 bits).
    #[inline]
    pub const fn as_i32(&self) -> i32 {
        self.as_u64() as i32
    }

    /// The value as `sint32`: the low 32 bits, zig-zag decoded.
    #[inline]
    pub const fn as_sint32(&self) -> i32 {
        zigzag_decode32(self.as_u32())
    }

    /// The value as `sint64`: zig-zag decoded.
    #[inline]
    pub const fn as_sint64(&self) -> i64 {
        zigzag_decode64(self.as_u64())
    }

    /// The value as `bool`: true for any non-zero value.
    #[inline]
    pub const fn as_bool(&self) -> bool {
        self.as_u64() != 0
    }

    /// The value as `fixed32`; same as [`as_u32`](Self::as_u32).
    #[inline]
    pub const fn as_fixed32(&self) -> u32 {
        self.as_u32()
    }

    /// The value as `fixed64`; same as [`as_u64`](Self::as_u64).
    #[inline]
    pub const fn as_fixed64(&self) -> u64 {
        self.as_u64()
    }

    /// The value as `sfixed32`: the low 32 bits as two's complement.
    #[inline]
    pub const fn as_sfixed32(&self) -> i32 {
        self.as_u32() as i32
    }

    /// The value as `sfixed64`: the 64 bits as two's complement.
    #[inline]
    pub const fn as_sfixed64(&self) -> i64 {
        self.as_u64() as i64
    }

    /// The value as `float`: the IEEE 754 number whose bits are [`as_u32`](Self::as_u32).
    #[inline]
    pub fn as_f32(&self) -> f32 {
        f32::from_bits(self.as_u32())
    }

    /// The value as `double`: the IEEE 754 number whose bits are [`as_u64`](Self::as_u64).
    #[inline]
    pub fn as_f64(&self) -> f64 {
        f64::from_bits(self.as_u64())
    }

    /// The payload of a length-delimited field; empty for any other wire type.
    #[inline]
    pub const fn as_bytes(&self) -> &'a [u8] {
        match self.value {
            FieldValue::Bytes(b) => b,
            _ => &[],
        }
    }

    /// The payload as a `string`; `Ok("")` for a field that is not length-delimited.
    ///
    /// # Errors
    /// [`DecodeError::InvalidUtf8`] if the payload is not UTF-8; its offset is relative to the
    /// payload.
    #[inline]
    pub fn as_str(&self) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(self.as_bytes()).map_err(|e| DecodeError::InvalidUtf8 {
            offset: e.valid_up_to(),
        })
    }

    /// A decoder over the payload, read as a nested message; it has no fields if this field is
    /// not length-delimited.
    #[inline]
    pub const fn as_message(&self) -> ProtoDecoder<'a> {
        ProtoDecoder::new(self.as_bytes())
    }

    /// The payload read as a packed repeated varint field (`int32`, `uint64`, `sint64`, `bool`,
    /// `enum`, ...); empty if this field is not length-delimited.
    #[inline]
    pub const fn packed_varints(&self) -> PackedVarints<'a> {
        PackedVarints::new(self.as_bytes())
    }

    /// The payload read as a packed repeated 4-byte field (`fixed32`, `sfixed32`, `float`);
    /// empty if this field is not length-delimited.
    #[inline]
    pub const fn packed_fixed32(&self) -> PackedFixed32<'a> {
        PackedFixed32::new(self.as_bytes())
    }

    /// The payload read as a packed repeated 8-byte field (`fixed64`, `sfixed64`, `double`);
    /// empty if this field is not length-delimited.
    #[inline]
    pub const fn packed_fixed64(&self) -> PackedFixed64<'a> {
        PackedFixed64::new(self.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(v: u64) -> Field<'static> {
        Field::new(1, FieldValue::Varint(v))
    }

    #[test]
    fn wire_type_follows_value() {
        assert_eq!(varint(0).wire_type(), WireType::Varint);
        assert_eq!(
            Field::new(1, FieldValue::Fixed32(0)).wire_type(),
            WireType::Fixed32
        );
        assert_eq!(
            Field::new(1, FieldValue::Fixed64(0)).wire_type(),
            WireType::Fixed64
        );
        assert_eq!(
            Field::new(1, FieldValue::Bytes(b"")).wire_type(),
            WireType::LengthDelimited
        );
    }

    #[test]
    fn int32_is_read_from_a_sign_extended_varint() {
        // protobuf encodes int32 -1 as ten bytes, i.e. u64::MAX.
        let f = varint(u64::MAX);
        assert_eq!(f.as_i32(), -1);
        assert_eq!(f.as_i64(), -1);
        assert_eq!(f.as_u32(), u32::MAX);
        // Truncation keeps the low 32 bits only.
        let f = varint(0x1_0000_0005);
        assert_eq!(f.as_i32(), 5);
        assert_eq!(f.as_u32(), 5);
        assert_eq!(f.as_u64(), 0x1_0000_0005);
    }

    #[test]
    fn zigzag_accessors() {
        assert_eq!(varint(1).as_sint32(), -1);
        assert_eq!(varint(4).as_sint32(), 2);
        assert_eq!(varint(u64::from(u32::MAX)).as_sint32(), i32::MIN);
        assert_eq!(varint(u64::MAX).as_sint64(), i64::MIN);
        assert_eq!(varint(u64::MAX - 1).as_sint64(), i64::MAX);
    }

    #[test]
    fn bool_is_any_non_zero() {
        assert!(!varint(0).as_bool());
        assert!(varint(1).as_bool());
        assert!(varint(1 << 40).as_bool());
    }

    #[test]
    fn fixed_accessors() {
        let f = Field::new(7, FieldValue::Fixed32(0xffff_fffe));
        assert_eq!(f.as_fixed32(), 0xffff_fffe);
        assert_eq!(f.as_sfixed32(), -2);
        // Zero-extended, not sign-extended.
        assert_eq!(f.as_u64(), 0xffff_fffe);
        let f = Field::new(7, FieldValue::Fixed32(1.5f32.to_bits()));
        assert_eq!(f.as_f32(), 1.5);
        let f = Field::new(8, FieldValue::Fixed64((-2.25f64).to_bits()));
        assert_eq!(f.as_f64(), -2.25);
        let f = Field::new(8, FieldValue::Fixed64(u64::MAX));
        assert_eq!(f.as_sfixed64(), -1);
        assert_eq!(f.as_fixed64(), u64::MAX);
    }

    #[test]
    fn scalar_accessors_on_bytes_return_zero() {
        let f = Field::new(3, FieldValue::Bytes(&[1, 2, 3]));
        assert_eq!(f.as_u64(), 0);
        assert_eq!(f.as_i32(), 0);
        assert_eq!(f.as_sint64(), 0);
        assert!(!f.as_bool());
        assert_eq!(f.as_f64(), 0.0);
        assert_eq!(f.as_bytes(), &[1, 2, 3]);
    }

    #[test]
    fn bytes_accessors_on_scalars_are_empty() {
        let f = varint(0x0a);
        assert_eq!(f.as_bytes(), b"");
        assert_eq!(f.as_str(), Ok(""));
        assert_eq!(f.as_message().count(), 0);
        assert_eq!(f.packed_varints().count(), 0);
        assert_eq!(f.packed_fixed32().count(), 0);
        assert_eq!(f.packed_fixed64().count(), 0);
    }

    #[test]
    fn as_str_validates_utf8() {
        assert_eq!(
            Field::new(1, FieldValue::Bytes("héllo".as_bytes())).as_str(),
            Ok("héllo")
        );
        let bad = Field::new(1, FieldValue::Bytes(&[b'o', b'k', 0xff, b'x']));
        assert_eq!(bad.as_str(), Err(DecodeError::InvalidUtf8 { offset: 2 }));
        // A truncated multi-byte sequence.
        let cut = Field::new(1, FieldValue::Bytes(&[b'a', 0xc3]));
        assert_eq!(cut.as_str(), Err(DecodeError::InvalidUtf8 { offset: 1 }));
    }

    #[test]
    fn as_message_decodes_the_payload() {
        // The seed's example: nested { str_val: "foo", int_val: 42 }.
        let payload = [0x0a, 0x03, b'f', b'o', b'o', 0x10, 0x2a];
        let f = Field::new(3, FieldValue::Bytes(&payload));
        let fields: Vec<_> = f.as_message().collect::<Result<_, _>>().unwrap();
        assert_eq!(fields.len(), 2);
        assert_eq!(fields[0].as_str(), Ok("foo"));
        assert_eq!(fields[1].as_i32(), 42);
    }
}

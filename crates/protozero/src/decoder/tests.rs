//! Unit tests of `ProtoDecoder`: one per error and skip rule of the module docs.

use super::*;
use crate::wire::{encode_varint, make_tag, redundant_varint};

/// Appends `v` as a varint.
fn put_varint(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; MAX_VARINT_SIZE];
    let n = encode_varint(v, &mut buf);
    out.extend_from_slice(&buf[..n]);
}

/// Appends a tag for a field id that may exceed what `make_tag` takes.
fn put_tag(out: &mut Vec<u8>, id: u64, wire_type: u8) {
    put_varint(out, (id << 3) | u64::from(wire_type));
}

fn all(bytes: &[u8]) -> Vec<Result<Field<'_>, DecodeError>> {
    ProtoDecoder::new(bytes).collect()
}

#[test]
fn decodes_every_wire_type() {
    let mut b = vec![];
    put_tag(&mut b, 1, 0);
    put_varint(&mut b, 150);
    put_tag(&mut b, 2, 1);
    b.extend(0x0102_0304_0506_0708u64.to_le_bytes());
    put_tag(&mut b, 3, 2);
    put_varint(&mut b, 3);
    b.extend(b"abc");
    put_tag(&mut b, 4, 5);
    b.extend(0xdead_beefu32.to_le_bytes());
    put_tag(&mut b, 5, 2);
    put_varint(&mut b, 0);

    let fields: Vec<_> = ProtoDecoder::new(&b).collect::<Result<_, _>>().unwrap();
    assert_eq!(
        fields,
        [
            Field::new(1, FieldValue::Varint(150)),
            Field::new(2, FieldValue::Fixed64(0x0102_0304_0506_0708)),
            Field::new(3, FieldValue::Bytes(b"abc")),
            Field::new(4, FieldValue::Fixed32(0xdead_beef)),
            Field::new(5, FieldValue::Bytes(b"")),
        ]
    );
}

#[test]
fn empty_buffer_is_a_clean_end() {
    let mut d = ProtoDecoder::new(&[]);
    assert_eq!(d.read_field(), Ok(None));
    assert_eq!(d.read_field(), Ok(None));
    assert_eq!(d.next(), None);
    assert_eq!(d.bytes_left(), 0);
}

#[test]
fn cursor_offset_and_bytes_left() {
    let b = [0x08, 0x96, 0x01, 0x10, 0x01];
    let mut d = ProtoDecoder::new(&b);
    assert_eq!((d.offset(), d.bytes_left()), (0, 5));
    d.read_field().unwrap();
    assert_eq!((d.offset(), d.bytes_left()), (3, 2));
    d.read_field().unwrap();
    assert_eq!((d.offset(), d.bytes_left()), (5, 0));
    assert_eq!(d.read_field(), Ok(None));
    d.reset();
    assert_eq!(d.offset(), 0);
    assert_eq!(d.read_field().unwrap().unwrap().as_u64(), 150);
    assert_eq!(d.bytes(), &b);
}

#[test]
fn truncated_tag() {
    assert_eq!(
        all(&[0x80]),
        [Err(DecodeError::TruncatedVarint { offset: 0 })]
    );
    assert_eq!(all(&[0x08, 0x01, 0xf8, 0xff]), {
        let ok = Field::new(1, FieldValue::Varint(1));
        [Ok(ok), Err(DecodeError::TruncatedVarint { offset: 2 })]
    });
}

#[test]
fn overlong_tag() {
    let mut b = vec![0xff; 10];
    b.push(0x01);
    assert_eq!(all(&b), [Err(DecodeError::VarintTooLong { offset: 0 })]);
}

#[test]
fn ten_byte_tag_is_accepted() {
    // A redundant 10-byte encoding of tag (1, varint).
    let b = [
        0x88, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00, 0x2a,
    ];
    assert_eq!(all(&b), [Ok(Field::new(1, FieldValue::Varint(42)))]);
}

#[test]
fn field_id_zero() {
    for wire_type in [0u8, 1, 2, 5] {
        let b = [wire_type, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(
            all(&b),
            [Err(DecodeError::ZeroFieldId { offset: 0 })],
            "wt {wire_type}"
        );
    }
    // A redundant multi-byte tag of id 0, after a valid field.
    assert_eq!(
        all(&[0x08, 0x00, 0x80, 0x80, 0x00, 0x00]),
        [
            Ok(Field::new(1, FieldValue::Varint(0))),
            Err(DecodeError::ZeroFieldId { offset: 2 })
        ]
    );
    // Id 0 is an error even with a wire type that is also invalid: the id is checked first.
    assert_eq!(all(&[0x03]), [Err(DecodeError::ZeroFieldId { offset: 0 })]);
}

#[test]
fn invalid_wire_types() {
    for wire_type in [3u8, 4, 6, 7] {
        let b = [0x08, 0x01, (1 << 3) | wire_type, 0, 0, 0, 0, 0, 0, 0, 0];
        let mut d = ProtoDecoder::new(&b);
        assert_eq!(d.read_field().unwrap().unwrap().id(), 1);
        assert_eq!(
            d.read_field(),
            Err(DecodeError::InvalidWireType {
                offset: 2,
                wire_type
            })
        );
        // Even on a field that would otherwise be skipped for its id.
        let mut big = vec![];
        put_tag(&mut big, u64::from(MAX_FIELD_ID) + 1, wire_type);
        big.extend([0; 8]);
        assert_eq!(
            all(&big),
            [Err(DecodeError::InvalidWireType {
                offset: 0,
                wire_type
            })]
        );
    }
}

#[test]
fn truncated_varint_value() {
    assert_eq!(
        all(&[0x08]),
        [Err(DecodeError::TruncatedVarint { offset: 1 })]
    );
    assert_eq!(
        all(&[0x08, 0x80, 0x80]),
        [Err(DecodeError::TruncatedVarint { offset: 1 })]
    );
    let mut b = vec![0x08];
    b.extend([0x80; 12]);
    assert_eq!(all(&b), [Err(DecodeError::VarintTooLong { offset: 1 })]);
}

#[test]
fn truncated_fixed() {
    assert_eq!(
        all(&[0x0d, 1, 2, 3]),
        [Err(DecodeError::TruncatedFixed32 { offset: 1 })]
    );
    assert_eq!(
        all(&[0x0d]),
        [Err(DecodeError::TruncatedFixed32 { offset: 1 })]
    );
    assert_eq!(
        all(&[0x09, 1, 2, 3, 4, 5, 6, 7]),
        [Err(DecodeError::TruncatedFixed64 { offset: 1 })]
    );
    // Exactly enough bytes is fine.
    assert_eq!(
        all(&[0x0d, 1, 0, 0, 0]),
        [Ok(Field::new(1, FieldValue::Fixed32(1)))]
    );
}

#[test]
fn length_delimited_errors() {
    // The length itself is truncated.
    assert_eq!(
        all(&[0x0a]),
        [Err(DecodeError::TruncatedVarint { offset: 1 })]
    );
    assert_eq!(
        all(&[0x0a, 0x85]),
        [Err(DecodeError::TruncatedVarint { offset: 1 })]
    );
    // The payload runs past the end by one byte.
    assert_eq!(
        all(&[0x0a, 0x03, b'a', b'b']),
        [Err(DecodeError::PayloadPastEnd { offset: 2, len: 3 })]
    );
    // A length of u64::MAX must not wrap around.
    let mut b = vec![0x0a];
    put_varint(&mut b, u64::MAX);
    b.extend([0; 16]);
    assert_eq!(
        all(&b),
        [Err(DecodeError::PayloadPastEnd {
            offset: 11,
            len: u64::MAX
        })]
    );
    // Exactly up to the end is fine.
    assert_eq!(
        all(&[0x0a, 0x02, b'a', b'b']),
        [Ok(Field::new(1, FieldValue::Bytes(b"ab")))]
    );
}

#[test]
fn cursor_does_not_move_on_error() {
    let b = [0x08, 0x07, 0x12, 0x05, b'x'];
    let mut d = ProtoDecoder::new(&b);
    assert_eq!(d.read_field().unwrap().unwrap().as_u64(), 7);
    let err = DecodeError::PayloadPastEnd { offset: 4, len: 5 };
    assert_eq!(d.read_field(), Err(err));
    assert_eq!(d.offset(), 2);
    assert_eq!(d.bytes_left(), 3);
    // Retrying gives the same error from the same place.
    assert_eq!(d.read_field(), Err(err));
    assert_eq!(d.offset(), 2);

    // A streaming caller that retries on a longer buffer picks up from the same field.
    let longer = [0x08, 0x07, 0x12, 0x05, b'x', b'y', b'z', b'w', b'v'];
    let mut d2 = ProtoDecoder::with_offset(&longer, d.offset());
    assert_eq!(d2.read_field().unwrap().unwrap().as_bytes(), b"xyzwv");
}

#[test]
fn iterator_yields_the_error_once_then_ends() {
    let b = [0x08, 0x01, 0x00, 0x10, 0x02];
    let mut d = ProtoDecoder::new(&b);
    assert_eq!(d.next(), Some(Ok(Field::new(1, FieldValue::Varint(1)))));
    assert_eq!(d.next(), Some(Err(DecodeError::ZeroFieldId { offset: 2 })));
    assert_eq!(d.next(), None);
    assert_eq!(d.next(), None);
    // read_field still reports the error: the cursor did not move.
    assert_eq!(d.read_field(), Err(DecodeError::ZeroFieldId { offset: 2 }));
    // reset re-arms the iterator.
    d.reset();
    assert_eq!(d.count(), 2);
}

#[test]
fn redundant_varints_decode() {
    // Tag (1, len) with a 4-byte redundant length of 3, as the writer emits it.
    let mut b = vec![0x0a];
    b.extend(redundant_varint(3));
    b.extend(b"abc");
    // Tag (2, varint) encoded redundantly, value 7 as 87 80 80 00.
    b.extend([0x90, 0x80, 0x00, 0x87, 0x80, 0x80, 0x00]);
    assert_eq!(
        all(&b),
        [
            Ok(Field::new(1, FieldValue::Bytes(b"abc"))),
            Ok(Field::new(2, FieldValue::Varint(7)))
        ]
    );
}

#[test]
fn largest_field_id_is_kept() {
    let mut b = vec![];
    put_tag(&mut b, u64::from(MAX_FIELD_ID), 0);
    b.push(0x05);
    assert_eq!(
        all(&b),
        [Ok(Field::new(MAX_FIELD_ID, FieldValue::Varint(5)))]
    );
}

#[test]
fn field_ids_above_the_limit_are_skipped() {
    let mut b = vec![];
    put_tag(&mut b, 1, 0);
    b.push(0x01);
    // One skipped field of each wire type, with ids just above the limit, at 2^29 - 1 and far
    // beyond what a u32 holds.
    let big_ids = [u64::from(MAX_FIELD_ID) + 1, (1 << 29) - 1, 1 << 40];
    for id in big_ids {
        put_tag(&mut b, id, 0);
        put_varint(&mut b, 300);
        put_tag(&mut b, id, 1);
        b.extend([0xaa; 8]);
        put_tag(&mut b, id, 2);
        b.extend([0x02, 0x08, 0x01]);
        put_tag(&mut b, id, 5);
        b.extend([0xbb; 4]);
    }
    put_tag(&mut b, 2, 0);
    b.push(0x02);
    let ids: Vec<_> = all(&b).into_iter().map(|f| f.unwrap().id()).collect();
    assert_eq!(ids, [1, 2]);
}

#[test]
fn skipped_field_must_still_be_well_formed() {
    let mut b = vec![];
    put_tag(&mut b, u64::from(MAX_FIELD_ID) + 1, 2);
    let tag_len = b.len();
    b.extend([0x05, b'x']);
    assert_eq!(
        all(&b),
        [Err(DecodeError::PayloadPastEnd {
            offset: tag_len + 1,
            len: 5
        })]
    );
}

#[test]
fn error_after_skipped_fields_leaves_the_cursor_after_them() {
    let mut b = vec![];
    put_tag(&mut b, 1 << 30, 0);
    b.push(0x01);
    let skipped_end = b.len();
    b.push(0x00);
    let mut d = ProtoDecoder::new(&b);
    assert_eq!(
        d.read_field(),
        Err(DecodeError::ZeroFieldId {
            offset: skipped_end
        })
    );
    assert_eq!(d.offset(), skipped_end);
}

/// Each field as (id, value or payload length): printable even for huge payloads.
fn summary(bytes: &[u8]) -> Vec<Result<(u32, u64), DecodeError>> {
    let value = |f: Field<'_>| match f.value() {
        FieldValue::Bytes(b) => b.len() as u64,
        _ => f.as_u64(),
    };
    ProtoDecoder::new(bytes)
        .map(|r| r.map(|f| (f.id(), value(f))))
        .collect()
}

#[test]
#[cfg_attr(miri, ignore = "allocates 256 MiB")]
fn payloads_longer_than_the_message_limit_are_skipped() {
    let max = MAX_MESSAGE_LENGTH as usize;
    // [1: payload of max + 1 bytes][2: 7]: a zeroed buffer just big enough (the allocation is
    // zero-filled lazily by the OS; only the first and last bytes are touched).
    let mut b = vec![0u8; 1 + 5 + max + 1 + 2];
    let mut head = vec![0x0a];
    put_varint(&mut head, max as u64 + 1);
    b[..head.len()].copy_from_slice(&head);
    let tail = b.len() - 2;
    b[tail..].copy_from_slice(&[0x10, 0x07]);
    // The payload ends exactly where field 2 starts.
    assert_eq!(head.len() + max + 1, tail);
    assert_eq!(summary(&b), [Ok((2, 7))]);

    // One byte less is the largest payload that is kept. Its length varint is one byte
    // shorter, which leaves room for a field 3 before field 2.
    let mut head = vec![0x0a];
    put_varint(&mut head, max as u64);
    assert_eq!(head.len(), 5);
    b[..head.len()].copy_from_slice(&head);
    let payload_end = head.len() + max;
    b[payload_end..payload_end + 2].copy_from_slice(&[0x18, 0x01]);
    assert_eq!(summary(&b), [Ok((1, max as u64)), Ok((3, 1)), Ok((2, 7))]);
}

#[test]
fn find_field_scans_from_the_start_without_moving_the_cursor() {
    // { 1: 1, 2: "a", 1: 2 }
    let b = [0x08, 0x01, 0x12, 0x01, b'a', 0x08, 0x02];
    let mut d = ProtoDecoder::new(&b);
    d.read_field().unwrap();
    d.read_field().unwrap();
    assert_eq!(d.offset(), 5);
    assert_eq!(d.find_field(1), Some(Field::new(1, FieldValue::Varint(1))));
    assert_eq!(
        d.find_last_field(1),
        Some(Field::new(1, FieldValue::Varint(2)))
    );
    assert_eq!(d.find_field(2).unwrap().as_str(), Ok("a"));
    assert_eq!(d.find_field(3), None);
    assert_eq!(d.find_field(0), None);
    assert_eq!(d.offset(), 5);
    assert_eq!(d.read_field().unwrap().unwrap().as_u64(), 2);
}

#[test]
fn find_field_stops_at_the_first_malformed_field() {
    // { 1: 1 } then a field with wire type 7, then { 2: 2 }.
    let b = [0x08, 0x01, 0x0f, 0x10, 0x02];
    let d = ProtoDecoder::new(&b);
    assert!(d.find_field(1).is_some());
    assert_eq!(d.find_field(2), None);
    assert_eq!(d.find_last_field(2), None);
    assert_eq!(d.find_last_field(1).unwrap().as_u64(), 1);
}

#[test]
fn error_display_and_offset() {
    let e = DecodeError::InvalidWireType {
        offset: 3,
        wire_type: 6,
    };
    assert_eq!(e.to_string(), "invalid wire type 6 at offset 3");
    assert_eq!(e.offset(), 3);
    assert_eq!(e.rebased(10).offset(), 13);
    let e: Box<dyn std::error::Error> = Box::new(DecodeError::TruncatedVarint { offset: 0 });
    assert_eq!(e.to_string(), "truncated varint at offset 0");
    assert!(DecodeError::PackedSizeNotMultiple {
        offset: 8,
        element_size: 4
    }
    .to_string()
    .contains("multiple of 4"));
}

#[test]
fn make_tag_agrees_with_the_decoder() {
    let mut b = vec![];
    put_varint(&mut b, u64::from(make_tag(500, WireType::LengthDelimited)));
    b.extend([0x01, b'z']);
    assert_eq!(all(&b), [Ok(Field::new(500, FieldValue::Bytes(b"z")))]);
}

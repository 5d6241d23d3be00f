//! Fuzzes every decoder API of `protozero` on arbitrary bytes.
//!
//! The input is decoded as a message with `ProtoDecoder` (both `read_field` and the iterator),
//! `find_field`/`find_last_field`, and a `TypedDecoder` with its repeated iterators; each
//! length-delimited field is decoded again as a packed varint, fixed32 and fixed64 payload and,
//! recursively, as a nested message. Besides "no panic", the APIs must agree with one another,
//! so a logic bug that a plain walk would not notice still aborts the run.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protozero::wire::MAX_FIELD_ID;
use protozero::{
    DecodeError, Field, FieldValue, PackedFixed32, PackedFixed64, PackedVarints, ProtoDecoder,
    TypedDecoder,
};

/// Nesting depth to follow; each level is at least 2 bytes shorter than its parent, so this only
/// bounds the fuzzer's own stack on inputs of many kilobytes.
const MAX_DEPTH: usize = 64;

fuzz_target!(|data: &[u8]| exercise(data, 0));

fn exercise(bytes: &[u8], depth: usize) {
    let mut decoder = ProtoDecoder::new(bytes);
    let mut fields = Vec::new();
    let error = loop {
        let before = decoder.offset();
        match decoder.read_field() {
            Ok(Some(field)) => {
                assert!(decoder.offset() > before);
                assert!((1..=MAX_FIELD_ID).contains(&field.id()));
                fields.push(field);
            }
            Ok(None) => {
                assert_eq!(decoder.bytes_left(), 0);
                break None;
            }
            Err(e) => {
                let at = decoder.offset();
                assert!(e.offset() >= at && e.offset() <= bytes.len());
                assert_eq!(decoder.read_field(), Err(e));
                assert_eq!(decoder.offset(), at);
                break Some(e);
            }
        }
    };

    // The iterator: the same fields, the error once, then a fused end.
    let mut iter = ProtoDecoder::new(bytes);
    for expected in fields.iter().copied().map(Ok).chain(error.map(Err)) {
        assert_eq!(iter.next(), Some(expected));
    }
    assert_eq!(iter.next(), None);
    assert_eq!(iter.next(), None);

    let d = ProtoDecoder::new(bytes);
    for id in [1, 2, 3, 4, 15, 16, 500, MAX_FIELD_ID] {
        assert_eq!(
            d.find_field(id),
            fields.iter().find(|f| f.id() == id).copied()
        );
        assert_eq!(
            d.find_last_field(id),
            fields.iter().rev().find(|f| f.id() == id).copied()
        );
    }

    for field in &fields {
        touch(field);
        if depth < MAX_DEPTH {
            if let FieldValue::Bytes(payload) = field.value() {
                exercise(payload, depth + 1);
            }
        }
    }

    typed(bytes, &fields, error);
}

fn touch(field: &Field<'_>) {
    let ints = [
        field.as_u64(),
        field.as_u32().into(),
        field.as_i64() as u64,
        field.as_i32() as u64,
        field.as_sint32() as u64,
        field.as_sint64() as u64,
        field.as_bool().into(),
        field.as_fixed32().into(),
        field.as_fixed64(),
        field.as_sfixed32() as u64,
        field.as_sfixed64() as u64,
        field.as_f32().to_bits().into(),
        field.as_f64().to_bits(),
    ];
    if field.wire_type() == protozero::WireType::LengthDelimited {
        assert!(ints.iter().all(|&v| v == 0));
    } else {
        assert!(field.as_bytes().is_empty());
    }
    let payload = field.as_bytes();
    assert_eq!(field.as_str().is_ok(), std::str::from_utf8(payload).is_ok());
    packed(payload);
}

fn packed(payload: &[u8]) {
    let mut errors = 0;
    let mut consumed = 0;
    for item in PackedVarints::new(payload) {
        assert_eq!(errors, 0, "an item after an error");
        match item {
            Ok(_) => consumed += 1,
            Err(_) => errors += 1,
        }
    }
    assert!(consumed <= payload.len());
    check_fixed(
        PackedFixed32::new(payload).map(|r| r.map(u64::from)),
        payload.len(),
        4,
    );
    check_fixed(PackedFixed64::new(payload), payload.len(), 8);
}

fn check_fixed(items: impl Iterator<Item = Result<u64, DecodeError>>, len: usize, width: usize) {
    let items: Vec<_> = items.collect();
    if len % width == 0 {
        assert_eq!(items.len(), len / width);
        assert!(items.iter().all(Result::is_ok));
    } else {
        let offset = len - len % width;
        let err = DecodeError::PackedSizeNotMultiple {
            offset,
            element_size: width as u8,
        };
        assert_eq!(items, [Err(err)]);
    }
}

fn typed(bytes: &[u8], fields: &[Field<'_>], error: Option<DecodeError>) {
    // Ids 1..=4 in slots 0..=3, id 5 mapped out of range (unknown), everything else unknown.
    let d = TypedDecoder::<4>::new(bytes, |id| match id {
        1..=4 => Some(id as usize - 1),
        5 => Some(7),
        _ => None,
    });
    assert_eq!(d.error(), error);
    assert_eq!(d.bytes(), bytes);
    for slot in 0..6 {
        let id = slot as u32 + 1;
        let expected: Vec<_> = if slot < 4 {
            fields.iter().filter(|f| f.id() == id).copied().collect()
        } else {
            Vec::new()
        };
        assert_eq!(d.count(slot), expected.len());
        assert_eq!(d.has(slot), !expected.is_empty());
        assert_eq!(d.get(slot), expected.last().copied());
        assert!(d.repeated(slot).eq(expected.iter().copied()));

        let mut varints = Vec::new();
        let mut fixed32s = Vec::new();
        let mut fixed64s = Vec::new();
        for f in &expected {
            match f.value() {
                FieldValue::Varint(v) => varints.push(Ok(v)),
                FieldValue::Fixed32(v) => fixed32s.push(Ok(v)),
                FieldValue::Fixed64(v) => fixed64s.push(Ok(v)),
                FieldValue::Bytes(_) => {
                    varints.extend(f.packed_varints());
                    fixed32s.extend(f.packed_fixed32());
                    fixed64s.extend(f.packed_fixed64());
                }
            }
        }
        same_until_error(d.repeated_varints(slot), varints);
        same_until_error(d.repeated_fixed32(slot), fixed32s);
        same_until_error(d.repeated_fixed64(slot), fixed64s);
    }
}

/// `actual` yields `expected` up to and including its first error (whose offset the unified
/// iterators rebase onto the message, so only its variant is compared), then ends.
fn same_until_error<T: PartialEq + std::fmt::Debug>(
    mut actual: impl Iterator<Item = Result<T, DecodeError>>,
    expected: Vec<Result<T, DecodeError>>,
) {
    for want in expected {
        let got = actual.next().expect("too few items");
        match (got, want) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(a), Err(b)) => {
                assert_eq!(std::mem::discriminant(&a), std::mem::discriminant(&b));
                assert!(a.offset() >= b.offset());
                break;
            }
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }
    assert!(
        actual.next().is_none(),
        "items after the expected end or error"
    );
}

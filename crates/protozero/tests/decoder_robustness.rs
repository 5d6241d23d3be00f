//! Arbitrary bytes never make the decoder panic, and its APIs agree with each other on them.
//!
//! Inputs are either uniformly random bytes or sequences of plausible fields (random ids
//! including 0 and ids above the limit, every wire type including the invalid ones, random
//! lengths) that may be cut short, so that the walk gets past the first few bytes. Every
//! length-delimited field is then decoded again as a message, as packed varints, fixed32 and
//! fixed64, and with a `TypedDecoder`, recursively.
//!
//! The fuzz target in `fuzz/fuzz_targets/decoder.rs` runs the same kind of walk under libFuzzer.

use proptest::collection::vec;
use proptest::prelude::*;
use protozero::wire::{encode_varint, MAX_FIELD_ID, MAX_VARINT_SIZE};
use protozero::{
    DecodeError, Field, FieldValue, PackedFixed32, PackedFixed64, PackedVarints, ProtoDecoder,
    TypedDecoder,
};

/// How deep to follow length-delimited fields: enough for any input proptest generates here.
const MAX_DEPTH: usize = 16;

/// Decodes `bytes` every way the API allows, checking that the ways agree.
fn exercise(bytes: &[u8], depth: usize) {
    // The fields up to the first error, and the error, with read_field.
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
                // The cursor stays put, and retrying gives the same error.
                let at = decoder.offset();
                assert!(e.offset() >= at && e.offset() <= bytes.len());
                assert_eq!(decoder.read_field(), Err(e));
                assert_eq!(decoder.offset(), at);
                assert!(!e.to_string().is_empty());
                break Some(e);
            }
        }
    };

    // The iterator yields the same fields, then the error once, then nothing.
    let mut iter = ProtoDecoder::new(bytes);
    let from_iter: Vec<_> = iter.by_ref().collect();
    let expected: Vec<_> = fields
        .iter()
        .copied()
        .map(Ok)
        .chain(error.map(Err))
        .collect::<Vec<_>>();
    assert_eq!(from_iter, expected);
    assert_eq!(iter.next(), None);

    // find_field and find_last_field agree with the walk.
    let d = ProtoDecoder::new(bytes);
    for id in [1, 2, 3, 15, 16, 500] {
        assert_eq!(
            d.find_field(id),
            fields.iter().find(|f| f.id() == id).copied()
        );
        assert_eq!(
            d.find_last_field(id),
            fields.iter().rev().find(|f| f.id() == id).copied()
        );
    }

    // Every accessor on every field; every payload decoded again every way.
    for field in &fields {
        touch(field);
        if let FieldValue::Bytes(payload) = field.value() {
            if depth < MAX_DEPTH {
                exercise(payload, depth + 1);
            }
        }
    }

    typed(bytes, &fields, error);
}

fn touch(field: &Field<'_>) {
    let _ = (
        field.as_u64(),
        field.as_u32(),
        field.as_i64(),
        field.as_i32(),
    );
    let _ = (field.as_sint32(), field.as_sint64(), field.as_bool());
    let _ = (
        field.as_fixed32(),
        field.as_fixed64(),
        field.as_sfixed32(),
        field.as_sfixed64(),
    );
    let _ = (field.as_f32(), field.as_f64(), field.wire_type());
    let payload = field.as_bytes();
    assert_eq!(
        field.as_str().ok().map(str::as_bytes),
        std::str::from_utf8(payload).ok().map(str::as_bytes)
    );
    packed(payload);
}

/// Runs the three packed iterators over `payload` and checks their contract.
fn packed(payload: &[u8]) {
    let varints: Vec<_> = PackedVarints::new(payload).collect();
    // At most one error, and only at the end.
    assert!(varints.iter().rev().skip(1).all(Result::is_ok));
    if varints.iter().all(Result::is_ok) {
        // Without an error the whole payload was consumed, one byte or more per element.
        assert!(varints.len() <= payload.len());
    }
    let f32s: Vec<_> = PackedFixed32::new(payload).collect();
    let f64s: Vec<_> = PackedFixed64::new(payload).collect();
    for (items, width) in [
        (f32s.iter().map(|r| r.map(u64::from)).collect::<Vec<_>>(), 4),
        (f64s, 8),
    ] {
        if payload.len() % width == 0 {
            assert_eq!(items.len(), payload.len() / width);
            assert!(items.iter().all(Result::is_ok));
        } else {
            let offset = payload.len() - payload.len() % width;
            let err = DecodeError::PackedSizeNotMultiple {
                offset,
                element_size: width as u8,
            };
            assert_eq!(items, [Err(err)]);
        }
    }
}

/// A `TypedDecoder` over `bytes` agrees with the plain walk in `fields` and `error`.
fn typed(bytes: &[u8], fields: &[Field<'_>], error: Option<DecodeError>) {
    // Ids 1..=4 in slots 0..=3, id 5 in slot 9 (out of range, so unknown), the rest unknown.
    let d = TypedDecoder::<4>::new(bytes, |id| match id {
        1..=4 => Some(id as usize - 1),
        5 => Some(9),
        _ => None,
    });
    assert_eq!(d.error(), error);
    assert_eq!(d.bytes(), bytes);
    for slot in 0..6 {
        let id = slot as u32 + 1;
        let expected: Vec<_> = if slot < 4 {
            fields.iter().filter(|f| f.id() == id).copied().collect()
        } else {
            vec![]
        };
        assert_eq!(d.count(slot), expected.len());
        assert_eq!(d.has(slot), !expected.is_empty());
        assert_eq!(d.get(slot), expected.last().copied());
        assert_eq!(d.repeated(slot).collect::<Vec<_>>(), expected);

        // The unified iterators: expand packed occurrences, keep matching scalars, stop after
        // the first error.
        let mut varints = vec![];
        let mut fixed32s = vec![];
        let mut fixed64s = vec![];
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
        assert_eq!(
            strip_offsets(d.repeated_varints(slot).collect()),
            until_error(varints)
        );
        assert_eq!(
            strip_offsets(d.repeated_fixed32(slot).collect()),
            until_error(fixed32s)
        );
        assert_eq!(
            strip_offsets(d.repeated_fixed64(slot).collect()),
            until_error(fixed64s)
        );
    }
}

/// Items up to and including the first error; errors reduced to their kind.
fn until_error<T>(items: Vec<Result<T, DecodeError>>) -> Vec<Result<T, String>> {
    let mut out = Vec::new();
    for item in items {
        let stop = item.is_err();
        out.push(item.map_err(kind));
        if stop {
            break;
        }
    }
    out
}

/// The unified iterators rebase error offsets onto the message; compare kinds only.
fn strip_offsets<T>(items: Vec<Result<T, DecodeError>>) -> Vec<Result<T, String>> {
    items.into_iter().map(|r| r.map_err(kind)).collect()
}

fn kind(e: DecodeError) -> String {
    let debug = format!("{e:?}");
    debug
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A field id: mostly small, sometimes 0 or around the 2^24 - 1 limit, sometimes anything.
fn field_id() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 1u64..8,
        1 => Just(0u64),
        1 => (MAX_FIELD_ID as u64 - 1)..(MAX_FIELD_ID as u64 + 3),
        1 => any::<u64>().prop_map(|v| v >> 3),
    ]
}

/// A length-delimited payload: random bytes, a small message of varint fields, or a packed
/// varint payload.
fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..24),
        vec((1u64..6, any::<u32>()), 0..6).prop_map(|fields| {
            fields
                .iter()
                .flat_map(|&(id, v)| [varint(id << 3), varint(v.into())].concat())
                .collect()
        }),
        vec(any::<u64>(), 0..6).prop_map(|vs| vs.into_iter().flat_map(varint).collect()),
    ]
}

/// One field: usually well-formed (the body matches the wire type), sometimes a random wire
/// type (including the invalid ones) with a random body.
fn field() -> impl Strategy<Value = Vec<u8>> {
    let tag = |id: u64, wire_type: u64| varint((id << 3) | wire_type);
    let well_formed = prop_oneof![
        (field_id(), any::<u64>()).prop_map(move |(id, v)| [tag(id, 0), varint(v)].concat()),
        (field_id(), any::<[u8; 8]>()).prop_map(move |(id, v)| [tag(id, 1), v.to_vec()].concat()),
        (field_id(), any::<[u8; 4]>()).prop_map(move |(id, v)| [tag(id, 5), v.to_vec()].concat()),
        (field_id(), payload())
            .prop_map(move |(id, p)| [tag(id, 2), varint(p.len() as u64), p].concat()),
    ];
    let random = (field_id(), 0u64..8, vec(any::<u8>(), 0..12))
        .prop_map(move |(id, wire_type, body)| [tag(id, wire_type), body].concat());
    prop_oneof![6 => well_formed, 1 => random]
}

fn varint(v: u64) -> Vec<u8> {
    let mut buf = [0u8; MAX_VARINT_SIZE];
    let n = encode_varint(v, &mut buf);
    buf[..n].to_vec()
}

fn input() -> impl Strategy<Value = Vec<u8>> {
    // One structured input in four is cut short, anywhere.
    let structured = (
        vec(field(), 0..10),
        any::<prop::sample::Index>(),
        prop::bool::weighted(0.25),
    )
        .prop_map(|(fields, cut, do_cut)| {
            let mut bytes = fields.concat();
            if do_cut && !bytes.is_empty() {
                bytes.truncate(cut.index(bytes.len()));
            }
            bytes
        });
    prop_oneof![1 => vec(any::<u8>(), 0..64), 3 => structured]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_and_apis_agree(bytes in input()) {
        exercise(&bytes, 0);
    }
}

#[test]
fn deeply_nested_input_does_not_recurse_in_the_decoder() {
    // 3 000 levels of { 1: { 1: ... } }: the decoder itself only looks at the outer level.
    let mut msg: Vec<u8> = vec![];
    for _ in 0..3_000 {
        let mut outer = varint((1 << 3) | 2);
        outer.extend(varint(msg.len() as u64));
        outer.extend(msg);
        msg = outer;
    }
    let mut d = ProtoDecoder::new(&msg);
    let field = d.read_field().unwrap().unwrap();
    assert_eq!(d.read_field(), Ok(None));
    // Walking it iteratively reaches the bottom.
    let mut depth = 1;
    let mut current = field;
    while let Some(inner) = current.as_message().read_field().unwrap() {
        current = inner;
        depth += 1;
    }
    assert_eq!(depth, 3_000);
}

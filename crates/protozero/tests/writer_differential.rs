//! Differential test of the writer: random `EveryField` messages written with protozero at
//! awkward buffer sizes (1, 3, 7, 42 and 4096 bytes per buffer, heap-kept or handed off
//! eagerly with patches, or carrying buffer tails into the next buffer) must decode, with prost-reflect from the same `.proto`, to exactly
//! the message built from the same operations.

mod common;

use common::{collect, EagerDelegate};
use proptest::prelude::*;
use prost::Message as _;
use prost_reflect::{DynamicMessage, MessageDescriptor, ReflectMessage, Value};
use protozero::{HeapBuffered, Message, ScatteredStreamWriter};

/// One setter call on an `EveryField` writer.
#[derive(Clone, Debug)]
enum Op {
    Int32(i32),
    Int64(i64),
    Uint32(u32),
    Uint64(u64),
    Sint32(i32),
    Sint64(i64),
    Fixed32(u32),
    Fixed64(u64),
    Sfixed32(i32),
    Sfixed64(i64),
    Float(f32),
    Double(f64),
    Bool(bool),
    Bytes(Vec<u8>),
    String(String),
    ScatteredString(Vec<String>),
    RepeatedInt32(i32),
    PackedSint64(Vec<i64>),
    PackedFixed32(Vec<u32>),
    PackedFixed64(Vec<u64>),
    PackedUint64(Vec<u64>),
    RepeatedString(String),
    BigId(u32),
    Nested(Vec<Op>),
}

fn op(depth: u32) -> BoxedStrategy<Op> {
    let leaf = prop_oneof![
        any::<i32>().prop_map(Op::Int32),
        any::<i64>().prop_map(Op::Int64),
        any::<u32>().prop_map(Op::Uint32),
        any::<u64>().prop_map(Op::Uint64),
        any::<i32>().prop_map(Op::Sint32),
        any::<i64>().prop_map(Op::Sint64),
        any::<u32>().prop_map(Op::Fixed32),
        any::<u64>().prop_map(Op::Fixed64),
        any::<i32>().prop_map(Op::Sfixed32),
        any::<i64>().prop_map(Op::Sfixed64),
        proptest::num::f32::NORMAL.prop_map(Op::Float),
        proptest::num::f64::NORMAL.prop_map(Op::Double),
        any::<bool>().prop_map(Op::Bool),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Op::Bytes),
        ".{0,40}".prop_map(Op::String),
        proptest::collection::vec(".{0,5}", 0..4).prop_map(Op::ScatteredString),
        any::<i32>().prop_map(Op::RepeatedInt32),
        proptest::collection::vec(any::<i64>(), 0..20).prop_map(Op::PackedSint64),
        proptest::collection::vec(any::<u32>(), 0..20).prop_map(Op::PackedFixed32),
        proptest::collection::vec(any::<u64>(), 0..20).prop_map(Op::PackedFixed64),
        proptest::collection::vec(any::<u64>(), 0..20).prop_map(Op::PackedUint64),
        ".{0,10}".prop_map(Op::RepeatedString),
        any::<u32>().prop_map(Op::BigId),
    ];
    if depth == 0 {
        leaf.boxed()
    } else {
        prop_oneof![
            8 => leaf,
            1 => proptest::collection::vec(op(depth - 1), 0..8).prop_map(Op::Nested),
        ]
        .boxed()
    }
}

/// Writes `ops` with the protozero API.
fn write(m: &mut Message<'_>, ops: &[Op]) {
    for o in ops {
        match o {
            Op::Int32(v) => m.append_int32(1, *v),
            Op::Int64(v) => m.append_int64(2, *v),
            Op::Uint32(v) => m.append_uint32(3, *v),
            Op::Uint64(v) => m.append_uint64(4, *v),
            Op::Sint32(v) => m.append_sint32(5, *v),
            Op::Sint64(v) => m.append_sint64(6, *v),
            Op::Fixed32(v) => m.append_fixed32(7, *v),
            Op::Fixed64(v) => m.append_fixed64(8, *v),
            Op::Sfixed32(v) => m.append_sfixed32(9, *v),
            Op::Sfixed64(v) => m.append_sfixed64(10, *v),
            Op::Float(v) => m.append_float(11, *v),
            Op::Double(v) => m.append_double(12, *v),
            Op::Bool(v) => m.append_bool(13, *v),
            Op::Nested(ops) => write(&mut m.begin_nested(14), ops),
            Op::Bytes(v) => m.append_bytes(15, v),
            Op::RepeatedInt32(v) => m.append_int32(16, *v),
            Op::PackedSint64(v) => m.append_packed_sint64(17, v.iter().copied()),
            Op::PackedFixed32(v) => m.append_packed_fixed32(18, v),
            Op::PackedFixed64(v) => m.append_packed_fixed64(19, v),
            Op::PackedUint64(v) => m.append_packed_varint(20, v.iter().copied()),
            Op::RepeatedString(v) => m.append_string(21, v),
            Op::BigId(v) => m.append_uint32(99999, *v),
            Op::String(v) => m.append_string(500, v),
            Op::ScatteredString(parts) => {
                let parts: Vec<&[u8]> = parts.iter().map(|p| p.as_bytes()).collect();
                m.append_scattered_bytes(500, &parts);
            }
        }
    }
}

/// Builds the message the same operations describe, with prost-reflect's own API.
fn expected(desc: &MessageDescriptor, ops: &[Op]) -> DynamicMessage {
    let mut msg = DynamicMessage::new(desc.clone());
    let set = |msg: &mut DynamicMessage, id: u32, v: Value| msg.set_field_by_number(id, v);
    let push = |msg: &mut DynamicMessage, id: u32, v: Value| {
        msg.get_field_by_number_mut(id)
            .unwrap()
            .as_list_mut()
            .unwrap()
            .push(v)
    };
    for o in ops {
        match o {
            Op::Int32(v) => set(&mut msg, 1, Value::I32(*v)),
            Op::Int64(v) => set(&mut msg, 2, Value::I64(*v)),
            Op::Uint32(v) => set(&mut msg, 3, Value::U32(*v)),
            Op::Uint64(v) => set(&mut msg, 4, Value::U64(*v)),
            Op::Sint32(v) => set(&mut msg, 5, Value::I32(*v)),
            Op::Sint64(v) => set(&mut msg, 6, Value::I64(*v)),
            Op::Fixed32(v) => set(&mut msg, 7, Value::U32(*v)),
            Op::Fixed64(v) => set(&mut msg, 8, Value::U64(*v)),
            Op::Sfixed32(v) => set(&mut msg, 9, Value::I32(*v)),
            Op::Sfixed64(v) => set(&mut msg, 10, Value::I64(*v)),
            Op::Float(v) => set(&mut msg, 11, Value::F32(*v)),
            Op::Double(v) => set(&mut msg, 12, Value::F64(*v)),
            Op::Bool(v) => set(&mut msg, 13, Value::Bool(*v)),
            Op::Nested(ops) => push(&mut msg, 14, Value::Message(expected(desc, ops))),
            Op::Bytes(v) => set(&mut msg, 15, Value::Bytes(v.clone().into())),
            Op::RepeatedInt32(v) => push(&mut msg, 16, Value::I32(*v)),
            Op::PackedSint64(v) => {
                v.iter().for_each(|x| push(&mut msg, 17, Value::I64(*x)));
            }
            Op::PackedFixed32(v) => {
                v.iter().for_each(|x| push(&mut msg, 18, Value::U32(*x)));
            }
            Op::PackedFixed64(v) => {
                v.iter().for_each(|x| push(&mut msg, 19, Value::U64(*x)));
            }
            Op::PackedUint64(v) => {
                v.iter().for_each(|x| push(&mut msg, 20, Value::U64(*x)));
            }
            Op::RepeatedString(v) => push(&mut msg, 21, Value::String(v.clone())),
            Op::BigId(v) => set(&mut msg, 99999, Value::U32(*v)),
            Op::String(v) => set(&mut msg, 500, Value::String(v.clone())),
            Op::ScatteredString(parts) => set(&mut msg, 500, Value::String(parts.concat())),
        }
    }
    msg
}

fn check(desc: &MessageDescriptor, ops: &[Op], bytes: &[u8]) -> Result<(), TestCaseError> {
    let decoded = DynamicMessage::decode(desc.clone(), bytes)
        .map_err(|e| TestCaseError::fail(format!("prost-reflect rejects our bytes: {e}")))?;
    let want = expected(desc, ops);
    // prost-reflect's encoding is canonical (fields in number order), so equal encodings mean
    // equal messages; comparing them also sidesteps "empty list" versus "absent" noise.
    prop_assert_eq!(decoded.encode_to_vec(), want.encode_to_vec());
    let desc_name = decoded.descriptor();
    prop_assert_eq!(desc_name.full_name(), "protozero.test.EveryField");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn heap_buffered_matches_prost_reflect(
        ops in proptest::collection::vec(op(3), 0..24),
        slice in prop::sample::select(vec![1usize, 3, 7, 42, 4096]),
    ) {
        let desc = common::pool().get_message_by_name("protozero.test.EveryField").unwrap();
        let mut buf = HeapBuffered::with_slice_sizes(slice, slice);
        write(&mut buf.root_message(), &ops);
        check(&desc, &ops, &buf.serialize().unwrap())?;
    }

    #[test]
    fn eager_hand_off_with_patches_matches_prost_reflect(
        ops in proptest::collection::vec(op(3), 0..24),
        size in prop::sample::select(vec![1usize, 3, 7, 42, 4096]),
    ) {
        let desc = common::pool().get_message_by_name("protozero.test.EveryField").unwrap();
        let mut w = ScatteredStreamWriter::new(EagerDelegate::new(size));
        write(&mut w.root_message(), &ops);
        prop_assert_eq!(w.error(), None);
        check(&desc, &ops, &collect(&mut w))?;
    }

    #[test]
    fn carrying_buffer_tails_over_matches_prost_reflect(
        ops in proptest::collection::vec(op(3), 0..24),
        size in prop::sample::select(vec![1usize, 3, 7, 42, 4096]),
        seed in any::<u64>(),
    ) {
        // The delegate carries a random tail of each buffer into the next and poisons what it
        // left: every size field inside a carried tail must be written at its new place.
        let desc = common::pool().get_message_by_name("protozero.test.EveryField").unwrap();
        let mut w = ScatteredStreamWriter::new(EagerDelegate::carrying(size, seed));
        write(&mut w.root_message(), &ops);
        prop_assert_eq!(w.error(), None);
        check(&desc, &ops, &collect(&mut w))?;
    }
}

//! Differential test of the decoder against an independent encoder.
//!
//! Random `protozero.test.EveryField` values (every scalar type, strings, bytes, nested messages
//! up to depth 3, repeated, packed, and the field numbered 99999) are encoded by prost-reflect
//! from a schema that protox compiles at test time, then decoded by our `ProtoDecoder` and by
//! our `TypedDecoder` into the same plain Rust model; both must give back the original values.
//!
//! The same values are also encoded with a second schema, identical but for flipped `packed`
//! options, so that each repeated scalar is seen both packed and unpacked: protobuf parsers must
//! accept either encoding, and so must our unified repeated iterators.

use std::path::PathBuf;

use proptest::collection::vec;
use proptest::prelude::*;
use prost::Message as _;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, Value};
use protozero::wire::{zigzag_decode64, WireType};
use protozero::{Field, FieldValue, ProtoDecoder, TypedDecoder};

const MESSAGE: &str = "protozero.test.EveryField";

fn proto_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/protos")
}

/// The `EveryField` descriptor, compiled by protox from the checked-in schema.
fn descriptor() -> MessageDescriptor {
    let dir = proto_dir();
    let fds = protox::compile([dir.join("test_messages.proto")], [&dir]).expect("compile schema");
    let pool = DescriptorPool::from_file_descriptor_set(fds).expect("descriptor pool");
    pool.get_message_by_name(MESSAGE).expect("EveryField")
}

/// A protox file resolver serving one in-memory file.
struct InMemory {
    name: &'static str,
    source: String,
}

impl protox::file::FileResolver for InMemory {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        if name == self.name {
            protox::file::File::from_source(name, &self.source)
        } else {
            Err(protox::Error::file_not_found(name))
        }
    }
}

/// The same schema with the `packed` option of every repeated scalar flipped.
fn flipped_descriptor() -> MessageDescriptor {
    let original = std::fs::read_to_string(proto_dir().join("test_messages.proto")).unwrap();
    let source = original
        .replace("[packed = true]", "[packed = false]")
        .replace(
            "repeated int32 repeated_int32 = 16;",
            "repeated int32 repeated_int32 = 16 [packed = true];",
        );
    assert_ne!(source, original);
    let resolver = InMemory {
        name: "flipped.proto",
        source,
    };
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler
        .open_file("flipped.proto")
        .expect("compile flipped schema");
    // Build the pool from the file descriptor set, as `descriptor` does: the pool that
    // `Compiler::descriptor_pool` returns (protox 0.10) reports `is_packed() == false` for a
    // field declared `[packed = true]`, and prost-reflect would then encode it unpacked.
    let pool = DescriptorPool::from_file_descriptor_set(compiler.file_descriptor_set())
        .expect("descriptor pool");
    pool.get_message_by_name(MESSAGE).expect("EveryField")
}

// === The model ===

/// A plain Rust image of `EveryField`. Floats are kept as bits so that NaNs compare equal.
#[derive(Clone, Debug, Default, PartialEq)]
struct Every {
    int32: Option<i32>,
    int64: Option<i64>,
    uint32: Option<u32>,
    uint64: Option<u64>,
    sint32: Option<i32>,
    sint64: Option<i64>,
    fixed32: Option<u32>,
    fixed64: Option<u64>,
    sfixed32: Option<i32>,
    sfixed64: Option<i64>,
    float_bits: Option<u32>,
    double_bits: Option<u64>,
    boolean: Option<bool>,
    nested: Vec<Every>,
    bytes: Option<Vec<u8>>,
    repeated_int32: Vec<i32>,
    packed_sint64: Vec<i64>,
    packed_fixed32: Vec<u32>,
    packed_fixed64: Vec<u64>,
    packed_uint64: Vec<u64>,
    repeated_string: Vec<String>,
    big_id_field: Option<u32>,
    string: Option<String>,
}

fn every(depth: u32) -> BoxedStrategy<Every> {
    let ints = (
        any::<Option<i32>>(),
        any::<Option<i64>>(),
        any::<Option<u32>>(),
        any::<Option<u64>>(),
        any::<Option<i32>>(),
        any::<Option<i64>>(),
        any::<Option<u32>>(),
        any::<Option<u64>>(),
        any::<Option<i32>>(),
        any::<Option<i64>>(),
    );
    let others = (
        any::<Option<u32>>(),
        any::<Option<u64>>(),
        any::<Option<bool>>(),
        proptest::option::of(vec(any::<u8>(), 0..24)),
        any::<Option<u32>>(),
        proptest::option::of(".{0,16}"),
    );
    let repeated = (
        vec(any::<i32>(), 0..5),
        vec(any::<i64>(), 0..5),
        vec(any::<u32>(), 0..5),
        vec(any::<u64>(), 0..5),
        vec(any::<u64>(), 0..5),
        vec(".{0,8}", 0..4),
    );
    let nested = if depth == 0 {
        Just(Vec::new()).boxed()
    } else {
        vec(every(depth - 1), 0..3).boxed()
    };
    (ints, others, repeated, nested)
        .prop_map(|(i, o, r, nested)| Every {
            int32: i.0,
            int64: i.1,
            uint32: i.2,
            uint64: i.3,
            sint32: i.4,
            sint64: i.5,
            fixed32: i.6,
            fixed64: i.7,
            sfixed32: i.8,
            sfixed64: i.9,
            float_bits: o.0,
            double_bits: o.1,
            boolean: o.2,
            nested,
            bytes: o.3,
            repeated_int32: r.0,
            packed_sint64: r.1,
            packed_fixed32: r.2,
            packed_fixed64: r.3,
            packed_uint64: r.4,
            repeated_string: r.5,
            big_id_field: o.4,
            string: o.5,
        })
        .boxed()
}

// === Model -> DynamicMessage (the independent encoder) ===

fn to_dynamic(m: &Every, desc: &MessageDescriptor) -> DynamicMessage {
    let mut msg = DynamicMessage::new(desc.clone());
    let mut set = |name: &str, value: Option<Value>| {
        if let Some(value) = value {
            msg.set_field_by_name(name, value);
        }
    };
    set("field_int32", m.int32.map(Value::I32));
    set("field_int64", m.int64.map(Value::I64));
    set("field_uint32", m.uint32.map(Value::U32));
    set("field_uint64", m.uint64.map(Value::U64));
    set("field_sint32", m.sint32.map(Value::I32));
    set("field_sint64", m.sint64.map(Value::I64));
    set("field_fixed32", m.fixed32.map(Value::U32));
    set("field_fixed64", m.fixed64.map(Value::U64));
    set("field_sfixed32", m.sfixed32.map(Value::I32));
    set("field_sfixed64", m.sfixed64.map(Value::I64));
    set(
        "field_float",
        m.float_bits.map(|b| Value::F32(f32::from_bits(b))),
    );
    set(
        "field_double",
        m.double_bits.map(|b| Value::F64(f64::from_bits(b))),
    );
    set("field_bool", m.boolean.map(Value::Bool));
    set(
        "field_bytes",
        m.bytes.clone().map(|b| Value::Bytes(b.into())),
    );
    set("big_id_field", m.big_id_field.map(Value::U32));
    set("field_string", m.string.clone().map(Value::String));
    let list = |values: Vec<Value>| (!values.is_empty()).then_some(Value::List(values));
    set(
        "field_nested",
        list(
            m.nested
                .iter()
                .map(|n| Value::Message(to_dynamic(n, desc)))
                .collect(),
        ),
    );
    set(
        "repeated_int32",
        list(m.repeated_int32.iter().copied().map(Value::I32).collect()),
    );
    set(
        "packed_sint64",
        list(m.packed_sint64.iter().copied().map(Value::I64).collect()),
    );
    set(
        "packed_fixed32",
        list(m.packed_fixed32.iter().copied().map(Value::U32).collect()),
    );
    set(
        "packed_fixed64",
        list(m.packed_fixed64.iter().copied().map(Value::U64).collect()),
    );
    set(
        "packed_uint64",
        list(m.packed_uint64.iter().copied().map(Value::U64).collect()),
    );
    set(
        "repeated_string",
        list(
            m.repeated_string
                .iter()
                .cloned()
                .map(Value::String)
                .collect(),
        ),
    );
    msg
}

// === Bytes -> model, with ProtoDecoder ===

/// Asserts a field has the wire type its declared type must be encoded with.
fn expect(field: &Field<'_>, wire_type: WireType) {
    assert_eq!(field.wire_type(), wire_type, "field {}", field.id());
}

/// Pushes the elements of a repeated varint field, in whichever encoding it came.
fn push_varints<T>(out: &mut Vec<T>, field: &Field<'_>, convert: impl Fn(u64) -> T) {
    match field.value() {
        FieldValue::Bytes(_) => out.extend(
            field
                .packed_varints()
                .map(|v| convert(v.expect("packed varint"))),
        ),
        FieldValue::Varint(v) => out.push(convert(v)),
        other => panic!("field {}: unexpected {other:?}", field.id()),
    }
}

fn decode_with_proto_decoder(bytes: &[u8]) -> Every {
    let mut m = Every::default();
    let mut decoder = ProtoDecoder::new(bytes);
    while let Some(f) = decoder.read_field().expect("well-formed input") {
        match f.id() {
            1..=6 | 13 | 99999 => expect(&f, WireType::Varint),
            7 | 9 | 11 => expect(&f, WireType::Fixed32),
            8 | 10 | 12 => expect(&f, WireType::Fixed64),
            14 | 15 | 21 | 500 => expect(&f, WireType::LengthDelimited),
            _ => {}
        }
        match f.id() {
            1 => m.int32 = Some(f.as_i32()),
            2 => m.int64 = Some(f.as_i64()),
            3 => m.uint32 = Some(f.as_u32()),
            4 => m.uint64 = Some(f.as_u64()),
            5 => m.sint32 = Some(f.as_sint32()),
            6 => m.sint64 = Some(f.as_sint64()),
            7 => m.fixed32 = Some(f.as_fixed32()),
            8 => m.fixed64 = Some(f.as_fixed64()),
            9 => m.sfixed32 = Some(f.as_sfixed32()),
            10 => m.sfixed64 = Some(f.as_sfixed64()),
            11 => m.float_bits = Some(f.as_f32().to_bits()),
            12 => m.double_bits = Some(f.as_f64().to_bits()),
            13 => m.boolean = Some(f.as_bool()),
            14 => m.nested.push(decode_with_proto_decoder(f.as_bytes())),
            15 => m.bytes = Some(f.as_bytes().to_vec()),
            16 => push_varints(&mut m.repeated_int32, &f, |v| v as i32),
            17 => push_varints(&mut m.packed_sint64, &f, zigzag_decode64),
            18 => match f.value() {
                FieldValue::Bytes(_) => m
                    .packed_fixed32
                    .extend(f.packed_fixed32().map(|v| v.expect("packed fixed32"))),
                _ => {
                    expect(&f, WireType::Fixed32);
                    m.packed_fixed32.push(f.as_fixed32());
                }
            },
            19 => match f.value() {
                FieldValue::Bytes(_) => m
                    .packed_fixed64
                    .extend(f.packed_fixed64().map(|v| v.expect("packed fixed64"))),
                _ => {
                    expect(&f, WireType::Fixed64);
                    m.packed_fixed64.push(f.as_fixed64());
                }
            },
            20 => push_varints(&mut m.packed_uint64, &f, |v| v),
            21 => m
                .repeated_string
                .push(f.as_str().expect("UTF-8").to_owned()),
            99999 => m.big_id_field = Some(f.as_u32()),
            500 => m.string = Some(f.as_str().expect("UTF-8").to_owned()),
            id => panic!("unexpected field {id}"),
        }
    }
    assert_eq!(decoder.bytes_left(), 0);

    // find_field and find_last_field agree with the walk (single fields occur at most once).
    let d = ProtoDecoder::new(bytes);
    assert_eq!(d.find_field(1).map(|f| f.as_i32()), m.int32);
    assert_eq!(d.find_last_field(99999).map(|f| f.as_u32()), m.big_id_field);
    assert_eq!(
        d.find_field(500).map(|f| f.as_str().unwrap().to_owned()),
        m.string
    );
    m
}

// === Bytes -> model, with TypedDecoder ===

/// Field ids of `EveryField` in slot order, as a code generator would lay them out.
const IDS: [u32; 23] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 99999, 500,
];

fn slot_of(id: u32) -> Option<usize> {
    match id {
        1..=21 => Some(id as usize - 1),
        99999 => Some(21),
        500 => Some(22),
        _ => None,
    }
}

fn decode_with_typed_decoder(bytes: &[u8]) -> Every {
    let d = TypedDecoder::<23>::new(bytes, slot_of);
    assert_eq!(d.error(), None);
    assert_eq!(d.bytes(), bytes);
    for (slot, id) in IDS.iter().enumerate() {
        assert_eq!(d.has(slot), d.count(slot) > 0);
        if let Some(f) = d.get(slot) {
            assert_eq!(f.id(), *id);
        }
    }
    let slot = |id: u32| slot_of(id).unwrap();
    let get = |id: u32| d.get(slot(id));
    let string = |f: Field<'_>| f.as_str().expect("UTF-8").to_owned();
    let m = Every {
        int32: get(1).map(|f| f.as_i32()),
        int64: get(2).map(|f| f.as_i64()),
        uint32: get(3).map(|f| f.as_u32()),
        uint64: get(4).map(|f| f.as_u64()),
        sint32: get(5).map(|f| f.as_sint32()),
        sint64: get(6).map(|f| f.as_sint64()),
        fixed32: get(7).map(|f| f.as_fixed32()),
        fixed64: get(8).map(|f| f.as_fixed64()),
        sfixed32: get(9).map(|f| f.as_sfixed32()),
        sfixed64: get(10).map(|f| f.as_sfixed64()),
        float_bits: get(11).map(|f| f.as_f32().to_bits()),
        double_bits: get(12).map(|f| f.as_f64().to_bits()),
        boolean: get(13).map(|f| f.as_bool()),
        nested: d
            .repeated(slot(14))
            .map(|f| decode_with_typed_decoder(f.as_bytes()))
            .collect(),
        bytes: get(15).map(|f| f.as_bytes().to_vec()),
        repeated_int32: d
            .repeated_varints(slot(16))
            .map(|v| v.unwrap() as i32)
            .collect(),
        packed_sint64: d
            .repeated_varints(slot(17))
            .map(|v| zigzag_decode64(v.unwrap()))
            .collect(),
        packed_fixed32: d.repeated_fixed32(slot(18)).map(Result::unwrap).collect(),
        packed_fixed64: d.repeated_fixed64(slot(19)).map(Result::unwrap).collect(),
        packed_uint64: d.repeated_varints(slot(20)).map(Result::unwrap).collect(),
        repeated_string: d.repeated(slot(21)).map(string).collect(),
        big_id_field: get(99999).map(|f| f.as_u32()),
        string: get(500).map(string),
    };
    assert_eq!(d.count(slot(14)), m.nested.len());
    assert_eq!(d.count(slot(21)), m.repeated_string.len());
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn decoders_agree_with_prost_reflect(m in every(3)) {
        let desc = descriptor_cached();
        let bytes = to_dynamic(&m, desc).encode_to_vec();
        prop_assert_eq!(&decode_with_proto_decoder(&bytes), &m);
        prop_assert_eq!(&decode_with_typed_decoder(&bytes), &m);

        // The other packing of every repeated scalar decodes to the same values.
        let flipped = to_dynamic(&m, flipped_cached()).encode_to_vec();
        prop_assert_eq!(&decode_with_proto_decoder(&flipped), &m);
        prop_assert_eq!(&decode_with_typed_decoder(&flipped), &m);
    }
}

fn descriptor_cached() -> &'static MessageDescriptor {
    static DESC: std::sync::OnceLock<MessageDescriptor> = std::sync::OnceLock::new();
    DESC.get_or_init(descriptor)
}

fn flipped_cached() -> &'static MessageDescriptor {
    static DESC: std::sync::OnceLock<MessageDescriptor> = std::sync::OnceLock::new();
    DESC.get_or_init(flipped_descriptor)
}

/// The flipped schema really changes the encoding: without this the second half of the property
/// above could pass vacuously.
#[test]
fn flipped_schema_flips_the_packing() {
    let m = Every {
        repeated_int32: vec![1, -1],
        packed_uint64: vec![2, 3],
        packed_fixed32: vec![4, 5],
        ..Every::default()
    };
    let wire_types = |desc: &MessageDescriptor| {
        let bytes = to_dynamic(&m, desc).encode_to_vec();
        ProtoDecoder::new(&bytes)
            .map(|f| f.map(|f| (f.id(), f.wire_type())))
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
    };
    use WireType::*;
    assert_eq!(
        wire_types(descriptor_cached()),
        [
            (16, Varint),
            (16, Varint),
            (18, LengthDelimited),
            (20, LengthDelimited)
        ]
    );
    assert_eq!(
        wire_types(flipped_cached()),
        [
            (16, LengthDelimited),
            (18, Fixed32),
            (18, Fixed32),
            (20, Varint),
            (20, Varint)
        ]
    );
}

/// A known encoding, checked field by field: the model and the decoders agree with prost-reflect
/// on a message with every field set, including negative int32 (ten bytes on the wire).
#[test]
fn every_field_set_round_trips() {
    let m = Every {
        int32: Some(-1),
        int64: Some(i64::MIN),
        uint32: Some(u32::MAX),
        uint64: Some(u64::MAX),
        sint32: Some(i32::MIN),
        sint64: Some(-2),
        fixed32: Some(7),
        fixed64: Some(8),
        sfixed32: Some(-9),
        sfixed64: Some(-10),
        float_bits: Some(1.5f32.to_bits()),
        double_bits: Some(f64::NAN.to_bits()),
        boolean: Some(true),
        nested: vec![Every {
            string: Some("inner".into()),
            ..Every::default()
        }],
        bytes: Some(vec![0, 255]),
        repeated_int32: vec![-5, 5],
        packed_sint64: vec![i64::MIN, 0, i64::MAX],
        packed_fixed32: vec![1],
        packed_fixed64: vec![2],
        packed_uint64: vec![300],
        repeated_string: vec!["a".into(), "".into()],
        big_id_field: Some(99999),
        string: Some("héllo".into()),
    };
    let bytes = to_dynamic(&m, descriptor_cached()).encode_to_vec();
    assert_eq!(decode_with_proto_decoder(&bytes), m);
    assert_eq!(decode_with_typed_decoder(&bytes), m);
    // int32 -1 is a 10-byte varint: tag 08 then ff ff ff ff ff ff ff ff ff 01.
    assert_eq!(
        &bytes[..11],
        &[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
    );
}

//! Property tests of the generated views against protozero's generic, schema-less path, on
//! hostile input: every getter of `Everything` (every field kind) must return what the rules
//! give when computed from a plain `ProtoDecoder` walk and `TypedDecoder`'s repeated iterators
//! (the path the views were built on before they dispatched on whole tags):
//!
//! - `decode` fails exactly when the walk meets a malformed field, with the same error;
//! - a singular field is the last occurrence with its declared wire type (the default when
//!   there is none), and `has_*` says whether there is one;
//! - a repeated scalar is every element of its packed and unpacked occurrences, with the same
//!   error for a malformed packed chunk; a repeated string, bytes or message field is every
//!   length-delimited occurrence.
//!
//! The input is a "soup" of fields with declared and undeclared ids, any wire type (also the
//! invalid ones), varints with redundant continuation bytes up to over-long ones, payloads that
//! are nested soups, packed chunks or random bytes, sometimes an oversized length or a field id
//! of 0, and the whole possibly truncated; plus plain random bytes.

use proptest::prelude::*;
use protozero::wire::WireType;
use protozero::{DecodeError, Field, FieldValue, ProtoDecoder, TypedDecoder};

use crate::golden_code::pz::test::everything::Kind;
use crate::golden_code::pz::test::EverythingView;

/// A varint with `extra` redundant continuation bytes (more than 10 bytes in all is over-long).
fn varint(out: &mut Vec<u8>, mut v: u64, extra: usize) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            if extra == 0 {
                out.push(b);
            } else {
                out.push(b | 0x80);
                out.extend(std::iter::repeat_n(0x80, extra - 1));
                out.push(0);
            }
            return;
        }
        out.push(b | 0x80);
    }
}

/// One field of a soup.
#[derive(Clone, Debug)]
enum Part {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Bytes(Vec<u8>),
    /// A wire type with no defined payload (3, 4, 6, 7): malformed.
    Invalid(u8),
}

fn redundancy() -> impl Strategy<Value = usize> {
    prop_oneof![8 => Just(0usize), 2 => 1usize..4, 1 => 4usize..12]
}

/// Field ids: mostly ones `Everything` declares, some it does not, sometimes 0.
fn id() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => prop::sample::select(vec![
            1u64, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
            24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 41, 42, 43, 44, 45, 46, 47, 48,
            49, 50, 51, 52, 53, 54, 60, 61, 70, 71, 72, 73, 90, 16_777_215,
        ]),
        1 => 1u64..200,
        1 => prop::sample::select(vec![0u64, 16_777_216, u64::MAX >> 3]),
    ]
}

fn leaf_payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..12),
        // Packed varints (valid or not, depending on the last byte).
        prop::collection::vec(any::<u64>().prop_map(|v| v >> (v % 64)), 0..5).prop_map(|vs| {
            let mut out = Vec::new();
            for v in vs {
                varint(&mut out, v, 0);
            }
            out
        }),
        Just(b"ok".to_vec()),
        Just(vec![0xff, 0xfe]),
    ]
}

/// A soup of fields, nested `depth` levels deep.
fn soup(depth: u32) -> BoxedStrategy<Vec<u8>> {
    let payload = if depth == 0 {
        leaf_payload().boxed()
    } else {
        prop_oneof![3 => leaf_payload(), 1 => soup(depth - 1)].boxed()
    };
    let part = prop_oneof![
        4 => any::<u64>().prop_map(|v| Part::Varint(v >> (v % 64))),
        1 => any::<u64>().prop_map(Part::Fixed64),
        1 => any::<u32>().prop_map(Part::Fixed32),
        4 => payload.prop_map(Part::Bytes),
        1 => prop::sample::select(vec![3u8, 4, 6, 7]).prop_map(Part::Invalid),
    ];
    prop::collection::vec((id(), part, redundancy(), redundancy(), 0u8..40), 0..12)
        .prop_map(|fields| {
            let mut out = Vec::new();
            for (id, part, tag_extra, value_extra, oddity) in fields {
                let wire = match part {
                    Part::Varint(_) => 0,
                    Part::Fixed64(_) => 1,
                    Part::Bytes(_) => 2,
                    Part::Fixed32(_) => 5,
                    Part::Invalid(w) => u64::from(w),
                };
                varint(&mut out, (id << 3) | wire, tag_extra);
                match part {
                    Part::Varint(v) => varint(&mut out, v, value_extra),
                    Part::Fixed64(v) => out.extend_from_slice(&v.to_le_bytes()),
                    Part::Fixed32(v) => out.extend_from_slice(&v.to_le_bytes()),
                    Part::Bytes(b) => {
                        // Now and then a length past the end, or one above MAX_MESSAGE_LENGTH.
                        let len = match oddity {
                            0 => b.len() as u64 + 3,
                            1 => 1 << 28,
                            _ => b.len() as u64,
                        };
                        varint(&mut out, len, value_extra);
                        out.extend_from_slice(&b);
                    }
                    Part::Invalid(_) => {}
                }
            }
            out
        })
        .boxed()
}

/// What the generic path says: the fields before the first malformed one, and its error.
fn walk(bytes: &[u8]) -> (Vec<Field<'_>>, Option<DecodeError>) {
    let mut fields = Vec::new();
    for f in ProtoDecoder::new(bytes) {
        match f {
            Ok(f) => fields.push(f),
            Err(e) => return (fields, Some(e)),
        }
    }
    (fields, None)
}

/// Checks every getter of the view of `bytes` against the generic path, recursively.
fn check(bytes: &[u8], depth: u32) -> Result<(), TestCaseError> {
    let (fields, error) = walk(bytes);
    let view = EverythingView::decode(bytes);
    prop_assert_eq!(view.as_ref().err().copied(), error);
    let Ok(v) = view else { return Ok(()) };
    prop_assert_eq!(v.bytes(), bytes);
    let empty = EverythingView::decode(&[]).unwrap();
    // The old index: `TypedDecoder` with one slot per field id below 128.
    let typed = TypedDecoder::<128>::new(bytes, |id| (id < 128).then_some(id as usize));
    prop_assert!(typed.error().is_none());
    let last = |id: u32, wire: WireType| {
        fields
            .iter()
            .rev()
            .find(|f| f.id() == id && f.wire_type() == wire)
            .copied()
    };
    let payloads = |id: u32| {
        fields.iter().filter_map(move |f| match f.value() {
            FieldValue::Bytes(b) if f.id() == id => Some(b),
            _ => None,
        })
    };
    macro_rules! singular {
        ($($get:ident, $has:ident, $id:expr, $wire:ident, $as:ident;)*) => {$(
            let f = last($id, WireType::$wire);
            prop_assert_eq!(v.$has(), f.is_some(), "{}", stringify!($has));
            let want = f.map_or(empty.$get(), |f| f.$as());
            // Compared by bits: NaN is a value too.
            prop_assert_eq!(format!("{:?}", v.$get()), format!("{want:?}"), "{}", stringify!($get));
        )*};
    }
    singular! {
        f_int32, has_f_int32, 1, Varint, as_i32;
        f_int64, has_f_int64, 2, Varint, as_i64;
        f_uint32, has_f_uint32, 3, Varint, as_u32;
        f_uint64, has_f_uint64, 4, Varint, as_u64;
        f_sint32, has_f_sint32, 5, Varint, as_sint32;
        f_sint64, has_f_sint64, 6, Varint, as_sint64;
        f_fixed32, has_f_fixed32, 7, Fixed32, as_fixed32;
        f_fixed64, has_f_fixed64, 8, Fixed64, as_fixed64;
        f_sfixed32, has_f_sfixed32, 9, Fixed32, as_sfixed32;
        f_sfixed64, has_f_sfixed64, 10, Fixed64, as_sfixed64;
        f_float, has_f_float, 11, Fixed32, as_f32;
        f_double, has_f_double, 12, Fixed64, as_f64;
        f_bool, has_f_bool, 13, Varint, as_bool;
        f_string, has_f_string, 14, LengthDelimited, as_str;
        f_string_bytes, has_f_string, 14, LengthDelimited, as_bytes;
        f_bytes, has_f_bytes, 15, LengthDelimited, as_bytes;
        f_enum_raw, has_f_enum, 16, Varint, as_i32;
        color_raw, has_color, 19, Varint, as_i32;
        f_pi, has_f_pi, 20, Fixed64, as_f64;
        o_int, has_o_int, 70, Varint, as_i32;
        o_string, has_o_string, 71, LengthDelimited, as_str;
        o_kind_raw, has_o_kind, 73, Varint, as_i32;
        big_number, has_big_number, 16_777_215, Varint, as_u32;
    }
    // Enums: the raw value (above) and the declared variant.
    let raw = last(16, WireType::Varint).map_or(empty.f_enum_raw(), |f| f.as_i32());
    prop_assert_eq!(v.f_enum_raw(), raw);
    prop_assert_eq!(v.f_enum(), Kind::from_i32(raw));
    // Singular messages: the last payload (empty when absent), decoded and checked in turn.
    for (id, got) in [
        (17, v.child().map(|c| c.bytes())),
        (18, v.point().map(|c| c.bytes())),
        (72, v.o_point().map(|c| c.bytes())),
        (90, v.nested().map(|c| c.bytes())),
    ] {
        let want = last(id, WireType::LengthDelimited).map_or(&[][..], |f| f.as_bytes());
        let want = match walk(want).1 {
            Some(e) => Err(e),
            None => Ok(want),
        };
        prop_assert_eq!(got, want);
    }
    if let (Ok(child), true) = (v.child(), depth < 4) {
        check(child.bytes(), depth + 1)?;
    }
    macro_rules! repeated {
        ($($get:ident, $id:expr, $elements:ident, |$x:ident| $convert:expr;)*) => {$(
            let got: Vec<_> = v.$get().collect();
            let want: Vec<_> = typed.$elements($id).map(|r| r.map(|$x| $convert)).collect();
            prop_assert_eq!(format!("{got:?}"), format!("{want:?}"), "{}", stringify!($get));
        )*};
    }
    repeated! {
        r_int32, 21, repeated_varints, |x| x as i32;
        r_int64, 22, repeated_varints, |x| x as i64;
        r_uint32, 23, repeated_varints, |x| x as u32;
        r_uint64, 24, repeated_varints, |x| x;
        r_sint32, 25, repeated_varints, |x| protozero::wire::zigzag_decode32(x as u32);
        r_sint64, 26, repeated_varints, |x| protozero::wire::zigzag_decode64(x);
        r_fixed32, 27, repeated_fixed32, |x| x;
        r_fixed64, 28, repeated_fixed64, |x| x;
        r_sfixed32, 29, repeated_fixed32, |x| x as i32;
        r_sfixed64, 30, repeated_fixed64, |x| x as i64;
        r_float, 31, repeated_fixed32, |x| f32::from_bits(x);
        r_double, 32, repeated_fixed64, |x| f64::from_bits(x);
        r_bool, 33, repeated_varints, |x| x != 0;
        r_enum_raw, 36, repeated_varints, |x| x as i32;
        r_enum, 36, repeated_varints, |x| Kind::from_i32(x as i32);
        p_int32, 41, repeated_varints, |x| x as i32;
        p_sint64, 46, repeated_varints, |x| protozero::wire::zigzag_decode64(x);
        p_fixed32, 47, repeated_fixed32, |x| x;
        p_double, 52, repeated_fixed64, |x| f64::from_bits(x);
        p_bool, 53, repeated_varints, |x| x != 0;
    }
    let strings: Vec<_> = v.r_string().collect();
    let want: Vec<_> = payloads(34)
        .map(|b| {
            std::str::from_utf8(b).map_err(|e| DecodeError::InvalidUtf8 {
                offset: e.valid_up_to(),
            })
        })
        .collect();
    prop_assert_eq!(strings, want);
    prop_assert_eq!(
        v.r_bytes().collect::<Vec<_>>(),
        payloads(35).collect::<Vec<_>>()
    );
    let children: Vec<_> = v.children().map(|c| c.map(|c| c.bytes())).collect();
    let want: Vec<_> = payloads(60)
        .map(|b| EverythingView::decode(b).map(|c| c.bytes()))
        .collect();
    prop_assert_eq!(children, want);
    let points: Vec<_> = v.points().map(|c| c.map(|c| c.bytes())).collect();
    let want: Vec<_> = payloads(61)
        .map(|b| match walk(b).1 {
            Some(e) => Err(e),
            None => Ok(b),
        })
        .collect();
    prop_assert_eq!(points, want);
    if depth < 4 {
        for c in v.children().flatten() {
            check(c.bytes(), depth + 1)?;
        }
    }
    Ok(())
}

/// Cuts `bytes` at `cut` (a fraction of 256) some of the time.
fn truncated(mut bytes: Vec<u8>, cut: Option<u8>) -> Vec<u8> {
    if let Some(c) = cut {
        let at = bytes.len() * usize::from(c) / 256;
        bytes.truncate(at);
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn views_match_the_generic_path_on_soups(
        bytes in soup(2),
        cut in proptest::option::weighted(0.3, any::<u8>()),
    ) {
        check(&truncated(bytes, cut), 0)?;
    }

    #[test]
    fn views_match_the_generic_path_on_random_bytes(
        bytes in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        check(&bytes, 0)?;
    }
}

/// Payloads above `MAX_MESSAGE_LENGTH` (but within the buffer) are skipped like unknown fields:
/// an earlier occurrence of a singular field stays the last one, and a repeated field has no
/// such occurrence. (The 256 MiB buffer is mostly never touched: `vec!` of zeros maps it
/// lazily.)
#[test]
fn oversized_payloads_are_skipped() {
    let big = 1usize << 28;
    let head = [0x72, 2, b'o', b'k', 0x08, 5]; // f_string = "ok", f_int32 = 5
                                               // Tags as varints: f_string 14 << 3 | 2 = 0x72; r_string 34 << 3 | 2 = 0x112; p_int32
                                               // 41 << 3 | 2 = 0x14a.
    let fields = [vec![0x72u8], vec![0x92, 0x02], vec![0xca, 0x02]];
    let mut bytes = vec![0u8; head.len() + fields.len() * (3 + 5 + big)];
    let mut at = 0;
    bytes[..head.len()].copy_from_slice(&head);
    at += head.len();
    for tag in &fields {
        let mut prefix = tag.clone();
        varint(&mut prefix, big as u64, 0);
        bytes[at..at + prefix.len()].copy_from_slice(&prefix);
        at += prefix.len() + big;
    }
    bytes.truncate(at);
    let v = EverythingView::decode(&bytes).unwrap();
    assert!(v.f_string() == Ok("ok"), "the oversized f_string won");
    assert_eq!(v.f_int32(), 5);
    assert_eq!(v.r_string().count(), 0);
    assert_eq!(v.p_int32().count(), 0);
    check(&bytes, 0).unwrap();
}

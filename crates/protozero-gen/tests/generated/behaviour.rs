//! Hand-written checks of the generated API: names, defaults, enums, and how views treat
//! unknown fields, wrong wire types and malformed input.

use protozero::{DecodeError, HeapBuffered};

use crate::golden_code::pz::common::{Color, Point, PointView};
use crate::golden_code::pz::test::everything::{Kind, NestedView};
use crate::golden_code::pz::test::{self, Everything, EverythingView};
use crate::golden_code::single;

/// The bytes `$body` writes with `$w`, a root writer of type `$ty`.
macro_rules! write {
    ($ty:ty, |$w:ident| $body:expr) => {{
        let mut buf = HeapBuffered::new();
        {
            let mut $w: $ty = buf.root();
            $body;
        }
        buf.serialize().unwrap()
    }};
}

fn everything(f: impl FnOnce(&mut Everything<'_>)) -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    {
        let mut w: Everything<'_> = buf.root();
        f(&mut w);
    }
    buf.serialize().unwrap()
}

#[test]
fn absent_fields_read_as_their_proto2_defaults() {
    let v = EverythingView::decode(&[]).unwrap();
    assert_eq!(v.f_int32(), -42);
    assert_eq!(v.f_int64(), i64::MIN);
    assert_eq!(v.f_uint32(), u32::MAX);
    assert_eq!(v.f_uint64(), u64::MAX);
    assert_eq!(v.f_sint32(), -7);
    assert_eq!(v.f_sint64(), 0);
    assert_eq!(v.f_fixed32(), 7);
    assert_eq!(v.f_fixed64(), 0);
    assert_eq!(v.f_sfixed32(), i32::MIN);
    assert_eq!(v.f_sfixed64(), -5);
    assert_eq!(v.f_float(), 1.5);
    assert_eq!(v.f_double(), f64::NEG_INFINITY);
    assert!(v.f_bool());
    assert_eq!(v.f_string(), Ok("d\"e\\f\n\u{e9}"));
    assert_eq!(v.f_string_bytes(), "d\"e\\f\n\u{e9}".as_bytes());
    assert_eq!(v.f_bytes(), b"\x00\x01\xffabc");
    assert_eq!(v.f_enum(), Some(Kind::Negative));
    assert_eq!(v.f_enum_raw(), -3);
    assert_eq!(v.color(), Some(Color::Unspecified));
    #[allow(clippy::approx_constant)]
    let pi = 3.14159;
    assert_eq!(v.f_pi(), pi);
    assert!(!v.has_f_int32() && !v.has_f_string() && !v.has_child() && !v.has_f_enum());
    // An absent message reads as an empty one; absent repeated fields are empty.
    assert!(v.child().unwrap().bytes().is_empty());
    assert_eq!(v.child().unwrap().child().unwrap().f_int32(), -42);
    assert_eq!(
        v.r_int32().count() + v.children().count() + v.r_string().count(),
        0
    );
}

#[test]
fn proto3_defaults_are_zero() {
    let v = test::three::ThreeView::decode(&[]).unwrap();
    assert_eq!(
        (v.plain(), v.opt(), v.name(), v.data()),
        (0, 0, Ok(""), &[][..])
    );
    assert_eq!(v.mood(), Some(test::three::three_::Mood::Unspecified));
    assert!(!v.has_opt() && !v.has_opt_mood());
}

#[test]
fn setters_write_what_getters_read() {
    let bytes = everything(|w| {
        w.set_f_int32(1);
        w.set_f_int32(2); // the last occurrence wins
        w.set_f_string("hé");
        w.set_f_enum(Kind::One);
        w.set_color_raw(99); // a value the enum does not declare
        {
            let mut c = w.set_child();
            c.set_f_sint64(-3);
            c.add_children().set_f_bool(false);
        }
        w.add_r_string("a");
        w.add_r_string("b");
        w.set_p_sint32_packed([-1, 0, 1]);
        w.add_p_sint32(5); // packed then unpacked elements of one field
        w.set_p_float_packed(&[0.5, -2.0]);
        w.set_p_enum_packed([Kind::Kind2d, Kind::Kind]);
        {
            let mut e = w.add_named_points();
            e.set_key("origin");
            e.set_value().set_x(0);
        }
        w.set_big_number(16_777_215);
    });
    let v = EverythingView::decode(&bytes).unwrap();
    assert_eq!(v.bytes(), bytes.as_slice());
    assert_eq!(v.f_int32(), 2);
    assert_eq!(v.f_string(), Ok("hé"));
    assert_eq!(v.f_enum(), Some(Kind::One));
    assert_eq!((v.color(), v.color_raw()), (None, 99));
    let child = v.child().unwrap();
    assert_eq!(child.f_sint64(), -3);
    let grandchildren: Vec<_> = child.children().map(Result::unwrap).collect();
    assert_eq!(grandchildren.len(), 1);
    assert!(grandchildren[0].has_f_bool() && !grandchildren[0].f_bool());
    let strings: Result<Vec<&str>, _> = v.r_string().collect();
    assert_eq!(strings, Ok(vec!["a", "b"]));
    let sints: Result<Vec<i32>, _> = v.p_sint32().collect();
    assert_eq!(sints, Ok(vec![-1, 0, 1, 5]));
    let floats: Result<Vec<f32>, _> = v.p_float().collect();
    assert_eq!(floats, Ok(vec![0.5, -2.0]));
    let kinds: Result<Vec<_>, _> = v.p_enum().collect();
    assert_eq!(kinds, Ok(vec![Some(Kind::Kind2d), Some(Kind::Kind)]));
    let entry = v.named_points().next().unwrap().unwrap();
    assert_eq!(entry.key(), Ok("origin"));
    assert!(entry.value().unwrap().has_x());
    assert_eq!(v.big_number(), 16_777_215);
}

#[test]
fn field_number_constants() {
    assert_eq!(Everything::F_INT32_FIELD_NUMBER, 1);
    assert_eq!(Everything::BIG_NUMBER_FIELD_NUMBER, 16_777_215);
    assert_eq!(test::Keywords::TYPE_FIELD_NUMBER, 1);
    assert_eq!(test::Keywords::FOO_BAR_FIELD_NUMBER, 12);
    assert_eq!(test::Keywords::FOO_BAR_FIELD_NUMBER_, 13);
}

#[test]
fn enums() {
    assert_eq!(Kind::from_i32(-3), Some(Kind::Negative));
    assert_eq!(Kind::from_i32(3), None);
    assert_eq!(Kind::ALIAS_ONE, Kind::One);
    assert_eq!(Kind::Negative.as_i32(), -3);
    assert_eq!(Kind::Kind2d.as_str_name(), "KIND_2D");
    assert_eq!(Kind::Kind.as_str_name(), "KIND");
    assert_eq!(Kind::from_str_name("KIND_ALIAS_ONE"), Some(Kind::One));
    assert_eq!(Kind::from_str_name("KIND_ONE"), Some(Kind::One));
    assert_eq!(Kind::from_str_name("ONE"), None);
    assert_eq!(Color::Green as i32, 2);
    // `SELF` in enum `Kind` cannot be the variant `Self`.
    assert_eq!(test::keywords::Kind::Self_.as_str_name(), "SELF");
    assert_eq!(test::keywords::Kind::A.as_i32(), 0);
    assert_eq!(test::r#type::Match::Unspecified.as_i32(), 0);
}

/// Each line calls a method whose name the escaping and clash rules decide; the test is that
/// this compiles (and reads back what was written).
#[test]
fn escaped_and_deduplicated_names() {
    let bytes = write!(test::Keywords<'_>, |w| {
        w.set_type(1);
        w.set_self_("me");
        w.set_bytes(b"raw");
        w.set_decode(4);
        w.set_foo(5);
        w.set_has_foo(true);
        w.set_gen(7);
        w.set_clone(8);
        w.set_from_source("src");
        w.set_kind(test::keywords::Kind::Self_);
        w.set_kind_raw(11); // the field `kind_raw`...
        w.set_kind_raw_(1); // ...so the raw setter of `kind` gets a suffix (and wins: last)
        w.set_foo_bar(12); // `Foo_bar`
        w.set_foo_bar_(13); // `foo_bar`
        w.set_async(14);
        w.set_super_().set_crate_(15);
        w.set_into_iter_packed([16]);
        w.set_as_mut(17);
    });
    let v = test::KeywordsView::decode(&bytes).unwrap();
    assert_eq!(v.r#type(), 1);
    assert_eq!(v.self_(), Ok("me"));
    assert_eq!(v.self_bytes(), b"me");
    assert_eq!(v.bytes_(), b"raw"); // `bytes()` is the whole message
    assert_eq!(v.bytes(), bytes.as_slice());
    assert_eq!(v.decode_(), 4);
    assert_eq!(v.foo(), 5);
    assert!(v.has_foo()); // the field `has_foo`...
    assert!(v.has_foo_()); // ...so the presence of `foo` gets a suffix
    assert!(v.has_has_foo());
    assert_eq!(v.r#gen(), 7);
    assert_eq!(v.clone_(), 8);
    assert_eq!(v.from_source(), Ok("src"));
    assert_eq!(v.kind(), Some(test::keywords::Kind::Self_));
    assert_eq!(v.kind_raw_(), 1);
    assert_eq!(v.kind_raw(), 11);
    assert_eq!((v.foo_bar(), v.foo_bar_()), (12, 13));
    assert_eq!(v.r#async(), 14);
    let sup: test::SelfView<'_> = v.super_().unwrap();
    assert_eq!(sup.crate_(), 15);
    assert_eq!(v.into_iter().collect::<Vec<_>>(), [Ok(16)]);
    assert_eq!(v.as_mut(), 17);
}

#[test]
fn type_names_that_clash_or_shadow() {
    // `FooView` the message keeps its name; `Foo`'s view is `FooView_`.
    let foo = write!(test::Foo<'_>, |w| w.set_x(1));
    assert_eq!(test::FooView_::decode(&foo).unwrap().x(), 1);
    let fv = write!(test::FooView<'_>, |w| {
        w.set_foo().set_x(2);
        w.set_bar().set_y(3);
    });
    let fv = test::FooViewView::decode(&fv).unwrap();
    assert_eq!(fv.foo().unwrap().x(), 2);
    assert_eq!(fv.bar().unwrap().y(), 3);
    let _: test::foo::BarView<'_> = fv.bar().unwrap();
    // Messages named like prelude items do not confuse the generated code.
    let some = write!(test::Some<'_>, |w| {
        w.set_none().set_result().set_ok(1);
    });
    let some = test::SomeView::decode(&some).unwrap();
    assert_eq!(some.none().unwrap().result().unwrap().ok(), 1);
    let _: Option<test::OptionView<'_>> = None;
    // `str` → `Str`; its nested types live in `str_` (a module `str` would shadow the type).
    let s = write!(test::Str<'_>, |w| {
        w.set_u32(4);
        w.set_big();
    });
    let s = test::StrView::decode(&s).unwrap();
    assert_eq!(s.u32(), 4);
    let _: test::str_::I64View<'_> = s.big().unwrap();
    // `type` → `Type`, nested types in `r#type`.
    let t = write!(test::Type<'_>, |w| w.set_type().set_type());
    let t = test::TypeView::decode(&t).unwrap();
    assert!(t.has_type() && t.r#type().unwrap().has_type());
    // `Three`'s nested module would be the child package `three`: it is `three_`.
    let three = write!(test::Three<'_>, |w| w.set_inner().set_x(6));
    let inner: test::three_::InnerView<'_> =
        test::ThreeView::decode(&three).unwrap().inner().unwrap();
    assert_eq!(inner.x(), 6);
}

#[test]
fn unknown_fields_are_skipped() {
    // { 1: 7, 999: "zzz", 5000: 1 (fixed64), 1: 8 } read as Point (x is field 1, sint32).
    let mut bytes = vec![0x08, 0x0e];
    bytes.extend([0xba, 0x3e, 3, b'z', b'z', b'z']);
    bytes.extend([0xc1, 0xb8, 0x02, 1, 0, 0, 0, 0, 0, 0, 0]);
    bytes.extend([0x08, 0x10]);
    let v = PointView::decode(&bytes).unwrap();
    assert_eq!(v.x(), 8);
    assert!(!v.has_y());
}

#[test]
fn a_mismatched_wire_type_reads_as_absent() {
    // f_int32 (1, varint) = 5, then field 1 as fixed32: ignored, the varint stays.
    let v = EverythingView::decode(&[0x08, 0x05, 0x0d, 1, 0, 0, 0]).unwrap();
    assert!(v.has_f_int32());
    assert_eq!(v.f_int32(), 5);
    // Only the wrong wire type: absent, the default.
    let v = EverythingView::decode(&[0x0d, 1, 0, 0, 0]).unwrap();
    assert!(!v.has_f_int32());
    assert_eq!(v.f_int32(), -42);
    // f_string (14) as a varint; child (17) as a varint: absent.
    let v = EverythingView::decode(&[0x70, 0x01, 0x88, 0x01, 0x01]).unwrap();
    assert!(!v.has_f_string() && !v.has_child());
    assert_eq!(v.f_string(), Ok("d\"e\\f\n\u{e9}"));
    assert!(v.child().unwrap().bytes().is_empty());
    // A repeated string with a varint occurrence between two strings: skipped.
    let v =
        EverythingView::decode(&[0x92, 0x02, 1, b'a', 0x90, 0x02, 7, 0x92, 0x02, 1, b'b']).unwrap();
    assert_eq!(v.r_string().collect::<Vec<_>>(), [Ok("a"), Ok("b")]);
    // A repeated fixed32 with a varint occurrence: skipped.
    let v = EverythingView::decode(&[0xd8, 0x01, 0x05, 0xdd, 0x01, 2, 0, 0, 0]).unwrap();
    assert_eq!(v.r_fixed32().collect::<Vec<_>>(), [Ok(2)]);
}

#[test]
fn malformed_input_is_an_error_not_a_panic() {
    // Truncated varint, truncated length-delimited payload, a group wire type, field id 0.
    for bytes in [&[0x08][..], &[0x72, 5, b'a'], &[0x0b], &[0x00, 0x01]] {
        assert!(EverythingView::decode(bytes).is_err(), "{bytes:?}");
    }
    // A well-formed outer message with a malformed child: the error surfaces when the child is
    // read.
    let v = EverythingView::decode(&[0x8a, 0x01, 0x01, 0x08]).unwrap();
    assert!(v.has_child());
    assert_eq!(
        v.child().unwrap_err(),
        DecodeError::TruncatedVarint { offset: 1 }
    );
    let children: Vec<_> = EverythingView::decode(&[0xe2, 0x03, 0x01, 0x08])
        .unwrap()
        .children()
        .collect();
    assert!(matches!(children[..], [Err(_)]));
    // A malformed packed payload: one error, then the end.
    let v = EverythingView::decode(&[0xca, 0x02, 0x02, 0x01, 0x80]).unwrap();
    let ints: Vec<_> = v.p_int32().collect();
    assert_eq!(ints.len(), 2);
    assert_eq!(ints[0], Ok(1));
    assert!(ints[1].is_err());
    // Invalid UTF-8 in a string: an error from the string getter, the bytes are still there.
    let v = EverythingView::decode(&[0x72, 1, 0xff]).unwrap();
    assert!(matches!(v.f_string(), Err(DecodeError::InvalidUtf8 { .. })));
    assert_eq!(v.f_string_bytes(), [0xff]);
    // A view of nested garbage.
    assert!(NestedView::decode(&[0x12, 0x7f]).is_err());
}

#[test]
fn both_layouts_generate_the_same_code() {
    let per_package = everything(|w| {
        w.set_f_uint64(3);
        w.set_point().set_y(-1);
        w.add_r_bytes(b"x");
    });
    let mut buf = HeapBuffered::new();
    {
        let mut w: single::pz::test::Everything<'_> = buf.root();
        w.set_f_uint64(3);
        w.set_point().set_y(-1);
        w.add_r_bytes(b"x");
    }
    assert_eq!(buf.serialize().unwrap(), per_package);
    let v = single::pz::test::EverythingView::decode(&per_package).unwrap();
    assert_eq!(v.point().unwrap().y(), -1);
    // Types of another package are the same types in both layouts' trees only by shape: the
    // single-file `Point` writes the same bytes as the per-package one.
    let a = write!(Point<'_>, |w| w.set_x(-5));
    let b = write!(single::pz::common::Point<'_>, |w| w.set_x(-5));
    assert_eq!(a, b);
}

#[test]
fn fields_out_of_number_order() {
    let bytes = write!(test::Shuffled<'_>, |w| {
        w.set_x(5);
        w.set_y(6);
        w.set_a(1);
        w.set_b(2);
        w.set_d(10);
        w.set_e(11);
    });
    let v = test::ShuffledView::decode(&bytes).unwrap();
    assert_eq!(
        [v.x(), v.y(), v.a(), v.b(), v.d(), v.e()],
        [5, 6, 1, 2, 10, 11]
    );
    // Numbers around the ranges are unknown fields: { 3: 1, 7: 1, 12: 1 }.
    let v = test::ShuffledView::decode(&[0x18, 1, 0x38, 1, 0x60, 1]).unwrap();
    assert!(!(v.has_x() || v.has_y() || v.has_a() || v.has_b() || v.has_d() || v.has_e()));
}

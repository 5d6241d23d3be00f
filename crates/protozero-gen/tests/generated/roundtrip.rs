//! Property tests of the generated code against prost-reflect, an independent implementation,
//! with the schema parsed by protox from the same `.proto` files:
//!
//! - **writers**: a random `DynamicMessage` is written field by field through the generated
//!   setters (repeated scalars randomly one by one or packed), into small scattered buffers; the
//!   bytes, decoded by prost-reflect, must equal the message.
//! - **views**: a random `DynamicMessage` encoded by prost-reflect is read back field by field
//!   through the generated getters; the result must equal the message, and every absent field
//!   must read as prost-reflect's default for it (proto2 `[default = ...]` included).
//! - **packed vs unpacked**: `PackedTwin` and `UnpackedTwin` declare the same fields packed and
//!   unpacked; bytes encoded with one (and the concatenation of both) are read with the other's
//!   view.
//!
//! The `write_*`/`read_*` functions below are the bridge between `DynamicMessage` and the
//! generated API; they touch every field of the schema.

use std::collections::HashMap;

use proptest::prelude::*;
use prost::Message as _;
use prost_reflect::{DynamicMessage, MapKey, MessageDescriptor, ReflectMessage, Value};
use protozero::{HeapBuffered, MessageWriter};

use crate::arb::{self, Shown};
use crate::golden_code::pz::common::{Color, Point, PointView};
use crate::golden_code::pz::test::everything::{Kind, Nested, NestedView};
use crate::golden_code::pz::test::three::{three_::Mood, Three, ThreeView};
use crate::golden_code::pz::test::{
    Everything, EverythingView, PackedTwin, PackedTwinView, UnpackedTwin, UnpackedTwinView,
};

fn desc(name: &str) -> MessageDescriptor {
    thread_local! {
        static POOL: prost_reflect::DescriptorPool = crate::common::pool();
    }
    POOL.with(|p| p.get_message_by_name(name).unwrap())
}

// === reading a DynamicMessage (writer side) ===

/// The value of field `name` if it is set.
fn get(m: &DynamicMessage, name: &str) -> Option<Value> {
    let f = m.descriptor().get_field_by_name(name).unwrap();
    m.has_field(&f).then(|| m.get_field(&f).into_owned())
}

/// The elements of repeated field `name` (empty if unset).
fn list(m: &DynamicMessage, name: &str) -> Vec<Value> {
    get(m, name).map_or_else(Vec::new, |v| v.as_list().unwrap().to_vec())
}

/// Writes `w.$set(value)` if scalar field `$name` is set.
macro_rules! put {
    ($m:expr, $w:expr, $name:literal, $set:ident, $as:ident) => {
        if let Some(v) = get($m, $name) {
            $w.$set(v.$as().unwrap());
        }
    };
}

/// Writes the elements of repeated scalar field `$name`: one by one with `$add`, or, when
/// `$packed`, all at once with `$set_packed` (taking an iterator).
macro_rules! put_repeated {
    ($m:expr, $w:expr, $packed:expr, $name:literal, $add:ident, $set_packed:ident, $as:ident) => {
        let l = list($m, $name);
        if $packed && !l.is_empty() {
            $w.$set_packed(l.iter().map(|v| v.$as().unwrap()));
        } else {
            for v in &l {
                $w.$add(v.$as().unwrap());
            }
        }
    };
    // Fixed-size elements: the packed setter takes a slice.
    (slice $m:expr, $w:expr, $packed:expr, $name:literal, $add:ident, $set_packed:ident, $as:ident) => {
        let l = list($m, $name);
        if $packed && !l.is_empty() {
            let v: Vec<_> = l.iter().map(|v| v.$as().unwrap()).collect();
            $w.$set_packed(&v);
        } else {
            for v in &l {
                $w.$add(v.$as().unwrap());
            }
        }
    };
}

/// Writes enum field `$name`: through the typed setter when the value is declared, else raw.
macro_rules! put_enum {
    ($m:expr, $w:expr, $name:literal, $set:ident, $set_raw:ident, $enum:ty) => {
        if let Some(v) = get($m, $name) {
            let n = v.as_enum_number().unwrap();
            match <$enum>::from_i32(n) {
                Some(e) => $w.$set(e),
                None => $w.$set_raw(n),
            }
        }
    };
}

fn write_point(m: &DynamicMessage, w: &mut Point<'_>) {
    put!(m, w, "x", set_x, as_i32);
    put!(m, w, "y", set_y, as_i32);
}

fn write_nested(m: &DynamicMessage, w: &mut Nested<'_>) {
    put!(m, w, "note", set_note, as_str);
    for d in list(m, "deeper") {
        write_nested(d.as_message().unwrap(), &mut w.add_deeper());
    }
}

fn write_everything(m: &DynamicMessage, w: &mut Everything<'_>, packed: bool) {
    put!(m, w, "f_int32", set_f_int32, as_i32);
    put!(m, w, "f_int64", set_f_int64, as_i64);
    put!(m, w, "f_uint32", set_f_uint32, as_u32);
    put!(m, w, "f_uint64", set_f_uint64, as_u64);
    put!(m, w, "f_sint32", set_f_sint32, as_i32);
    put!(m, w, "f_sint64", set_f_sint64, as_i64);
    put!(m, w, "f_fixed32", set_f_fixed32, as_u32);
    put!(m, w, "f_fixed64", set_f_fixed64, as_u64);
    put!(m, w, "f_sfixed32", set_f_sfixed32, as_i32);
    put!(m, w, "f_sfixed64", set_f_sfixed64, as_i64);
    put!(m, w, "f_float", set_f_float, as_f32);
    put!(m, w, "f_double", set_f_double, as_f64);
    put!(m, w, "f_bool", set_f_bool, as_bool);
    put!(m, w, "f_string", set_f_string, as_str);
    if let Some(v) = get(m, "f_bytes") {
        w.set_f_bytes(v.as_bytes().unwrap());
    }
    put_enum!(m, w, "f_enum", set_f_enum, set_f_enum_raw, Kind);
    if let Some(v) = get(m, "child") {
        write_everything(v.as_message().unwrap(), &mut w.set_child(), !packed);
    }
    if let Some(v) = get(m, "point") {
        write_point(v.as_message().unwrap(), &mut w.set_point());
    }
    put_enum!(m, w, "color", set_color, set_color_raw, Color);
    put!(m, w, "f_pi", set_f_pi, as_f64);

    for (prefix, packed) in [("r_", packed), ("p_", !packed)] {
        // The same writes for the unpacked (`r_*`) and packed (`p_*`) fields, each in both
        // styles across runs.
        match prefix {
            "r_" => {
                put_repeated!(
                    m,
                    w,
                    packed,
                    "r_int32",
                    add_r_int32,
                    set_r_int32_packed,
                    as_i32
                );
                put_repeated!(
                    m,
                    w,
                    packed,
                    "r_int64",
                    add_r_int64,
                    set_r_int64_packed,
                    as_i64
                );
                put_repeated!(
                    m,
                    w,
                    packed,
                    "r_uint32",
                    add_r_uint32,
                    set_r_uint32_packed,
                    as_u32
                );
                put_repeated!(
                    m,
                    w,
                    packed,
                    "r_uint64",
                    add_r_uint64,
                    set_r_uint64_packed,
                    as_u64
                );
                put_repeated!(
                    m,
                    w,
                    packed,
                    "r_sint32",
                    add_r_sint32,
                    set_r_sint32_packed,
                    as_i32
                );
                put_repeated!(
                    m,
                    w,
                    packed,
                    "r_sint64",
                    add_r_sint64,
                    set_r_sint64_packed,
                    as_i64
                );
                put_repeated!(slice m, w, packed, "r_fixed32", add_r_fixed32, set_r_fixed32_packed, as_u32);
                put_repeated!(slice m, w, packed, "r_fixed64", add_r_fixed64, set_r_fixed64_packed, as_u64);
                put_repeated!(slice m, w, packed, "r_sfixed32", add_r_sfixed32, set_r_sfixed32_packed, as_i32);
                put_repeated!(slice m, w, packed, "r_sfixed64", add_r_sfixed64, set_r_sfixed64_packed, as_i64);
                put_repeated!(slice m, w, packed, "r_float", add_r_float, set_r_float_packed, as_f32);
                put_repeated!(slice m, w, packed, "r_double", add_r_double, set_r_double_packed, as_f64);
                put_repeated!(
                    m,
                    w,
                    packed,
                    "r_bool",
                    add_r_bool,
                    set_r_bool_packed,
                    as_bool
                );
                put_repeated!(
                    m,
                    w,
                    packed,
                    "r_enum",
                    add_r_enum_raw,
                    set_r_enum_packed_raw,
                    as_enum_number
                );
            }
            _ => {
                put_repeated!(
                    m,
                    w,
                    packed,
                    "p_int32",
                    add_p_int32,
                    set_p_int32_packed,
                    as_i32
                );
                put_repeated!(
                    m,
                    w,
                    packed,
                    "p_int64",
                    add_p_int64,
                    set_p_int64_packed,
                    as_i64
                );
                put_repeated!(
                    m,
                    w,
                    packed,
                    "p_uint32",
                    add_p_uint32,
                    set_p_uint32_packed,
                    as_u32
                );
                put_repeated!(
                    m,
                    w,
                    packed,
                    "p_uint64",
                    add_p_uint64,
                    set_p_uint64_packed,
                    as_u64
                );
                put_repeated!(
                    m,
                    w,
                    packed,
                    "p_sint32",
                    add_p_sint32,
                    set_p_sint32_packed,
                    as_i32
                );
                put_repeated!(
                    m,
                    w,
                    packed,
                    "p_sint64",
                    add_p_sint64,
                    set_p_sint64_packed,
                    as_i64
                );
                put_repeated!(slice m, w, packed, "p_fixed32", add_p_fixed32, set_p_fixed32_packed, as_u32);
                put_repeated!(slice m, w, packed, "p_fixed64", add_p_fixed64, set_p_fixed64_packed, as_u64);
                put_repeated!(slice m, w, packed, "p_sfixed32", add_p_sfixed32, set_p_sfixed32_packed, as_i32);
                put_repeated!(slice m, w, packed, "p_sfixed64", add_p_sfixed64, set_p_sfixed64_packed, as_i64);
                put_repeated!(slice m, w, packed, "p_float", add_p_float, set_p_float_packed, as_f32);
                put_repeated!(slice m, w, packed, "p_double", add_p_double, set_p_double_packed, as_f64);
                put_repeated!(
                    m,
                    w,
                    packed,
                    "p_bool",
                    add_p_bool,
                    set_p_bool_packed,
                    as_bool
                );
                // Typed enum elements where every value is declared, raw otherwise.
                let l = list(m, "p_enum");
                let typed: Option<Vec<Kind>> = l
                    .iter()
                    .map(|v| Kind::from_i32(v.as_enum_number().unwrap()))
                    .collect();
                match typed {
                    Some(t) if packed && !t.is_empty() => w.set_p_enum_packed(t),
                    Some(t) => t.into_iter().for_each(|k| w.add_p_enum(k)),
                    None => w.set_p_enum_packed_raw(l.iter().map(|v| v.as_enum_number().unwrap())),
                }
            }
        }
    }
    for v in list(m, "r_string") {
        w.add_r_string(v.as_str().unwrap());
    }
    for v in list(m, "r_bytes") {
        w.add_r_bytes(v.as_bytes().unwrap());
    }
    for v in list(m, "children") {
        write_everything(v.as_message().unwrap(), &mut w.add_children(), packed);
    }
    for v in list(m, "points") {
        write_point(v.as_message().unwrap(), &mut w.add_points());
    }
    put!(m, w, "o_int", set_o_int, as_i32);
    put!(m, w, "o_string", set_o_string, as_str);
    if let Some(v) = get(m, "o_point") {
        write_point(v.as_message().unwrap(), &mut w.set_o_point());
    }
    put_enum!(m, w, "o_kind", set_o_kind, set_o_kind_raw, Kind);
    if let Some(v) = get(m, "named_points") {
        for (k, v) in v.as_map().unwrap() {
            let mut e = w.add_named_points();
            let MapKey::String(k) = k else { panic!() };
            e.set_key(k);
            write_point(v.as_message().unwrap(), &mut e.set_value());
        }
    }
    if let Some(v) = get(m, "labels") {
        for (k, v) in v.as_map().unwrap() {
            let mut e = w.add_labels();
            let MapKey::I32(k) = k else { panic!() };
            e.set_key(*k);
            e.set_value(v.as_str().unwrap());
        }
    }
    if let Some(v) = get(m, "nested") {
        write_nested(v.as_message().unwrap(), &mut w.set_nested());
    }
    put!(m, w, "big_number", set_big_number, as_u32);
}

fn write_three(m: &DynamicMessage, w: &mut Three<'_>, packed: bool) {
    put!(m, w, "plain", set_plain, as_i32);
    put!(m, w, "opt", set_opt, as_i32);
    put!(m, w, "name", set_name, as_str);
    put!(m, w, "opt_name", set_opt_name, as_str);
    if let Some(v) = get(m, "data") {
        w.set_data(v.as_bytes().unwrap());
    }
    put_repeated!(
        m,
        w,
        packed,
        "packed_by_default",
        add_packed_by_default,
        set_packed_by_default_packed,
        as_i64
    );
    put_repeated!(slice m, w, packed, "doubles", add_doubles, set_doubles_packed, as_f64);
    put_repeated!(
        m,
        w,
        packed,
        "unpacked",
        add_unpacked,
        set_unpacked_packed,
        as_u32
    );
    if let Some(v) = get(m, "point") {
        write_point(v.as_message().unwrap(), &mut w.set_point());
    }
    put_enum!(m, w, "mood", set_mood, set_mood_raw, Mood);
    put_enum!(m, w, "opt_mood", set_opt_mood, set_opt_mood_raw, Mood);
    put!(m, w, "pick_name", set_pick_name, as_str);
    if let Some(v) = get(m, "pick_point") {
        write_point(v.as_message().unwrap(), &mut w.set_pick_point());
    }
    if let Some(v) = get(m, "counts") {
        for (k, v) in v.as_map().unwrap() {
            let mut e = w.add_counts();
            let MapKey::String(k) = k else { panic!() };
            e.set_key(k);
            e.set_value(v.as_i64().unwrap());
        }
    }
    put_repeated!(
        m,
        w,
        packed,
        "moods",
        add_moods_raw,
        set_moods_packed_raw,
        as_enum_number
    );
    for v in list(m, "tags") {
        w.add_tags(v.as_str().unwrap());
    }
    for v in list(m, "blobs") {
        w.add_blobs(v.as_bytes().unwrap());
    }
    if let Some(v) = get(m, "nested") {
        write_nested(v.as_message().unwrap(), &mut w.set_nested());
    }
    for _ in list(m, "empties") {
        w.add_empties();
    }
}

/// `PackedTwin` and `UnpackedTwin` have the same API.
macro_rules! write_twin {
    ($fn:ident, $ty:ident) => {
        fn $fn(m: &DynamicMessage, w: &mut $ty<'_>, packed: bool) {
            put_repeated!(m, w, packed, "v_int32", add_v_int32, set_v_int32_packed, as_i32);
            put_repeated!(m, w, packed, "v_int64", add_v_int64, set_v_int64_packed, as_i64);
            put_repeated!(m, w, packed, "v_uint32", add_v_uint32, set_v_uint32_packed, as_u32);
            put_repeated!(m, w, packed, "v_uint64", add_v_uint64, set_v_uint64_packed, as_u64);
            put_repeated!(m, w, packed, "v_sint32", add_v_sint32, set_v_sint32_packed, as_i32);
            put_repeated!(m, w, packed, "v_sint64", add_v_sint64, set_v_sint64_packed, as_i64);
            put_repeated!(slice m, w, packed, "v_fixed32", add_v_fixed32, set_v_fixed32_packed, as_u32);
            put_repeated!(slice m, w, packed, "v_fixed64", add_v_fixed64, set_v_fixed64_packed, as_u64);
            put_repeated!(slice m, w, packed, "v_sfixed32", add_v_sfixed32, set_v_sfixed32_packed, as_i32);
            put_repeated!(slice m, w, packed, "v_sfixed64", add_v_sfixed64, set_v_sfixed64_packed, as_i64);
            put_repeated!(slice m, w, packed, "v_float", add_v_float, set_v_float_packed, as_f32);
            put_repeated!(slice m, w, packed, "v_double", add_v_double, set_v_double_packed, as_f64);
            put_repeated!(m, w, packed, "v_bool", add_v_bool, set_v_bool_packed, as_bool);
            put_repeated!(m, w, packed, "v_enum", add_v_enum_raw, set_v_enum_packed_raw, as_enum_number);
        }
    };
}
write_twin!(write_packed_twin, PackedTwin);
write_twin!(write_unpacked_twin, UnpackedTwin);

/// Runs `write` on a root writer of type `W` over `buf`; the writer is finalized when this
/// returns.
fn written<'b, W: MessageWriter<'b>>(buf: &'b mut HeapBuffered, write: impl FnOnce(&mut W)) {
    let mut w: W = buf.root();
    write(&mut w);
}

// === building a DynamicMessage (view side) ===

/// Sets field `name` of `m` to `value`.
fn set(m: &mut DynamicMessage, name: &str, value: Value) {
    m.set_field_by_name(name, value);
}

/// The default prost-reflect gives field `name` when it is absent.
fn default_of(m: &DynamicMessage, name: &str) -> Value {
    Value::default_value_for_field(&m.descriptor().get_field_by_name(name).unwrap())
}

/// Copies singular field `$name` from the view into `$m` if present; if absent, checks that the
/// getter returns prost-reflect's default.
macro_rules! take {
    ($m:expr, $v:expr, $name:literal, $get:ident, $has:ident, $variant:ident) => {{
        let value = Value::$variant($v.$get());
        if $v.$has() {
            set(&mut $m, $name, value);
        } else {
            assert_eq!(value, default_of(&$m, $name), "default of {}", $name);
        }
    }};
    (bytes $m:expr, $v:expr, $name:literal, $get:ident, $has:ident) => {{
        let value = Value::Bytes($v.$get().to_vec().into());
        if $v.$has() {
            set(&mut $m, $name, value);
        } else {
            assert_eq!(value, default_of(&$m, $name), "default of {}", $name);
        }
    }};
    (str $m:expr, $v:expr, $name:literal, $get:ident, $get_bytes:ident, $has:ident) => {{
        let s = $v.$get().unwrap();
        assert_eq!(s.as_bytes(), $v.$get_bytes());
        let value = Value::String(s.to_owned());
        if $v.$has() {
            set(&mut $m, $name, value);
        } else {
            assert_eq!(value, default_of(&$m, $name), "default of {}", $name);
        }
    }};
    (enum $m:expr, $v:expr, $name:literal, $get:ident, $get_raw:ident, $has:ident, $enum:ty) => {{
        let raw = $v.$get_raw();
        assert_eq!($v.$get(), <$enum>::from_i32(raw));
        let value = Value::EnumNumber(raw);
        if $v.$has() {
            set(&mut $m, $name, value);
        } else {
            assert_eq!(value, default_of(&$m, $name), "default of {}", $name);
        }
    }};
}

/// Copies repeated scalar field `$name` (an iterator of `Result`s) into `$m`.
macro_rules! take_repeated {
    ($m:expr, $v:expr, $name:literal, $get:ident, $variant:ident) => {{
        let l: Vec<Value> = $v.$get().map(|r| Value::$variant(r.unwrap())).collect();
        if !l.is_empty() {
            set(&mut $m, $name, Value::List(l));
        }
    }};
    (enum $m:expr, $v:expr, $name:literal, $get:ident, $get_raw:ident, $enum:ty) => {{
        let raw: Vec<i32> = $v.$get_raw().map(Result::unwrap).collect();
        let typed: Vec<Option<$enum>> = $v.$get().map(Result::unwrap).collect();
        assert_eq!(
            typed,
            raw.iter()
                .map(|&n| <$enum>::from_i32(n))
                .collect::<Vec<_>>()
        );
        if !raw.is_empty() {
            set(
                &mut $m,
                $name,
                Value::List(raw.into_iter().map(Value::EnumNumber).collect()),
            );
        }
    }};
}

fn read_point(v: &PointView<'_>) -> DynamicMessage {
    let mut m = DynamicMessage::new(desc("pz.common.Point"));
    take!(m, v, "x", x, has_x, I32);
    take!(m, v, "y", y, has_y, I32);
    m
}

fn read_nested(v: &NestedView<'_>) -> DynamicMessage {
    let mut m = DynamicMessage::new(desc("pz.test.Everything.Nested"));
    take!(str m, v, "note", note, note_bytes, has_note);
    let deeper: Vec<Value> = v
        .deeper()
        .map(|d| Value::Message(read_nested(&d.unwrap())))
        .collect();
    if !deeper.is_empty() {
        set(&mut m, "deeper", Value::List(deeper));
    }
    m
}

/// A singular message field: copied if present, else the getter must give an empty view.
macro_rules! take_message {
    ($m:expr, $v:expr, $name:literal, $get:ident, $has:ident, $read:expr) => {{
        let child = $v.$get().unwrap();
        if $v.$has() {
            set(&mut $m, $name, Value::Message($read(&child)));
        } else {
            assert!(child.bytes().is_empty());
        }
    }};
}

fn read_everything(v: &EverythingView<'_>) -> DynamicMessage {
    let mut m = DynamicMessage::new(desc("pz.test.Everything"));
    take!(m, v, "f_int32", f_int32, has_f_int32, I32);
    take!(m, v, "f_int64", f_int64, has_f_int64, I64);
    take!(m, v, "f_uint32", f_uint32, has_f_uint32, U32);
    take!(m, v, "f_uint64", f_uint64, has_f_uint64, U64);
    take!(m, v, "f_sint32", f_sint32, has_f_sint32, I32);
    take!(m, v, "f_sint64", f_sint64, has_f_sint64, I64);
    take!(m, v, "f_fixed32", f_fixed32, has_f_fixed32, U32);
    take!(m, v, "f_fixed64", f_fixed64, has_f_fixed64, U64);
    take!(m, v, "f_sfixed32", f_sfixed32, has_f_sfixed32, I32);
    take!(m, v, "f_sfixed64", f_sfixed64, has_f_sfixed64, I64);
    take!(m, v, "f_float", f_float, has_f_float, F32);
    take!(m, v, "f_double", f_double, has_f_double, F64);
    take!(m, v, "f_bool", f_bool, has_f_bool, Bool);
    take!(str m, v, "f_string", f_string, f_string_bytes, has_f_string);
    take!(bytes m, v, "f_bytes", f_bytes, has_f_bytes);
    take!(enum m, v, "f_enum", f_enum, f_enum_raw, has_f_enum, Kind);
    take_message!(m, v, "child", child, has_child, read_everything);
    take_message!(m, v, "point", point, has_point, read_point);
    take!(enum m, v, "color", color, color_raw, has_color, Color);
    take!(m, v, "f_pi", f_pi, has_f_pi, F64);

    take_repeated!(m, v, "r_int32", r_int32, I32);
    take_repeated!(m, v, "r_int64", r_int64, I64);
    take_repeated!(m, v, "r_uint32", r_uint32, U32);
    take_repeated!(m, v, "r_uint64", r_uint64, U64);
    take_repeated!(m, v, "r_sint32", r_sint32, I32);
    take_repeated!(m, v, "r_sint64", r_sint64, I64);
    take_repeated!(m, v, "r_fixed32", r_fixed32, U32);
    take_repeated!(m, v, "r_fixed64", r_fixed64, U64);
    take_repeated!(m, v, "r_sfixed32", r_sfixed32, I32);
    take_repeated!(m, v, "r_sfixed64", r_sfixed64, I64);
    take_repeated!(m, v, "r_float", r_float, F32);
    take_repeated!(m, v, "r_double", r_double, F64);
    take_repeated!(m, v, "r_bool", r_bool, Bool);
    let strings: Vec<Value> = v
        .r_string()
        .map(|s| Value::String(s.unwrap().to_owned()))
        .collect();
    if !strings.is_empty() {
        set(&mut m, "r_string", Value::List(strings));
    }
    let bytes: Vec<Value> = v
        .r_bytes()
        .map(|b| Value::Bytes(b.to_vec().into()))
        .collect();
    if !bytes.is_empty() {
        set(&mut m, "r_bytes", Value::List(bytes));
    }
    take_repeated!(enum m, v, "r_enum", r_enum, r_enum_raw, Kind);

    take_repeated!(m, v, "p_int32", p_int32, I32);
    take_repeated!(m, v, "p_int64", p_int64, I64);
    take_repeated!(m, v, "p_uint32", p_uint32, U32);
    take_repeated!(m, v, "p_uint64", p_uint64, U64);
    take_repeated!(m, v, "p_sint32", p_sint32, I32);
    take_repeated!(m, v, "p_sint64", p_sint64, I64);
    take_repeated!(m, v, "p_fixed32", p_fixed32, U32);
    take_repeated!(m, v, "p_fixed64", p_fixed64, U64);
    take_repeated!(m, v, "p_sfixed32", p_sfixed32, I32);
    take_repeated!(m, v, "p_sfixed64", p_sfixed64, I64);
    take_repeated!(m, v, "p_float", p_float, F32);
    take_repeated!(m, v, "p_double", p_double, F64);
    take_repeated!(m, v, "p_bool", p_bool, Bool);
    take_repeated!(enum m, v, "p_enum", p_enum, p_enum_raw, Kind);

    let children: Vec<Value> = v
        .children()
        .map(|c| Value::Message(read_everything(&c.unwrap())))
        .collect();
    if !children.is_empty() {
        set(&mut m, "children", Value::List(children));
    }
    let points: Vec<Value> = v
        .points()
        .map(|p| Value::Message(read_point(&p.unwrap())))
        .collect();
    if !points.is_empty() {
        set(&mut m, "points", Value::List(points));
    }
    // Oneof members: at most one is present; absent ones read as defaults.
    take!(m, v, "o_int", o_int, has_o_int, I32);
    take!(str m, v, "o_string", o_string, o_string_bytes, has_o_string);
    take_message!(m, v, "o_point", o_point, has_o_point, read_point);
    take!(enum m, v, "o_kind", o_kind, o_kind_raw, has_o_kind, Kind);

    let mut named = HashMap::new();
    for e in v.named_points() {
        let e = e.unwrap();
        let key = MapKey::String(e.key().unwrap().to_owned());
        named.insert(key, Value::Message(read_point(&e.value().unwrap())));
    }
    if !named.is_empty() {
        set(&mut m, "named_points", Value::Map(named));
    }
    let mut labels = HashMap::new();
    for e in v.labels() {
        let e = e.unwrap();
        labels.insert(
            MapKey::I32(e.key()),
            Value::String(e.value().unwrap().to_owned()),
        );
    }
    if !labels.is_empty() {
        set(&mut m, "labels", Value::Map(labels));
    }
    take_message!(m, v, "nested", nested, has_nested, read_nested);
    take!(m, v, "big_number", big_number, has_big_number, U32);
    m
}

fn read_three(v: &ThreeView<'_>) -> DynamicMessage {
    let mut m = DynamicMessage::new(desc("pz.test.three.Three"));
    take!(m, v, "plain", plain, has_plain, I32);
    take!(m, v, "opt", opt, has_opt, I32);
    take!(str m, v, "name", name, name_bytes, has_name);
    take!(str m, v, "opt_name", opt_name, opt_name_bytes, has_opt_name);
    take!(bytes m, v, "data", data, has_data);
    take_repeated!(m, v, "packed_by_default", packed_by_default, I64);
    take_repeated!(m, v, "doubles", doubles, F64);
    take_repeated!(m, v, "unpacked", unpacked, U32);
    take_message!(m, v, "point", point, has_point, read_point);
    take!(enum m, v, "mood", mood, mood_raw, has_mood, Mood);
    take!(enum m, v, "opt_mood", opt_mood, opt_mood_raw, has_opt_mood, Mood);
    take!(str m, v, "pick_name", pick_name, pick_name_bytes, has_pick_name);
    take_message!(m, v, "pick_point", pick_point, has_pick_point, read_point);
    let mut counts = HashMap::new();
    for e in v.counts() {
        let e = e.unwrap();
        counts.insert(
            MapKey::String(e.key().unwrap().to_owned()),
            Value::I64(e.value()),
        );
    }
    if !counts.is_empty() {
        set(&mut m, "counts", Value::Map(counts));
    }
    take_repeated!(enum m, v, "moods", moods, moods_raw, Mood);
    let tags: Vec<Value> = v
        .tags()
        .map(|s| Value::String(s.unwrap().to_owned()))
        .collect();
    if !tags.is_empty() {
        set(&mut m, "tags", Value::List(tags));
    }
    let blobs: Vec<Value> = v.blobs().map(|b| Value::Bytes(b.to_vec().into())).collect();
    if !blobs.is_empty() {
        set(&mut m, "blobs", Value::List(blobs));
    }
    take_message!(m, v, "nested", nested, has_nested, read_nested);
    let empties: Vec<Value> = v
        .empties()
        .map(|e| {
            assert!(e.unwrap().bytes().is_empty());
            Value::Message(DynamicMessage::new(desc("pz.test.Empty")))
        })
        .collect();
    if !empties.is_empty() {
        set(&mut m, "empties", Value::List(empties));
    }
    m
}

macro_rules! read_twin {
    ($fn:ident, $view:ident, $name:literal) => {
        fn $fn(v: &$view<'_>) -> DynamicMessage {
            let mut m = DynamicMessage::new(desc($name));
            take_repeated!(m, v, "v_int32", v_int32, I32);
            take_repeated!(m, v, "v_int64", v_int64, I64);
            take_repeated!(m, v, "v_uint32", v_uint32, U32);
            take_repeated!(m, v, "v_uint64", v_uint64, U64);
            take_repeated!(m, v, "v_sint32", v_sint32, I32);
            take_repeated!(m, v, "v_sint64", v_sint64, I64);
            take_repeated!(m, v, "v_fixed32", v_fixed32, U32);
            take_repeated!(m, v, "v_fixed64", v_fixed64, U64);
            take_repeated!(m, v, "v_sfixed32", v_sfixed32, I32);
            take_repeated!(m, v, "v_sfixed64", v_sfixed64, I64);
            take_repeated!(m, v, "v_float", v_float, F32);
            take_repeated!(m, v, "v_double", v_double, F64);
            take_repeated!(m, v, "v_bool", v_bool, Bool);
            take_repeated!(enum m, v, "v_enum", v_enum, v_enum_raw, Kind);
            m
        }
    };
}
read_twin!(read_packed_twin, PackedTwinView, "pz.test.PackedTwin");
read_twin!(read_unpacked_twin, UnpackedTwinView, "pz.test.UnpackedTwin");

/// `m` re-typed as the twin message `name` (same field numbers, other packing).
fn as_twin(m: &DynamicMessage, name: &str) -> DynamicMessage {
    DynamicMessage::decode(desc(name), m.encode_to_vec().as_slice()).unwrap()
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

/// Heap slice sizes: tiny ones make every message cross buffer boundaries.
fn slice_size() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), Just(7), Just(42), Just(4096)]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn everything_writer_matches_prost_reflect(
        m in arb::shown(desc("pz.test.Everything"), 2),
        packed in any::<bool>(),
        slice in slice_size(),
    ) {
        let m = m.0;
        let mut buf = HeapBuffered::with_slice_sizes(slice, slice);
        written(&mut buf, |w: &mut Everything<'_>| write_everything(&m, w, packed));
        let bytes = buf.serialize().unwrap();
        let decoded = DynamicMessage::decode(desc("pz.test.Everything"), bytes.as_slice()).unwrap();
        prop_assert_eq!(Shown(decoded), Shown(arb::canonical(&m)));
    }

    #[test]
    fn everything_view_matches_prost_reflect(m in arb::shown(desc("pz.test.Everything"), 2)) {
        let m = m.0;
        let bytes = m.encode_to_vec();
        let view = EverythingView::decode(&bytes).unwrap();
        prop_assert_eq!(view.bytes(), bytes.as_slice());
        prop_assert_eq!(Shown(read_everything(&view)), Shown(arb::canonical(&m)));
    }

    #[test]
    fn proto3_writer_matches_prost_reflect(
        m in arb::shown(desc("pz.test.three.Three"), 2),
        packed in any::<bool>(),
        slice in slice_size(),
    ) {
        let m = m.0;
        let mut buf = HeapBuffered::with_slice_sizes(slice, slice);
        written(&mut buf, |w: &mut Three<'_>| write_three(&m, w, packed));
        let bytes = buf.serialize().unwrap();
        let decoded = DynamicMessage::decode(desc("pz.test.three.Three"), bytes.as_slice()).unwrap();
        prop_assert_eq!(Shown(decoded), Shown(arb::canonical(&m)));
    }

    #[test]
    fn proto3_view_matches_prost_reflect(m in arb::shown(desc("pz.test.three.Three"), 2)) {
        let m = m.0;
        let bytes = m.encode_to_vec();
        prop_assert_eq!(Shown(read_three(&ThreeView::decode(&bytes).unwrap())), Shown(arb::canonical(&m)));
    }

    #[test]
    fn twins_write_both_forms(
        m in arb::shown(desc("pz.test.PackedTwin"), 0),
        packed in any::<bool>(),
    ) {
        let m = m.0;
        // Either writer, either style: prost-reflect reads the same elements with either
        // descriptor.
        let mut a = HeapBuffered::new();
        written(&mut a, |w: &mut PackedTwin<'_>| write_packed_twin(&m, w, packed));
        let mut b = HeapBuffered::new();
        written(&mut b, |w: &mut UnpackedTwin<'_>| write_unpacked_twin(&m, w, packed));
        for bytes in [a.serialize().unwrap(), b.serialize().unwrap()] {
            let decoded = DynamicMessage::decode(desc("pz.test.PackedTwin"), bytes.as_slice()).unwrap();
            prop_assert_eq!(Shown(decoded), Shown(arb::canonical(&m)));
        }
    }

    #[test]
    fn views_read_packed_and_unpacked_alike(
        p in arb::shown(desc("pz.test.PackedTwin"), 0),
        u in arb::shown(desc("pz.test.UnpackedTwin"), 0),
    ) {
        let (p, u) = (p.0, u.0);
        let packed_bytes = p.encode_to_vec();
        let unpacked_bytes = u.encode_to_vec();
        // Packed bytes through the unpacked view and vice versa.
        let via_unpacked = read_unpacked_twin(&UnpackedTwinView::decode(&packed_bytes).unwrap());
        prop_assert_eq!(Shown(via_unpacked), Shown(as_twin(&p, "pz.test.UnpackedTwin")));
        let via_packed = read_packed_twin(&PackedTwinView::decode(&unpacked_bytes).unwrap());
        prop_assert_eq!(Shown(via_packed), Shown(as_twin(&u, "pz.test.PackedTwin")));
        // Both concatenated (protobuf's merge: the elements of one, then of the other), mixing
        // packed and unpacked occurrences of each field.
        let both = [packed_bytes, unpacked_bytes].concat();
        let expected = DynamicMessage::decode(desc("pz.test.PackedTwin"), both.as_slice()).unwrap();
        prop_assert_eq!(Shown(read_packed_twin(&PackedTwinView::decode(&both).unwrap())), Shown(expected.clone()));
        prop_assert_eq!(
            Shown(read_unpacked_twin(&UnpackedTwinView::decode(&both).unwrap())),
            Shown(as_twin(&expected, "pz.test.UnpackedTwin"))
        );
    }
}

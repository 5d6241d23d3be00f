//! Field types: how each proto type is written, read and defaulted.

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{FieldDescriptorProto, FileDescriptorProto};

use crate::model::{Decl, Index, TypeInfo};
use crate::Error;

/// A numeric or `bool` proto type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scalar {
    Int32,
    Int64,
    Uint32,
    Uint64,
    Sint32,
    Sint64,
    Fixed32,
    Fixed64,
    Sfixed32,
    Sfixed64,
    Float,
    Double,
    Bool,
}

/// How a field's values travel on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wire {
    Varint,
    Fixed32,
    Fixed64,
}

impl Scalar {
    /// The proto type name.
    pub(crate) fn proto(self) -> &'static str {
        match self {
            Scalar::Int32 => "int32",
            Scalar::Int64 => "int64",
            Scalar::Uint32 => "uint32",
            Scalar::Uint64 => "uint64",
            Scalar::Sint32 => "sint32",
            Scalar::Sint64 => "sint64",
            Scalar::Fixed32 => "fixed32",
            Scalar::Fixed64 => "fixed64",
            Scalar::Sfixed32 => "sfixed32",
            Scalar::Sfixed64 => "sfixed64",
            Scalar::Float => "float",
            Scalar::Double => "double",
            Scalar::Bool => "bool",
        }
    }

    /// The Rust type.
    pub(crate) fn rust(self) -> &'static str {
        match self {
            Scalar::Int32 | Scalar::Sint32 | Scalar::Sfixed32 => "i32",
            Scalar::Int64 | Scalar::Sint64 | Scalar::Sfixed64 => "i64",
            Scalar::Uint32 | Scalar::Fixed32 => "u32",
            Scalar::Uint64 | Scalar::Fixed64 => "u64",
            Scalar::Float => "f32",
            Scalar::Double => "f64",
            Scalar::Bool => "bool",
        }
    }

    pub(crate) fn wire(self) -> Wire {
        match self {
            Scalar::Fixed32 | Scalar::Sfixed32 | Scalar::Float => Wire::Fixed32,
            Scalar::Fixed64 | Scalar::Sfixed64 | Scalar::Double => Wire::Fixed64,
            _ => Wire::Varint,
        }
    }

    /// The `protozero::Message` method writing one value.
    pub(crate) fn append(self) -> String {
        format!("append_{}", self.proto())
    }

    /// The zero value (the default of a field without an explicit one).
    fn zero(self) -> &'static str {
        match self {
            Scalar::Float | Scalar::Double => "0.0",
            Scalar::Bool => "false",
            _ => "0",
        }
    }
}

/// What a field holds.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ty<'i, 'a> {
    Scalar(Scalar),
    String,
    Bytes,
    Enum(&'i TypeInfo<'a>),
    Message(&'i TypeInfo<'a>),
}

/// The full proto name of a field, for messages.
pub(crate) fn field_full_name(message: &str, field: &FieldDescriptorProto) -> String {
    format!("{message}.{}", field.name())
}

/// The type of `field` of message `message` (full name), resolving enums and messages.
pub(crate) fn field_type<'i, 'a>(
    index: &'i Index<'a>,
    message: &str,
    field: &FieldDescriptorProto,
) -> Result<Ty<'i, 'a>, Error> {
    let full = field_full_name(message, field);
    let Some(ty) = field.r#type.and_then(|t| Type::try_from(t).ok()) else {
        // protoc always sets the type; a missing one would need name resolution we do not do.
        return Err(Error::InvalidDescriptor(format!(
            "field `{full}` has no type"
        )));
    };
    Ok(match ty {
        Type::Int32 => Ty::Scalar(Scalar::Int32),
        Type::Int64 => Ty::Scalar(Scalar::Int64),
        Type::Uint32 => Ty::Scalar(Scalar::Uint32),
        Type::Uint64 => Ty::Scalar(Scalar::Uint64),
        Type::Sint32 => Ty::Scalar(Scalar::Sint32),
        Type::Sint64 => Ty::Scalar(Scalar::Sint64),
        Type::Fixed32 => Ty::Scalar(Scalar::Fixed32),
        Type::Fixed64 => Ty::Scalar(Scalar::Fixed64),
        Type::Sfixed32 => Ty::Scalar(Scalar::Sfixed32),
        Type::Sfixed64 => Ty::Scalar(Scalar::Sfixed64),
        Type::Float => Ty::Scalar(Scalar::Float),
        Type::Double => Ty::Scalar(Scalar::Double),
        Type::Bool => Ty::Scalar(Scalar::Bool),
        Type::String => Ty::String,
        Type::Bytes => Ty::Bytes,
        Type::Group => {
            return Err(Error::Unsupported {
                element: full,
                reason: "group fields are not supported (use a nested message)".into(),
            })
        }
        Type::Enum | Type::Message => {
            let info = index.resolve(field.type_name(), &full)?;
            match (ty, info.decl) {
                (Type::Enum, Decl::Enum(_)) => Ty::Enum(info),
                (Type::Message, Decl::Message(_)) => Ty::Message(info),
                _ => {
                    return Err(Error::InvalidDescriptor(format!(
                        "field `{full}` has type {ty:?} but `{}` is not one",
                        info.full_name
                    )))
                }
            }
        }
    })
}

/// Whether the field is `repeated`.
pub(crate) fn is_repeated(field: &FieldDescriptorProto) -> bool {
    field.label == Some(Label::Repeated as i32)
}

/// The field's declaration as the `.proto` file would spell it, for docs:
/// `optional int32 foo = 1 [default = 3]`, `map<string, Point> points = 4`.
pub(crate) fn declaration(
    file: &FileDescriptorProto,
    field: &FieldDescriptorProto,
    ty: &Ty<'_, '_>,
) -> String {
    let type_name = |ty: &Ty<'_, '_>| match ty {
        Ty::Scalar(s) => s.proto().to_owned(),
        Ty::String => "string".to_owned(),
        Ty::Bytes => "bytes".to_owned(),
        Ty::Enum(info) | Ty::Message(info) => info.full_name.clone(),
    };
    let mut out = String::new();
    if let Ty::Message(info) = ty {
        if let Some((k, v)) = map_entry_types(info) {
            return format!("map<{k}, {v}> {} = {}", field.name(), field.number());
        }
    }
    if is_repeated(field) {
        out.push_str("repeated ");
    } else if field.label == Some(Label::Required as i32) {
        out.push_str("required ");
    } else if file.syntax() == "proto3" {
        if field.proto3_optional() {
            out.push_str("optional ");
        }
    } else if field.oneof_index.is_none() {
        out.push_str("optional ");
    }
    out.push_str(&type_name(ty));
    out.push_str(&format!(" {} = {}", field.name(), field.number()));
    let mut opts = Vec::new();
    if let Some(d) = &field.default_value {
        match ty {
            Ty::String | Ty::Bytes => opts.push(format!("default = {d:?}")),
            _ => opts.push(format!("default = {d}")),
        }
    }
    if let Some(p) = field.options.as_ref().and_then(|o| o.packed) {
        opts.push(format!("packed = {p}"));
    }
    if !opts.is_empty() {
        out.push_str(&format!(" [{}]", opts.join(", ")));
    }
    out
}

/// The key and value type names of a map entry message, if `info` is one.
fn map_entry_types(info: &TypeInfo<'_>) -> Option<(String, String)> {
    let Decl::Message(m) = info.decl else {
        return None;
    };
    if !m.options.as_ref().is_some_and(|o| o.map_entry()) {
        return None;
    }
    let name = |number: i32| {
        let f = m.field.iter().find(|f| f.number() == number)?;
        Some(match f.r#type.and_then(|t| Type::try_from(t).ok())? {
            Type::Enum | Type::Message => f.type_name().trim_start_matches('.').to_owned(),
            // The proto spelling of a scalar type: `TYPE_SINT64` → `sint64`.
            t => t.as_str_name().trim_start_matches("TYPE_").to_lowercase(),
        })
    };
    Some((name(1)?, name(2)?))
}

/// The default of a singular field as a Rust expression of its getter's type: the proto2
/// `[default = ...]` if there is one, else the type's zero (the first value for an enum).
pub(crate) fn default_expr(
    full_name: &str,
    field: &FieldDescriptorProto,
    ty: &Ty<'_, '_>,
) -> Result<String, Error> {
    let bad = |what: &str| {
        Error::InvalidDescriptor(format!(
            "field `{full_name}` has a default value that is not a valid {what}: {:?}",
            field.default_value()
        ))
    };
    let given = field.default_value.as_deref();
    Ok(match ty {
        Ty::Scalar(s) => match given {
            None => s.zero().to_owned(),
            Some(d) => match s {
                Scalar::Bool => match d {
                    "true" => "true".into(),
                    "false" => "false".into(),
                    _ => return Err(bad("bool")),
                },
                Scalar::Float => float_literal(d, "f32").ok_or_else(|| bad("float"))?,
                Scalar::Double => float_literal(d, "f64").ok_or_else(|| bad("double"))?,
                Scalar::Int32 | Scalar::Sint32 | Scalar::Sfixed32 => {
                    int_literal::<i32>(d, "i32").ok_or_else(|| bad("int32"))?
                }
                Scalar::Int64 | Scalar::Sint64 | Scalar::Sfixed64 => {
                    int_literal::<i64>(d, "i64").ok_or_else(|| bad("int64"))?
                }
                Scalar::Uint32 | Scalar::Fixed32 => {
                    int_literal::<u32>(d, "u32").ok_or_else(|| bad("uint32"))?
                }
                Scalar::Uint64 | Scalar::Fixed64 => {
                    int_literal::<u64>(d, "u64").ok_or_else(|| bad("uint64"))?
                }
            },
        },
        Ty::String => format!("{:?}", given.unwrap_or("")),
        Ty::Bytes => {
            let bytes = match given {
                Some(d) => c_unescape(d).ok_or_else(|| bad("C-escaped bytes literal"))?,
                None => Vec::new(),
            };
            byte_string_literal(&bytes)
        }
        Ty::Enum(info) => {
            let Decl::Enum(e) = info.decl else {
                unreachable!("Ty::Enum holds an enum");
            };
            let value = match given {
                Some(name) => e.value.iter().find(|v| v.name() == name),
                None => e.value.first(),
            };
            let Some(value) = value else {
                return Err(bad(&format!("value of `{}`", info.full_name)));
            };
            int_literal::<i32>(&value.number().to_string(), "i32").expect("an i32 prints")
        }
        Ty::Message(_) => unreachable!("messages have no default expression"),
    })
}

/// An integer literal (`i32::MIN` for the minimum, whose literal would overflow).
fn int_literal<T>(text: &str, ty: &str) -> Option<String>
where
    T: std::str::FromStr + std::fmt::Display + PartialEq + MinValue,
{
    let text = text.trim();
    let v: T = if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        // protoc normalizes defaults to decimal; accept hex anyway.
        T::from_str_radix_16(hex)?
    } else if let Some(hex) = text.strip_prefix("-0x") {
        T::from_str_radix_16(&format!("-{hex}"))?
    } else {
        text.parse().ok()?
    };
    if v == T::MIN_VALUE {
        if T::SIGNED {
            return Some(format!("{ty}::MIN"));
        }
        return Some("0".into());
    }
    Some(v.to_string())
}

/// The integer types defaults come in.
trait MinValue: Sized {
    const MIN_VALUE: Self;
    const SIGNED: bool;
    fn from_str_radix_16(s: &str) -> Option<Self>;
}

macro_rules! min_value {
    ($($t:ty: $signed:expr),*) => {$(
        impl MinValue for $t {
            const MIN_VALUE: Self = <$t>::MIN;
            const SIGNED: bool = $signed;
            fn from_str_radix_16(s: &str) -> Option<Self> {
                <$t>::from_str_radix(s, 16).ok()
            }
        }
    )*};
}
min_value!(i32: true, i64: true, u32: false, u64: false);

/// A float literal for a proto default (`1.5`, `-inf`, `nan`, `1e+10`), as `ty` (`f32`/`f64`).
/// The digits are Rust's shortest round-trip form of the value, so they never carry more
/// precision than the type has.
fn float_literal(text: &str, ty: &str) -> Option<String> {
    let text = text.trim();
    match text.to_ascii_lowercase().as_str() {
        "inf" | "infinity" | "+inf" => return Some(format!("{ty}::INFINITY")),
        "-inf" | "-infinity" => return Some(format!("{ty}::NEG_INFINITY")),
        "nan" | "-nan" | "+nan" => return Some(format!("{ty}::NAN")),
        _ => {}
    }
    let s = if ty == "f32" {
        let v: f32 = text.parse().ok()?;
        if !v.is_finite() {
            return float_literal(if v > 0.0 { "inf" } else { "-inf" }, ty);
        }
        format!("{v:?}")
    } else {
        let v: f64 = text.parse().ok()?;
        if !v.is_finite() {
            return float_literal(if v > 0.0 { "inf" } else { "-inf" }, ty);
        }
        format!("{v:?}")
    };
    // `1e20` is a float literal, but `{:?}` may print `1e-7` without a dot: keep it as it is
    // (a float literal either way) and make plain integers floats.
    if s.contains(['.', 'e', 'E']) {
        Some(s)
    } else {
        Some(format!("{s}.0"))
    }
}

/// Reverses protobuf's C escaping of a `bytes` default: `\n`, `\\`, octal `\123`, hex `\x4f`.
pub(crate) fn c_unescape(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        i += 1;
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let e = *bytes.get(i)?;
        i += 1;
        match e {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'a' => out.push(0x07),
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b'v' => out.push(0x0b),
            b'\\' | b'\'' | b'"' | b'?' => out.push(e),
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match bytes.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(u8::try_from(v).ok()?);
            }
            b'x' | b'X' => {
                let mut v = 0u32;
                let mut n = 0;
                while n < 2 {
                    match bytes.get(i).and_then(|&d| (d as char).to_digit(16)) {
                        Some(d) => {
                            v = v * 16 + d;
                            i += 1;
                            n += 1;
                        }
                        None => break,
                    }
                }
                if n == 0 {
                    return None;
                }
                out.push(v as u8);
            }
            _ => return None,
        }
    }
    Some(out)
}

/// `b"..."` with printable ASCII kept and everything else as `\xNN`.
pub(crate) fn byte_string_literal(bytes: &[u8]) -> String {
    let mut s = String::from("b\"");
    for &b in bytes {
        match b {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    s.push('"');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_literals() {
        assert_eq!(float_literal("1.5", "f32").unwrap(), "1.5");
        assert_eq!(float_literal("1", "f64").unwrap(), "1.0");
        assert_eq!(float_literal("-0", "f64").unwrap(), "-0.0");
        assert_eq!(float_literal("1e+10", "f64").unwrap(), "10000000000.0");
        assert_eq!(float_literal("1e300", "f64").unwrap(), "1e300");
        assert_eq!(float_literal("1e-7", "f32").unwrap(), "1e-7");
        assert_eq!(float_literal("0.1", "f32").unwrap(), "0.1");
        assert_eq!(float_literal("inf", "f32").unwrap(), "f32::INFINITY");
        assert_eq!(float_literal("-inf", "f64").unwrap(), "f64::NEG_INFINITY");
        assert_eq!(float_literal("nan", "f64").unwrap(), "f64::NAN");
        assert_eq!(float_literal("1e39", "f32").unwrap(), "f32::INFINITY");
        assert!(float_literal("one", "f32").is_none());
    }

    #[test]
    fn int_literals() {
        assert_eq!(int_literal::<i32>("-42", "i32").unwrap(), "-42");
        assert_eq!(
            int_literal::<i32>("-2147483648", "i32").unwrap(),
            "i32::MIN"
        );
        assert_eq!(
            int_literal::<i64>("-9223372036854775808", "i64").unwrap(),
            "i64::MIN"
        );
        assert_eq!(
            int_literal::<u64>("18446744073709551615", "u64").unwrap(),
            "18446744073709551615"
        );
        assert_eq!(int_literal::<u32>("0x10", "u32").unwrap(), "16");
        assert!(int_literal::<u32>("-1", "u32").is_none());
        assert!(int_literal::<i32>("2147483648", "i32").is_none());
    }

    #[test]
    fn bytes_defaults() {
        assert_eq!(
            c_unescape(r#"\000\001\377a\"\\\n\x41\x4"#).unwrap(),
            b"\x00\x01\xffa\"\\\nA\x04"
        );
        assert!(c_unescape(r"\").is_none());
        assert!(c_unescape(r"\q").is_none());
        assert!(c_unescape(r"\777").is_none());
        assert_eq!(byte_string_literal(b"\x00a\"\\\xff"), r#"b"\x00a\"\\\xff""#);
    }
}

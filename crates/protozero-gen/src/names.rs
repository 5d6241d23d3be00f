//! Naming rules: how proto names become Rust identifiers.
//!
//! All of it is deterministic and depends only on the descriptors, so the library and the protoc
//! plugin produce the same names for the same input.
//!
//! * **Case.** Fields, packages and nested-type modules become `snake_case`; messages and enums
//!   keep their proto name when it already is UpperCamelCase (so `ChromeRAILMode` stays
//!   `ChromeRAILMode`, as in Perfetto's docs) and are converted otherwise (`foo_bar` →
//!   `FooBar`, `GPU` → `Gpu`). Enum values become UpperCamelCase variants with the enum's
//!   name stripped as a prefix ([`variant_name`], prost's rule).
//! * **Keywords.** A keyword becomes a raw identifier (`r#type`), except the four that cannot be
//!   raw (`self`, `super`, `crate`, `Self`) and `_`, which get a `_` suffix (`self_`). Module
//!   names that are primitive type names (`u32`, `str`, ...) also get a `_` suffix, so they
//!   cannot shadow the primitive in generated code.
//! * **Clashes.** Within one namespace, names are allocated in a fixed order and a name already
//!   taken gets `_` appended until it is free ([`Namespace`]).
//!
//! The word splitting follows the `heck` crate (0.5), which prost uses, so names match prost's
//! where both convert.

use std::collections::HashSet;

/// Rust keywords of every edition up to 2024, plus the reserved ones. All of them are written as
/// raw identifiers (`r#type`) except [`NOT_RAW`].
const KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern",
    "false", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut",
    "pub", "ref", "return", "self", "Self", "static", "struct", "super", "trait", "true", "try",
    "type", "unsafe", "use", "where", "while", "abstract", "become", "box", "do", "final", "macro",
    "override", "priv", "typeof", "unsized", "virtual", "yield",
];

/// Keywords that cannot be raw identifiers.
const NOT_RAW: &[&str] = &["self", "Self", "super", "crate", "_"];

/// Primitive type names; a module with one of these names would shadow the type.
const PRIMITIVES: &[&str] = &[
    "bool", "char", "f32", "f64", "i8", "i16", "i32", "i64", "i128", "isize", "str", "u8", "u16",
    "u32", "u64", "u128", "usize",
];

/// Splits a proto name into words the way `heck` does: at `_` and other non-alphanumeric
/// characters, before an uppercase letter that follows a lowercase one (`fooBar`), and before
/// the last uppercase letter of a run followed by a lowercase one (`HTTPRequest` → `HTTP`,
/// `Request`). Digits stay in the word they follow (`V8String` → `V8`, `String`).
fn words(name: &str) -> Vec<&str> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        Boundary,
        Lower,
        Upper,
    }
    let mut out = Vec::new();
    for word in name.split(|c: char| !c.is_alphanumeric()) {
        let mut chars = word.char_indices().peekable();
        let mut init = 0;
        let mut mode = Mode::Boundary;
        while let Some((i, c)) = chars.next() {
            let Some(&(next_i, next)) = chars.peek() else {
                out.push(&word[init..]);
                break;
            };
            let next_mode = if c.is_lowercase() {
                Mode::Lower
            } else if c.is_uppercase() {
                Mode::Upper
            } else {
                mode
            };
            if next_mode == Mode::Lower && next.is_uppercase() {
                out.push(&word[init..next_i]);
                init = next_i;
                mode = Mode::Boundary;
            } else if mode == Mode::Upper && c.is_uppercase() && next.is_lowercase() {
                if init < i {
                    out.push(&word[init..i]);
                }
                init = i;
                mode = Mode::Boundary;
            } else {
                mode = next_mode;
            }
        }
    }
    out.retain(|w| !w.is_empty());
    out
}

/// `snake_case`: words lowercased and joined with `_` (`fooBar` → `foo_bar`).
pub(crate) fn snake_case(name: &str) -> String {
    words(name)
        .iter()
        .map(|w| w.to_lowercase())
        .collect::<Vec<_>>()
        .join("_")
}

/// `SCREAMING_SNAKE_CASE`.
pub(crate) fn screaming_snake_case(name: &str) -> String {
    words(name)
        .iter()
        .map(|w| w.to_uppercase())
        .collect::<Vec<_>>()
        .join("_")
}

/// `UpperCamelCase`: each word capitalized, the rest lowercased, joined (`FOO_BAR` → `FooBar`).
pub(crate) fn upper_camel_case(name: &str) -> String {
    let mut out = String::new();
    for w in words(name) {
        let mut chars = w.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(&chars.as_str().to_lowercase());
        }
    }
    out
}

/// Whether `name` passes rustc's `non_camel_case_types` lint and clippy's default
/// `upper_case_acronyms` check: no `_` (other than leading/trailing), does not start lowercase,
/// and is not all uppercase (unless it is a single character).
fn is_upper_camel(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    first.is_uppercase()
        && name.chars().all(|c| c.is_alphanumeric())
        && (name.chars().count() == 1 || name.chars().any(|c| c.is_lowercase()))
}

/// The Rust name of a message or enum: the proto name if it already is UpperCamelCase, else its
/// UpperCamelCase conversion. Keywords (only `Self` can arise) get a `_` suffix.
pub(crate) fn type_name(proto_name: &str) -> String {
    let name = if is_upper_camel(proto_name) {
        proto_name.to_owned()
    } else {
        upper_camel_case(proto_name)
    };
    fix_not_raw(non_empty(name, "Type"))
}

/// The Rust name of a field (the base of its methods), a package segment or a nested-type
/// module: `snake_case`, with the four non-raw keywords suffixed (`self` → `self_`).
pub(crate) fn field_name(proto_name: &str) -> String {
    fix_not_raw(non_empty(snake_case(proto_name), "field"))
}

/// The name of a module: like [`field_name`], and a primitive type name gets a `_` suffix.
pub(crate) fn module_name(proto_name: &str) -> String {
    let name = field_name(proto_name);
    if PRIMITIVES.contains(&name.as_str()) {
        name + "_"
    } else {
        name
    }
}

/// The variant name of enum value `value` in enum `enum_name`: the value in UpperCamelCase,
/// with the enum's name (in UpperCamelCase) stripped when it is a true prefix, i.e. followed by
/// an uppercase letter. `Type.TYPE_SLICE_BEGIN` → `SliceBegin`, but `Kind.KIND_2D` → `Kind2d`
/// (the rest starts with a digit) and `Kind.KIND` → `Kind` (nothing would be left).
pub(crate) fn variant_name(enum_name: &str, value: &str) -> String {
    let prefix = upper_camel_case(enum_name);
    let full = upper_camel_case(value);
    let name = match full.strip_prefix(&prefix) {
        Some(rest) if rest.chars().next().is_some_and(char::is_uppercase) => rest.to_owned(),
        _ => full,
    };
    fix_not_raw(non_empty(name, "Value"))
}

fn non_empty(name: String, fallback: &str) -> String {
    if name.is_empty() {
        fallback.to_owned()
    } else {
        name
    }
}

/// Appends `_` to the names that cannot be raw identifiers.
fn fix_not_raw(name: String) -> String {
    if NOT_RAW.contains(&name.as_str()) {
        name + "_"
    } else {
        name
    }
}

/// The name as it is written in Rust source: `r#` before a keyword.
pub(crate) fn ident(name: &str) -> String {
    if KEYWORDS.contains(&name) && !NOT_RAW.contains(&name) {
        format!("r#{name}")
    } else {
        name.to_owned()
    }
}

/// One Rust namespace (the items of a module, the methods of a type): hands out names in call
/// order, appending `_` to a name until it is free.
#[derive(Debug, Default)]
pub(crate) struct Namespace {
    taken: HashSet<String>,
}

impl Namespace {
    /// A namespace where `reserved` are already taken.
    pub(crate) fn with_reserved<'s>(reserved: impl IntoIterator<Item = &'s str>) -> Self {
        Namespace {
            taken: reserved.into_iter().map(str::to_owned).collect(),
        }
    }

    /// Marks `name` as taken (whether or not it already was).
    pub(crate) fn reserve(&mut self, name: &str) {
        self.taken.insert(name.to_owned());
    }

    /// `base`, or `base_`, `base__`, ... : the first one not yet taken, which is now taken.
    pub(crate) fn alloc(&mut self, base: &str) -> String {
        let mut name = base.to_owned();
        while self.taken.contains(&name) {
            name.push('_');
        }
        self.taken.insert(name.clone());
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_follow_heck() {
        assert_eq!(words("fooBar"), ["foo", "Bar"]);
        assert_eq!(words("HTTPRequest"), ["HTTP", "Request"]);
        assert_eq!(words("V8String"), ["V8", "String"]);
        assert_eq!(words("foo2Bar"), ["foo2", "Bar"]);
        assert_eq!(words("TYPE_SLICE_BEGIN"), ["TYPE", "SLICE", "BEGIN"]);
        assert_eq!(words("__a__b__"), ["a", "b"]);
        assert!(words("_").is_empty());
    }

    #[test]
    fn snake_and_camel_case() {
        assert_eq!(snake_case("track_event"), "track_event");
        assert_eq!(snake_case("TrackEvent"), "track_event");
        assert_eq!(snake_case("trackEvent"), "track_event");
        assert_eq!(snake_case("HTTPRequest"), "http_request");
        assert_eq!(snake_case("V8JsFunction"), "v8_js_function");
        assert_eq!(
            screaming_snake_case("debugAnnotations"),
            "DEBUG_ANNOTATIONS"
        );
        assert_eq!(upper_camel_case("TYPE_SLICE_BEGIN"), "TypeSliceBegin");
        assert_eq!(upper_camel_case("foo_bar"), "FooBar");
        assert_eq!(upper_camel_case("KIND_2D"), "Kind2d");
    }

    #[test]
    fn type_names_keep_valid_camel_case() {
        assert_eq!(type_name("TracePacket"), "TracePacket");
        assert_eq!(type_name("ChromeRAILMode"), "ChromeRAILMode");
        assert_eq!(type_name("A"), "A");
        assert_eq!(type_name("GPU"), "Gpu");
        assert_eq!(type_name("foo_bar"), "FooBar");
        assert_eq!(type_name("Foo_Bar"), "FooBar");
        assert_eq!(type_name("lower"), "Lower");
        assert_eq!(type_name("Self"), "Self_");
    }

    #[test]
    fn keywords_are_escaped() {
        assert_eq!(ident(&field_name("type")), "r#type");
        assert_eq!(ident(&field_name("gen")), "r#gen");
        assert_eq!(ident(&field_name("async")), "r#async");
        assert_eq!(ident(&field_name("self")), "self_");
        assert_eq!(ident(&field_name("super")), "super_");
        assert_eq!(ident(&field_name("crate")), "crate_");
        assert_eq!(ident(&field_name("Self")), "self_"); // snake_case first
        assert_eq!(ident(&type_name("Self")), "Self_");
        assert_eq!(ident(&field_name("union")), "union"); // a weak keyword is a fine name
        assert_eq!(ident(&module_name("u32")), "u32_");
        assert_eq!(ident(&module_name("type")), "r#type");
        assert_eq!(ident("foo"), "foo");
    }

    #[test]
    fn enum_prefix_stripping() {
        assert_eq!(variant_name("Type", "TYPE_SLICE_BEGIN"), "SliceBegin");
        assert_eq!(variant_name("Kind", "KIND_2D"), "Kind2d");
        assert_eq!(variant_name("Kind", "KIND"), "Kind");
        assert_eq!(variant_name("Kind", "KINDNESS"), "Kindness");
        assert_eq!(variant_name("Kind", "OTHER"), "Other");
        assert_eq!(
            variant_name("ChromeRAILMode", "RAIL_MODE_NONE"),
            "RailModeNone"
        );
        assert_eq!(
            variant_name("BuiltinClock", "BUILTIN_CLOCK_BOOTTIME"),
            "Boottime"
        );
        assert_eq!(variant_name("E", "SELF"), "Self_");
    }

    #[test]
    fn namespace_appends_underscores() {
        let mut ns = Namespace::with_reserved(["decode"]);
        assert_eq!(ns.alloc("foo"), "foo");
        assert_eq!(ns.alloc("foo"), "foo_");
        assert_eq!(ns.alloc("foo"), "foo__");
        assert_eq!(ns.alloc("decode"), "decode_");
        ns.reserve("bar");
        assert_eq!(ns.alloc("bar"), "bar_");
    }
}

//! Random `DynamicMessage`s of any message type, driven by its descriptor alone: every field
//! kind, repeated fields, maps, oneofs (at most one member set), nested messages to a depth.

use std::collections::HashMap;

use proptest::prelude::*;
use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, ReflectMessage, Value,
};

/// A random message of type `desc`, with message fields nested at most `depth` deep.
pub(crate) fn message(desc: MessageDescriptor, depth: u32) -> BoxedStrategy<DynamicMessage> {
    let mut parts: Vec<BoxedStrategy<Vec<(FieldDescriptor, Value)>>> = Vec::new();
    for field in desc.fields() {
        if field.containing_oneof().is_some_and(|o| !o.is_synthetic()) {
            continue;
        }
        let Some(value) = field_value(&field, depth) else {
            continue;
        };
        let f = field.clone();
        parts.push(
            proptest::option::weighted(0.6, value)
                .prop_map(move |v| v.map(|v| (f.clone(), v)).into_iter().collect())
                .boxed(),
        );
    }
    for oneof in desc.oneofs().filter(|o| !o.is_synthetic()) {
        let members: Vec<BoxedStrategy<Vec<(FieldDescriptor, Value)>>> = oneof
            .fields()
            .filter_map(|f| {
                let value = field_value(&f, depth)?;
                Some(value.prop_map(move |v| vec![(f.clone(), v)]).boxed())
            })
            .collect();
        let none = Just(Vec::new()).boxed();
        parts.push(prop_oneof![1 => none, 3 => proptest::strategy::Union::new(members)].boxed());
    }
    parts
        .prop_map(move |parts| {
            let mut m = DynamicMessage::new(desc.clone());
            for (f, v) in parts.into_iter().flatten() {
                m.set_field(&f, v);
            }
            m
        })
        .boxed()
}

/// A value for the whole field (a list for repeated fields, a map for maps), or `None` for a
/// message field when the depth is exhausted.
fn field_value(field: &FieldDescriptor, depth: u32) -> Option<BoxedStrategy<Value>> {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            unreachable!("maps are messages")
        };
        let key = map_key(&entry.map_entry_key_field().kind());
        let value = single(&entry.map_entry_value_field().kind(), depth)?;
        return Some(
            proptest::collection::hash_map(key, value, 0..4)
                .prop_map(|m: HashMap<MapKey, Value>| Value::Map(m))
                .boxed(),
        );
    }
    let one = single(&field.kind(), depth)?;
    if field.is_list() {
        Some(
            proptest::collection::vec(one, 0..5)
                .prop_map(Value::List)
                .boxed(),
        )
    } else {
        Some(one)
    }
}

fn single(kind: &Kind, depth: u32) -> Option<BoxedStrategy<Value>> {
    Some(match kind {
        Kind::Double => any::<f64>()
            .prop_filter("NaN != NaN", |v| !v.is_nan())
            .prop_map(Value::F64)
            .boxed(),
        Kind::Float => any::<f32>()
            .prop_filter("NaN != NaN", |v| !v.is_nan())
            .prop_map(Value::F32)
            .boxed(),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => any::<i32>().prop_map(Value::I32).boxed(),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => any::<i64>().prop_map(Value::I64).boxed(),
        Kind::Uint32 | Kind::Fixed32 => any::<u32>().prop_map(Value::U32).boxed(),
        Kind::Uint64 | Kind::Fixed64 => any::<u64>().prop_map(Value::U64).boxed(),
        Kind::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
        Kind::String => ".{0,12}".prop_map(Value::String).boxed(),
        Kind::Bytes => proptest::collection::vec(any::<u8>(), 0..12)
            .prop_map(|b| Value::Bytes(b.into()))
            .boxed(),
        Kind::Enum(e) => {
            let known: Vec<i32> = e.values().map(|v| v.number()).collect();
            // Mostly declared values; sometimes one the enum does not declare, which must
            // survive through the `_raw` accessors.
            prop_oneof![
                4 => proptest::sample::select(known),
                1 => any::<i32>(),
            ]
            .prop_map(Value::EnumNumber)
            .boxed()
        }
        Kind::Message(m) => {
            if depth == 0 {
                return None;
            }
            message(m.clone(), depth - 1)
                .prop_map(Value::Message)
                .boxed()
        }
    })
}

fn map_key(kind: &Kind) -> BoxedStrategy<MapKey> {
    match kind {
        Kind::String => "[a-z]{0,4}".prop_map(MapKey::String).boxed(),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => (-3i32..3).prop_map(MapKey::I32).boxed(),
        other => unimplemented!("map keys of kind {other:?} are not in the test schema"),
    }
}

/// `m` as prost-reflect decodes its own encoding: the canonical form to compare against (e.g.
/// a proto3 field set to its default is not encoded, so it comes back unset).
pub(crate) fn canonical(m: &DynamicMessage) -> DynamicMessage {
    use prost::Message as _;
    DynamicMessage::decode(m.descriptor(), m.encode_to_vec().as_slice()).unwrap()
}

/// A message with a `Debug` that terminates: prost-reflect's own `Debug` prints each field's
/// descriptor, which recurses forever through a self-referential message such as `Everything`.
#[derive(Clone, PartialEq)]
pub(crate) struct Shown(pub(crate) DynamicMessage);

impl std::fmt::Debug for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        show_message(&self.0, f)
    }
}

/// A random message of type `desc` (see [`message`]), shown by [`Shown`].
pub(crate) fn shown(desc: MessageDescriptor, depth: u32) -> impl Strategy<Value = Shown> {
    message(desc, depth).prop_map(Shown)
}

fn show_message(m: &DynamicMessage, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    f.write_str(m.descriptor().name())?;
    f.debug_map()
        .entries(
            m.fields()
                .map(|(fd, v)| (fd.name().to_owned(), ShowValue(v))),
        )
        .finish()
}

struct ShowValue<'v>(&'v Value);

impl std::fmt::Debug for ShowValue<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Value::Message(m) => show_message(m, f),
            Value::List(l) => f.debug_list().entries(l.iter().map(ShowValue)).finish(),
            Value::Map(m) => f
                .debug_map()
                .entries(m.iter().map(|(k, v)| (k, ShowValue(v))))
                .finish(),
            other => other.fmt(f),
        }
    }
}

//! A debug annotation's `legacy_json_value` expanded into args, as Perfetto's `json_args` does:
//! an object's members become `key.member`, an array's elements `key[i]` (the flat key leaves
//! the index out), numbers become ints when they are integers that fit an i64 and reals
//! otherwise, and `null`s are skipped (without taking an array index). Leaves come out in
//! document order; a repeated member keeps its first place and its last value, as in
//! Perfetto. A value that is not valid JSON (or nests deeper than serde_json's limit of 128)
//! gives None: the caller keeps it as its JSON string (type `json`), where Perfetto drops it,
//! so that nothing the producer wrote is lost.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::importers::PendingArg;
use crate::storage::strings::{StrId, StringPool};
use crate::storage::ArgValue;

/// Appends the args of annotation value `json` (at `flat_key`/`key`) to `out`: its leaves, or
/// the JSON string itself if it does not parse.
pub(crate) fn push(
    strings: &mut StringPool,
    out: &mut Vec<PendingArg>,
    flat_key: StrId,
    key: StrId,
    json: &[u8],
) {
    let (f, k) = (
        strings.get(flat_key).to_owned(),
        strings.get(key).to_owned(),
    );
    let Some(leaves) = leaves(json, &f, &k) else {
        let value = ArgValue::Json(strings.intern_bytes(json));
        out.push(PendingArg {
            flat_key,
            key,
            value,
        });
        return;
    };
    for (f, k, v) in leaves {
        let value = match v {
            JsonLeaf::Int(v) => ArgValue::Int(v),
            JsonLeaf::Real(v) => ArgValue::Real(v),
            JsonLeaf::Str(v) => ArgValue::Str(strings.intern(&v)),
            JsonLeaf::Bool(v) => ArgValue::Bool(v),
        };
        out.push(PendingArg {
            flat_key: strings.intern(&f),
            key: strings.intern(&k),
            value,
        });
    }
}

/// A JSON leaf value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum JsonLeaf {
    Int(i64),
    Real(f64),
    Str(String),
    Bool(bool),
}

/// One arg: flat key, key, value.
pub(crate) type JsonArg = (String, String, JsonLeaf);

/// The leaves of `json` under `flat_key`/`key` (a scalar gives one arg with those keys), or
/// None if `json` is not one valid JSON value.
pub(crate) fn leaves(json: &[u8], flat_key: &str, key: &str) -> Option<Vec<JsonArg>> {
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(json);
    let root = Node {
        flat_key: flat_key.to_owned(),
        key: key.to_owned(),
        slot: Slot::Root,
        out: &mut out,
    };
    root.deserialize(&mut de).ok()?;
    de.end().ok()?;
    // A repeated member: the last value wins, in the first one's place.
    let mut seen = std::collections::HashMap::with_capacity(out.len());
    let mut unique: Vec<JsonArg> = Vec::with_capacity(out.len());
    for (flat_key, key, value) in out {
        match seen.get(&key) {
            Some(&i) => unique[i] = (flat_key, key, value),
            None => {
                seen.insert(key.clone(), unique.len());
                unique.push((flat_key, key, value));
            }
        }
    }
    Some(unique)
}

/// Where a value sits in its parent.
enum Slot<'a> {
    Root,
    /// The next index of the parent array (taken only by a value that is not null).
    Element(&'a mut usize),
    Member(String),
}

/// A value about to be read: its parent's keys and its place in the parent.
struct Node<'a, 'o> {
    flat_key: String,
    key: String,
    slot: Slot<'a>,
    out: &'o mut Vec<JsonArg>,
}

impl Node<'_, '_> {
    /// The value's own (flat key, key); an array element takes its index here.
    fn keys(&mut self) -> (String, String) {
        match &mut self.slot {
            Slot::Root => (self.flat_key.clone(), self.key.clone()),
            Slot::Element(next) => {
                let i = **next;
                **next += 1;
                (self.flat_key.clone(), format!("{}[{i}]", self.key))
            }
            Slot::Member(name) => (
                format!("{}.{name}", self.flat_key),
                format!("{}.{name}", self.key),
            ),
        }
    }

    fn leaf(mut self, value: JsonLeaf) {
        let (flat_key, key) = self.keys();
        self.out.push((flat_key, key, value));
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.leaf(JsonLeaf::Bool(v));
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.leaf(JsonLeaf::Int(v));
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.leaf(match i64::try_from(v) {
            Ok(v) => JsonLeaf::Int(v),
            Err(_) => JsonLeaf::Real(v as f64),
        });
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.leaf(JsonLeaf::Real(v));
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.leaf(JsonLeaf::Str(v.to_owned()));
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let (flat_key, key) = self.keys();
        let mut next = 0;
        loop {
            let child = Node {
                flat_key: flat_key.clone(),
                key: key.clone(),
                slot: Slot::Element(&mut next),
                out: &mut *self.out,
            };
            if seq.next_element_seed(child)?.is_none() {
                return Ok(());
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let (flat_key, key) = self.keys();
        while let Some(name) = map.next_key::<String>()? {
            map.next_value_seed(Node {
                flat_key: flat_key.clone(),
                key: key.clone(),
                slot: Slot::Member(name),
                out: &mut *self.out,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(json: &str) -> Vec<(String, String, JsonLeaf)> {
        leaves(json.as_bytes(), "debug.j", "debug.j").expect("valid JSON")
    }

    #[test]
    fn objects_arrays_and_scalars_become_args_in_document_order() {
        let got = keys(
            r#"{"b": 1, "a": [2.5, null, "x", {"c": true}], "n": null, "big": 18446744073709551615}"#,
        );
        let want = [
            ("debug.j.b", "debug.j.b", JsonLeaf::Int(1)),
            ("debug.j.a", "debug.j.a[0]", JsonLeaf::Real(2.5)),
            ("debug.j.a", "debug.j.a[1]", JsonLeaf::Str("x".into())),
            ("debug.j.a.c", "debug.j.a[2].c", JsonLeaf::Bool(true)),
            (
                "debug.j.big",
                "debug.j.big",
                JsonLeaf::Real(u64::MAX as f64),
            ),
        ];
        let want: Vec<_> = want
            .into_iter()
            .map(|(f, k, v)| (f.to_owned(), k.to_owned(), v))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_repeated_member_is_updated_in_place() {
        let got = keys(r#"{"s": "x", "t": 1, "s": "y"}"#);
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0],
            (
                "debug.j.s".into(),
                "debug.j.s".into(),
                JsonLeaf::Str("y".into())
            )
        );
    }

    #[test]
    fn a_scalar_keeps_the_annotation_key() {
        assert_eq!(
            keys("-3"),
            [("debug.j".into(), "debug.j".into(), JsonLeaf::Int(-3))]
        );
        assert!(keys("{}").is_empty());
    }

    #[test]
    fn invalid_or_too_deep_json_is_refused() {
        assert!(leaves(b"{\"a\": ", "k", "k").is_none());
        assert!(leaves(b"[1] [2]", "k", "k").is_none());
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(leaves(deep.as_bytes(), "k", "k").is_none());
    }
}

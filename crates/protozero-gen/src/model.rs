//! The index of every message and enum in a descriptor set, with its Rust names and module.
//!
//! Names are decided here, once, for every type of every file in the set (not only the files to
//! generate), so that a file generated today and a file generated tomorrow from the same set name
//! each other's types identically.
//!
//! # Module tree and allocation order
//!
//! `package a.b;` is module `a::b`; a message with nested messages or enums gets a module named
//! after it in `snake_case` (prost's layout): `a.b.Foo.Bar` is `a::b::foo::Bar`. Within one
//! module the names are handed out in this order, each clash resolved with a `_` suffix (see
//! [`Namespace`]):
//!
//! 1. taken up front: the modules of child packages (`b` in `a`), which the user mounts and so
//!    cannot be renamed, and the module's own name (a nested module `foo` inside module `foo`
//!    would trip clippy's `module_inception`);
//! 2. the writer type of each message and the type of each enum, files sorted by name, then in
//!    declaration order (messages before enums);
//! 3. the view type of each message (`FooView`, or `FooView_` next to a message `FooView`);
//! 4. the nested-type modules.
//!
//! Sorting by file name makes the result independent of the order of files in the set (protoc
//! and protox order them differently).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto, FileDescriptorSet};

use crate::names::{self, ident, Namespace};
use crate::Error;

/// A message or an enum.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Decl<'a> {
    Message(&'a DescriptorProto),
    Enum(&'a EnumDescriptorProto),
}

/// One message or enum, with its Rust names.
#[derive(Debug)]
pub(crate) struct TypeInfo<'a> {
    /// Full proto name without the leading dot: `a.b.Foo.Bar`.
    pub(crate) full_name: String,
    pub(crate) decl: Decl<'a>,
    pub(crate) file: &'a FileDescriptorProto,
    /// Source-code-info path of the declaration (`[4, i, 3, j]`), for comments.
    pub(crate) path: Vec<i32>,
    /// The module holding the type, as printed identifiers (`["a", "b", "foo"]`).
    pub(crate) module: Vec<String>,
    /// The writer type of a message, or the enum type (printed identifier).
    pub(crate) name: String,
    /// The view type of a message (printed identifier); empty for enums.
    pub(crate) view: String,
    /// The module of a message's nested types, if it has any (printed identifier).
    pub(crate) nested_module: Option<String>,
}

impl TypeInfo<'_> {
    /// The path from module `from` to `item` (a type of this module), relative: `super::` up to
    /// the common ancestor, then down.
    pub(crate) fn path_from(&self, from: &[String], item: &str) -> String {
        relative_path(from, &self.module, item)
    }

    /// The module of this message's nested types.
    pub(crate) fn inner_module(&self) -> Vec<String> {
        let mut m = self.module.clone();
        if let Some(n) = &self.nested_module {
            m.push(n.clone());
        }
        m
    }
}

/// `item` in module `to`, named from module `from`.
pub(crate) fn relative_path(from: &[String], to: &[String], item: &str) -> String {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    let mut p = String::new();
    for _ in common..from.len() {
        p.push_str("super::");
    }
    for seg in &to[common..] {
        p.push_str(seg);
        p.push_str("::");
    }
    p.push_str(item);
    p
}

/// Every type of a descriptor set, by full name.
#[derive(Debug)]
pub(crate) struct Index<'a> {
    types: HashMap<String, TypeInfo<'a>>,
}

/// The module path of a package (`a.b` → `["a", "b"]`, printed identifiers).
pub(crate) fn package_module(package: &str) -> Vec<String> {
    package
        .split('.')
        .filter(|s| !s.is_empty())
        .map(|s| ident(&names::module_name(s)))
        .collect()
}

impl<'a> Index<'a> {
    pub(crate) fn build(fds: &'a FileDescriptorSet) -> Result<Self, Error> {
        let mut by_package: BTreeMap<&str, Vec<&FileDescriptorProto>> = BTreeMap::new();
        for f in &fds.file {
            by_package.entry(f.package()).or_default().push(f);
        }
        // Every package module that exists, including the intermediate ones (`a` for `a.b`).
        let mut modules: BTreeSet<Vec<String>> = BTreeSet::new();
        for package in by_package.keys() {
            let m = package_module(package);
            for len in 0..=m.len() {
                modules.insert(m[..len].to_vec());
            }
        }
        let mut index = Index {
            types: HashMap::new(),
        };
        for (package, mut files) in by_package {
            files.sort_by(|a, b| a.name().cmp(b.name()));
            let module = package_module(package);
            // Child package modules of this one, by their logical (unescaped) names: the
            // escaped forms differ only for keywords, which are never allocated.
            let mut ns = Namespace::default();
            for m in &modules {
                if m.len() == module.len() + 1 && m.starts_with(&module) {
                    ns.reserve(m.last().unwrap().trim_start_matches("r#"));
                }
            }
            if let Some(own) = module.last() {
                ns.reserve(own.trim_start_matches("r#"));
            }
            let mut decls = Vec::new();
            for file in files {
                let prefix = if package.is_empty() {
                    String::new()
                } else {
                    format!("{package}.")
                };
                for (i, m) in file.message_type.iter().enumerate() {
                    decls.push((file, Decl::Message(m), prefix.clone(), vec![4, i as i32]));
                }
                for (i, e) in file.enum_type.iter().enumerate() {
                    decls.push((file, Decl::Enum(e), prefix.clone(), vec![5, i as i32]));
                }
            }
            // Messages of all files first, then enums, as in each file.
            decls.sort_by_key(|(_, d, _, _)| matches!(d, Decl::Enum(_)));
            index.add_scope(ns, &module, decls)?;
        }
        Ok(index)
    }

    /// Names the types declared in one module (see the module docs for the order), then
    /// recurses into their nested-type modules.
    fn add_scope(
        &mut self,
        mut ns: Namespace,
        module: &[String],
        decls: Vec<(&'a FileDescriptorProto, Decl<'a>, String, Vec<i32>)>,
    ) -> Result<(), Error> {
        let mut infos = Vec::with_capacity(decls.len());
        for (file, decl, prefix, path) in decls {
            let proto_name = match decl {
                Decl::Message(m) => m.name(),
                Decl::Enum(e) => e.name(),
            };
            if proto_name.is_empty() {
                return Err(Error::InvalidDescriptor(format!(
                    "a message or enum in `{}` has no name",
                    file.name()
                )));
            }
            let name = ns.alloc(&names::type_name(proto_name));
            infos.push(TypeInfo {
                full_name: format!("{prefix}{proto_name}"),
                decl,
                file,
                path,
                module: module.to_vec(),
                name: ident(&name),
                view: String::new(),
                nested_module: None,
            });
        }
        for info in &mut infos {
            if let Decl::Message(_) = info.decl {
                // `Self_` → `SelfView`: a `_` inside a camel-case name trips rustc's
                // `non_camel_case_types`.
                let base = format!("{}View", info.name.trim_end_matches('_'));
                info.view = ident(&ns.alloc(&base));
            }
        }
        let mut children = Vec::new();
        for info in &mut infos {
            let Decl::Message(m) = info.decl else {
                continue;
            };
            if m.nested_type.is_empty() && m.enum_type.is_empty() {
                continue;
            }
            let proto_name = m.name();
            let nested = ns.alloc(&names::module_name(proto_name));
            let nested = ident(&nested);
            info.nested_module = Some(nested.clone());
            let mut inner = module.to_vec();
            inner.push(nested.clone());
            let prefix = format!("{}.", info.full_name);
            let mut decls = Vec::new();
            for (j, n) in m.nested_type.iter().enumerate() {
                let mut path = info.path.clone();
                path.extend([3, j as i32]);
                decls.push((info.file, Decl::Message(n), prefix.clone(), path));
            }
            for (j, e) in m.enum_type.iter().enumerate() {
                let mut path = info.path.clone();
                path.extend([4, j as i32]);
                decls.push((info.file, Decl::Enum(e), prefix.clone(), path));
            }
            let inner_ns = Namespace::with_reserved([nested.trim_start_matches("r#")]);
            children.push((inner_ns, inner, decls));
        }
        for info in infos {
            let key = info.full_name.clone();
            if self.types.insert(key.clone(), info).is_some() {
                return Err(Error::InvalidDescriptor(format!(
                    "`{key}` is declared twice"
                )));
            }
        }
        for (ns, inner, decls) in children {
            self.add_scope(ns, &inner, decls)?;
        }
        Ok(())
    }

    /// The type a field refers to (`type_name`, fully qualified with a leading dot as protoc and
    /// protox write it).
    pub(crate) fn resolve(&self, type_name: &str, field: &str) -> Result<&TypeInfo<'a>, Error> {
        let key = type_name.strip_prefix('.').ok_or_else(|| {
            Error::InvalidDescriptor(format!(
                "field `{field}` has a type name `{type_name}` that is not fully qualified"
            ))
        })?;
        self.types.get(key).ok_or_else(|| {
            Error::InvalidDescriptor(format!(
                "field `{field}` refers to `{type_name}`, which is in no file of the set"
            ))
        })
    }

    /// The type with this full name (no leading dot).
    pub(crate) fn get(&self, full_name: &str) -> Option<&TypeInfo<'a>> {
        self.types.get(full_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn relative_paths() {
        assert_eq!(relative_path(&m(&["a", "b"]), &m(&["a", "b"]), "X"), "X");
        assert_eq!(
            relative_path(&m(&["a", "b"]), &m(&["a", "b", "x"]), "Y"),
            "x::Y"
        );
        assert_eq!(
            relative_path(&m(&["a", "b", "x"]), &m(&["a", "c"]), "Y"),
            "super::super::c::Y"
        );
        assert_eq!(relative_path(&m(&["a"]), &m(&[]), "Y"), "super::Y");
        assert_eq!(relative_path(&m(&[]), &m(&["r#type"]), "Y"), "r#type::Y");
    }

    #[test]
    fn package_modules_are_escaped() {
        assert_eq!(package_module("perfetto.protos"), ["perfetto", "protos"]);
        assert_eq!(package_module("a.type.Self"), ["a", "r#type", "self_"]);
        assert!(package_module("").is_empty());
    }
}

//! Declares the `loom` cfg so that `unexpected_cfgs` accepts `#[cfg(loom)]`.
//!
//! The natural place would be `[lints.rust] unexpected_cfgs = { check-cfg = [...] }` in
//! Cargo.toml, but cargo refuses to combine a crate-level `[lints.rust]` table with
//! `[lints] workspace = true`, so the declaration lives here.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
    println!("cargo::rerun-if-changed=build.rs");
}

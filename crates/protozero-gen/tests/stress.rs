//! Stress: a synthetic schema of 3000 messages with 10 fields each (every field kind, repeated
//! and packed fields, oneofs, maps, nested messages and enums, references across messages,
//! files and packages) goes through protox and the generator. Times are printed, never
//! asserted.
//!
//! `generated_stress_code_compiles` then builds the generated code as a crate of its own with
//! `cargo build` (debug, edition 2024, `#![deny(warnings)]`), against this workspace's
//! `protozero`, prints how long that took, and runs rustdoc on it with `-D warnings`. Building
//! is the expensive part (about 56 s for all 3000 messages on the project's 2-core VM; see the
//! crate README), so by default it builds a 200-message slice of the schema (about 4 s);
//! `PROTOZERO_GEN_STRESS_FULL=1` builds all of it.

mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use protozero_gen::{generate, Layout, Options};

const PACKAGES: usize = 10;
const MESSAGES_PER_PACKAGE: usize = 300;
const FIELDS: usize = 10;

/// A deterministic pseudo-random sequence (64-bit LCG), so the schema is the same every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

const SCALARS: &[&str] = &[
    "int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64", "sfixed32",
    "sfixed64", "float", "double", "bool", "string", "bytes",
];

/// The synthetic schema: `packages` files `stress/pN.proto` (package `stress.pN`), each
/// importing the previous one, with `messages` messages each.
fn schema(packages: usize, messages: usize) -> Vec<(String, String)> {
    let mut rng = Lcg(42);
    let mut files = Vec::new();
    for p in 0..packages {
        let mut s = String::new();
        let proto3 = p % 2 == 1;
        writeln!(
            s,
            "syntax = \"{}\";",
            if proto3 { "proto3" } else { "proto2" }
        )
        .unwrap();
        writeln!(s, "package stress.p{p};").unwrap();
        if p > 0 {
            writeln!(s, "import \"stress/p{}.proto\";", p - 1).unwrap();
        }
        let label = if proto3 { "" } else { "optional " };
        for e in 0..5 {
            writeln!(s, "// Enum {e}.\nenum E{e} {{").unwrap();
            for v in 0..4 {
                writeln!(s, "  E{e}_V{v} = {v};").unwrap();
            }
            writeln!(s, "}}").unwrap();
        }
        for m in 0..messages {
            writeln!(s, "// Message {m} of package {p}.\nmessage M{m} {{").unwrap();
            let mut number = 1;
            for f in 0..FIELDS {
                let kind = rng.next(10);
                let ty = match kind {
                    // A message: an earlier one here, one of the previous package, or itself.
                    0 if m > 0 => format!("M{}", rng.next(m)),
                    1 if p > 0 => format!("stress.p{}.M{}", p - 1, rng.next(messages)),
                    2 => format!("E{}", rng.next(5)),
                    3 if m % 10 == 0 => "Inner".to_string(),
                    _ => SCALARS[rng.next(SCALARS.len())].to_string(),
                };
                let repeated = rng.next(4) == 0;
                let packed =
                    repeated && !proto3 && rng.next(2) == 0 && SCALARS[..13].contains(&ty.as_str());
                let (label, opts) = if repeated {
                    ("repeated ", if packed { " [packed = true]" } else { "" })
                } else {
                    (label, "")
                };
                writeln!(s, "  // Field {f}.\n  {label}{ty} f{f} = {number}{opts};").unwrap();
                number += 1 + rng.next(3);
            }
            if m % 7 == 0 {
                writeln!(
                    s,
                    "  oneof choice {{ int64 o_a = {}; string o_b = {}; M{m} o_c = {}; }}",
                    number,
                    number + 1,
                    number + 2
                )
                .unwrap();
                number += 3;
            }
            if m % 11 == 0 {
                writeln!(s, "  map<string, E0> labels = {number};").unwrap();
            }
            if m % 10 == 0 {
                writeln!(
                    s,
                    "  message Inner {{ {label}string name = 1; repeated Inner children = 2; {label}Kind kind = 3; }}\n  enum Kind {{ KIND_UNSPECIFIED = 0; KIND_A = 1; }}"
                )
                .unwrap();
            }
            writeln!(s, "}}").unwrap();
        }
        files.push((format!("stress/p{p}.proto"), s));
    }
    files
}

fn generate_schema(
    packages: usize,
    messages: usize,
    layout: Layout,
) -> Vec<protozero_gen::GeneratedFile> {
    let files = schema(packages, messages);
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, s)| (n.as_str(), s.as_str()))
        .collect();
    let t = Instant::now();
    let fds = common::compile_sources(&refs).expect("the synthetic schema parses");
    let parse = t.elapsed();
    let names: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    let t = Instant::now();
    let out = generate(&fds, &names, &Options::new().layout(layout)).expect("it generates");
    let gen = t.elapsed();
    let bytes: usize = out.iter().map(|f| f.content.len()).sum();
    let lines: usize = out.iter().map(|f| f.content.lines().count()).sum();
    println!(
        "stress: {} messages x {FIELDS} fields: protox {parse:.2?}, generate {gen:.2?}, \
         {lines} lines / {:.1} MiB of Rust",
        packages * messages,
        bytes as f64 / (1 << 20) as f64
    );
    out
}

#[test]
fn a_large_schema_generates() {
    let files = generate_schema(PACKAGES, MESSAGES_PER_PACKAGE, Layout::PerPackage);
    assert_eq!(files.len(), PACKAGES);
    let writers: usize = files
        .iter()
        .map(|f| f.content.matches("(::protozero::Message<'w>);").count())
        .sum();
    // Every message, every nested `Inner`, every map entry.
    let inner = MESSAGES_PER_PACKAGE.div_ceil(10);
    let maps = MESSAGES_PER_PACKAGE.div_ceil(11);
    assert_eq!(writers, PACKAGES * (MESSAGES_PER_PACKAGE + inner + maps));
    // Cross-package references are relative paths.
    assert!(files[1].content.contains("super::p0::"));
}

/// Writes a crate including `file` (single-file layout), and the golden single-file code of
/// the test schema, and builds it; returns the build time. The crate is **edition 2024** (the
/// workspace is 2021, where the golden code is compiled by `tests/generated`), so the generated
/// code is checked under both.
fn build_crate(dir: &Path, file: &protozero_gen::GeneratedFile) -> std::time::Duration {
    let protozero = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../protozero");
    let golden = common::golden_dir().join(common::SINGLE_FILE);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"stress\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\n\
             [dependencies]\nprotozero = {{ path = {:?} }}\n\n[workspace]\n",
            protozero.display().to_string()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("src").join(&file.name), &file.content).unwrap();
    std::fs::write(
        dir.join("src/lib.rs"),
        format!(
            "//! Generated stress code.\n\
             #![deny(warnings, missing_docs, missing_debug_implementations, unreachable_pub)]\n\
             /// The synthetic schema.\npub mod stress {{\n    include!(\"{}\");\n}}\n\
             /// The golden test schema.\npub mod golden {{\n    include!({:?});\n}}\n",
            file.name,
            golden.display().to_string()
        ),
    )
    .unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // A target directory of its own: the outer `cargo test` may hold the lock on the
    // workspace's (and CI may point CARGO_TARGET_DIR at it).
    let cargo = |args: &[&str]| {
        let mut cmd = Command::new(&cargo);
        cmd.args(args)
            .env("CARGO_TARGET_DIR", dir.join("target"))
            .current_dir(dir);
        cmd
    };
    // protozero first, so that the time measured is the generated code's.
    let status = cargo(&["build", "--offline", "--quiet", "-p", "protozero"])
        .status()
        .unwrap();
    assert!(status.success());
    let t = Instant::now();
    let out = cargo(&["build", "--offline", "--quiet"]).output().unwrap();
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "the generated stress code does not build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // rustdoc must not warn either (comments are sanitized: no broken links, no stray HTML, no
    // code blocks that would become doctests).
    let t = Instant::now();
    let out = cargo(&["doc", "--offline", "--quiet", "--no-deps"])
        .env("RUSTDOCFLAGS", "-D warnings")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rustdoc warns about the generated code:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("stress: cargo doc: {:.2?}", t.elapsed());
    took
}

#[test]
fn generated_stress_code_compiles() {
    let full = std::env::var_os("PROTOZERO_GEN_STRESS_FULL").is_some_and(|v| v != "0");
    let (packages, messages) = if full {
        (PACKAGES, MESSAGES_PER_PACKAGE)
    } else {
        (2, 100)
    };
    let files = generate_schema(
        packages,
        messages,
        Layout::SingleFile("stress_gen.rs".into()),
    );
    // `PROTOZERO_GEN_STRESS_DIR` keeps the crate there, for a closer look.
    let keep = std::env::var_os("PROTOZERO_GEN_STRESS_DIR").map(PathBuf::from);
    let dir = keep.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("protozero-gen-stress-{}", std::process::id()))
    });
    let took = build_crate(&dir, &files[0]);
    println!(
        "stress: cargo build (debug) of {} messages x {FIELDS} fields: {took:.2?}",
        packages * messages
    );
    if keep.is_none() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

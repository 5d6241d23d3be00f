//! Repository chores, run as `cargo xtask <verb>` (the alias lives in `.cargo/config.toml`).
//!
//! - `gen-protos`: regenerates `crates/tachyon-protos/src/generated/` from the `.proto` files in
//!   `crates/tachyon-protos/protos/` with protozero-gen. The bootstrap test of tachyon-protos
//!   fails whenever the checked-in code differs from what this produces.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("gen-protos") => gen_protos(),
        _ => {
            eprintln!("usage: cargo xtask gen-protos");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn gen_protos() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let crate_dir = root.join("crates/tachyon-protos");
    let protos = crate_dir.join("protos");
    let files = tachyon_proto_files(&protos)?;
    let out = crate_dir.join("src/generated");
    let written = protozero_gen::Config::new()
        .layout(protozero_gen::Layout::SingleFile("protos.rs".into()))
        .out_dir(&out)
        .compile_protos(&files, &[&protos])?;
    for f in written {
        println!("generated {}", f.display());
    }
    Ok(())
}

/// Every `.proto` under `dir`, relative to it, sorted (the generator's output does not depend
/// on the order, but a stable list keeps diagnostics stable).
fn tachyon_proto_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(base, &path, out)?;
            } else if path.extension().is_some_and(|e| e == "proto") {
                out.push(path.strip_prefix(base).expect("under base").to_path_buf());
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}

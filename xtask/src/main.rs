//! Repository chores, run as `cargo xtask <verb>` (the alias lives in `.cargo/config.toml`).
//!
//! - `gen-protos`: regenerates `crates/tachyon-protos/src/generated/` from the `.proto` files in
//!   `crates/tachyon-protos/protos/` with protozero-gen. The bootstrap test of tachyon-protos
//!   fails whenever the checked-in code differs from what this produces.
//! - `difftests PERFETTO_DIR [ARGS]`: runs Perfetto's trace processor diff tests against
//!   Tachyon's processor: `cargo run -p tachyon-difftests -- ARGS` (its own crate, so
//!   that xtask, and with it `gen-protos`, never depends on the processor: regenerating must
//!   work when the processor needs fields the checked-in code lacks).
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::ExitCode;

#[path = "../../crates/tachyon-protos/proto_files.rs"]
mod proto_files;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("gen-protos") => gen_protos(),
        Some("difftests") => return difftests(&args[1..]),
        _ => {
            eprintln!("usage: cargo xtask gen-protos | cargo xtask difftests PERFETTO_DIR");
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

fn difftests(args: &[String]) -> ExitCode {
    let status = std::process::Command::new(env!("CARGO"))
        .args(["run", "--quiet", "-p", "tachyon-difftests", "--"])
        .args(args)
        .status();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("xtask: cannot run cargo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn gen_protos() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let crate_dir = root.join("crates/tachyon-protos");
    let protos = crate_dir.join("protos");
    let files = proto_files::proto_files(&protos)?;
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

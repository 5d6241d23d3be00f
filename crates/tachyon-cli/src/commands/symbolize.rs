//! `tachyon symbolize IN OUT`: appends symbols for the trace's call stacks (Perfetto
//! `ModuleSymbols` packets) to a copy of the trace, like Perfetto's `traceconv symbolize`.

use std::path::PathBuf;

/// Resolve the frames of a trace's call stacks (function, file, line, inlined functions) from
/// the binaries' debug info, and write the trace with the symbols appended.
///
/// A binary is read only if you name it (`--binary`, `--search-dir`) or it is the file at the
/// trace's own mapping path AND has the build id the trace records (`--no-trace-paths` turns
/// that off). Binaries not found are listed; the rest is symbolized.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The trace to symbolize.
    input: PathBuf,
    /// Where the symbolized trace is written.
    output: PathBuf,
    /// A binary (or its separate debug file) to take symbols from; repeatable.
    #[arg(long = "binary", value_name = "FILE")]
    binaries: Vec<PathBuf>,
    /// A directory to look for binaries in (`DIR/NAME`, `DIR/.build-id/xx/rest.debug`);
    /// repeatable.
    #[arg(long = "search-dir", value_name = "DIR")]
    search_dirs: Vec<PathBuf>,
    /// Never read the paths the trace names, only what the options above name.
    #[arg(long)]
    no_trace_paths: bool,
}

pub(crate) fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let opts = tachyon_symbolize::Options {
        binaries: args.binaries,
        search_dirs: args.search_dirs,
        trace_paths: !args.no_trace_paths,
    };
    let out = tachyon_symbolize::symbolize_file(&args.input, &args.output, &opts)?;
    if out.modules.is_empty() {
        println!("no unsymbolized frames in {}", args.input.display());
    }
    for m in &out.modules {
        println!("{m}");
    }
    let missing = out.missing().count();
    if missing > 0 {
        eprintln!(
            "tachyon: {missing} binar{} not found; their frames stay unsymbolized",
            if missing == 1 { "y" } else { "ies" }
        );
    }
    println!("wrote {}", args.output.display());
    Ok(())
}

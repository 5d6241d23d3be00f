//! `tachyon`: the command-line front end. Glue only: argument parsing (clap) and printing; the
//! work happens in the library crates. One module per subcommand under `commands/`; `demo.rs`
//! is the instrumented workload `tachyon demo` records.
#![forbid(unsafe_code)]

mod commands;
mod demo;
mod load;
mod output;
mod trace_config_text;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Every allocation of the process goes through Tachyon's tracking allocator: recorded while a
/// session tracks memory (`tachyon demo`; `TACHYON_MEMORY=off|exact|sampled:BYTES`), one
/// relaxed load otherwise.
#[global_allocator]
static ALLOC: tachyon::alloc::Tracked<std::alloc::System> =
    tachyon::alloc::Tracked::new(std::alloc::System);

/// Tachyon: Perfetto-format tracing for Rust programs.
#[derive(Debug, Parser)]
#[command(
    name = "tachyon",
    version,
    about,
    propagate_version = true,
    after_help = "Examples:
  tachyon demo --out demo.pftrace            record an instrumented workload
  tachyon stats demo.pftrace                 zones by total time, and any data loss
  tachyon query demo.pftrace 'SELECT name, dur FROM slice ORDER BY dur DESC LIMIT 5'
  tachyon traced &                           the daemon (system mode)
  tachyon record -o all.pftrace -- ./my-app  record every traced process while my-app runs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(after_help = "Examples:
  tachyon demo
  tachyon demo --out demo.pftrace --threads 8 --seconds 5
  TACHYON_DISABLED_CATEGORIES=io tachyon demo   leave the io category out")]
    Demo(commands::demo::Args),
    #[command(after_help = "Examples:
  tachyon query t.pftrace 'SELECT name, count(*) FROM slice GROUP BY name'
  tachyon query t.pftrace -f report.sql --format csv > report.csv
  tachyon query t.pftrace                    an interactive shell (statements end with ;)")]
    Query(commands::query::Args),
    #[command(after_help = "Examples:
  tachyon stats t.pftrace
  tachyon stats t.pftrace.gz | head -20")]
    Stats(commands::stats::Args),
    Record(commands::record::Args),
    #[command(after_help = "Examples:
  tachyon traced
  TACHYON_PRODUCER_SOCK=/tmp/p.sock TACHYON_CONSUMER_SOCK=/tmp/c.sock tachyon traced")]
    Traced(commands::traced::Args),
    Export(commands::export::Args),
    Capture(commands::capture::Args),
    #[command(after_help = "Examples:
  tachyon symbolize t.pftrace t.sym.pftrace             binaries at the trace's paths, same build id
  tachyon symbolize t.pftrace out.pftrace --binary target/debug/my-app
  tachyon symbolize t.pftrace out.pftrace --search-dir /usr/lib/debug --no-trace-paths")]
    Symbolize(commands::symbolize::Args),
}

/// 128 + SIGPIPE: the status of a Unix tool ended by a closed pipe.
const EXIT_BROKEN_PIPE: i32 = 141;

/// Ends the process quietly when standard output is a closed pipe (`tachyon stats t | head`):
/// Rust ignores SIGPIPE, so `println!` panics on EPIPE instead of the process ending as a Unix
/// tool would. Every other panic keeps the default report.
fn quiet_on_closed_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if text.starts_with("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(EXIT_BROKEN_PIPE);
        }
        default(info);
    }));
}

/// Whether an error (or one of its sources) is a closed pipe on our output.
fn is_broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::BrokenPipe {
                return true;
            }
        }
        cur = e.source();
    }
    false
}

fn main() -> ExitCode {
    quiet_on_closed_pipe();
    let cli = Cli::parse();
    let done = |r: Result<(), _>| r.map(|()| ExitCode::SUCCESS);
    let result = match cli.command {
        Command::Demo(args) => done(commands::demo::run(args)),
        Command::Query(args) => done(commands::query::run(args)),
        Command::Stats(args) => done(commands::stats::run(args)),
        // With a program to run, its exit status.
        Command::Record(args) => commands::record::run(args),
        Command::Traced(args) => done(commands::traced::run(args)),
        Command::Export(args) => done(commands::export::run(args)),
        Command::Capture(args) => done(commands::capture::run(args)),
        Command::Symbolize(args) => done(commands::symbolize::run(args)),
    };
    match result {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&*e) => ExitCode::from(EXIT_BROKEN_PIPE as u8),
        Err(e) => {
            eprintln!("tachyon: error: {e}");
            ExitCode::FAILURE
        }
    }
}

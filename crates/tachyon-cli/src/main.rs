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

/// Tachyon: Perfetto-format tracing for Rust programs.
#[derive(Debug, Parser)]
#[command(name = "tachyon", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Demo(commands::demo::Args),
    Query(commands::query::Args),
    Stats(commands::stats::Args),
    Record(commands::record::Args),
    Traced(commands::traced::Args),
    Symbolize(commands::symbolize::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let done = |r: Result<(), _>| r.map(|()| ExitCode::SUCCESS);
    let result = match cli.command {
        Command::Demo(args) => done(commands::demo::run(args)),
        Command::Query(args) => done(commands::query::run(args)),
        Command::Stats(args) => done(commands::stats::run(args)),
        // With a program to run, its exit status.
        Command::Record(args) => commands::record::run(args),
        Command::Traced(args) => done(commands::traced::run(args)),
        Command::Symbolize(args) => done(commands::symbolize::run(args)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tachyon: error: {e}");
            ExitCode::FAILURE
        }
    }
}

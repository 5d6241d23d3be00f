//! `tachyon query TRACE [SQL | -f FILE]`: run SQL against a trace, or open a shell.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use tachyon_processor::{is_complete_statement, TraceProcessor};

use crate::load::{load, Sort};
use crate::output::{render, Format};

/// Run SQL on a trace (Perfetto's table names: slice, thread, process, track, counter, args,
/// flow, stats, …). Without SQL, reads statements from stdin (end each with `;`).
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The trace file (Perfetto protobuf, optionally gzip-compressed).
    trace: PathBuf,
    /// The SQL to run; several statements may be separated by `;` (the last one's rows are
    /// printed).
    #[arg(conflicts_with = "file")]
    sql: Option<String>,
    /// Read the SQL from this file instead.
    #[arg(short = 'f', long = "file", value_name = "FILE.sql")]
    file: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// How events are sorted before import.
    #[arg(long, value_enum, default_value_t = Sort::Full)]
    sort: Sort,
}

pub(crate) fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let sql = match (&args.sql, &args.file) {
        (Some(sql), _) => Some(sql.clone()),
        (None, Some(f)) => {
            Some(std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?)
        }
        (None, None) => None,
    };
    let tp = load(&args.trace, args.sort)?;
    match sql {
        Some(sql) => {
            let result = tp.query(&sql)?;
            print!("{}", render(&result, args.format));
            Ok(())
        }
        None => shell(&tp, args.format),
    }
}

/// A line-based shell: statements end with `;`; `.quit` or end of input leaves. Errors are
/// printed and the shell goes on.
fn shell(tp: &TraceProcessor, format: Format) -> Result<(), Box<dyn std::error::Error>> {
    let interactive = std::io::stdin().is_terminal();
    let prompt = |pending: &str| {
        if interactive {
            eprint!(
                "{}",
                if pending.is_empty() {
                    "tachyon> "
                } else {
                    "    ...> "
                }
            );
            let _ = std::io::stderr().flush();
        }
    };
    if interactive {
        eprintln!("Enter SQL statements ending with `;` (.quit to leave).");
    }
    let mut pending = String::new();
    prompt(&pending);
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if pending.is_empty() && matches!(line.trim(), ".quit" | ".exit") {
            return Ok(());
        }
        pending.push_str(&line);
        pending.push('\n');
        if is_complete_statement(&pending) {
            match tp.query(&pending) {
                Ok(result) => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(render(&result, format).as_bytes())?;
                    out.flush()?;
                }
                Err(e) => eprintln!("error: {e}"),
            }
            pending.clear();
        }
        prompt(&pending);
    }
    if !pending.trim().is_empty() {
        // Input ended without a final `;`: run what is there rather than drop it.
        match tp.query(&pending) {
            Ok(result) => print!("{}", render(&result, format)),
            Err(e) => eprintln!("error: {e}"),
        }
    }
    Ok(())
}

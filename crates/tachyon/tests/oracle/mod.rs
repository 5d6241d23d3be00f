//! Perfetto's own trace processor as the oracle for Tachyon's traces and processor.
//!
//! [`perfetto_rows`] runs a query through `trace_processor_shell` (the `TRACE_PROCESSOR_SHELL`
//! environment variable, else the workspace's `../shared/tools/trace_processor_shell`) and
//! returns its CSV rows; [`our_rows`] gives the same query's rows from Tachyon's processor in
//! the same CSV form, so the two compare as strings. Tests skip the comparison (never fail)
//! when the tool is absent: it is built from Perfetto's sources and not on every machine.

// Shared by several test binaries, each using a part.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use tachyon_processor::{TraceProcessor, Value};

/// Perfetto's `trace_processor_shell`, if present (says so on stderr when it is not).
pub fn shell() -> Option<PathBuf> {
    let path = std::env::var_os("TRACE_PROCESSOR_SHELL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../../shared/tools/trace_processor_shell")
        });
    if path.is_file() {
        Some(path)
    } else {
        eprintln!("trace_processor_shell absent: comparison with Perfetto skipped");
        None
    }
}

/// `sql`'s result from Perfetto's processor on the trace file `trace`: the CSV lines after the
/// header (strings in `"`, inner quotes as they are; NULL as `[NULL]`). Panics with the tool's
/// stderr when it fails.
pub fn perfetto_rows_of_file(shell: &Path, trace: &Path, sql: &str) -> Vec<String> {
    let query = scratch(trace, "sql");
    std::fs::write(&query, format!("{sql};\n")).unwrap();
    let out = Command::new(shell)
        .arg("-q")
        .arg(&query)
        .arg(trace)
        .output()
        .unwrap();
    std::fs::remove_file(&query).ok();
    assert!(
        out.status.success(),
        "trace_processor_shell failed on {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The shell may print its own lines before the CSV; the header is the first quoted line.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip_while(|l| !l.starts_with('"'))
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// [`perfetto_rows_of_file`] for a trace in memory; `None` when the tool is absent.
pub fn perfetto_rows(trace: &[u8], sql: &str) -> Option<Vec<String>> {
    let shell = shell()?;
    let file = scratch(Path::new("trace"), "pftrace");
    std::fs::write(&file, trace).unwrap();
    let rows = perfetto_rows_of_file(&shell, &file, sql);
    std::fs::remove_file(&file).ok();
    Some(rows)
}

/// `sql`'s rows from Tachyon's processor, in the CSV form of [`perfetto_rows`].
pub fn our_rows(tp: &TraceProcessor, sql: &str) -> Vec<String> {
    tp.query(sql)
        .unwrap()
        .rows
        .iter()
        .map(|r| r.iter().map(csv).collect::<Vec<_>>().join(","))
        .collect()
}

/// One value as `trace_processor_shell` prints it in CSV.
fn csv(v: &Value) -> String {
    match v {
        Value::Integer(i) => i.to_string(),
        Value::Text(s) => format!("\"{s}\""),
        Value::Null => "[NULL]".into(),
        other => format!("{other:?}"),
    }
}

/// A file name of its own for this process and call, beside the test binary's scratch files.
fn scratch(near: &Path, ext: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let stem = near
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("oracle");
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{stem}-{}-{}.{ext}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

//! Helpers shared by the tests that run the built `tachyon` binary and read its traces back
//! (`tests/demo.rs`, `tests/system.rs`).

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

use tachyon_processor::{TraceProcessor, Value};

/// A command with none of the test environment's `TACHYON_*` variables.
pub(crate) fn clean_command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TACHYON_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A fresh, empty directory `name` under the target's temporary directory (short enough for
/// socket paths).
pub(crate) fn tmp_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The integer in the first column of the first row `sql` returns (panics otherwise).
pub(crate) fn int(tp: &TraceProcessor, sql: &str) -> i64 {
    let rows = tp.query(sql).unwrap_or_else(|e| panic!("{sql}: {e}")).rows;
    match rows.first().map(|r| &r[0]) {
        Some(Value::Integer(n)) => *n,
        other => panic!("{sql}: {other:?}"),
    }
}

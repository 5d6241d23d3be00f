//! Runs every example of this crate (cargo builds them before its tests) and reads the trace
//! each writes back with the trace processor: non-empty, and no error or data-loss stats. The
//! `crash` example, which dies on purpose, is run by `tests/crash.rs`.

use std::path::PathBuf;
use std::process::Command;

use tachyon_processor::{Options, TraceProcessor, Value};

/// `target/<profile>/examples`, next to this test's `deps` directory.
fn examples_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("examples")
}

fn count(tp: &TraceProcessor, sql: &str) -> i64 {
    match tp.query(sql).unwrap().rows.first().map(|r| &r[0]) {
        Some(Value::Integer(n)) => *n,
        other => panic!("{sql}: {other:?}"),
    }
}

#[test]
fn examples_run_and_write_clean_traces() {
    for name in [
        "quickstart",
        "counters",
        "flows",
        "threads",
        "memory",
        "callstacks",
        "instrumentation",
    ] {
        let exe = examples_dir().join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
        assert!(exe.is_file(), "{} is not built", exe.display());
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("example_{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = Command::new(&exe);
        cmd.current_dir(&dir);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TACHYON_") {
                cmd.env_remove(k);
            }
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {:?}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.starts_with("wrote "), "{name}: {text}");
        let trace = dir.join(format!("{name}.pftrace"));
        assert!(trace.is_file(), "{name}: no {}", trace.display());
        let tp = TraceProcessor::open(&trace, &Options::default()).unwrap();
        assert!(
            count(&tp, "SELECT count(*) FROM slice") + count(&tp, "SELECT count(*) FROM counter")
                > 0,
            "{name}: empty trace"
        );
        let bad = tp
            .query(
                "SELECT name, idx, severity, value FROM stats \
                 WHERE severity IN ('error', 'data_loss') AND value != 0",
            )
            .unwrap()
            .rows;
        assert!(bad.is_empty(), "{name}: {bad:?}");
    }
}

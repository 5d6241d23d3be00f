//! `TACHYON_CALLSTACK=8 tachyon demo` records stacks that the processor imports into
//! `stack_profile_callsite` / `stack_profile_frame` (symbolized at the end of the demo), and
//! `tachyon symbolize` / `tachyon stats --samples --callstacks` work on the result.

use std::path::PathBuf;
use std::process::Command;

use tachyon_processor::{Options, TraceProcessor, Value};

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("callstacks_cli");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn count(tp: &TraceProcessor, sql: &str) -> i64 {
    match tp.query(sql).unwrap().rows[0][0] {
        Value::Integer(n) => n,
        ref v => panic!("{sql}: {v:?}"),
    }
}

fn tachyon(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tachyon"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TACHYON_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd.args(args).envs(env.iter().copied()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "tachyon {args:?}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn demo_stacks_are_imported_symbolized_and_shown() {
    let trace = tmp("demo.pftrace");
    let t = trace.to_str().unwrap();
    let out = tachyon(
        &["demo", "--seconds", "0.3", "--threads", "2", "--out", t],
        &[("TACHYON_CALLSTACK", "8")],
    );
    assert!(out.contains("call stacks:"), "{out}");
    let tp = TraceProcessor::open(&trace, &Options::default()).unwrap();
    // Every zone and instant on a thread carries a stack of at most 8 frames.
    let with_stack = count(
        &tp,
        "SELECT count(*) FROM __intrinsic_track_event_callstacks",
    );
    assert!(with_stack > 10, "{with_stack}");
    // The count of zones depends on the machine's load; that none lacks a stack does not.
    // (Lock waits and log messages are Tachyon's own slices, in `tachyon.*` categories.)
    assert_eq!(
        count(
            &tp,
            "SELECT count(*) FROM slice s JOIN thread_track tt ON s.track_id = tt.id \
             LEFT JOIN __intrinsic_track_event_callstacks c ON c.slice_id = s.id \
             WHERE c.slice_id IS NULL AND coalesce(s.category, '') NOT LIKE 'tachyon.%'"
        ),
        0,
        "zones and instants without a stack"
    );
    assert!(count(&tp, "SELECT count(*) FROM stack_profile_callsite") > 8);
    assert_eq!(
        count(&tp, "SELECT max(depth) FROM stack_profile_callsite"),
        7,
        "8 frames deep"
    );
    assert!(count(&tp, "SELECT count(*) FROM stack_profile_frame") > 8);
    // Every callsite's frame and parent exist (the ids join).
    assert_eq!(
        count(
            &tp,
            "SELECT count(*) FROM stack_profile_callsite c \
             LEFT JOIN stack_profile_frame f ON f.id = c.frame_id \
             LEFT JOIN stack_profile_callsite p ON p.id = c.parent_id \
             WHERE f.id IS NULL OR (c.parent_id IS NOT NULL AND p.id IS NULL)"
        ),
        0
    );
    // Symbolized at the end of the demo: the demo's own functions are named.
    assert!(
        count(
            &tp,
            "SELECT count(*) FROM stack_profile_symbol WHERE name GLOB 'tachyon::demo::*'"
        ) > 0
    );
    let stats = tachyon(&["stats", "--callstacks", t], &[]);
    assert!(stats.contains("Zones by call stack"), "{stats}");
}

#[test]
fn symbolize_and_samples_view() {
    let raw = tmp("sampled.pftrace");
    let sym = tmp("sampled.sym.pftrace");
    tachyon(
        &[
            "demo",
            "--seconds",
            "0.3",
            "--threads",
            "1",
            "--out",
            raw.to_str().unwrap(),
        ],
        &[("TACHYON_SAMPLING_HZ", "1000"), ("TACHYON_SYMBOLIZE", "0")],
    );
    let out = tachyon(
        &["symbolize", raw.to_str().unwrap(), sym.to_str().unwrap()],
        &[],
    );
    assert!(out.contains("addresses symbolized"), "{out}");
    let stats = tachyon(&["stats", "--samples", sym.to_str().unwrap()], &[]);
    assert!(stats.contains("CPU samples:"), "{stats}");
    let tp = TraceProcessor::open(&sym, &Options::default()).unwrap();
    let samples = count(&tp, "SELECT count(*) FROM perf_sample");
    if samples > 0 {
        assert!(
            stats.contains("Top-down") && stats.contains("Bottom-up"),
            "{stats}"
        );
        assert_eq!(
            count(
                &tp,
                "SELECT count(*) FROM perf_sample WHERE callsite_id IS NULL"
            ),
            0
        );
    }
}

//! The `testdata/` corpus against Perfetto's own trace processor: for the queries listed here,
//! the expected `.csv` (which `tests/corpus.rs` holds Tachyon's output to) must also be what
//! `trace_processor_shell` prints for the same trace, so a blessed expectation cannot drift
//! away from Perfetto. The other queries of the corpus differ from Perfetto on purpose or in
//! ways `docs/difftests.md` lists (stats Perfetto does not keep, clock recovery, id numbering).
//!
//! The shell is `$TACHYON_TRACE_PROCESSOR_SHELL`, else `/work/shared/tools/trace_processor_shell`;
//! without one the test says so and passes.

mod common;

use std::path::{Path, PathBuf};

/// (case, query) pairs where Tachyon and Perfetto agree.
const AGREED: &[(&str, &str)] = &[
    ("annotation_names", "args"),
    ("args_nested", "args"),
    ("args_nested", "extract_arg"),
    ("callstacks", "events"),
    ("callstacks", "samples"),
    ("callstacks", "tables"),
    ("clock_incremental", "slice"),
    ("clock_incremental_descriptors", "slice"),
    ("clock_snapshot_sets", "slice"),
    ("counters", "counter"),
    ("counters", "tracks"),
    ("flows", "flow"),
    ("heap_profile", "allocations"),
    ("heap_profile", "profiles"),
    ("heap_profile", "stacks"),
    ("incremental_state", "slice"),
    ("legacy_async", "args"),
    ("legacy_async", "slice"),
    ("log_messages", "android_logs"),
    ("log_messages", "slice_args"),
    ("merged_tracks", "slices"),
    ("merged_tracks", "tracks"),
    ("process_tree", "process"),
    ("process_tree", "slice"),
    ("process_tree", "thread"),
    ("slices_threads", "instant"),
    ("slices_threads", "slice"),
    ("slices_threads", "tracks"),
    ("state_tracks", "args"),
    ("state_tracks", "state"),
    ("streaming_profile", "samples"),
    ("streaming_profile", "slices"),
    ("streaming_profile", "stats"),
    ("sys_stats", "counter"),
    ("sys_stats", "cpu_counter_track"),
    ("sys_stats", "dimensions"),
    ("sys_stats_sections", "counter"),
    ("sys_stats_sections", "cpu_counter_track"),
    ("sys_stats_sections", "dimensions"),
    ("trace_stats", "data_loss"),
    ("track_hierarchy", "slice"),
    ("track_hierarchy", "track"),
    ("process_stats", "counters"),
    ("process_stats", "dimensions"),
    ("process_stats", "process_args"),
    ("process_stats", "stats"),
    ("process_stats", "threads"),
];

fn shell() -> Option<PathBuf> {
    let path = std::env::var_os("TACHYON_TRACE_PROCESSOR_SHELL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/shared/tools/trace_processor_shell"));
    path.is_file().then_some(path)
}

/// Perfetto's diff-test normalization: leading blank lines dropped, lines trimmed.
fn normalize(text: &str) -> String {
    let lines: Vec<&str> = text
        .trim_start_matches('\n')
        .lines()
        .map(str::trim)
        .collect();
    lines.join("\n").trim_end().to_owned()
}

#[test]
#[cfg_attr(miri, ignore = "runs an external program")]
fn corpus_expectations_are_perfettos() {
    let Some(shell) = shell() else {
        eprintln!("skipped: no trace_processor_shell (set TACHYON_TRACE_PROCESSOR_SHELL)");
        return;
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = std::env::temp_dir().join(format!("tachyon-oracle-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut failures = Vec::new();
    for &(case, query) in AGREED {
        let dir = manifest.join("../../testdata").join(case);
        let text = std::fs::read_to_string(dir.join("trace.textproto")).unwrap();
        let trace = tmp.join(format!("{}.pb", case.replace('/', "_")));
        std::fs::write(&trace, common::text_trace(&text)).unwrap();
        let out = std::process::Command::new(&shell)
            .arg("-q")
            .arg(dir.join(format!("{query}.sql")))
            .arg(&trace)
            .output()
            .expect("run trace_processor_shell");
        let expected = std::fs::read_to_string(dir.join(format!("{query}.csv"))).unwrap();
        let actual = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || normalize(&actual) != normalize(&expected) {
            failures.push(format!(
                "{case}/{query}: trace_processor_shell printed\n{actual}{}\nexpected ({case}/{query}.csv)\n{expected}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

//! `--compare TRACE...`: the tables a user queries, through Tachyon's processor and through
//! Perfetto's `trace_processor_shell` (`--oracle`), on any trace (one Tachyon wrote, one from
//! Perfetto's tools), with the differences printed. Diff tests cover what Perfetto thought to
//! test; this covers what a given trace holds.

use std::path::Path;

/// (table, query): deterministic orders, columns both processors have. Internal timing stats
/// of Perfetto (`*_duration_ns`) are left out.
pub(crate) const QUERIES: &[(&str, &str)] = &[
    (
        "slice",
        "SELECT id, ts, dur, track_id, category, name, depth, parent_id FROM slice ORDER BY id",
    ),
    // Arg set ids are numbered differently (Perfetto's are args row ids): args are compared
    // through what they belong to.
    (
        "slice args",
        "SELECT s.id, a.flat_key, a.key, a.value_type, a.display_value \
         FROM slice s JOIN args a USING (arg_set_id) ORDER BY s.id, a.key",
    ),
    (
        "process args",
        "SELECT p.upid, a.key, a.value_type, a.display_value \
         FROM process p JOIN args a USING (arg_set_id) ORDER BY p.upid, a.key",
    ),
    (
        "track dimensions",
        "SELECT t.id, a.key, a.value_type, a.display_value \
         FROM track t JOIN args a ON a.arg_set_id = t.dimension_arg_set_id ORDER BY t.id, a.key",
    ),
    (
        "thread",
        "SELECT utid, tid, name, upid, is_main_thread FROM thread ORDER BY utid",
    ),
    (
        "process",
        "SELECT upid, pid, name, cmdline, parent_upid, uid, start_ts FROM process ORDER BY upid",
    ),
    (
        "track",
        "SELECT id, name, type, parent_id FROM track ORDER BY id",
    ),
    (
        "thread_track",
        "SELECT id, utid FROM thread_track ORDER BY id",
    ),
    (
        "process_track",
        "SELECT id, upid FROM process_track ORDER BY id",
    ),
    (
        "counter_track",
        "SELECT id, name, type, unit, parent_id FROM counter_track ORDER BY id",
    ),
    (
        "counter",
        "SELECT id, ts, track_id, value FROM counter ORDER BY id",
    ),
    (
        "flow",
        "SELECT slice_out, slice_in FROM flow ORDER BY slice_out, slice_in",
    ),
    (
        "android_logs",
        "SELECT ts, utid, prio, tag, msg FROM android_logs ORDER BY ts, utid, msg",
    ),
    (
        "heap_profile_allocation",
        "SELECT ts, upid, heap_name, callsite_id, count, size FROM heap_profile_allocation \
         ORDER BY id",
    ),
    (
        "stack_profile_mapping",
        "SELECT id, build_id, exact_offset, start_offset, start, end, load_bias, name \
         FROM stack_profile_mapping ORDER BY id",
    ),
    (
        "stack_profile_frame",
        "SELECT id, name, mapping, rel_pc FROM stack_profile_frame ORDER BY id",
    ),
    (
        "stack_profile_callsite",
        "SELECT id, depth, parent_id, frame_id FROM stack_profile_callsite ORDER BY id",
    ),
    (
        "cpu_profile_stack_sample",
        "SELECT ts, callsite_id, utid, process_priority FROM cpu_profile_stack_sample \
         ORDER BY ts, utid",
    ),
    (
        "perf_sample",
        "SELECT ts, utid, cpu, cpu_mode, callsite_id, unwind_error FROM perf_sample \
         ORDER BY ts, utid",
    ),
    (
        "trace_bounds",
        "SELECT start_ts, end_ts, trace_start(), trace_end(), trace_dur() FROM trace_bounds",
    ),
    (
        "stats",
        "SELECT name, idx, severity, source, value FROM stats WHERE value != 0 \
         AND name NOT GLOB '*_duration_ns' ORDER BY name, idx",
    ),
];

/// What one table gave on each side.
pub(crate) enum Outcome {
    Same {
        rows: usize,
    },
    Differs {
        first: usize,
        tachyon: String,
        oracle: String,
    },
    /// One side failed (e.g. a table the other does not have).
    Error {
        tachyon: Result<(), String>,
        oracle: Result<(), String>,
    },
}

/// Compares every table of [`QUERIES`] on `trace`.
pub(crate) fn compare(
    trace: &Path,
    oracle: &Path,
    tmp: &Path,
) -> Result<Vec<(&'static str, Outcome)>, String> {
    let bytes = std::fs::read(trace).map_err(|e| format!("{}: {e}", trace.display()))?;
    let mut out = Vec::new();
    for &(table, query) in QUERIES {
        let ours = crate::run_tachyon(&bytes, query).map(|s| crate::normalize(&s));
        let theirs = crate::run_oracle(oracle, &bytes, query, tmp).map(|s| crate::normalize(&s));
        let outcome = match (ours, theirs) {
            (Ok(a), Ok(b)) if a == b => Outcome::Same {
                rows: a.lines().count().saturating_sub(1),
            },
            (Ok(a), Ok(b)) => {
                let first = a
                    .lines()
                    .zip(b.lines())
                    .position(|(x, y)| x != y)
                    .unwrap_or_else(|| a.lines().count().min(b.lines().count()));
                Outcome::Differs {
                    first,
                    tachyon: a,
                    oracle: b,
                }
            }
            (a, b) => Outcome::Error {
                tachyon: a.map(drop),
                oracle: b.map(drop),
            },
        };
        out.push((table, outcome));
    }
    Ok(out)
}

/// Prints the comparison; `verbose` adds both sides' lines around the first difference.
pub(crate) fn report(trace: &Path, results: &[(&str, Outcome)], verbose: bool) -> usize {
    println!("== {}", trace.display());
    let mut differing = 0;
    for (table, outcome) in results {
        match outcome {
            Outcome::Same { rows } => println!("SAME  {table} ({rows} rows)"),
            Outcome::Differs {
                first,
                tachyon,
                oracle,
            } => {
                differing += 1;
                let (a, b): (Vec<&str>, Vec<&str>) =
                    (tachyon.lines().collect(), oracle.lines().collect());
                println!(
                    "DIFF  {table}: {} vs {} rows, first difference at line {}",
                    a.len().saturating_sub(1),
                    b.len().saturating_sub(1),
                    first + 1
                );
                if verbose {
                    let header = a.first().copied().unwrap_or_default();
                    println!("      {header}");
                    for i in *first..(*first + 5) {
                        if let Some(l) = a.get(i) {
                            println!("  T   {l}");
                        }
                        if let Some(l) = b.get(i) {
                            println!("  P   {l}");
                        }
                    }
                }
            }
            Outcome::Error { tachyon, oracle } => {
                differing += 1;
                let first_line = |r: &Result<(), String>| match r {
                    Ok(()) => "ok".to_owned(),
                    Err(e) => e.lines().next().unwrap_or_default().to_owned(),
                };
                println!(
                    "ERR   {table}: tachyon: {}; trace_processor_shell: {}",
                    first_line(tachyon),
                    first_line(oracle)
                );
            }
        }
    }
    differing
}

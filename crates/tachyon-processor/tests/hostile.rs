//! Hostile inputs found by hand and by the fuzz targets (`fuzz/fuzz_targets/import*.rs`): each
//! must import (with the problem counted in `stats`) or be refused with an error, never panic.

use tachyon_processor::{Options, SortMode, TraceProcessor};

/// Imports `bytes` in both sorting modes, runs the queries `tachyon stats` runs and returns the
/// non-zero stats of the full-sort import as (name, value).
fn import(bytes: &[u8]) -> Vec<(String, i64)> {
    let mut stats = Vec::new();
    for sort in [SortMode::Windowed, SortMode::Full] {
        let tp = TraceProcessor::from_bytes(bytes, &Options::with_sort(sort)).expect("imports");
        tp.zone_stats().expect("zone stats");
        tp.query("SELECT count(*), sum(dur) FROM slice")
            .expect("slice");
        let r = tp
            .query("SELECT name, value FROM stats WHERE value != 0 ORDER BY name")
            .expect("stats");
        stats = r
            .rows
            .into_iter()
            .map(|row| match (&row[0], &row[1]) {
                (tachyon_processor::Value::Text(n), tachyon_processor::Value::Integer(v)) => {
                    (n.clone(), *v)
                }
                other => panic!("{other:?}"),
            })
            .collect();
    }
    stats
}

fn has(stats: &[(String, i64)], name: &str) -> bool {
    stats.iter().any(|(n, v)| n == name && *v > 0)
}

/// One packet holding an empty ClockSnapshot (`0a 02 32 00`) used to index an empty series.
#[test]
fn empty_clock_snapshot() {
    let stats = import(&[0x0a, 0x02, 0x32, 0x00]);
    assert!(has(&stats, "invalid_clock_snapshots"), "{stats:?}");
}

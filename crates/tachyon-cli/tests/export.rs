//! `tachyon export --format parquet`: two real `tachyon demo` traces and a missing file are
//! exported; the Parquet files are read back with the `parquet` crate's record reader (not the
//! Arrow path the writer uses) and compared, table by table and value by value, with what
//! `tachyon query` and the processor return for the same traces. DuckDB, when its Python package
//! is installed, reads them too (an extra check that is skipped otherwise).

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{clean_command, int, tmp_dir};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use tachyon_processor::{Options, TraceProcessor, Value};

const BIN: &str = env!("CARGO_BIN_EXE_tachyon");
const TABLES: &[&str] = &[
    "slice", "thread", "process", "track", "counter", "args", "flow", "stats",
];

fn tachyon(args: &[&str], dir: &Path) -> Output {
    let out = clean_command(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run tachyon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    out
}

/// Two short demo traces recorded in `dir`.
fn demo_traces(dir: &Path) -> [PathBuf; 2] {
    ["a.pftrace", "b.pftrace"].map(|name| {
        let out = tachyon(
            &["demo", "--seconds", "0.2", "--threads", "2", "--out", name],
            dir,
        );
        assert!(out.status.success(), "{out:?}");
        dir.join(name)
    })
}

/// The rows of a Parquet file as (column names, rows), read with the record reader.
fn read_parquet(path: &Path) -> (Vec<String>, Vec<Vec<Field>>) {
    let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
    let columns = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    let rows = reader
        .get_row_iter(None)
        .unwrap()
        .map(|r| {
            r.unwrap()
                .get_column_iter()
                .map(|(_, f)| f.clone())
                .collect()
        })
        .collect();
    (columns, rows)
}

/// Whether a Parquet value is the SQL value (integers as Int64, reals as Float64, text as
/// Utf8, NULL as null).
fn same(field: &Field, value: &Value) -> bool {
    match (field, value) {
        (Field::Null, Value::Null) => true,
        (Field::Long(a), Value::Integer(b)) => a == b,
        (Field::Double(a), Value::Real(b)) => a.to_bits() == b.to_bits(),
        (Field::Double(a), Value::Integer(b)) => *a == *b as f64,
        (Field::Str(a), Value::Text(b)) => a == b,
        (Field::Bytes(a), Value::Blob(b)) => a.data() == b.as_slice(),
        _ => false,
    }
}

/// `SELECT count(*) FROM table` through `tachyon query`.
fn query_count(trace: &Path, table: &str, dir: &Path) -> usize {
    let out = tachyon(
        &[
            "query",
            trace.to_str().unwrap(),
            &format!("SELECT count(*) FROM {table}"),
            "--format",
            "csv",
        ],
        dir,
    );
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines().nth(1).unwrap().trim().parse().unwrap()
}

/// Checks every standard table of `out_dir` against the traces (`traces[i]` is `trace_id` i,
/// `None` for a trace that must have no rows).
fn check_tables(out_dir: &Path, traces: &[Option<&Path>], dir: &Path) {
    for table in TABLES {
        let (columns, rows) = read_parquet(&out_dir.join(format!("{table}.parquet")));
        assert_eq!(columns[0], "trace_id", "{table}");
        let mut by_trace: BTreeMap<i64, Vec<&[Field]>> = BTreeMap::new();
        for row in &rows {
            let Field::Long(id) = row[0] else {
                panic!("{table}: trace_id {:?}", row[0])
            };
            by_trace.entry(id).or_default().push(&row[1..]);
        }
        for (id, trace) in traces.iter().enumerate() {
            let got = by_trace.remove(&(id as i64)).unwrap_or_default();
            let Some(trace) = trace else {
                assert!(got.is_empty(), "{table}: rows for failed trace {id}");
                continue;
            };
            assert_eq!(
                got.len(),
                query_count(trace, table, dir),
                "{table} trace {id}"
            );
            let tp = TraceProcessor::open(trace, &Options::default()).unwrap();
            let want = tp.query(&format!("SELECT * FROM {table}")).unwrap();
            let names: Vec<&str> = want
                .columns
                .iter()
                .map(|c| if c == "trace_id" { "orig_trace_id" } else { c })
                .collect();
            assert_eq!(&columns[1..], names.as_slice(), "{table}");
            for (g, w) in got.iter().zip(&want.rows) {
                for ((f, v), name) in g.iter().zip(w).zip(&names) {
                    assert!(same(f, v), "{table}.{name} trace {id}: {f:?} != {v:?}");
                }
            }
        }
        assert!(by_trace.is_empty(), "{table}: unknown trace ids");
    }
}

#[test]
fn export_matches_query_and_reports_a_failed_trace() {
    let dir = tmp_dir("export-parquet");
    let [a, b] = demo_traces(&dir);
    let missing = dir.join("missing.pftrace");
    let out_dir = dir.join("out");
    let out = tachyon(
        &[
            "export",
            "--format",
            "parquet",
            out_dir.to_str().unwrap(),
            a.to_str().unwrap(),
            missing.to_str().unwrap(),
            b.to_str().unwrap(),
        ],
        &dir,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a failed trace must fail the command"
    );
    assert!(stderr.contains("missing.pftrace"), "{stderr}");
    assert!(stderr.contains("1 of 3 traces failed"), "{stderr}");

    // The demo traces have slices, args and counters: the comparison is not vacuous.
    let tp = TraceProcessor::open(&a, &Options::default()).unwrap();
    for table in ["slice", "args", "thread", "counter"] {
        assert!(
            int(&tp, &format!("SELECT count(*) FROM {table}")) > 0,
            "{table}"
        );
    }
    check_tables(&out_dir, &[Some(&a), None, Some(&b)], &dir);

    let (columns, rows) = read_parquet(&out_dir.join("traces.parquet"));
    assert_eq!(columns, ["trace_id", "path", "error"]);
    assert_eq!(rows.len(), 3);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row[0], Field::Long(i as i64));
        let Field::Str(path) = &row[1] else {
            panic!("{row:?}")
        };
        assert!(path.ends_with([&a, &missing, &b][i].file_name().unwrap().to_str().unwrap()));
        match (i, &row[2]) {
            (1, Field::Str(e)) => assert!(e.contains("missing.pftrace"), "{e}"),
            (0 | 2, Field::Null) => {}
            other => panic!("{other:?}"),
        }
    }
    // No temporary files are left behind.
    for entry in std::fs::read_dir(&out_dir).unwrap() {
        let name = entry.unwrap().file_name();
        assert!(name.to_str().unwrap().ends_with(".parquet"), "{name:?}");
    }

    duckdb_check(&out_dir, &a);

    // An export into the same directory replaces the table files; one it does not write is
    // removed rather than left stale.
    let stale = out_dir.join("perf_sample.parquet");
    std::fs::copy(out_dir.join("slice.parquet"), &stale).unwrap();
    let out = tachyon(
        &["export", out_dir.to_str().unwrap(), b.to_str().unwrap()],
        &dir,
    );
    assert!(out.status.success(), "{out:?}");
    // The processor has every optional table now, so the file is rewritten from the trace
    // (the copy of `slice` is gone either way).
    assert!(
        !stale.exists()
            || std::fs::read(&stale).unwrap()
                != std::fs::read(out_dir.join("slice.parquet")).unwrap()
    );
    check_tables(&out_dir, &[Some(&b)], &dir);

    // --fail-fast: stops at the missing trace; what came before is still exported.
    assert!(query_count(&a, "slice", &dir) > 100);
    let out_dir = dir.join("out-fail-fast");
    let out = tachyon(
        &[
            "export",
            "--fail-fast",
            // Pages smaller than the tables: rows must come out whole and in order.
            "--page-rows",
            "100",
            out_dir.to_str().unwrap(),
            a.to_str().unwrap(),
            missing.to_str().unwrap(),
            b.to_str().unwrap(),
        ],
        &dir,
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 not attempted"));
    check_tables(&out_dir, &[Some(&a)], &dir);
    assert_eq!(read_parquet(&out_dir.join("traces.parquet")).1.len(), 2);
}

/// DuckDB, when installed, reads the files: its per-trace slice count and total duration
/// match the processor's.
fn duckdb_check(out_dir: &Path, a: &Path) {
    let probe = std::process::Command::new("python3")
        .args(["-c", "import duckdb"])
        .output();
    if !matches!(probe, Ok(o) if o.status.success()) {
        eprintln!("skipping the DuckDB check: python3 -c 'import duckdb' failed");
        return;
    }
    let script = format!(
        "import duckdb\n\
         r = duckdb.sql(\"SELECT count(*), sum(s.dur), min(t.path) FROM '{dir}/slice.parquet' s \
         JOIN '{dir}/traces.parquet' t USING (trace_id) WHERE trace_id = 0\").fetchall()[0]\n\
         print(r[0], r[1], r[2])\n",
        dir = out_dir.display()
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut parts = text.split_whitespace();
    let count: i64 = parts.next().unwrap().parse().unwrap();
    let total: i64 = parts.next().unwrap().parse().unwrap();
    let path = parts.next().unwrap();
    let tp = TraceProcessor::open(a, &Options::default()).unwrap();
    let want = tp
        .query("SELECT count(*), sum(dur) FROM slice")
        .unwrap()
        .rows;
    assert_eq!(
        want[0],
        [Value::Integer(count), Value::Integer(total)],
        "DuckDB vs processor"
    );
    assert!(path.ends_with("a.pftrace"), "{path}");
}

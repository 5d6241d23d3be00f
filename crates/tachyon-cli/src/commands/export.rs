//! `tachyon export --format parquet OUTDIR TRACE...`: the processor's standard tables from many
//! traces as one Parquet file per table, for DuckDB, DataFusion or Spark.
//!
//! Layout: `OUTDIR/<table>.parquet` holds the rows of that table from every trace, with a leading
//! `trace_id` column (the trace's position on the command line, from 0); `OUTDIR/traces.parquet`
//! maps each `trace_id` to its file and, for a trace that failed, the error. A table's own column
//! named `trace_id` (`flow.trace_id`, `stats.trace_id`) is exported as `orig_trace_id`.
//!
//! The tables are read through the processor's SQL surface only (`SELECT * FROM <table>` and
//! `PRAGMA table_info`), so the export does not depend on how the processor stores them. A
//! column's Arrow type comes from its declared SQL type by SQLite's affinity rules (INT → Int64,
//! REAL/FLOAT/DOUBLE → Float64, CHAR/CLOB/TEXT → Utf8, BLOB → Binary); a column without one (an
//! expression in a view) takes its type from the first trace's values, or when they are all
//! NULL from Perfetto's column naming (ids, timestamps and durations are Int64, others Utf8). The schema of a table is
//! fixed by the first trace that has it; later traces' values are converted to it where that
//! is exact (an integer into a Float64 or Utf8 column) and are an error otherwise. NULLs stay NULL.
//!
//! A trace that fails to load or export is reported on stderr and recorded in `traces.parquet`;
//! the other traces are still exported, none of its rows are written, and the command exits
//! non-zero at the end. `--fail-fast` stops at the first failure instead (the files then hold the
//! traces before it).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, Float64Builder, Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use tachyon_processor::{TraceProcessor, Value};

use crate::load::{load, Sort};

/// Export traces' tables as Parquet files with a `trace_id` column (for DuckDB, DataFusion, …).
///
/// One file per table holds the rows of all the traces (`OUTDIR/slice.parquet`, …);
/// `OUTDIR/traces.parquet` maps `trace_id` (the trace's position, from 0) to the trace file
/// and the error of a trace that failed. Tables: slice, thread, process, track, counter, args,
/// flow, stats, and when the processor has them thread_track, process_track, counter_track
/// and the heap profile, sample, stack_profile and android_logs tables. A trace that fails is reported, the
/// others are still exported, and the exit status is non-zero (`--fail-fast` stops at the
/// first failure).
///
/// Examples:
///   tachyon export --format parquet out/ a.pftrace b.pftrace
///   duckdb -c "SELECT trace_id, name, count(*) FROM 'out/slice.parquet' GROUP BY ALL"
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub(crate) struct Args {
    /// The output format.
    #[arg(long, value_enum, default_value_t = ExportFormat::Parquet)]
    format: ExportFormat,
    /// The directory the files are written to (created if missing; the table files of an
    /// earlier export there are replaced or removed).
    #[arg(value_name = "OUTDIR")]
    out_dir: PathBuf,
    /// The trace files (Perfetto protobuf, optionally gzip-compressed).
    #[arg(required = true, value_name = "TRACE")]
    traces: Vec<PathBuf>,
    /// Stop at the first trace that fails instead of exporting the rest.
    #[arg(long)]
    fail_fast: bool,
    /// How events are sorted before import.
    #[arg(long, value_enum, default_value_t = Sort::Full)]
    sort: Sort,
    /// Rows read from the processor per query (tests use a small page to exercise paging).
    #[arg(long, hide = true, default_value_t = 262_144,
          value_parser = clap::value_parser!(u32).range(1..))]
    page_rows: u32,
}

/// `--format`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum ExportFormat {
    /// Apache Parquet (Snappy-compressed), one file per table.
    Parquet,
}

/// Tables every trace has: a failure to read one is a failure of the trace.
const STANDARD_TABLES: &[&str] = &[
    "slice", "thread", "process", "track", "counter", "args", "flow", "stats",
];

/// Tables exported when the processor has them (absent ones are skipped).
const OPTIONAL_TABLES: &[&str] = &[
    "thread_track",
    "process_track",
    "counter_track",
    "heap_profile_allocation",
    "perf_sample",
    "cpu_profile_stack_sample",
    "stack_profile_mapping",
    "stack_profile_frame",
    "stack_profile_callsite",
    "stack_profile_symbol",
    "android_logs",
];

/// The column every exported table starts with, and the name a table's own `trace_id` column
/// is given instead.
const TRACE_ID: &str = "trace_id";
const ORIG_TRACE_ID: &str = "orig_trace_id";

type BoxError = Box<dyn std::error::Error>;

pub(crate) fn run(args: Args) -> Result<(), BoxError> {
    let ExportFormat::Parquet = args.format;
    std::fs::create_dir_all(&args.out_dir)
        .map_err(|e| format!("{}: {e}", args.out_dir.display()))?;
    let mut tables: BTreeMap<&'static str, TableOut> = BTreeMap::new();
    let mut traces: Vec<(i64, String, Option<String>)> = Vec::new();
    let mut failed = 0usize;
    for (i, path) in args.traces.iter().enumerate() {
        let trace_id = i as i64;
        let shown = std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.clone())
            .display()
            .to_string();
        let result = load(path, args.sort).and_then(|tp| {
            let batches = read_trace(&tp, trace_id, args.page_rows as usize, &mut tables)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            // Written only once every table of the trace converted, so a failed trace
            // leaves no rows behind.
            for (table, batch) in batches {
                let out = tables.get_mut(table).expect("schema made by read_trace");
                out.write(&args.out_dir, table, &batch)?;
            }
            Ok(())
        });
        match result {
            Ok(()) => traces.push((trace_id, shown, None)),
            Err(e) => {
                eprintln!("tachyon: error: {e}");
                failed += 1;
                traces.push((trace_id, shown, Some(e.to_string())));
                if args.fail_fast {
                    break;
                }
            }
        }
    }
    let mut written = Vec::new();
    for (table, out) in tables {
        if let Some(rows) = out.finish(&args.out_dir, table)? {
            println!("{}\t{rows} rows", out_path(&args.out_dir, table).display());
            written.push(table);
        }
    }
    // A table file of an earlier export that this one did not write would otherwise read as
    // part of it.
    for table in STANDARD_TABLES.iter().chain(OPTIONAL_TABLES) {
        let path = out_path(&args.out_dir, table);
        if !written.contains(table) && path.exists() {
            std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    write_traces(&args.out_dir, &traces)?;
    println!(
        "{}\t{} traces",
        out_path(&args.out_dir, "traces").display(),
        traces.len()
    );
    if failed > 0 {
        let skipped = args.traces.len() - traces.len();
        let mut msg = format!("{failed} of {} traces failed to export", args.traces.len());
        if skipped > 0 {
            msg.push_str(&format!(" ({skipped} not attempted: --fail-fast)"));
        }
        return Err(msg.into());
    }
    Ok(())
}

fn out_path(dir: &Path, table: &str) -> PathBuf {
    dir.join(format!("{table}.parquet"))
}

/// Reads every exported table of one trace into a record batch, fixing a table's schema the
/// first time it is seen.
fn read_trace(
    tp: &TraceProcessor,
    trace_id: i64,
    page_rows: usize,
    tables: &mut BTreeMap<&'static str, TableOut>,
) -> Result<Vec<(&'static str, RecordBatch)>, BoxError> {
    let mut batches = Vec::new();
    let all = STANDARD_TABLES
        .iter()
        .map(|t| (*t, true))
        .chain(OPTIONAL_TABLES.iter().map(|t| (*t, false)));
    for (table, required) in all {
        let mut offset = 0;
        loop {
            // Pages bound the memory of the SQL values in flight; the converted Arrow columns
            // are compact.
            let sql = format!("SELECT * FROM {table} LIMIT {page_rows} OFFSET {offset}");
            let page = match tp.query(&sql) {
                Ok(page) => page,
                // The processor does not have this optional table.
                Err(e) if !required && offset == 0 && e.to_string().contains("no such table") => {
                    break
                }
                Err(e) => return Err(format!("table {table}: {e}").into()),
            };
            let out = match tables.get(table) {
                Some(out) => out,
                None => {
                    let declared = declared_types(tp, table)?;
                    let out = TableOut::new(&page.columns, &declared, &page.rows);
                    tables.entry(table).or_insert(out)
                }
            };
            let batch = out
                .batch(trace_id, &page.columns, &page.rows)
                .map_err(|e| format!("table {table}: {e}"))?;
            batches.push((table, batch));
            if page.rows.len() < page_rows {
                break;
            }
            offset += page_rows;
        }
    }
    Ok(batches)
}

/// Declared SQL types by column name, from `PRAGMA table_info` (empty for an expression).
fn declared_types(tp: &TraceProcessor, table: &str) -> Result<BTreeMap<String, String>, BoxError> {
    let info = tp.query(&format!("PRAGMA table_info({table})"))?;
    let col = |name: &str| info.columns.iter().position(|c| c == name);
    let (Some(name), Some(ty)) = (col("name"), col("type")) else {
        return Ok(BTreeMap::new());
    };
    Ok(info
        .rows
        .iter()
        .filter_map(|r| match (&r[name], &r[ty]) {
            (Value::Text(n), Value::Text(t)) => Some((n.clone(), t.clone())),
            _ => None,
        })
        .collect())
}

/// The Arrow type for a declared SQL type, by SQLite's affinity rules; `None` when the type
/// does not decide it (no declared type, or NUMERIC affinity).
fn affinity_type(declared: &str) -> Option<DataType> {
    let d = declared.to_ascii_uppercase();
    if d.contains("INT") {
        Some(DataType::Int64)
    } else if d.contains("CHAR") || d.contains("CLOB") || d.contains("TEXT") {
        Some(DataType::Utf8)
    } else if d.contains("BLOB") {
        Some(DataType::Binary)
    } else if d.contains("REAL") || d.contains("FLOA") || d.contains("DOUB") {
        Some(DataType::Float64)
    } else {
        None
    }
}

/// The Arrow type for a column without a deciding declared type, from its values: text wins
/// (numbers convert to it exactly), then reals (integers widen), then integers, then blobs. An
/// all-NULL column is Int64 when Perfetto's naming makes it an id, timestamp or duration
/// (`id`, `*_id`, `utid`, `upid`, `ts`, `*_ts`, `dur`, `*_dur`: e.g. `counter_track.parent_id`,
/// a `NULL AS parent_id` in the view), so joins on it work; otherwise Utf8, the type every
/// other value converts to.
fn inferred_type(name: &str, rows: &[Vec<Value>], col: usize) -> DataType {
    let (mut int, mut real, mut blob) = (false, false, false);
    for row in rows {
        match row[col] {
            Value::Text(_) => return DataType::Utf8,
            Value::Real(_) => real = true,
            Value::Integer(_) => int = true,
            Value::Blob(_) => blob = true,
            Value::Null => {}
        }
    }
    match (real, int, blob) {
        (true, _, _) => DataType::Float64,
        (false, true, _) => DataType::Int64,
        (false, false, true) => DataType::Binary,
        _ if is_integer_name(name) => DataType::Int64,
        _ => DataType::Utf8,
    }
}

/// Whether Perfetto's column naming makes `name` an integer: an id, a timestamp or a duration.
fn is_integer_name(name: &str) -> bool {
    matches!(name, "id" | "utid" | "upid" | "ts" | "dur")
        || ["_id", "_ts", "_dur"].iter().any(|s| name.ends_with(s))
}

/// One table's output: its schema (fixed by the first trace that has it) and, once rows are
/// written, its Parquet writer on a temporary file renamed into place at the end.
struct TableOut {
    /// The table's SQL column names, in order (without `trace_id`).
    columns: Vec<String>,
    schema: SchemaRef,
    writer: Option<ArrowWriter<File>>,
    rows: u64,
}

impl TableOut {
    fn new(columns: &[String], declared: &BTreeMap<String, String>, rows: &[Vec<Value>]) -> Self {
        let mut fields = vec![Field::new(TRACE_ID, DataType::Int64, false)];
        for (i, name) in columns.iter().enumerate() {
            let ty = declared
                .get(name)
                .and_then(|d| affinity_type(d))
                .unwrap_or_else(|| inferred_type(name, rows, i));
            let name = if name == TRACE_ID {
                ORIG_TRACE_ID
            } else {
                name
            };
            fields.push(Field::new(name, ty, true));
        }
        TableOut {
            columns: columns.to_vec(),
            schema: Arc::new(Schema::new(fields)),
            writer: None,
            rows: 0,
        }
    }

    /// Converts one trace's rows to a batch of this table's schema.
    fn batch(
        &self,
        trace_id: i64,
        columns: &[String],
        rows: &[Vec<Value>],
    ) -> Result<RecordBatch, String> {
        if columns != self.columns.as_slice() {
            return Err(format!(
                "columns {columns:?} differ from the earlier traces' {:?}",
                self.columns
            ));
        }
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len() + 1);
        arrays.push(Arc::new(Int64Array::from(vec![trace_id; rows.len()])));
        for (i, field) in self.schema.fields().iter().skip(1).enumerate() {
            let values = rows.iter().map(|r| &r[i]);
            let err = |v: &Value| {
                format!(
                    "column {}: {v:?} does not convert to {}",
                    columns[i],
                    field.data_type()
                )
            };
            let array: ArrayRef = match field.data_type() {
                DataType::Int64 => {
                    let mut b = Int64Builder::with_capacity(rows.len());
                    for v in values {
                        b.append_option(match v {
                            Value::Null => None,
                            Value::Integer(n) => Some(*n),
                            // SQLite stores an integral REAL in an INTEGER column as an integer;
                            // accept the same exact conversion.
                            Value::Real(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => {
                                Some(*f as i64)
                            }
                            other => return Err(err(other)),
                        });
                    }
                    Arc::new(b.finish())
                }
                DataType::Float64 => {
                    let mut b = Float64Builder::with_capacity(rows.len());
                    for v in values {
                        b.append_option(match v {
                            Value::Null => None,
                            Value::Real(f) => Some(*f),
                            Value::Integer(n) => Some(*n as f64),
                            other => return Err(err(other)),
                        });
                    }
                    Arc::new(b.finish())
                }
                DataType::Utf8 => {
                    let mut b = StringBuilder::new();
                    for v in values {
                        match v {
                            Value::Null => b.append_null(),
                            Value::Text(s) => b.append_value(s),
                            Value::Integer(n) => b.append_value(n.to_string()),
                            Value::Real(f) => b.append_value(f.to_string()),
                            other => return Err(err(other)),
                        }
                    }
                    Arc::new(b.finish())
                }
                DataType::Binary => {
                    let mut b = BinaryBuilder::new();
                    for v in values {
                        match v {
                            Value::Null => b.append_null(),
                            Value::Blob(bytes) => b.append_value(bytes),
                            Value::Text(s) => b.append_value(s.as_bytes()),
                            other => return Err(err(other)),
                        }
                    }
                    Arc::new(b.finish())
                }
                other => unreachable!("export makes no {other} columns"),
            };
            arrays.push(array);
        }
        RecordBatch::try_new(self.schema.clone(), arrays).map_err(|e| e.to_string())
    }

    fn write(&mut self, dir: &Path, table: &str, batch: &RecordBatch) -> Result<(), BoxError> {
        let writer = match &mut self.writer {
            Some(w) => w,
            None => self
                .writer
                .insert(new_writer(dir, table, self.schema.clone())?),
        };
        writer.write(batch)?;
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    /// Closes the file and moves it into place; `None` if no trace's rows were written.
    fn finish(self, dir: &Path, table: &str) -> Result<Option<u64>, BoxError> {
        let Some(writer) = self.writer else {
            return Ok(None);
        };
        writer.close()?;
        let path = out_path(dir, table);
        std::fs::rename(tmp_path(dir, table), &path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Some(self.rows))
    }
}

/// `traces.parquet`: `trace_id`, the trace file's path, and the error for a trace that failed
/// (NULL for one that was exported).
fn write_traces(dir: &Path, traces: &[(i64, String, Option<String>)]) -> Result<(), BoxError> {
    let schema = Arc::new(Schema::new(vec![
        Field::new(TRACE_ID, DataType::Int64, false),
        Field::new("path", DataType::Utf8, false),
        Field::new("error", DataType::Utf8, true),
    ]));
    let ids = Int64Array::from_iter_values(traces.iter().map(|t| t.0));
    let mut paths = StringBuilder::new();
    let mut errors = StringBuilder::new();
    for (_, path, error) in traces {
        paths.append_value(path);
        errors.append_option(error.as_deref());
    }
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(ids),
            Arc::new(paths.finish()),
            Arc::new(errors.finish()),
        ],
    )?;
    let mut writer = new_writer(dir, "traces", schema)?;
    writer.write(&batch)?;
    writer.close()?;
    let path = out_path(dir, "traces");
    std::fs::rename(tmp_path(dir, "traces"), &path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}

fn tmp_path(dir: &Path, table: &str) -> PathBuf {
    dir.join(format!(".{table}.parquet.tmp"))
}

fn new_writer(dir: &Path, table: &str, schema: SchemaRef) -> Result<ArrowWriter<File>, BoxError> {
    let path = tmp_path(dir, table);
    let file = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    Ok(ArrowWriter::try_new(file, schema, Some(props))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type};
    use arrow_array::Array;

    fn cols(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn declared_types_follow_sqlite_affinity() {
        assert_eq!(affinity_type("INTEGER"), Some(DataType::Int64));
        assert_eq!(affinity_type("bigint"), Some(DataType::Int64));
        assert_eq!(affinity_type("VARCHAR(10)"), Some(DataType::Utf8));
        assert_eq!(affinity_type("TEXT"), Some(DataType::Utf8));
        assert_eq!(affinity_type("DOUBLE PRECISION"), Some(DataType::Float64));
        assert_eq!(affinity_type("REAL"), Some(DataType::Float64));
        assert_eq!(affinity_type("BLOB"), Some(DataType::Binary));
        assert_eq!(affinity_type(""), None);
        assert_eq!(affinity_type("NUMERIC"), None);
    }

    #[test]
    fn undeclared_columns_take_the_type_every_value_converts_to() {
        use Value::*;
        let rows = vec![
            vec![Integer(1), Integer(1), Null, Null, Null],
            vec![Real(0.5), Text("x".into()), Null, Integer(2), Null],
        ];
        assert_eq!(inferred_type("a", &rows, 0), DataType::Float64);
        assert_eq!(inferred_type("a", &rows, 1), DataType::Utf8);
        assert_eq!(inferred_type("display_value", &rows, 2), DataType::Utf8);
        assert_eq!(inferred_type("a", &rows, 3), DataType::Int64);
        assert_eq!(inferred_type("parent_id", &rows, 4), DataType::Int64);
        assert_eq!(inferred_type("utid", &rows, 4), DataType::Int64);
        assert_eq!(inferred_type("thread_ts", &rows, 4), DataType::Int64);
        // Values decide over the name.
        assert_eq!(inferred_type("parent_id", &rows, 1), DataType::Utf8);
    }

    #[test]
    fn batches_keep_nulls_and_convert_only_exactly() {
        use Value::*;
        let columns = cols(&["id", "value", "name", "trace_id"]);
        let declared: BTreeMap<String, String> = [
            ("id", "INTEGER"),
            ("value", "REAL"),
            ("name", "TEXT"),
            ("trace_id", "INTEGER"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        let rows = vec![
            vec![Integer(7), Integer(3), Text("a".into()), Null],
            vec![Null, Real(1.5), Null, Integer(9)],
        ];
        let out = TableOut::new(&columns, &declared, &rows);
        let names: Vec<&str> = out
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(names, ["trace_id", "id", "value", "name", "orig_trace_id"]);
        let batch = out.batch(4, &columns, &rows).unwrap();
        assert_eq!(
            batch.column(0).as_primitive::<Int64Type>().values(),
            &[4, 4]
        );
        let id = batch.column(1).as_primitive::<Int64Type>();
        assert_eq!((id.value(0), id.is_null(1)), (7, true));
        let value = batch.column(2).as_primitive::<Float64Type>();
        assert_eq!((value.value(0), value.value(1)), (3.0, 1.5));
        let name = batch.column(3).as_string::<i32>();
        assert_eq!((name.value(0), name.is_null(1)), ("a", true));

        // Text in an integer column, a fractional real in one, or other columns: errors.
        let bad = vec![vec![Text("x".into()), Null, Null, Null]];
        assert!(out.batch(0, &columns, &bad).is_err());
        let bad = vec![vec![Real(0.5), Null, Null, Null]];
        assert!(out.batch(0, &columns, &bad).is_err());
        assert!(out.batch(0, &cols(&["id"]), &[]).is_err());
    }
}

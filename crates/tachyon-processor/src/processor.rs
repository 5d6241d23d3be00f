//! The public API: import options, [`TraceProcessor`] and query results.

use std::path::Path;

use crate::storage::stats;
use crate::tokenize::{self, Tokenizer};
use crate::{crashes, memory, sql, zones, Crash, Error, ZoneStats};

/// How events are ordered by timestamp before they are parsed into tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortMode {
    /// Sort everything at the end of the file (Perfetto's `--full-sort`). Never drops events.
    #[default]
    Full,
    /// Perfetto's incremental extraction for `write_into_file` traces: events are sorted and
    /// parsed batch by batch at `read_tracing_buffers_completed` service events (after two
    /// flushes). Uses less time before the first rows appear; an event arriving after later
    /// events were parsed is dropped and counted in `sorter_push_event_out_of_order`.
    Windowed,
}

/// Import options.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Options {
    /// The sorting mode.
    pub sort: SortMode,
    /// The largest a gzip-compressed trace file may inflate to: a larger one (a "gzip bomb",
    /// or a trace too big to import in memory anyway) is refused with [`Error::TooLarge`]
    /// instead of exhausting memory. Default: 16 GiB.
    pub max_inflated_bytes: u64,
    /// Drop TrackEvents before the range of interest a producer declared
    /// (`TracePacket.track_event_range_of_interest`), as trace_processor's
    /// `--crop-track-events`. Default: off (keep everything).
    pub crop_track_events: bool,
    /// The most memory the import may need, in bytes: a trace whose estimated peak is larger
    /// is refused with [`Error::OutOfMemory`] before the import starts. `None` (the default):
    /// the memory available on this machine (`MemAvailable`, or the cgroup's limit).
    pub memory_limit: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sort: SortMode::default(),
            max_inflated_bytes: 16 << 30,
            crop_track_events: false,
            memory_limit: None,
        }
    }
}

impl Options {
    /// Options with the given sorting mode.
    pub fn with_sort(sort: SortMode) -> Self {
        Options {
            sort,
            ..Options::default()
        }
    }
}

/// One SQL value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A 64-bit integer.
    Integer(i64),
    /// A double.
    Real(f64),
    /// Text.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
}

/// The result of a query: column names and rows.
#[derive(Clone, Debug, PartialEq)]
pub struct QueryResult {
    /// Column names, in order.
    pub columns: Vec<String>,
    /// Rows, each with one value per column.
    pub rows: Vec<Vec<Value>>,
}

/// A row of the `stats` table.
#[derive(Clone, Debug, PartialEq)]
pub struct StatRow {
    /// The stat's name, e.g. `traced_buf_chunks_overwritten`.
    pub name: String,
    /// The index (buffer, …) of indexed stats.
    pub idx: Option<i64>,
    /// `info`, `notice`, `data_loss` or `error`.
    pub severity: String,
    /// `trace` or `analysis`.
    pub source: String,
    /// The value.
    pub value: i64,
    /// What the stat means.
    pub description: String,
}

/// Load progress, for a progress bar.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Bytes of the (decompressed) trace tokenized so far.
    pub done: u64,
    /// Total bytes of the (decompressed) trace.
    pub total: u64,
}

/// An imported trace, queryable with SQL.
#[derive(Debug)]
pub struct TraceProcessor {
    conn: rusqlite::Connection,
}

impl TraceProcessor {
    /// Imports a trace file (plain or gzip-compressed).
    pub fn open(path: impl AsRef<Path>, options: &Options) -> Result<Self, Error> {
        Self::open_with_progress(path, options, &mut |_| {})
    }

    /// Imports a trace file, calling `progress` now and then while it loads.
    ///
    /// A plain trace is read a window at a time ([`Tokenizer::push_stream`]), so only the
    /// import's own memory counts against the limit; a gzip-compressed one is read whole and
    /// inflated first.
    pub fn open_with_progress(
        path: impl AsRef<Path>,
        options: &Options,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Self, Error> {
        Self::open_windowed(path, options, tokenize::STREAM_WINDOW, progress)
    }

    /// Not an API (for the corpus test): [`Self::open_with_progress`] reading the file
    /// `window` bytes at a time.
    #[doc(hidden)]
    pub fn open_windowed(
        path: impl AsRef<Path>,
        options: &Options,
        window: usize,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Self, Error> {
        use std::io::{Read, Seek};
        let path = path.as_ref();
        let len = std::fs::metadata(path)?.len();
        let mut file = std::fs::File::open(path)?;
        let mut head = Vec::with_capacity(2);
        (&mut file).take(2).read_to_end(&mut head)?;
        if head.starts_with(&tokenize::GZIP_MAGIC) {
            // The file is read whole, then inflated and imported: all count against the limit.
            check_memory(len, len.saturating_add(memory::estimate(len)), options)?;
            let mut bytes = head;
            file.read_to_end(&mut bytes)?;
            return Self::from_bytes_with_progress(&bytes, options, progress);
        }
        check_format(&head)?;
        check_memory(len, memory::estimate(len), options)?;
        file.rewind()?;
        crate::trim::fix_mmap_threshold();
        let mut importer = Tokenizer::new(options.sort);
        importer.crop_track_events = options.crop_track_events;
        // Stops the import with the same error if it outgrows the limit after all.
        let limit = options.memory_limit.or_else(memory::available);
        let mut reader = memory::Guarded::new(&mut file, limit);
        let read = importer.push_stream(&mut reader, len, window, &mut |done| {
            progress(Progress {
                done: done as u64,
                total: len,
            })
        });
        if let (Some(needed), Some(limit)) = (reader.tripped(), limit) {
            return Err(Error::OutOfMemory {
                trace_bytes: len,
                needed,
                limit,
            });
        }
        read?;
        Self::finish_import(importer)
    }

    /// Imports a trace held in memory (plain or gzip-compressed).
    pub fn from_bytes(bytes: &[u8], options: &Options) -> Result<Self, Error> {
        Self::from_bytes_with_progress(bytes, options, &mut |_| {})
    }

    /// Imports a trace held in memory, calling `progress` now and then.
    pub fn from_bytes_with_progress(
        bytes: &[u8],
        options: &Options,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Self, Error> {
        crate::trim::fix_mmap_threshold();
        let mut importer = Tokenizer::new(options.sort);
        importer.crop_track_events = options.crop_track_events;
        let gunzipped;
        let trace: &[u8] = if bytes.starts_with(&tokenize::GZIP_MAGIC) {
            let limit = options.max_inflated_bytes;
            let (data, complete) = tokenize::inflate(bytes, limit.saturating_add(1));
            if data.len() as u64 > limit {
                return Err(Error::TooLarge(limit));
            }
            if !complete {
                importer.parser.st.stats.inc(stats::Stat::trace_truncated);
            }
            gunzipped = data;
            &gunzipped
        } else {
            bytes
        };
        check_format(trace)?;
        let total = trace.len() as u64;
        check_memory(total, memory::estimate(total), options)?;
        importer.push_trace(trace, false, &mut |done| {
            progress(Progress {
                done: done as u64,
                total,
            })
        });
        Self::finish_import(importer)
    }

    /// The end of an import: the last events sorted and parsed, the tables handed to SQL.
    fn finish_import(mut importer: Tokenizer) -> Result<Self, Error> {
        importer.finish();
        // Only the tables outlive the import: the event arenas and sequence state are freed
        // before the tables are built, which lowers the peak.
        let st = std::mem::take(&mut importer.parser.st);
        drop(importer);
        let conn = rusqlite::Connection::open_in_memory()?;
        sql::load(&conn, st)?;
        crate::trim::release_free_memory();
        Ok(TraceProcessor { conn })
    }

    /// Runs SQL and collects the rows (of the last statement, if there are several).
    pub fn query(&self, sql: &str) -> Result<QueryResult, Error> {
        let mut result = QueryResult {
            columns: Vec::new(),
            rows: Vec::new(),
        };
        let mut rest = sql.trim();
        while !rest.is_empty() {
            let (stmt, tail) = split_statement(rest);
            rest = tail.trim();
            if stmt.trim().is_empty() {
                continue;
            }
            let mut st = self.conn.prepare(stmt)?;
            let columns: Vec<String> = st.column_names().iter().map(|c| c.to_string()).collect();
            let n = columns.len();
            let mut rows = Vec::new();
            let mut it = st.query([])?;
            while let Some(row) = it.next()? {
                let mut out = Vec::with_capacity(n);
                for i in 0..n {
                    out.push(match row.get_ref(i)? {
                        rusqlite::types::ValueRef::Null => Value::Null,
                        rusqlite::types::ValueRef::Integer(v) => Value::Integer(v),
                        rusqlite::types::ValueRef::Real(v) => Value::Real(v),
                        rusqlite::types::ValueRef::Text(t) => {
                            Value::Text(String::from_utf8_lossy(t).into_owned())
                        }
                        rusqlite::types::ValueRef::Blob(b) => Value::Blob(b.to_vec()),
                    });
                }
                rows.push(out);
            }
            result = QueryResult { columns, rows };
        }
        Ok(result)
    }

    /// The underlying SQLite connection, for callers that want rusqlite's full API.
    pub fn connection(&self) -> &rusqlite::Connection {
        &self.conn
    }

    /// Tracy-style statistics per zone name (see [`ZoneStats`]), sorted by total time.
    pub fn zone_stats(&self) -> Result<Vec<ZoneStats>, Error> {
        zones::compute(&self.conn)
    }

    /// The crashes and panics Tachyon's crash handler recorded (see [`Crash`]), oldest first.
    pub fn crashes(&self) -> Result<Vec<Crash>, Error> {
        crashes::find(&self.conn)
    }

    /// The memory summary: per process and heap with heap profiles, peak live bytes and when,
    /// totals, and the top `top` sites by bytes still live (leaks) and by bytes allocated.
    pub fn memory(&self, top: usize) -> Result<Vec<crate::HeapReport>, Error> {
        Ok(crate::heap_report::memory_report(&self.conn, top)?)
    }

    /// Every `stats` row with severity `data_loss` or `error` and a non-zero value.
    pub fn data_loss(&self) -> Result<Vec<StatRow>, Error> {
        let mut st = self.conn.prepare(
            "SELECT name, idx, severity, source, value, description FROM stats \
             WHERE severity IN ('data_loss', 'error') AND value != 0 ORDER BY severity DESC, name, idx",
        )?;
        let rows = st.query_map([], |r| {
            Ok(StatRow {
                name: r.get(0)?,
                idx: r.get(1)?,
                severity: r.get(2)?,
                source: r.get(3)?,
                value: r.get(4)?,
                description: r.get::<_, Option<String>>(5)?.unwrap_or_default(),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// Refuses an import whose estimated peak memory exceeds the limit.
fn check_memory(trace_bytes: u64, needed: u64, options: &Options) -> Result<(), Error> {
    match options.memory_limit.or_else(memory::available) {
        Some(limit) if needed > limit => Err(Error::OutOfMemory {
            trace_bytes,
            needed,
            limit,
        }),
        _ => Ok(()),
    }
}

/// A Perfetto trace is a `Trace` message whose fields are `packet = 1` (tag byte 0x0a). Anything
/// else at byte 0 is another format (JSON, systrace, …) or not a trace at all.
fn check_format(trace: &[u8]) -> Result<(), Error> {
    match trace.first() {
        None | Some(0x0a) => Ok(()),
        Some(b'{') | Some(b'[') => Err(Error::NotATrace(
            "this looks like a JSON trace; only Perfetto protobuf traces are supported".into(),
        )),
        Some(b) => Err(Error::NotATrace(format!(
            "the first byte is 0x{b:02x}, a protobuf trace starts with 0x0a (TracePacket)"
        ))),
    }
}

/// Splits off the first SQL statement (at a `;` outside quotes and comments).
fn split_statement(sql: &str) -> (&str, &str) {
    let b = sql.as_bytes();
    let mut i = 0;
    let mut quote: Option<u8> = None;
    while i < b.len() {
        let c = b[i];
        match quote {
            Some(q) => {
                if c == q {
                    quote = None;
                }
            }
            None => match c {
                b'\'' | b'"' | b'`' => quote = Some(c),
                b'-' if b.get(i + 1) == Some(&b'-') => {
                    while i < b.len() && b[i] != b'\n' {
                        i += 1;
                    }
                    continue;
                }
                b'/' if b.get(i + 1) == Some(&b'*') => {
                    i += 2;
                    while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                        i += 1;
                    }
                    i += 2;
                    continue;
                }
                b';' => return (&sql[..i], &sql[i + 1..]),
                _ => {}
            },
        }
        i += 1;
    }
    (sql, "")
}

/// Whether `sql` holds at least one complete statement (ends with `;` outside quotes and
/// comments); used by interactive shells to know when to run what was typed.
pub fn is_complete_statement(sql: &str) -> bool {
    let (first, rest) = split_statement(sql);
    first.len() < sql.len() || !rest.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_split_outside_quotes_and_comments() {
        assert_eq!(split_statement("select ';'; x"), ("select ';'", " x"));
        assert_eq!(
            split_statement("-- a;b\nselect 1"),
            ("-- a;b\nselect 1", "")
        );
        assert!(is_complete_statement("select 1;"));
        assert!(!is_complete_statement("select ';'"));
        assert!(!is_complete_statement("select 1 /* ; */"));
    }

    #[test]
    fn rejects_other_formats() {
        assert!(matches!(
            TraceProcessor::from_bytes(b"{\"traceEvents\":[]}", &Options::default()),
            Err(Error::NotATrace(_))
        ));
        assert!(TraceProcessor::from_bytes(b"", &Options::default()).is_ok());
    }

    /// A gzip file that inflates past the limit is refused, not inflated without bound.
    #[test]
    fn gzip_bomb_is_refused() {
        use std::io::Write;
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        // Packets of zeros: `0a 00` repeated (empty TracePackets), 1 MiB of them.
        z.write_all(&[0x0a, 0x00].repeat(1 << 19)).unwrap();
        let gz = z.finish().unwrap();
        let options = Options {
            max_inflated_bytes: 1 << 16,
            ..Options::default()
        };
        assert!(matches!(
            TraceProcessor::from_bytes(&gz, &options),
            Err(Error::TooLarge(limit)) if limit == 1 << 16
        ));
        assert!(TraceProcessor::from_bytes(&gz, &Options::default()).is_ok());
    }

    /// A trace whose import would need more than the memory limit is refused, naming it.
    #[test]
    fn a_trace_too_large_for_the_memory_limit_is_refused() {
        let trace = [0x0a, 0x00].repeat(1 << 10);
        let options = Options {
            memory_limit: Some(1000),
            ..Options::default()
        };
        let e = TraceProcessor::from_bytes(&trace, &options).unwrap_err();
        assert!(
            matches!(e, Error::OutOfMemory { trace_bytes: 2048, limit: 1000, needed } if needed > 1000),
            "{e:?}"
        );
        assert!(e.to_string().contains("the limit is 0.0 MB"), "{e}");
        let options = Options {
            memory_limit: Some(1 << 20),
            ..Options::default()
        };
        assert!(TraceProcessor::from_bytes(&trace, &options).is_ok());
        // From a file: read in windows, so only the import's own estimate counts.
        let file =
            std::env::temp_dir().join(format!("tachyon-limit-{}.pftrace", std::process::id()));
        std::fs::write(&file, &trace).unwrap();
        let small = Options {
            memory_limit: Some(1000),
            ..Options::default()
        };
        let e = TraceProcessor::open(&file, &small).unwrap_err();
        assert!(
            matches!(e, Error::OutOfMemory { trace_bytes: 2048, needed, .. } if needed == memory::estimate(2048)),
            "{e:?}"
        );
        assert!(TraceProcessor::open(&file, &options).is_ok());
        std::fs::remove_file(&file).unwrap();
    }
}

//! The SQLite side: Perfetto's table and view names and columns, the bulk copy of the imported
//! tables, and the `extract_arg` function.
//!
//! As in Perfetto, the data lives in `__intrinsic_*` tables and the documented names
//! (`slice`, `thread`, `process`, `track`, `thread_track`, `counter_track`, `args`, …) are
//! views over them, so that alias columns (`slice.cat`, `thread.utid`, `args.display_value`)
//! and the per-kind track tables cost nothing to store.

mod heap;
mod logs;
mod profile;
mod state;
pub(crate) mod vtab;

use std::sync::Arc;

use rusqlite::functions::FunctionFlags;
use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::{params, Connection};

use crate::storage::stats::STATS;
use crate::storage::tables::Tables;
use crate::storage::{ArgValue, EventType, SliceRow, Storage, NONE};

const SCHEMA: &str = r#"
CREATE TABLE __intrinsic_track(
  id INTEGER PRIMARY KEY, name TEXT, type TEXT NOT NULL, event_type TEXT NOT NULL,
  dimension_arg_set_id INTEGER, parent_id INTEGER, source_arg_set_id INTEGER,
  machine_id INTEGER, track_group_id INTEGER, utid INTEGER, upid INTEGER,
  counter_unit TEXT, description TEXT);
CREATE VIEW track AS SELECT id, name, type, dimension_arg_set_id, parent_id,
  source_arg_set_id, machine_id, track_group_id FROM __intrinsic_track;
CREATE VIEW thread_track AS SELECT id, name, type, parent_id, source_arg_set_id, machine_id,
  utid FROM __intrinsic_track WHERE event_type = 'slice' AND utid IS NOT NULL;
CREATE VIEW process_track AS SELECT id, name, type, parent_id, source_arg_set_id, machine_id,
  upid FROM __intrinsic_track WHERE event_type = 'slice' AND upid IS NOT NULL;
CREATE VIEW counter_track AS SELECT id, name, parent_id, type, dimension_arg_set_id,
  source_arg_set_id, machine_id, counter_unit AS unit, description
  FROM __intrinsic_track WHERE event_type = 'counter';
CREATE VIEW thread_counter_track AS SELECT id, name, type, parent_id, source_arg_set_id,
  machine_id, counter_unit AS unit, description, utid
  FROM __intrinsic_track WHERE event_type = 'counter' AND utid IS NOT NULL;
CREATE VIEW process_counter_track AS SELECT id, name, type, parent_id, source_arg_set_id,
  machine_id, counter_unit AS unit, description, upid
  FROM __intrinsic_track WHERE event_type = 'counter' AND upid IS NOT NULL;
CREATE TABLE counter(
  id INTEGER PRIMARY KEY, ts INTEGER NOT NULL, track_id INTEGER NOT NULL,
  value REAL NOT NULL, arg_set_id INTEGER);
CREATE VIEW counters AS SELECT c.*, t.name, t.unit FROM counter c
  JOIN counter_track t ON c.track_id = t.id ORDER BY ts;

CREATE TABLE __intrinsic_thread(
  id INTEGER PRIMARY KEY, tid INTEGER NOT NULL, name TEXT, start_ts INTEGER, end_ts INTEGER,
  upid INTEGER, is_main_thread INTEGER, machine_id INTEGER, arg_set_id INTEGER);
CREATE VIEW thread AS SELECT id AS utid, * FROM __intrinsic_thread;

CREATE TABLE __intrinsic_process(
  id INTEGER PRIMARY KEY, pid INTEGER NOT NULL, name TEXT, start_ts INTEGER, end_ts INTEGER,
  parent_upid INTEGER, uid INTEGER, android_appid INTEGER, cmdline TEXT, arg_set_id INTEGER,
  machine_id INTEGER);
CREATE VIEW process AS SELECT id AS upid, * FROM __intrinsic_process;

CREATE TABLE flow(
  id INTEGER PRIMARY KEY, slice_out INTEGER NOT NULL, slice_in INTEGER NOT NULL,
  trace_id INTEGER, arg_set_id INTEGER);

CREATE TABLE __intrinsic_zero_length_zone(slice_id INTEGER PRIMARY KEY);

CREATE TABLE stats(
  id INTEGER PRIMARY KEY, name TEXT NOT NULL, key INTEGER NOT NULL, idx INTEGER,
  severity TEXT NOT NULL, source TEXT NOT NULL, value INTEGER NOT NULL, description TEXT,
  machine_id INTEGER, trace_id INTEGER);
"#;

/// The tables read in place from [`Tables`] (`crate::sql::vtab`), and the views over them.
const IN_MEMORY_SCHEMA: &str = r#"
CREATE VIRTUAL TABLE __intrinsic_slice USING tachyon_slice;
CREATE VIEW slice AS SELECT *, category AS cat, id AS slice_id FROM __intrinsic_slice;
CREATE VIEW slices AS SELECT * FROM slice;
CREATE VIEW instant AS SELECT ts, track_id, name, arg_set_id FROM slice WHERE dur = 0;

CREATE VIRTUAL TABLE __intrinsic_args USING tachyon_args;
CREATE VIEW args AS SELECT *,
  CASE value_type
    WHEN 'int' THEN CAST(int_value AS TEXT)
    WHEN 'uint' THEN printf('%llu', int_value)
    WHEN 'string' THEN string_value
    WHEN 'real' THEN CAST(real_value AS TEXT)
    WHEN 'pointer' THEN printf('0x%x', int_value)
    WHEN 'bool' THEN (CASE WHEN int_value <> 0 THEN 'true' ELSE 'false' END)
    WHEN 'json' THEN string_value
    ELSE NULL END AS display_value
  FROM __intrinsic_args;

CREATE VIEW cpu_counter_track AS SELECT ct.id, ct.name, ct.type, ct.parent_id,
  ct.source_arg_set_id, ct.machine_id, ct.unit, ct.description, a.int_value AS cpu
  FROM counter_track ct JOIN __intrinsic_args a ON ct.dimension_arg_set_id = a.arg_set_id
  WHERE a.key = 'cpu';

"#;

/// `trace_bounds` as Perfetto computes it (`StorageTablesPlugin::GetTimestampBounds`): the
/// first and last timestamp of the slices (their ends, for a finished slice), counters, heap
/// profile rows, log messages, states and CPU samples; `(0, 0)` for a trace with none of them,
/// and an end one past the start when both are equal.
fn trace_bounds(st: &Storage, slices: &[SliceRow]) -> (i64, i64) {
    let (mut start, mut end) = (i64::MAX, 0i64);
    let mut add = |ts: i64, dur: i64| {
        start = start.min(ts);
        end = end.max(ts.saturating_add(dur.max(0)));
    };
    for s in slices {
        add(s.ts, s.dur);
    }
    for s in &st.states.rows {
        add(s.ts, s.dur);
    }
    let points = st.counters.iter().map(|c| c.ts);
    let points = points.chain(st.heap.allocations.iter().map(|a| a.ts));
    let points = points.chain(st.android_logs.iter().map(|l| l.ts));
    let points = points.chain(st.profile.perf_samples.iter().map(|p| p.ts));
    let points = points.chain(st.profile.cpu_samples.iter().map(|p| p.ts));
    for ts in points {
        add(ts, 0);
    }
    match (start, end) {
        (i64::MAX, _) => (0, 0),
        (s, e) if s == e => (s, e.saturating_add(1)),
        bounds => bounds,
    }
}

/// A row reference as SQL sees it: NULL for none.
pub(crate) fn opt(id: u32) -> Option<i64> {
    (id != NONE).then_some(id as i64)
}

/// Creates the schema in `conn`, copies the small tables of `st` into it, hands the slices and
/// args (and the strings) to the virtual tables, and registers `extract_arg`.
pub(crate) fn load(conn: &Connection, mut st: Storage) -> rusqlite::Result<()> {
    conn.execute_batch(
        "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA temp_store = MEMORY;",
    )?;
    conn.execute_batch(SCHEMA)?;
    conn.execute_batch(profile::SCHEMA)?;
    conn.execute_batch(heap::SCHEMA)?;
    conn.execute_batch(state::SCHEMA)?;
    let slices = std::mem::take(&mut st.slices);
    let slice_names = std::mem::take(&mut st.slice_names);
    let args = std::mem::take(&mut st.args);
    let (start_ts, end_ts) = trace_bounds(&st, &slices);
    conn.execute(
        "CREATE TABLE _trace_bounds(start_ts INTEGER, end_ts INTEGER)",
        [],
    )?;
    conn.execute(
        "INSERT INTO _trace_bounds VALUES (?1, ?2)",
        params![start_ts, end_ts],
    )?;
    conn.execute_batch("CREATE VIEW trace_bounds AS SELECT start_ts, end_ts FROM _trace_bounds;")?;
    for (name, value) in [
        ("trace_start", start_ts),
        ("trace_end", end_ts),
        ("trace_dur", end_ts - start_ts),
    ] {
        conn.create_scalar_function(
            name,
            0,
            FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
            move |_| Ok(value),
        )?;
    }
    let tx = conn.unchecked_transaction()?;
    {
        let s = &st.strings;
        let text = |id: u32| (id != NONE).then(|| s.get(id));
        let mut ins = tx.prepare(
            "INSERT INTO __intrinsic_track(id, name, type, event_type, dimension_arg_set_id, \
             parent_id, source_arg_set_id, utid, upid, counter_unit, description) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        )?;
        for (i, t) in st.tracks.iter().enumerate() {
            ins.execute(params![
                i as i64,
                text(t.name),
                t.kind,
                match t.event_type {
                    EventType::Slice => "slice",
                    EventType::Counter => "counter",
                    EventType::State => "state",
                },
                opt(t.dimension_arg_set),
                opt(t.parent),
                opt(t.source_arg_set),
                opt(t.utid),
                opt(t.upid),
                text(t.unit),
                text(t.description)
            ])?;
        }
        let mut ins =
            tx.prepare("INSERT INTO counter(id, ts, track_id, value) VALUES (?1, ?2, ?3, ?4)")?;
        for (i, c) in st.counters.iter().enumerate() {
            ins.execute(params![i as i64, c.ts, c.track, c.value])?;
        }
        let mut ins = tx.prepare(
            "INSERT INTO __intrinsic_thread(id, tid, name, upid, is_main_thread, arg_set_id) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        for (i, t) in st.threads.iter().enumerate() {
            let main =
                (t.upid != NONE).then(|| (st.processes[t.upid as usize].pid == t.tid) as i64);
            ins.execute(params![
                i as i64,
                t.tid,
                text(t.name),
                opt(t.upid),
                main,
                opt(t.arg_set)
            ])?;
        }
        let mut ins = tx.prepare(
            "INSERT INTO __intrinsic_process(id, pid, name, cmdline, parent_upid, uid, \
             android_appid, arg_set_id, start_ts) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?;
        for (i, p) in st.processes.iter().enumerate() {
            ins.execute(params![
                i as i64,
                p.pid,
                text(p.name),
                text(p.cmdline),
                opt(p.parent),
                p.uid,
                // Android's app id, as Perfetto's `SetProcessUid` derives it.
                p.uid.map(|u| u % 100_000),
                opt(p.arg_set),
                p.start_ts
            ])?;
        }
        let mut ins = tx.prepare(
            "INSERT INTO flow(id, slice_out, slice_in, trace_id) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (i, f) in st.flows.iter().enumerate() {
            ins.execute(params![
                i as i64,
                f.slice_out,
                f.slice_in,
                f.trace_id as i64
            ])?;
        }
        let mut ins =
            tx.prepare("INSERT INTO __intrinsic_zero_length_zone(slice_id) VALUES (?1)")?;
        for &id in &st.zero_length_zones {
            ins.execute(params![id])?;
        }
        let mut ins = tx.prepare(
            "INSERT INTO stats(id, name, key, idx, severity, source, value, description) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        for (i, (key, idx, value)) in st.stats.rows().into_iter().enumerate() {
            let d = &STATS[key];
            ins.execute(params![
                i as i64,
                d.name,
                key as i64,
                idx,
                d.severity.as_str(),
                d.source.as_str(),
                value,
                d.description
            ])?;
        }
    }
    profile::load(&tx, &st)?;
    heap::load(&tx, &st)?;
    state::load(&tx, &st)?;
    logs::load(&tx, &st)?;
    tx.commit()?;

    // The large tables stay in memory as they are; SQL reads them through virtual tables.
    let tables = Arc::new(Tables::new(st.strings, slices, slice_names, args));
    crate::sql::vtab::register(conn, &tables)?;
    conn.execute_batch(IN_MEMORY_SCHEMA)?;
    let index = tables;
    conn.create_scalar_function(
        "extract_arg",
        2,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        move |ctx| {
            let set = match ctx.get_raw(0) {
                ValueRef::Integer(v) => v,
                _ => return Ok(SqlValue::Null),
            };
            let key = match ctx.get_raw(1) {
                ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
                _ => return Ok(SqlValue::Null),
            };
            Ok(match index.args.lookup(&index.strings, set, &key) {
                None => SqlValue::Null,
                Some(ArgValue::Int(v)) => SqlValue::Integer(v),
                Some(ArgValue::UInt(v) | ArgValue::Pointer(v)) => SqlValue::Integer(v as i64),
                Some(ArgValue::Bool(v)) => SqlValue::Integer(v as i64),
                Some(ArgValue::Real(v)) => SqlValue::Real(v),
                Some(ArgValue::Str(v) | ArgValue::Json(v)) => {
                    SqlValue::Text(index.strings.get(v).to_owned())
                }
            })
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_bounds_are_perfettos() {
        let mut st = Storage::default();
        assert_eq!(trace_bounds(&st, &[]), (0, 0));
        // A lone point: the end is one past the start.
        assert_eq!(trace_bounds(&st, &[SliceRow::at(70)]), (70, 71));
        // A finished slice counts to its end, an unfinished one (dur -1) to its start.
        let mut done = SliceRow::at(1000);
        done.dur = 1000;
        let mut open = SliceRow::at(3000);
        open.dur = -1;
        assert_eq!(trace_bounds(&st, &[done, open]), (1000, 3000));
        st.counters.push(crate::storage::CounterRow {
            ts: 500,
            track: 0,
            value: 1.0,
        });
        assert_eq!(trace_bounds(&st, &[done, open]), (500, 3000));
    }
}

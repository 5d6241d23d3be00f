//! The call-stack and CPU-sample tables in SQLite.

use crate::storage::{Storage, NONE};

/// The tables and views, with Perfetto's names and columns.
pub(crate) const SCHEMA: &str = "
CREATE TABLE __intrinsic_stack_profile_mapping(
    id INTEGER PRIMARY KEY, type TEXT NOT NULL DEFAULT '__intrinsic_stack_profile_mapping',
    build_id TEXT, exact_offset INTEGER, start_offset INTEGER, start INTEGER, \"end\" INTEGER,
    load_bias INTEGER, name TEXT);
CREATE VIEW stack_profile_mapping AS SELECT id, build_id, exact_offset, start_offset, start,
    \"end\", load_bias, name FROM __intrinsic_stack_profile_mapping;
CREATE TABLE __intrinsic_stack_profile_frame(
    id INTEGER PRIMARY KEY, name TEXT, mapping INTEGER, rel_pc INTEGER, symbol_set_id INTEGER,
    deobfuscated_name TEXT, type TEXT);
CREATE VIEW stack_profile_frame AS SELECT * FROM __intrinsic_stack_profile_frame;
CREATE TABLE __intrinsic_stack_profile_callsite(
    id INTEGER PRIMARY KEY, depth INTEGER, parent_id INTEGER, frame_id INTEGER);
CREATE VIEW stack_profile_callsite AS SELECT * FROM __intrinsic_stack_profile_callsite;
CREATE TABLE __intrinsic_stack_profile_symbol(
    id INTEGER PRIMARY KEY, symbol_set_id INTEGER, name TEXT, source_file TEXT,
    line_number INTEGER, inlined INTEGER);
CREATE VIEW stack_profile_symbol AS SELECT * FROM __intrinsic_stack_profile_symbol;
CREATE TABLE perf_sample(
    id INTEGER PRIMARY KEY, ts INTEGER, utid INTEGER, cpu INTEGER, cpu_mode TEXT,
    callsite_id INTEGER, unwind_error TEXT, perf_session_id INTEGER);
CREATE TABLE cpu_profile_stack_sample(
    id INTEGER PRIMARY KEY, ts INTEGER, callsite_id INTEGER, utid INTEGER,
    process_priority INTEGER);
CREATE TABLE __intrinsic_track_event_callstacks(
    id INTEGER PRIMARY KEY, slice_id INTEGER, track_id INTEGER, callsite_id INTEGER,
    end_callsite_id INTEGER, weight REAL);
";

/// Copies the rows into the tables of [`SCHEMA`].
pub(crate) fn load(tx: &rusqlite::Connection, st: &Storage) -> rusqlite::Result<()> {
    use rusqlite::params;
    let s = &st.strings;
    let text = |id: u32| (id != NONE).then(|| s.get(id));
    let opt = |id: u32| (id != NONE).then_some(i64::from(id));
    let p = &st.profile;
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_stack_profile_mapping(id, build_id, exact_offset, \
         start_offset, start, \"end\", load_bias, name) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for (i, m) in p.mappings.iter().enumerate() {
        ins.execute(params![
            i as i64,
            text(m.build_id),
            m.exact_offset as i64,
            m.start_offset as i64,
            m.start as i64,
            m.end as i64,
            m.load_bias as i64,
            text(m.name)
        ])?;
    }
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_stack_profile_frame(id, name, mapping, rel_pc, symbol_set_id) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for (i, f) in p.frames.iter().enumerate() {
        ins.execute(params![
            i as i64,
            text(f.name),
            f.mapping,
            f.rel_pc as i64,
            opt(f.symbol_set)
        ])?;
    }
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_stack_profile_callsite(id, depth, parent_id, frame_id) \
         VALUES (?1, ?2, ?3, ?4)",
    )?;
    for (i, c) in p.callsites.iter().enumerate() {
        ins.execute(params![i as i64, c.depth, opt(c.parent), c.frame])?;
    }
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_stack_profile_symbol(id, symbol_set_id, name, source_file, \
         line_number) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for (i, r) in p.symbols.iter().enumerate() {
        ins.execute(params![i as i64, r.set, text(r.name), text(r.file), r.line])?;
    }
    let mut ins = tx.prepare(
        "INSERT INTO perf_sample(id, ts, utid, cpu, cpu_mode, callsite_id, unwind_error, \
         perf_session_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for (i, r) in p.perf_samples.iter().enumerate() {
        ins.execute(params![
            i as i64,
            r.ts,
            r.utid,
            r.cpu,
            text(r.cpu_mode),
            opt(r.callsite),
            text(r.unwind_error),
            r.session
        ])?;
    }
    let mut ins = tx.prepare(
        "INSERT INTO cpu_profile_stack_sample(id, ts, callsite_id, utid, process_priority) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for (i, r) in p.cpu_samples.iter().enumerate() {
        ins.execute(params![i as i64, r.ts, r.callsite, r.utid, r.priority])?;
    }
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_track_event_callstacks(id, slice_id, track_id, callsite_id, \
         end_callsite_id, weight) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for (i, r) in p.track_event_callstacks.iter().enumerate() {
        ins.execute(params![
            i as i64,
            r.slice,
            r.track,
            opt(r.callsite),
            opt(r.end_callsite),
            r.weight
        ])?;
    }
    Ok(())
}

//! The heap profile tables in SQLite.

use crate::storage::{Storage, NONE};

/// The tables, with Perfetto's names and columns.
pub(crate) const SCHEMA: &str = "
CREATE TABLE __intrinsic_heap_profile_allocation(
    id INTEGER PRIMARY KEY, ts INTEGER, upid INTEGER, heap_name TEXT, callsite_id INTEGER,
    count INTEGER, size INTEGER);
CREATE VIEW heap_profile_allocation AS SELECT * FROM __intrinsic_heap_profile_allocation;
CREATE TABLE __intrinsic_heap_profile(
    id INTEGER PRIMARY KEY, ts INTEGER, ts_end INTEGER, dur INTEGER, upid INTEGER,
    heap_name TEXT);
CREATE VIEW heap_profile AS SELECT * FROM __intrinsic_heap_profile;
";

/// Copies the rows into the tables of [`SCHEMA`].
pub(crate) fn load(tx: &rusqlite::Connection, st: &Storage) -> rusqlite::Result<()> {
    use rusqlite::params;
    let s = &st.strings;
    let text = |id: u32| (id != NONE).then(|| s.get(id));
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_heap_profile_allocation(id, ts, upid, heap_name, callsite_id, \
         count, size) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    for (i, r) in st.heap.allocations.iter().enumerate() {
        ins.execute(params![
            i as i64,
            r.ts,
            r.upid,
            text(r.heap_name),
            r.callsite,
            r.count,
            r.size
        ])?;
    }
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_heap_profile(id, ts, ts_end, dur, upid, heap_name) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for (i, r) in st.heap.profiles.iter().enumerate() {
        ins.execute(params![
            i as i64,
            r.ts,
            r.ts_end,
            r.ts_end - r.ts,
            r.upid,
            text(r.heap_name)
        ])?;
    }
    Ok(())
}

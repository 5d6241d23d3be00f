//! The state tracks' table in SQLite.

use crate::storage::{Storage, NONE};

pub(crate) const SCHEMA: &str = r#"
CREATE TABLE __intrinsic_state(
  id INTEGER PRIMARY KEY, ts INTEGER NOT NULL, dur INTEGER NOT NULL, track_id INTEGER NOT NULL,
  category TEXT, value TEXT NOT NULL, arg_set_id INTEGER);
CREATE VIEW state AS SELECT * FROM __intrinsic_state;
CREATE VIEW state_track AS SELECT id, name, parent_id, type, dimension_arg_set_id,
  source_arg_set_id, machine_id FROM __intrinsic_track WHERE event_type = 'state';
CREATE VIEW process_state_track AS SELECT id, name, type, parent_id, source_arg_set_id,
  machine_id, upid FROM __intrinsic_track WHERE event_type = 'state' AND upid IS NOT NULL;
CREATE VIEW thread_state_track AS SELECT id, name, type, parent_id, source_arg_set_id,
  machine_id, utid FROM __intrinsic_track WHERE event_type = 'state' AND utid IS NOT NULL;
"#;

pub(crate) fn load(tx: &rusqlite::Connection, st: &Storage) -> rusqlite::Result<()> {
    use rusqlite::params;
    let s = &st.strings;
    let text = |id: u32| (id != NONE).then(|| s.get(id));
    let opt = |id: u32| (id != NONE).then_some(id as i64);
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_state(id, ts, dur, track_id, category, value, arg_set_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    for (i, r) in st.states.rows.iter().enumerate() {
        ins.execute(params![
            i as i64,
            r.ts,
            r.dur,
            r.track,
            text(r.category),
            text(r.value),
            opt(r.arg_set)
        ])?;
    }
    Ok(())
}

//! `android_logs` in SQLite.

use rusqlite::{params, Transaction};

use crate::storage::logs::LogRow;
use crate::storage::{Storage, NONE};

/// Creates `android_logs` and copies the rows.
pub(crate) fn load(tx: &Transaction<'_>, st: &Storage) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE __intrinsic_android_logs(
           id INTEGER PRIMARY KEY, ts INTEGER NOT NULL, utid INTEGER NOT NULL,
           prio INTEGER NOT NULL, tag TEXT, msg TEXT NOT NULL, log_source TEXT);
         CREATE VIEW android_logs AS SELECT id, ts, utid, prio, tag, msg
           FROM __intrinsic_android_logs;",
    )?;
    let s = &st.strings;
    let mut rows: Vec<&LogRow> = st.android_logs.iter().collect();
    rows.sort_by_key(|r| r.ts);
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_android_logs(id, ts, utid, prio, tag, msg, log_source) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'android_logcat')",
    )?;
    for (i, r) in rows.iter().enumerate() {
        ins.execute(params![
            i as i64,
            r.ts,
            r.utid as i64,
            r.prio as i64,
            (r.tag != NONE).then(|| s.get(r.tag)),
            if r.msg != NONE { s.get(r.msg) } else { "" },
        ])?;
    }
    Ok(())
}

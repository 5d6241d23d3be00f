//! Log messages: a TrackEvent's `log_message` becomes a row of `android_logs`, as in
//! Perfetto's `TrackEventParser::ParseLogMessage`: `ts`, `utid` (the event's thread: a message
//! off a thread's tracks is dropped, with `track_event_parser_errors`), `prio` (the message's
//! priority, `PRIO_INFO` when absent), `tag` (`file:line` of its source location, if any) and
//! `msg` (the interned body). The view has Perfetto's columns.

use rusqlite::{params, Transaction};

use crate::import::{Event, EventKind, Importer};
use crate::stats::Stat;
use crate::storage::{Storage, NONE};
use crate::strings::StrId;

/// `LogMessage.PRIO_INFO` (the same number as Android's `INFO`).
pub(crate) const PRIO_INFO: u32 = 4;

/// A message before its thread is known (tokenizer side).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PendingLog {
    pub(crate) prio: u32,
    pub(crate) tag: StrId,
    pub(crate) msg: StrId,
}

/// A row of `android_logs`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogRow {
    pub(crate) ts: i64,
    pub(crate) utid: u32,
    pub(crate) prio: u32,
    pub(crate) tag: StrId,
    pub(crate) msg: StrId,
}

impl Importer {
    /// Queues the log row of a track event at `ts` on `base`'s track.
    pub(crate) fn push_log(&mut self, base: &Event, log: PendingLog, out: &mut Vec<Event>) {
        let idx = self.arena_logs.len() as u64;
        self.arena_logs.push(log);
        let mut ev = Event::bare(EventKind::Log, base.ts, base.track, idx);
        ev.legacy_thread = base.legacy_thread;
        out.push(ev);
    }

    /// Parses a queued log row: its thread from the event's track.
    pub(crate) fn apply_log(&mut self, ev: &Event, track: Option<u32>) {
        let Some(log) = self.arena_logs.get(ev.data as usize).copied() else {
            return;
        };
        let utid = track.map_or(NONE, |t| self.st.tracks[t as usize].utid);
        if utid == NONE {
            self.st.stats.inc(Stat::track_event_parser_errors);
            return;
        }
        self.st.android_logs.push(LogRow {
            ts: ev.ts,
            utid,
            prio: log.prio,
            tag: log.tag,
            msg: log.msg,
        });
    }
}

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

/// Log messages per level, and the program's information.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MessageStats {
    /// (priority, its name, messages), for each priority present, most severe first.
    pub by_priority: Vec<(i64, &'static str, u64)>,
    /// Every message.
    pub total: u64,
    /// The most severe messages (warnings and worse), earliest first, at most 10: (ts,
    /// priority name, tag, text).
    pub notable: Vec<(i64, &'static str, Option<String>, String)>,
    /// The program's information (`app_info!`), per process that gave some.
    pub app_info: Vec<String>,
}

/// The name of an Android / `LogMessage` priority.
pub fn priority_name(prio: i64) -> &'static str {
    match prio {
        2 => "verbose",
        3 => "debug",
        4 => "info",
        5 => "warn",
        6 => "error",
        7 => "fatal",
        _ => "unspecified",
    }
}

pub(crate) fn message_stats(conn: &rusqlite::Connection) -> Result<MessageStats, crate::Error> {
    let mut out = MessageStats::default();
    let mut st =
        conn.prepare("SELECT prio, count(*) FROM android_logs GROUP BY prio ORDER BY prio DESC")?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let (prio, n): (i64, i64) = (r.get(0)?, r.get(1)?);
        out.by_priority.push((prio, priority_name(prio), n as u64));
        out.total += n as u64;
    }
    let mut st = conn.prepare(
        "SELECT ts, prio, tag, msg FROM android_logs WHERE prio >= 5 ORDER BY ts LIMIT 10",
    )?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let prio: i64 = r.get(1)?;
        out.notable
            .push((r.get(0)?, priority_name(prio), r.get(2)?, r.get(3)?));
    }
    let mut st = conn.prepare(
        "SELECT DISTINCT extract_arg(arg_set_id, 'debug.info') FROM slice \
         WHERE category = 'tachyon.app_info' ORDER BY ts",
    )?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        if let Some(s) = r.get::<_, Option<String>>(0)? {
            out.app_info.push(s);
        }
    }
    Ok(out)
}

impl crate::TraceProcessor {
    /// Log messages per level (`android_logs`), the notable ones, and the program's
    /// information (see [`MessageStats`]).
    pub fn message_stats(&self) -> Result<MessageStats, crate::Error> {
        message_stats(self.connection())
    }
}

//! Log messages per level (`tachyon stats`), read back through SQL.

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

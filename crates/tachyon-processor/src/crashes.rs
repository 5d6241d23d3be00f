//! The crashes a trace records: the instants Tachyon's crash handler writes (category
//! `tachyon.crash`: `crash: SIGSEGV` and friends for fatal signals, `panic` for panics), with
//! their thread and their debug annotations.

use rusqlite::Connection;

use crate::Error;

/// The category of crash and panic events.
pub const CRASH_CATEGORY: &str = "tachyon.crash";

/// A crash or panic recorded in the trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Crash {
    /// Timestamp, ns.
    pub ts: i64,
    /// The event's name: `crash: SIGSEGV`, `crash: stack overflow (SIGSEGV)`, `panic`, ….
    pub name: String,
    /// The crashing thread's id, when the event is on a thread's track.
    pub tid: Option<i64>,
    /// The crashing thread's name.
    pub thread: Option<String>,
    /// The signal (`SIGSEGV`), for a fatal signal.
    pub signal: Option<String>,
    /// The signal's code (`SEGV_MAPERR`, `SI_TKILL`).
    pub code: Option<String>,
    /// The faulting address, for a fault.
    pub address: Option<String>,
    /// The panic message.
    pub message: Option<String>,
    /// Where the panic happened (`file:line:column`).
    pub location: Option<String>,
    /// The interrupted instruction, for a fatal signal.
    pub pc: Option<String>,
    /// Where `pc` lies: `path+0xOFFSET` into the mapped file (for `addr2line -e path`).
    pub pc_module: Option<String>,
    /// What led to the signal (`panic: …` for the abort after a panic).
    pub cause: Option<String>,
    /// The call stack, innermost frame first (empty when none was recorded).
    pub stack: Vec<String>,
}

impl Crash {
    /// One line: what happened, where (`crash: SIGSEGV, SEGV_MAPERR at 0x0, on thread "main"
    /// (tid 7)`; `panic: "boom" at src/main.rs:3:5, on thread "worker" (tid 9)`).
    pub fn summary(&self) -> String {
        let mut s = self.name.clone();
        if let Some(sig) = &self.signal {
            if !self.name.contains(sig.as_str()) {
                s.push_str(&format!(" ({sig})"));
            }
        }
        if let Some(c) = &self.code {
            s.push_str(&format!(", {c}"));
        }
        if let Some(a) = &self.address {
            s.push_str(&format!(" at {a}"));
        }
        if let Some(m) = &self.message {
            s.push_str(&format!(": {m:?}"));
        }
        if let Some(l) = &self.location {
            s.push_str(&format!(" at {l}"));
        }
        match (&self.thread, self.tid) {
            (Some(n), Some(t)) => s.push_str(&format!(", on thread {n:?} (tid {t})")),
            (None, Some(t)) => s.push_str(&format!(", on thread {t}")),
            (Some(n), None) => s.push_str(&format!(", on thread {n:?}")),
            (None, None) => {}
        }
        if let Some(c) = &self.cause {
            s.push_str(&format!(", after {c}"));
        }
        s
    }
}

pub(crate) fn find(conn: &Connection) -> Result<Vec<Crash>, Error> {
    let mut st = conn.prepare(
        "SELECT s.ts, s.name, t.tid, t.name, s.arg_set_id FROM slice s \
         LEFT JOIN thread_track tt ON s.track_id = tt.id \
         LEFT JOIN thread t ON tt.utid = t.utid \
         WHERE s.category = ?1 ORDER BY s.ts, s.id",
    )?;
    let mut rows = st.query([CRASH_CATEGORY])?;
    let mut out = Vec::new();
    let mut sets = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(Crash {
            ts: r.get(0)?,
            name: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
            tid: r.get(2)?,
            thread: r.get(3)?,
            ..Crash::default()
        });
        sets.push(r.get::<_, Option<i64>>(4)?);
    }
    let mut args = conn.prepare("SELECT key, display_value FROM args WHERE arg_set_id = ?1")?;
    for (crash, set) in out.iter_mut().zip(sets) {
        let Some(set) = set else { continue };
        let mut rows = args.query([set])?;
        while let Some(r) = rows.next()? {
            let key: String = r.get(0)?;
            let Some(value) = r.get::<_, Option<String>>(1)? else {
                continue;
            };
            match key.strip_prefix("debug.").unwrap_or(&key) {
                "signal" => crash.signal = Some(value),
                "code" => crash.code = Some(value),
                "address" => crash.address = Some(value),
                "message" => crash.message = Some(value),
                "location" => crash.location = Some(value),
                "cause" => crash.cause = Some(value),
                "pc" => crash.pc = Some(value),
                "pc_module" => crash.pc_module = Some(value),
                "thread" if crash.thread.is_none() => crash.thread = Some(value),
                "stack" => crash.stack = value.lines().map(str::to_owned).collect(),
                _ => {}
            }
        }
    }
    Ok(out)
}

//! Tracy's lock statistics, from the slices Tachyon's instrumented locks write (category
//! `tachyon.lock`, argument `lock_id`): holds on each lock's track (shared holds on per-thread
//! tracks under it), `wait for <lock>` slices on the waiting threads' tracks. A lock is a
//! `(process, lock_id)`; its name is its track's.

use rusqlite::Connection;

use crate::strings::FxHashMap;
use crate::{Error, TraceProcessor};

/// One lock's contention.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LockStats {
    /// The lock's name (its track's).
    pub name: String,
    /// The process it belongs to.
    pub upid: Option<i64>,
    /// Holds recorded (acquisitions), shared ones included.
    pub acquisitions: u64,
    /// Of which shared (read) holds.
    pub shared: u64,
    /// Acquisitions that had to wait.
    pub contended: u64,
    /// Sum and maximum of the waits, ns.
    pub total_wait_ns: i64,
    /// Longest wait, ns.
    pub max_wait_ns: i64,
    /// Sum of the holds that ended, ns.
    pub total_hold_ns: i64,
    /// Longest hold that ended, ns.
    pub max_hold_ns: i64,
    /// The threads that waited longest in total, longest first (at most three): (thread's
    /// name or `tid N`, waits, total wait ns).
    pub top_waiters: Vec<(String, u64, i64)>,
}

impl LockStats {
    /// Share of acquisitions that waited.
    pub fn contention(&self) -> f64 {
        if self.acquisitions == 0 {
            0.0
        } else {
            self.contended as f64 / self.acquisitions as f64
        }
    }
}

const QUERY: &str = "
SELECT s.ts, s.dur, s.name, extract_arg(s.arg_set_id, 'debug.lock_id'),
       t.utid, t.upid, t.name, p.name, p.upid, th.upid, th.tid, th.name
FROM slice s
JOIN __intrinsic_track t ON s.track_id = t.id
LEFT JOIN __intrinsic_track p ON t.parent_id = p.id
LEFT JOIN thread th ON t.utid = th.utid
WHERE s.category = 'tachyon.lock'
ORDER BY s.ts";

#[derive(Default)]
struct Acc {
    stats: LockStats,
    waiters: FxHashMap<String, (u64, i64)>,
}

pub(crate) fn compute(conn: &Connection) -> Result<Vec<LockStats>, Error> {
    let mut st = conn.prepare(QUERY)?;
    let mut rows = st.query([])?;
    let mut locks: FxHashMap<(Option<i64>, i64), Acc> = FxHashMap::default();
    while let Some(r) = rows.next()? {
        let dur: i64 = r.get(1)?;
        let name: Option<String> = r.get(2)?;
        let Some(lock_id) = r.get::<_, Option<i64>>(3)? else {
            continue;
        };
        let utid: Option<i64> = r.get(4)?;
        if utid.is_some() {
            // A wait, on the waiting thread's track.
            let upid: Option<i64> = r.get(9)?;
            let acc = locks.entry((upid, lock_id)).or_default();
            if acc.stats.name.is_empty() {
                if let Some(n) = name.as_deref().and_then(|n| n.strip_prefix("wait for ")) {
                    acc.stats.name = n.to_owned();
                }
            }
            let dur = dur.max(0);
            acc.stats.contended += 1;
            acc.stats.total_wait_ns += dur;
            acc.stats.max_wait_ns = acc.stats.max_wait_ns.max(dur);
            let tid: Option<i64> = r.get(10)?;
            let thread = match r.get::<_, Option<String>>(11)? {
                Some(n) => format!("{n} ({})", tid.unwrap_or(0)),
                None => format!("tid {}", tid.unwrap_or(0)),
            };
            let w = acc.waiters.entry(thread).or_default();
            w.0 += 1;
            w.1 += dur;
        } else {
            // A hold, on the lock's track or (shared) on a thread's track under it.
            let parent_name: Option<String> = r.get(7)?;
            let shared = parent_name.is_some();
            let (track_name, upid) = if shared {
                (parent_name, r.get::<_, Option<i64>>(8)?)
            } else {
                (r.get::<_, Option<String>>(6)?, r.get::<_, Option<i64>>(5)?)
            };
            let acc = locks.entry((upid, lock_id)).or_default();
            acc.stats.upid = upid;
            if let Some(n) = track_name {
                acc.stats.name = n;
            }
            acc.stats.acquisitions += 1;
            acc.stats.shared += u64::from(shared);
            if dur >= 0 {
                acc.stats.total_hold_ns += dur;
                acc.stats.max_hold_ns = acc.stats.max_hold_ns.max(dur);
            }
        }
    }
    let mut out: Vec<LockStats> = locks
        .into_values()
        .map(|mut a| {
            let mut w: Vec<(String, u64, i64)> =
                a.waiters.into_iter().map(|(k, (n, t))| (k, n, t)).collect();
            w.sort_by(|x, y| y.2.cmp(&x.2).then_with(|| x.0.cmp(&y.0)));
            w.truncate(3);
            a.stats.top_waiters = w;
            a.stats
        })
        .collect();
    out.sort_by(|a, b| {
        b.total_wait_ns
            .cmp(&a.total_wait_ns)
            .then_with(|| b.acquisitions.cmp(&a.acquisitions))
            .then_with(|| a.name.cmp(&b.name))
    });
    Ok(out)
}

impl TraceProcessor {
    /// Per instrumented lock (`tachyon::sync`): acquisitions, contention, waits and holds,
    /// sorted by total wait (see [`LockStats`]).
    pub fn lock_stats(&self) -> Result<Vec<LockStats>, Error> {
        compute(self.connection())
    }
}

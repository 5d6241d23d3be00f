//! Tracy's lock statistics, from the slices Tachyon's instrumented locks write (category
//! `tachyon.lock`): holds on each lock's track (shared holds on per-thread tracks under it),
//! `wait for <lock>` slices on the waiting threads' tracks. A lock is its track (its name is the
//! track's); waits carry the argument `lock_id`, which the lock's holds carry at least once per
//! sequence generation, and are matched to the track through it (per process).

use rusqlite::Connection;

use crate::storage::strings::FxHashMap;
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
       t.utid, t.upid, t.name, p.name, p.upid, th.upid, th.tid, th.name, t.id, p.id
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

impl Acc {
    fn wait(&mut self, thread: String, dur: i64) {
        self.stats.contended += 1;
        self.stats.total_wait_ns += dur;
        self.stats.max_wait_ns = self.stats.max_wait_ns.max(dur);
        let w = self.waiters.entry(thread).or_default();
        w.0 += 1;
        w.1 += dur;
    }
}

/// A wait, before it is matched to its lock's track: (process, lock id, lock name, thread,
/// duration).
type Wait = (Option<i64>, i64, Option<String>, String, i64);

pub(crate) fn compute(conn: &Connection) -> Result<Vec<LockStats>, Error> {
    let mut st = conn.prepare(QUERY)?;
    let mut rows = st.query([])?;
    // Holds, by the lock's track (a shared hold's track is a child of it).
    let mut locks: FxHashMap<i64, Acc> = FxHashMap::default();
    // (process, lock id) → the lock's track, from the holds that carry the id.
    let mut ids: FxHashMap<(Option<i64>, i64), i64> = FxHashMap::default();
    let mut waits: Vec<Wait> = Vec::new();
    while let Some(r) = rows.next()? {
        let dur: i64 = r.get(1)?;
        let name: Option<String> = r.get(2)?;
        let lock_id: Option<i64> = r.get(3)?;
        let utid: Option<i64> = r.get(4)?;
        if utid.is_some() {
            // A wait, on the waiting thread's track.
            let Some(lock_id) = lock_id else {
                continue;
            };
            let tid: Option<i64> = r.get(10)?;
            let thread = match r.get::<_, Option<String>>(11)? {
                Some(n) => format!("{n} ({})", tid.unwrap_or(0)),
                None => format!("tid {}", tid.unwrap_or(0)),
            };
            let lock_name = name
                .as_deref()
                .and_then(|n| n.strip_prefix("wait for "))
                .map(str::to_owned);
            waits.push((r.get(9)?, lock_id, lock_name, thread, dur.max(0)));
            continue;
        }
        // A hold, on the lock's track or (shared) on a thread's track under it.
        let parent: Option<i64> = r.get(13)?;
        let shared = parent.is_some();
        let (track, track_name, upid) = if let Some(p) = parent {
            (
                p,
                r.get::<_, Option<String>>(7)?,
                r.get::<_, Option<i64>>(8)?,
            )
        } else {
            (
                r.get(12)?,
                r.get::<_, Option<String>>(6)?,
                r.get::<_, Option<i64>>(5)?,
            )
        };
        if let Some(id) = lock_id {
            ids.insert((upid, id), track);
        }
        let acc = locks.entry(track).or_default();
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
    // Waits whose lock has no identified hold (none can be: a wait is followed by its hold)
    // still count, under the lock's name, on a negative key of their own.
    let mut orphans: FxHashMap<(Option<i64>, i64), i64> = FxHashMap::default();
    for (upid, lock_id, lock_name, thread, dur) in waits {
        let key = match ids.get(&(upid, lock_id)) {
            Some(&t) => t,
            None => {
                let next = -1 - orphans.len() as i64;
                *orphans.entry((upid, lock_id)).or_insert(next)
            }
        };
        let acc = locks.entry(key).or_default();
        if acc.stats.name.is_empty() {
            acc.stats.name = lock_name.unwrap_or_default();
            acc.stats.upid = upid;
        }
        acc.wait(thread, dur);
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

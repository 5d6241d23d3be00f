//! Tracy's statistics view: per zone name, how often it ran and how long.

use rusqlite::Connection;

use crate::storage::strings::FxHashMap;
use crate::Error;

/// Statistics of all zones (slices with a duration) sharing one name.
///
/// Every slice that began and ended is a zone, including those whose begin and end fell on the
/// same nanosecond (`dur = 0`); instants and slices that never ended (`dur = -1`) are not zones
/// and are left out, and so are lock holds and waits and frames (categories `tachyon.lock` and
/// `tachyon.frame`: their own sections, `locks.rs` and `frames.rs`). Sums saturate at
/// `i64::MAX` (a hostile trace may hold durations whose sum does not fit). Self time is the
/// duration minus the time spent in direct children, as in Tracy.
/// Percentiles use the nearest-rank method.
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneStats {
    /// The zone name (`<unnamed>` for slices without one).
    pub name: String,
    /// How many zones.
    pub count: u64,
    /// Sum of durations, ns.
    pub total_ns: i64,
    /// Sum of self times, ns.
    pub self_ns: i64,
    /// Mean duration, ns.
    pub mean_ns: f64,
    /// Shortest, ns.
    pub min_ns: i64,
    /// Median, ns.
    pub median_ns: i64,
    /// 99th percentile, ns.
    pub p99_ns: i64,
    /// Longest, ns.
    pub max_ns: i64,
}

pub(crate) fn compute(conn: &Connection) -> Result<Vec<ZoneStats>, Error> {
    let mut st = conn.prepare(
        "SELECT id, parent_id, name, dur FROM slice WHERE (dur > 0 \
         OR (dur = 0 AND id IN (SELECT slice_id FROM __intrinsic_zero_length_zone))) \
         AND (category IS NULL OR category NOT IN ('tachyon.lock', 'tachyon.frame'))",
    )?;
    let mut zones: Vec<(i64, Option<i64>, Option<String>, i64)> = Vec::new();
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        zones.push((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?));
    }
    let mut children: FxHashMap<i64, i64> = FxHashMap::default();
    for &(_, parent, _, dur) in &zones {
        if let Some(p) = parent {
            let c = children.entry(p).or_insert(0);
            *c = c.saturating_add(dur);
        }
    }
    let mut by_name: FxHashMap<String, (Vec<i64>, i64)> = FxHashMap::default();
    for (id, _, name, dur) in zones {
        let e = by_name
            .entry(name.unwrap_or_else(|| "<unnamed>".to_owned()))
            .or_default();
        e.0.push(dur);
        let own = dur
            .saturating_sub(children.get(&id).copied().unwrap_or(0))
            .max(0);
        e.1 = e.1.saturating_add(own);
    }
    let mut out: Vec<ZoneStats> = by_name
        .into_iter()
        .map(|(name, (mut durs, self_ns))| {
            durs.sort_unstable();
            let n = durs.len();
            let total = durs.iter().fold(0i64, |a, &d| a.saturating_add(d));
            let rank = |p: f64| durs[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
            ZoneStats {
                name,
                count: n as u64,
                total_ns: total,
                self_ns,
                mean_ns: durs.iter().map(|&d| d as f64).sum::<f64>() / n as f64,
                min_ns: durs[0],
                median_ns: rank(0.5),
                p99_ns: rank(0.99),
                max_ns: durs[n - 1],
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then_with(|| a.name.cmp(&b.name))
    });
    Ok(out)
}

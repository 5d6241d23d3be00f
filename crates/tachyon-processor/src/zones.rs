//! Tracy's statistics view: per zone name, how often it ran and how long.

use rusqlite::types::ValueRef;
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

/// The zones' filter: slices that began and ended, lock and frame slices left out.
const ZONE_FILTER: &str = "(dur > 0 \
     OR (dur = 0 AND id IN (SELECT slice_id FROM __intrinsic_zero_length_zone))) \
     AND (category IS NULL OR category NOT IN ('tachyon.lock', 'tachyon.frame'))";

/// Name given to zones without one.
const UNNAMED: &[u8] = b"<unnamed>";

/// Reads the zones twice through SQL instead of holding them: the first pass sums each
/// parent's children, the second gathers each name's durations and self time. What is held is
/// about 16 bytes a zone (its duration and its children's sum), so statistics over a trace of
/// tens of millions of zones fit beside the loaded trace.
pub(crate) fn compute(conn: &Connection) -> Result<Vec<ZoneStats>, Error> {
    // Each parent's children's durations, by the parent's id: the slice table's ids are its
    // row numbers, so the vector is at most a slot per slice.
    let mut children: Vec<i64> = Vec::new();
    {
        let mut st = conn.prepare(&format!(
            "SELECT parent_id, dur FROM slice WHERE parent_id IS NOT NULL AND {ZONE_FILTER}"
        ))?;
        let mut rows = st.query([])?;
        while let Some(r) = rows.next()? {
            let Ok(parent) = usize::try_from(r.get::<_, i64>(0)?) else {
                continue;
            };
            if parent >= children.len() {
                children.resize(parent + 1, 0);
            }
            children[parent] = children[parent].saturating_add(r.get(1)?);
        }
    }

    let mut index: FxHashMap<Box<[u8]>, usize> = FxHashMap::default();
    let mut groups: Vec<(Box<[u8]>, Vec<i64>, i64)> = Vec::new();
    let mut st = conn.prepare(&format!(
        "SELECT id, name, dur FROM slice WHERE {ZONE_FILTER}"
    ))?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let id: i64 = r.get(0)?;
        let dur: i64 = r.get(2)?;
        let name = match r.get_ref(1)? {
            ValueRef::Text(t) | ValueRef::Blob(t) => t,
            _ => UNNAMED,
        };
        let g = match index.get(name) {
            Some(&g) => g,
            None => {
                index.insert(name.into(), groups.len());
                groups.push((name.into(), Vec::new(), 0));
                groups.len() - 1
            }
        };
        let below = usize::try_from(id)
            .ok()
            .and_then(|i| children.get(i))
            .copied()
            .unwrap_or(0);
        let own = dur.saturating_sub(below).max(0);
        let group = &mut groups[g];
        group.1.push(dur);
        group.2 = group.2.saturating_add(own);
    }
    drop(children);
    drop(index);

    let mut out: Vec<ZoneStats> = groups
        .into_iter()
        .map(|(name, mut durs, self_ns)| {
            durs.sort_unstable();
            let n = durs.len();
            let total = durs.iter().fold(0i64, |a, &d| a.saturating_add(d));
            let rank = |p: f64| durs[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
            ZoneStats {
                name: String::from_utf8_lossy(&name).into_owned(),
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

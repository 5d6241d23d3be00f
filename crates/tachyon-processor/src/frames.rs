//! Tracy's frame statistics, from the frame sets Tachyon's `frame_mark!` and `frame!` write:
//! slices of category `tachyon.frame` on a track per set. Frames that never ended (the one
//! open at the end of the trace) are left out.

use rusqlite::Connection;

use crate::storage::strings::FxHashMap;
use crate::{Error, TraceProcessor};

/// One frame set's frame times.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FrameStats {
    /// The set's name (its track's: `Frame` for the main set).
    pub name: String,
    /// Frames that ended.
    pub count: u64,
    /// Mean frame time, ns.
    pub mean_ns: f64,
    /// Median, ns (nearest rank, as the other percentiles).
    pub median_ns: i64,
    /// 90th percentile, ns.
    pub p90_ns: i64,
    /// 99th percentile, ns.
    pub p99_ns: i64,
    /// Longest, ns.
    pub max_ns: i64,
    /// Frames longer than twice the median (Tracy's "bad frames").
    pub over_2x_median: u64,
    /// Frames per second: 1 s / mean frame time.
    pub fps: f64,
}

pub(crate) fn compute(conn: &Connection) -> Result<Vec<FrameStats>, Error> {
    let mut st = conn.prepare(
        "SELECT s.track_id, t.name, s.dur FROM slice s JOIN track t ON s.track_id = t.id \
         WHERE s.category = 'tachyon.frame' AND s.dur >= 0",
    )?;
    let mut rows = st.query([])?;
    let mut sets: FxHashMap<i64, (String, Vec<i64>)> = FxHashMap::default();
    while let Some(r) = rows.next()? {
        let e = sets
            .entry(r.get(0)?)
            .or_insert_with(|| (String::new(), Vec::new()));
        if let Some(n) = r.get::<_, Option<String>>(1)? {
            e.0 = n;
        }
        e.1.push(r.get(2)?);
    }
    let mut out: Vec<FrameStats> = sets.into_values().map(|(name, d)| stats(name, d)).collect();
    out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.name.cmp(&b.name)));
    Ok(out)
}

/// The statistics of frame times `durs` (ns).
pub(crate) fn stats(name: String, mut durs: Vec<i64>) -> FrameStats {
    durs.sort_unstable();
    let n = durs.len();
    if n == 0 {
        return FrameStats {
            name,
            ..FrameStats::default()
        };
    }
    let total: i64 = durs.iter().sum();
    let rank = |p: f64| durs[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
    let median = rank(0.5);
    let mean = total as f64 / n as f64;
    FrameStats {
        name,
        count: n as u64,
        mean_ns: mean,
        median_ns: median,
        p90_ns: rank(0.9),
        p99_ns: rank(0.99),
        max_ns: durs[n - 1],
        over_2x_median: durs.iter().filter(|&&d| d > 2 * median).count() as u64,
        fps: if mean > 0.0 { 1e9 / mean } else { 0.0 },
    }
}

impl TraceProcessor {
    /// Per frame set: frame count and frame times (see [`FrameStats`]), most frames first.
    pub fn frame_stats(&self) -> Result<Vec<FrameStats>, Error> {
        compute(self.connection())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_bad_frames_and_fps() {
        // 16 ms frames, one 50 ms hitch.
        let mut d = vec![16_000_000; 9];
        d.push(50_000_000);
        let s = stats("Frame".into(), d);
        assert_eq!(s.count, 10);
        assert_eq!(s.median_ns, 16_000_000);
        assert_eq!(s.p90_ns, 16_000_000);
        assert_eq!(s.p99_ns, 50_000_000);
        assert_eq!(s.max_ns, 50_000_000);
        assert_eq!(s.over_2x_median, 1);
        assert!((s.mean_ns - 19.4e6).abs() < 1.0);
        assert!((s.fps - 1e9 / 19.4e6).abs() < 1e-9);
        assert_eq!(stats("x".into(), vec![]).count, 0);
    }
}

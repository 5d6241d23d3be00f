//! A criterion [`Measurement`] of the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`)
//! instead of wall time: on a shared, loaded machine wall time also counts the time the thread
//! waited for a core, which varies from sample to sample and from one bench to the next in the
//! same run, so ratios between benches mean little. CPU time counts only what the thread ran
//! (cache effects of the neighbours remain). `TACHYON_BENCH_WALL=1` measures wall time instead.

use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};

/// The calling thread's CPU time.
pub(crate) struct CpuTime;

fn now() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

impl Measurement for CpuTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        now()
    }
    fn end(&self, start: Duration) -> Duration {
        now().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        const WALL: &WallTime = &WallTime;
        WALL.formatter()
    }
}

/// Whether to measure wall time (`TACHYON_BENCH_WALL=1`) rather than CPU time.
pub(crate) fn wall() -> bool {
    std::env::var("TACHYON_BENCH_WALL").is_ok_and(|v| v == "1")
}

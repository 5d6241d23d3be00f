//! The trace clock: cheap timestamps in nanoseconds, tied to the system clocks.
//!
//! # Sources
//!
//! - **x86-64**: `rdtsc`, when CPUID says the TSC is invariant (leaf `0x8000_0007`, EDX bit 8:
//!   constant rate across P-states and C-states). One instruction, ~20 cycles.
//! - **aarch64**: the virtual counter `CNTVCT_EL0` (always constant-rate, frequency in
//!   `CNTFRQ_EL0`).
//! - **elsewhere**, or when the counter is not trustworthy, or when the environment variable
//!   `TACHYON_CLOCK=boottime` asks: `clock_gettime(CLOCK_BOOTTIME)`.
//!
//! # Conversion
//!
//! Counter ticks become nanoseconds (when an event is encoded) with one 64×64→128-bit multiply and a
//! shift, from a scale measured once at start-up by a short, bounded calibration against
//! `CLOCK_BOOTTIME` (at most [`CALIBRATION_BUDGET`]). The result is [`TRACE_CLOCK_ID`], a
//! clock in nanoseconds that starts equal to BOOTTIME. Because a calibrated counter drifts from
//! the kernel's clocks by a few parts per million, the SDK writes `ClockSnapshot` packets
//! ([`Snapshot`]) at start and periodically, so the trace processor maps every timestamp onto
//! BOOTTIME piecewise, and traces from several processes line up.

use std::sync::OnceLock;
use std::time::Duration;

/// The longest the start-up calibration may take.
pub const CALIBRATION_BUDGET: Duration = Duration::from_millis(20);

/// `ClockSnapshot` id of the trace clock (a global custom clock, ≥ 128, named as Perfetto
/// recommends: FNV-1a of the name with the top bit set).
pub const TRACE_CLOCK_ID: u32 = fnv1a(b"tachyon.trace_clock") | 0x8000_0000;

/// Perfetto's builtin clock ids (`common/builtin_clock.proto`), as `ClockSnapshot` takes them.
pub mod builtin {
    use tachyon_protos::BuiltinClock;

    /// `CLOCK_REALTIME`.
    pub const REALTIME: u32 = BuiltinClock::Realtime as u32;
    /// `CLOCK_MONOTONIC`.
    pub const MONOTONIC: u32 = BuiltinClock::Monotonic as u32;
    /// `CLOCK_BOOTTIME`, the default trace clock.
    pub const BOOTTIME: u32 = BuiltinClock::Boottime as u32;
}

const fn fnv1a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u32;
        h = h.wrapping_mul(0x0100_0193);
        i += 1;
    }
    h
}

/// Where timestamps come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// x86-64 invariant TSC.
    Tsc,
    /// aarch64 virtual counter.
    Cntvct,
    /// `clock_gettime(CLOCK_BOOTTIME)` (no counter, or asked for).
    Boottime,
}

/// The calibrated clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    source: Source,
    /// Nanoseconds per tick in 32.32 fixed point.
    mult: u64,
    base_ticks: u64,
    base_ns: u64,
}

static CLOCK: OnceLock<Clock> = OnceLock::new();

/// The process's trace clock (calibrated on first use).
#[inline]
pub fn clock() -> &'static Clock {
    CLOCK.get_or_init(Clock::calibrate)
}

/// Now, on the trace clock, in nanoseconds.
#[inline(always)]
pub fn now() -> u64 {
    clock().now()
}

impl Clock {
    /// `CLOCK_BOOTTIME` itself: ticks are nanoseconds.
    pub(crate) const BOOTTIME: Clock = Clock {
        source: Source::Boottime,
        mult: 1 << 32,
        base_ticks: 0,
        base_ns: 0,
    };

    /// The source in use.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Now, in nanoseconds on the trace clock.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        // One test of the source (not one to read and another to convert).
        match self.counter_ticks() {
            Some(ticks) => self.scale(ticks),
            None => self.ticks_to_ns(read_ticks(self.source)),
        }
    }

    /// [`ticks`](Self::ticks) when the source is this architecture's counter (read inline);
    /// `None` for any other source (the caller reads it out of line, keeping its own path
    /// free of a call and a stack frame).
    #[inline(always)]
    pub(crate) fn counter_ticks(&self) -> Option<u64> {
        #[cfg(target_arch = "x86_64")]
        if self.source == Source::Tsc {
            return Some(read_ticks(Source::Tsc));
        }
        #[cfg(target_arch = "aarch64")]
        if self.source == Source::Cntvct {
            return Some(read_ticks(Source::Cntvct));
        }
        None
    }

    /// Converts a raw counter reading (see [`Clock::ticks`]) to trace-clock nanoseconds.
    #[inline(always)]
    pub fn ticks_to_ns(&self, ticks: u64) -> u64 {
        if self.source == Source::Boottime {
            return ticks;
        }
        self.scale(ticks)
    }

    /// Counter ticks to nanoseconds: `base_ns + (ticks - base_ticks) * mult / 2^32`, the
    /// difference signed (readings before the base, another core's counter a hair behind, map
    /// below `base_ns`), one 64×64→128-bit signed multiply (`mult` < 2^63: less than 2^31 ns
    /// per tick).
    #[inline(always)]
    fn scale(&self, ticks: u64) -> u64 {
        let delta = ticks.wrapping_sub(self.base_ticks) as i64 as i128;
        let scaled = (delta * self.mult as i64 as i128) >> 32;
        self.base_ns.wrapping_add(scaled as u64)
    }

    /// A raw counter reading (ticks), the cheapest timestamp: convert later with
    /// [`Clock::ticks_to_ns`].
    #[inline(always)]
    pub fn ticks(&self) -> u64 {
        read_ticks(self.source)
    }

    /// Nanoseconds per tick (for reports).
    pub fn ns_per_tick(&self) -> f64 {
        self.mult as f64 / (1u64 << 32) as f64
    }

    fn calibrate() -> Clock {
        let forced =
            std::env::var("TACHYON_CLOCK").is_ok_and(|v| v.eq_ignore_ascii_case("boottime"));
        let source = if forced {
            Source::Boottime
        } else {
            counter_source()
        };
        if source == Source::Boottime {
            return Clock::BOOTTIME;
        }
        if let Some(freq) = counter_frequency(source) {
            // The architecture tells the frequency: no measuring needed.
            let (ticks, ns) = paired_reading(source);
            let mult = ((1_000_000_000u128 << 32) / freq as u128) as u64;
            return Clock {
                source,
                mult,
                base_ticks: ticks,
                base_ns: ns,
            };
        }
        // Measure ticks against BOOTTIME over a few short windows, keeping the longest one.
        let start = std::time::Instant::now();
        let (t0, n0) = paired_reading(source);
        let mut mult = 0u64;
        let mut window = Duration::from_millis(2);
        while start.elapsed() + window <= CALIBRATION_BUDGET {
            std::thread::sleep(window);
            let (t1, n1) = paired_reading(source);
            if t1 > t0 && n1 > n0 {
                let m = (((n1 - n0) as u128) << 32) / (t1 - t0) as u128;
                let prev = mult;
                mult = m as u64;
                // Two consecutive estimates within 10 ppm: good enough, the snapshots correct
                // the rest.
                if prev != 0
                    && (prev as i128 - mult as i128).unsigned_abs() * 100_000 < mult as u128
                {
                    break;
                }
            }
            window *= 2;
        }
        // `scale` needs `mult` < 2^63 (below 2^31 ns per tick: any real counter).
        if mult == 0 || mult >= 1 << 63 {
            return Clock::BOOTTIME;
        }
        Clock {
            source,
            mult,
            base_ticks: t0,
            base_ns: n0,
        }
    }
}

/// A counter reading and BOOTTIME taken together: the BOOTTIME read is bracketed by two counter
/// reads, and the tightest of a few attempts is kept (its midpoint).
fn paired_reading(source: Source) -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..5 {
        let a = read_ticks(source);
        let ns = boottime_ns();
        let b = read_ticks(source);
        if b >= a && b - a < best.0 {
            best = (b - a, a + (b - a) / 2, ns);
        }
    }
    (best.1, best.2)
}

fn counter_source() -> Source {
    // Miri interprets no counter instructions; its clocks are the system's.
    #[cfg(miri)]
    {
        Source::Boottime
    }
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // CPUID leaf 0x8000_0007 exists if the max extended leaf allows it.
        let max_ext = core::arch::x86_64::__cpuid(0x8000_0000).eax;
        if max_ext >= 0x8000_0007 && core::arch::x86_64::__cpuid(0x8000_0007).edx & (1 << 8) != 0 {
            return Source::Tsc;
        }
        Source::Boottime
    }
    #[cfg(all(target_arch = "aarch64", not(miri)))]
    {
        Source::Cntvct
    }
    #[cfg(all(not(any(target_arch = "x86_64", target_arch = "aarch64")), not(miri)))]
    {
        Source::Boottime
    }
}

/// The counter's frequency when the architecture states it (aarch64), in Hz.
fn counter_frequency(source: Source) -> Option<u64> {
    match source {
        #[cfg(target_arch = "aarch64")]
        Source::Cntvct => {
            let f: u64;
            // SAFETY: reading CNTFRQ_EL0 is allowed at EL0 and has no side effects.
            unsafe { core::arch::asm!("mrs {}, cntfrq_el0", out(reg) f, options(nomem, nostack)) };
            (f > 0).then_some(f)
        }
        _ => None,
    }
}

#[inline(always)]
fn read_ticks(source: Source) -> u64 {
    match source {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: rdtsc has no preconditions; it is only chosen after CPUID confirmed an
        // invariant TSC (and any x86-64 CPU has the instruction).
        Source::Tsc => unsafe { core::arch::x86_64::_rdtsc() },
        #[cfg(target_arch = "aarch64")]
        Source::Cntvct => {
            let t: u64;
            // SAFETY: CNTVCT_EL0 is readable at EL0 on Linux and has no side effects.
            unsafe { core::arch::asm!("mrs {}, cntvct_el0", out(reg) t, options(nomem, nostack)) };
            t
        }
        _ => boottime_ns(),
    }
}

// === system clocks ===

#[cfg(target_os = "linux")]
mod sys {
    #[repr(C)]
    pub(super) struct Timespec {
        pub(super) tv_sec: i64,
        pub(super) tv_nsec: i64,
    }
    extern "C" {
        pub(super) fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    pub(super) const CLOCK_REALTIME: i32 = 0;
    pub(super) const CLOCK_MONOTONIC: i32 = 1;
    pub(super) const CLOCK_BOOTTIME: i32 = 7;
}

/// Reads a Linux clock in nanoseconds.
#[cfg(target_os = "linux")]
fn read_clock(id: i32) -> u64 {
    let mut ts = sys::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec (64-bit time_t on the 64-bit targets we build
    // for); clock_gettime only writes it.
    let rc = unsafe { sys::clock_gettime(id, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// `CLOCK_BOOTTIME` in nanoseconds (monotonic, counts suspend).
pub fn boottime_ns() -> u64 {
    #[cfg(target_os = "linux")]
    {
        read_clock(sys::CLOCK_BOOTTIME)
    }
    #[cfg(not(target_os = "linux"))]
    {
        fallback_ns()
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
pub fn monotonic_ns() -> u64 {
    #[cfg(target_os = "linux")]
    {
        read_clock(sys::CLOCK_MONOTONIC)
    }
    #[cfg(not(target_os = "linux"))]
    {
        fallback_ns()
    }
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds (the clock of heap profile dumps).
pub fn monotonic_coarse_ns() -> u64 {
    #[cfg(target_os = "linux")]
    {
        const CLOCK_MONOTONIC_COARSE: i32 = 6;
        read_clock(CLOCK_MONOTONIC_COARSE)
    }
    #[cfg(not(target_os = "linux"))]
    {
        fallback_ns()
    }
}

/// `CLOCK_REALTIME` in nanoseconds since the Unix epoch.
pub fn realtime_ns() -> u64 {
    #[cfg(target_os = "linux")]
    {
        read_clock(sys::CLOCK_REALTIME)
    }
    #[cfg(not(target_os = "linux"))]
    {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}

#[cfg(not(target_os = "linux"))]
fn fallback_ns() -> u64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// The clocks read at one instant, for a `ClockSnapshot` packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The trace clock ([`TRACE_CLOCK_ID`]).
    pub trace_ns: u64,
    /// `CLOCK_BOOTTIME`.
    pub boottime_ns: u64,
    /// `CLOCK_MONOTONIC`.
    pub monotonic_ns: u64,
    /// `CLOCK_REALTIME`.
    pub realtime_ns: u64,
}

/// Readings of BOOTTIME between two trace-clock readings that [`Snapshot::take`] tries at
/// most, keeping the narrowest; and the window it accepts at once.
const SNAPSHOT_ATTEMPTS: u32 = 8;
const SNAPSHOT_WINDOW_NS: u64 = 1_000;

impl Snapshot {
    /// Reads all clocks as close together as possible: BOOTTIME between two readings of the
    /// trace clock, whose midpoint is taken as the trace clock's reading at that instant.
    ///
    /// The error of that pairing is up to half the window between the two trace-clock
    /// readings, and a thread preempted inside the window (routine on a loaded machine) made
    /// it milliseconds. Readers map timestamps onto BOOTTIME through the latest snapshot, so
    /// such an error is a step in the mapping where the snapshot was written, which is often
    /// inside an open zone (a generation start is written with the next event): a step back
    /// larger than the rest of the zone put its end before its begin on BOOTTIME, in
    /// Perfetto's trace processor as in Tachyon's (`misplaced_end_event`, the slice left
    /// open), the intermittent failure of `tests/threads_and_wrap.rs` under load. So the
    /// reading is retried while the window is wider than [`SNAPSHOT_WINDOW_NS`] (at most
    /// [`SNAPSHOT_ATTEMPTS`] times, a few hundred ns each) and the narrowest one is kept.
    pub fn take() -> Snapshot {
        let c = clock();
        let mut best = (u64::MAX, 0, 0);
        for _ in 0..SNAPSHOT_ATTEMPTS {
            let a = c.now();
            let boottime_ns = boottime_ns();
            let b = c.now();
            let window = b.saturating_sub(a);
            if window < best.0 {
                best = (window, a + window / 2, boottime_ns);
            }
            if window <= SNAPSHOT_WINDOW_NS {
                break;
            }
        }
        let (_, trace_ns, boottime_ns) = best;
        Snapshot {
            trace_ns,
            boottime_ns,
            monotonic_ns: monotonic_ns(),
            realtime_ns: realtime_ns(),
        }
    }

    /// `(clock id, timestamp)` pairs for a `ClockSnapshot`.
    pub fn clocks(&self) -> [(u32, u64); 4] {
        [
            (builtin::BOOTTIME, self.boottime_ns),
            (TRACE_CLOCK_ID, self.trace_ns),
            (builtin::MONOTONIC, self.monotonic_ns),
            (builtin::REALTIME, self.realtime_ns),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_clock_id_is_a_global_custom_clock() {
        const { assert!(TRACE_CLOCK_ID >= 128) };
        assert_eq!(fnv1a(b""), 0x811c_9dc5);
        assert_eq!(fnv1a(b"a"), 0xe40c_292c);
    }

    #[test]
    #[cfg_attr(miri, ignore = "sleeps and reads real clocks; slow under Miri")]
    fn the_trace_clock_is_monotonic_and_tracks_boottime() {
        let c = clock();
        let mut last = c.now();
        for _ in 0..10_000 {
            let t = c.now();
            assert!(t >= last, "time went backwards: {last} then {t}");
            last = t;
        }
        // Over a sleep, the trace clock and BOOTTIME advance by the same amount (within a
        // generous tolerance for a loaded VM: this checks the calibration's scale, not speed).
        let s0 = Snapshot::take();
        std::thread::sleep(Duration::from_millis(30));
        let s1 = Snapshot::take();
        let trace = s1.trace_ns - s0.trace_ns;
        let boot = s1.boottime_ns - s0.boottime_ns;
        let err = (trace as i64 - boot as i64).unsigned_abs();
        assert!(
            err * 20 < boot,
            "trace clock advanced {trace} ns, BOOTTIME {boot} ns"
        );
        // And it starts at BOOTTIME (same epoch), within a second.
        assert!((s1.trace_ns as i64 - s1.boottime_ns as i64).unsigned_abs() < 1_000_000_000);
    }

    #[test]
    fn ticks_convert_with_the_calibrated_scale() {
        let c = Clock {
            source: Source::Tsc,
            mult: 3 << 31,
            base_ticks: 1000,
            base_ns: 5000,
        };
        assert_eq!(c.ticks_to_ns(1000), 5000);
        assert_eq!(c.ticks_to_ns(1002), 5003); // 1.5 ns per tick
        assert_eq!(c.ticks_to_ns(998), 4997);
    }
}

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
//! shift, from a scale measured at start-up by a short, bounded calibration against
//! `CLOCK_BOOTTIME` (at most [`CALIBRATION_BUDGET`]). The result is [`TRACE_CLOCK_ID`], a clock in
//! nanoseconds that starts equal to BOOTTIME.
//!
//! # Discipline
//!
//! A calibrated counter drifts from the kernel's clocks by parts per million (0.75 ppm on the VM
//! this was measured on; a short calibration is itself only good to ~10 ppm). Readers map a
//! timestamp onto BOOTTIME through the latest `ClockSnapshot` before it, with slope 1, so a
//! trace clock that drifts and is re-paired with BOOTTIME every second makes the mapping step
//! back at every snapshot, and a zone open across one can end before it begins. So the trace
//! clock is *disciplined* to BOOTTIME: every [`Snapshot::take`] measures how far it is off, and
//! [`Model`] publishes a new segment of the tick → ns function that removes that error over
//! the next second ([`HORIZON_NS`]) and then runs at the rate measured since start-up. The
//! function stays continuous and increasing (each segment starts where the previous one is at
//! that tick, a millisecond in the future so no reading already converted changes), and a tick
//! converts the same way whenever it is converted (a segment is chosen by the tick, not by the
//! time of conversion). The trace clock is then BOOTTIME to within the pairing error and the
//! last second's drift (about a microsecond), and each snapshot states exactly that: trace clock
//! = BOOTTIME at its instant, so every reader's mapping is the identity, with no steps, whichever
//! process's or sequence's snapshot it picks.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

/// The calibrated clock: where ticks come from and how they become nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    source: Source,
    /// Ticks to nanoseconds (unused for [`Source::Boottime`], whose ticks are nanoseconds).
    model: &'static Model,
}

/// The process's tick → ns function: calibrated once by [`Clock::calibrate`], then disciplined
/// by [`Snapshot::take`].
static MODEL: Model = Model::new();

/// The model of [`Clock::BOOTTIME`], which converts nothing.
static UNUSED_MODEL: Model = Model::new();

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
        model: &UNUSED_MODEL,
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

    /// Counter ticks to nanoseconds through the disciplined model (see the module docs).
    #[inline(always)]
    fn scale(&self, ticks: u64) -> u64 {
        self.model.to_ns(ticks)
    }

    /// A converter for a batch of readings taken before this call: the model's current
    /// segment copied once, so each conversion is a compare and a multiply, with no atomic
    /// loads (the drainer's per-record path). Exact: a segment published later starts at a
    /// tick later than any reading taken before it.
    #[inline]
    pub(crate) fn converter(&self) -> Converter {
        Converter {
            boottime: self.source == Source::Boottime,
            segment: self.model.newest_segment(),
            model: self.model,
        }
    }

    /// A raw counter reading (ticks), the cheapest timestamp: convert later with
    /// [`Clock::ticks_to_ns`].
    #[inline(always)]
    pub fn ticks(&self) -> u64 {
        read_ticks(self.source)
    }

    /// Nanoseconds per tick (for reports).
    pub fn ns_per_tick(&self) -> f64 {
        if self.source == Source::Boottime {
            return 1.0;
        }
        self.model.newest_segment().rate() as f64 / (1u64 << 32) as f64
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
            MODEL.start(ticks, ns, mult);
            return Clock {
                source,
                model: &MODEL,
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
        MODEL.start(t0, n0, mult);
        Clock {
            source,
            model: &MODEL,
        }
    }
}

// === the disciplined tick → ns function ===

/// How long a measured error takes to be removed (trace-clock ns): the clock runs that much
/// faster or slower than the measured rate for this long after a [`Snapshot::take`].
pub const HORIZON_NS: u64 = 1_000_000_000;

/// The largest correction of the rate, in parts per million: a bad pairing (a thread preempted
/// between its readings) can only bend the clock this much, and the next snapshots undo it.
const MAX_CORRECTION_PPM: i128 = 500;

/// How far behind BOOTTIME (ns) the trace clock must be to step forward rather than catch up
/// at the bounded rate: only a counter that stopped (a suspend) gets this far.
const STEP_NS: u64 = 10_000_000;

/// How soon after the previous segment a new one may start (ns): snapshots come every second
/// per sequence, so with many threads this keeps the model from churning.
const MIN_SEGMENT_NS: u64 = 100_000_000;

/// How far in the future a new segment starts (ns), so that no reading converted with the
/// previous segment before the new one was published lies inside the new one.
const SEGMENT_LEAD_NS: u64 = 1_000_000;

/// Segments kept: a reading older than all of them (queued for seconds) converts with the
/// oldest one kept, a few ns off at most.
const SLOTS: usize = 8;

/// A line: from `ticks` (where it is at `ns`), `slope` ns per tick in 32.32 fixed point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    ticks: u64,
    ns: u64,
    slope: u64,
}

impl Piece {
    /// `ns + (t - ticks) * slope / 2^32`, the difference signed (a reading from before the
    /// piece, another core's counter a hair behind, maps below `ns`), one 64×64→128-bit
    /// signed multiply (slopes are < 2^62: below 2^30 ns a tick).
    #[inline(always)]
    fn at(&self, t: u64) -> u64 {
        let delta = t.wrapping_sub(self.ticks) as i64 as i128;
        let scaled = (delta * self.slope as i64 as i128) >> 32;
        self.ns.wrapping_add(scaled as u64)
    }
}

/// One piece of the tick → ns function: the correction piece from `pieces[0].ticks`, then
/// from `pieces[1].ticks` on, the measured rate (the value there stored, so a conversion is
/// one multiply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pieces: [Piece; 2],
}

impl Segment {
    /// A plain line through `(ticks, ns)` with slope `slope`.
    const fn line(ticks: u64, ns: u64, slope: u64) -> Segment {
        let p = Piece { ticks, ns, slope };
        Segment { pieces: [p, p] }
    }

    fn base_ticks(&self) -> u64 {
        self.pieces[0].ticks
    }

    fn rate(&self) -> u64 {
        self.pieces[1].slope
    }

    #[inline(always)]
    fn ns(&self, ticks: u64) -> u64 {
        self.pieces[usize::from(ticks >= self.pieces[1].ticks)].at(ticks)
    }
}

/// A segment's storage: a sequence lock around the fields, so a reader never blocks (a
/// signal handler may convert while the thread it interrupted is writing) and retries only
/// when a write finished while it read.
struct SegmentSlot {
    /// Odd while being written.
    seq: AtomicU64,
    /// `Segment::pieces`, field by field.
    pieces: [[AtomicU64; 3]; 2],
}

impl SegmentSlot {
    const fn new() -> SegmentSlot {
        SegmentSlot {
            seq: AtomicU64::new(0),
            pieces: [const { [const { AtomicU64::new(0) }; 3] }; 2],
        }
    }

    /// `ticks` in ns by this segment, or `None` when a write overlapped the read or `ticks`
    /// is before the segment (and `before` is false). Loads only the piece it needs.
    #[inline(always)]
    fn to_ns(&self, ticks: u64, before: bool) -> Option<u64> {
        let seq = self.seq.load(Ordering::Acquire);
        let base_ticks = self.pieces[0][0].load(Ordering::Relaxed);
        let end_ticks = self.pieces[1][0].load(Ordering::Relaxed);
        let piece = load_piece(&self.pieces[usize::from(ticks >= end_ticks)]);
        fence(Ordering::Acquire);
        let whole = seq & 1 == 0 && self.seq.load(Ordering::Relaxed) == seq;
        (whole && (before || ticks >= base_ticks)).then(|| piece.at(ticks))
    }

    /// The segment, or `None` when a write overlapped the read.
    fn read(&self) -> Option<Segment> {
        let seq = self.seq.load(Ordering::Acquire);
        let segment = Segment {
            pieces: [load_piece(&self.pieces[0]), load_piece(&self.pieces[1])],
        };
        fence(Ordering::Acquire);
        (seq & 1 == 0 && self.seq.load(Ordering::Relaxed) == seq).then_some(segment)
    }

    /// Only ever called by the one writer ([`Model::writing`] held, or before publication).
    fn write(&self, s: Segment) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (fields, p) in self.pieces.iter().zip(s.pieces) {
            for (field, v) in fields.iter().zip([p.ticks, p.ns, p.slope]) {
                field.store(v, Ordering::Relaxed);
            }
        }
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }
}

/// A piece's fields, loaded relaxed (the slot's sequence number orders them).
#[inline(always)]
fn load_piece(p: &[AtomicU64; 3]) -> Piece {
    Piece {
        ticks: p[0].load(Ordering::Relaxed),
        ns: p[1].load(Ordering::Relaxed),
        slope: p[2].load(Ordering::Relaxed),
    }
}

/// The tick → ns function: the start-up calibration, then a segment per correction, kept in
/// a ring of [`SLOTS`] (see the module docs, "Discipline").
pub(crate) struct Model {
    /// Segments published so far, minus one: the newest is in slot `newest % SLOTS`.
    newest: AtomicUsize,
    slots: [SegmentSlot; SLOTS],
    /// Where the rate is measured from (ticks, BOOTTIME ns: the calibration's pairing, or the
    /// first after a suspend), and the calibrated rate (32.32 ns per tick).
    origin: [AtomicU64; 3],
    /// Held by the one thread that is publishing a segment.
    writing: AtomicBool,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("segments", &(self.newest.load(Ordering::Relaxed) + 1))
            .field("newest", &self.newest_segment())
            .finish()
    }
}

impl Model {
    /// A model not started yet (converting nothing).
    pub(crate) const fn new() -> Model {
        Model {
            newest: AtomicUsize::new(0),
            slots: [const { SegmentSlot::new() }; SLOTS],
            origin: [const { AtomicU64::new(0) }; 3],
            writing: AtomicBool::new(false),
        }
    }

    /// The calibration: a line through `(ticks, ns)` with slope `mult`. Called once, before
    /// the model is shared (inside the clock's `OnceLock` initialisation, which orders these
    /// stores before every reader's loads).
    fn start(&self, ticks: u64, ns: u64, mult: u64) {
        self.origin[0].store(ticks, Ordering::Relaxed);
        self.origin[1].store(ns, Ordering::Relaxed);
        self.origin[2].store(mult, Ordering::Relaxed);
        self.slots[0].write(Segment::line(ticks, ns, mult));
        self.newest.store(0, Ordering::Release);
    }

    /// A model for tests: started, owned by the test.
    #[cfg(test)]
    fn started(ticks: u64, ns: u64, mult: u64) -> Box<Model> {
        let m = Box::new(Model::new());
        m.start(ticks, ns, mult);
        m
    }

    /// The newest segment (retried until read whole; a write is a handful of stores, and a
    /// reader interrupting the writer on its own thread finds the newest slot untouched: the
    /// writer fills the next slot and publishes it last).
    #[inline]
    fn newest_segment(&self) -> Segment {
        loop {
            let n = self.newest.load(Ordering::Acquire);
            if let Some(s) = self.slots[n % SLOTS].read() {
                return s;
            }
        }
    }

    /// `ticks` in trace-clock ns.
    #[inline(always)]
    fn to_ns(&self, ticks: u64) -> u64 {
        let n = self.newest.load(Ordering::Acquire);
        match self.slots[n % SLOTS].to_ns(ticks, n == 0) {
            Some(ns) => ns,
            None => self.to_ns_older(ticks),
        }
    }

    /// A reading from before the newest segment (or a read that overlapped a write).
    #[cold]
    #[inline(never)]
    fn to_ns_older(&self, ticks: u64) -> u64 {
        loop {
            let n = self.newest.load(Ordering::Acquire);
            let mut oldest = None;
            let mut torn = false;
            for k in 0..SLOTS.min(n + 1) {
                match self.slots[(n - k) % SLOTS].read() {
                    Some(s) if ticks >= s.base_ticks() => return s.ns(ticks),
                    Some(s) => oldest = Some(s),
                    // The writer is refilling the oldest slot: the one before it will do.
                    None if k + 1 == SLOTS => break,
                    None => {
                        torn = true;
                        break;
                    }
                }
            }
            if !torn {
                if let Some(s) = oldest {
                    return s.ns(ticks);
                }
            }
        }
    }

    /// A measurement: at `ticks` BOOTTIME read `boot_ns`. Publishes a segment that removes the
    /// trace clock's error over [`HORIZON_NS`] and then runs at the rate measured since the
    /// calibration, unless another thread is publishing or the newest segment is younger than
    /// [`MIN_SEGMENT_NS`]. `now` reads the counter (the segment starts [`SEGMENT_LEAD_NS`]
    /// after the reading taken just before it is published).
    fn observe(&self, ticks: u64, boot_ns: u64, now: impl Fn() -> u64) {
        if self.writing.swap(true, Ordering::Acquire) {
            return;
        }
        let n = self.newest.load(Ordering::Relaxed);
        if let Some(next) = self.correction(self.newest_segment(), ticks, boot_ns, now) {
            self.slots[(n + 1) % SLOTS].write(next);
            self.newest.store(n + 1, Ordering::Release);
        }
        self.writing.store(false, Ordering::Release);
    }

    /// The segment [`observe`](Self::observe) publishes after `cur`, if any.
    fn correction(
        &self,
        cur: Segment,
        ticks: u64,
        boot_ns: u64,
        now: impl Fn() -> u64,
    ) -> Option<Segment> {
        let [origin_ticks, origin_ns, calibrated] =
            [0, 1, 2].map(|i| self.origin[i].load(Ordering::Relaxed));
        if ticks <= origin_ticks || boot_ns <= origin_ns || ticks < cur.base_ticks() {
            return None;
        }
        let error = i128::from(cur.ns(ticks)) - i128::from(boot_ns);
        let to_ticks = |ns: u64, slope: i128| ((i128::from(ns) << 32) / slope) as u64;
        if error < -i128::from(STEP_NS) {
            // Far behind: the counter stopped while BOOTTIME went on (a suspend). Step
            // forward (never back) and measure the rate afresh from here.
            self.origin[0].store(ticks, Ordering::Relaxed);
            self.origin[1].store(boot_ns, Ordering::Relaxed);
            let rate = cur.rate();
            let base_ticks = now().wrapping_add(to_ticks(SEGMENT_LEAD_NS, rate.into()));
            let base_ns = Segment::line(ticks, boot_ns, rate).ns(base_ticks);
            return Some(Segment::line(base_ticks, base_ns, rate));
        }
        // The rate since calibration, 32.32 ns per tick: its error is the two pairings'
        // (each within half of `SNAPSHOT_WINDOW_NS`) over the span, a fraction of a ppm after
        // a second. Kept within 2 % of the calibrated one, which no real counter is off by.
        let calibrated = i128::from(calibrated);
        let bound = calibrated / 50;
        let rate = ((i128::from(boot_ns - origin_ns) << 32) / i128::from(ticks - origin_ticks))
            .clamp(calibrated - bound, calibrated + bound);
        if rate <= 0 || rate >= 1 << 62 {
            return None;
        }
        if ticks - cur.base_ticks() < to_ticks(MIN_SEGMENT_NS, rate) {
            return None;
        }
        let horizon = i128::from(HORIZON_NS);
        let limit = horizon * MAX_CORRECTION_PPM / 1_000_000;
        // Ahead (error > 0): run slower for the horizon, so it loses `error` ns over it.
        let mult = rate - rate * error.clamp(-limit, limit) / horizon;
        let base_ticks = now().wrapping_add(to_ticks(SEGMENT_LEAD_NS, rate));
        let correcting = Piece {
            ticks: base_ticks,
            ns: cur.ns(base_ticks),
            slope: mult as u64,
        };
        let end_ticks = base_ticks.wrapping_add(to_ticks(HORIZON_NS, mult));
        Some(Segment {
            pieces: [
                correcting,
                Piece {
                    ticks: end_ticks,
                    ns: correcting.at(end_ticks),
                    slope: rate as u64,
                },
            ],
        })
    }
}

/// [`Clock::converter`]'s result.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Converter {
    boottime: bool,
    segment: Segment,
    model: &'static Model,
}

impl Converter {
    /// `ticks` in trace-clock ns, as [`Clock::ticks_to_ns`].
    #[inline(always)]
    pub(crate) fn ns(&self, ticks: u64) -> u64 {
        if self.boottime {
            return ticks;
        }
        if ticks >= self.segment.base_ticks() {
            return self.segment.ns(ticks);
        }
        self.model.to_ns(ticks)
    }

    /// The line that [`ns`](Self::ns) converts `ticks` with, and the ticks it holds for: for a
    /// run of readings (the drainer's), each converted by [`Linear::ns`] with one range check
    /// and a multiply until one falls outside it.
    #[inline]
    pub(crate) fn linear(&self, ticks: u64) -> Linear {
        if self.boottime {
            // The identity: `at(t)` with slope 1.0 from (0, 0) is `t`.
            return Linear {
                lo: 0,
                span: u64::MAX,
                piece: Piece {
                    ticks: 0,
                    ns: 0,
                    slope: 1 << 32,
                },
            };
        }
        let [first, second] = self.segment.pieces;
        if ticks >= first.ticks && ticks >= second.ticks {
            // `ns` takes the second piece for every reading from the segment's base on that is
            // at or after the second piece's start (the two coincide unless the second wrapped).
            let lo = first.ticks.max(second.ticks);
            Linear {
                lo,
                span: u64::MAX - lo,
                piece: second,
            }
        } else if ticks >= first.ticks {
            // first.ticks <= ticks < second.ticks.
            Linear {
                lo: first.ticks,
                span: second.ticks - first.ticks,
                piece: first,
            }
        } else {
            // Before the segment: an older one converts it (`Model::to_ns`), never this line.
            Linear {
                lo: 0,
                span: 0,
                piece: first,
            }
        }
    }
}

/// One line of a [`Converter`] and the ticks it holds for ([`Converter::linear`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Linear {
    lo: u64,
    span: u64,
    piece: Piece,
}

impl Linear {
    /// `ticks` in trace-clock ns, exactly as [`Converter::ns`] converts it, if the line holds
    /// for it (`None`: ask the converter).
    #[inline(always)]
    pub(crate) fn ns(&self, ticks: u64) -> Option<u64> {
        (ticks.wrapping_sub(self.lo) < self.span).then(|| self.piece.at(ticks))
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
    /// How far the trace clock was from BOOTTIME as measured (trace − BOOTTIME, ns): the
    /// error stated as zero in `boottime_ns`, within the pairing's error.
    pub residual_ns: i64,
}

/// Readings of BOOTTIME between two trace-clock readings that [`Snapshot::take`] tries at
/// most, keeping the narrowest; and the window it accepts at once.
const SNAPSHOT_ATTEMPTS: u32 = 8;
const SNAPSHOT_WINDOW_NS: u64 = 1_000;

impl Snapshot {
    /// Reads all clocks as close together as possible, disciplines the trace clock with the
    /// reading, and states the trace clock as BOOTTIME at that instant (see the module docs,
    /// "Discipline"); MONOTONIC and REALTIME, read just after BOOTTIME, are moved by the same
    /// residual so the four stay one instant.
    ///
    /// The pairing reads BOOTTIME between two counter readings and takes their midpoint. Its
    /// error is up to half the window between them, and a thread preempted inside the window
    /// (routine on a loaded machine) made it milliseconds, so the reading is retried while
    /// the window is wider than [`SNAPSHOT_WINDOW_NS`] (at most [`SNAPSHOT_ATTEMPTS`] times, a
    /// few hundred ns each), the narrowest one is kept, and only a narrow one disciplines the
    /// clock.
    pub fn take() -> Snapshot {
        Snapshot::take_with(clock())
    }

    fn take_with(c: &Clock) -> Snapshot {
        let mut best = (u64::MAX, 0, 0);
        for _ in 0..SNAPSHOT_ATTEMPTS {
            let a = c.ticks();
            let boottime_ns = boottime_ns();
            let b = c.ticks();
            let window = b.wrapping_sub(a);
            if b >= a && window < best.0 {
                best = (window, a + window / 2, boottime_ns);
            }
            if b >= a && c.ticks_to_ns(b).saturating_sub(c.ticks_to_ns(a)) <= SNAPSHOT_WINDOW_NS {
                if c.source != Source::Boottime {
                    c.model.observe(best.1, best.2, || c.ticks());
                }
                break;
            }
        }
        if best.0 == u64::MAX {
            // No attempt read the counter in order (not seen on any machine): say the clocks
            // are where they are, without disciplining.
            best = (0, c.ticks(), boottime_ns());
        }
        let (_, ticks, measured_boottime_ns) = best;
        let trace_ns = c.ticks_to_ns(ticks);
        let residual = trace_ns.wrapping_sub(measured_boottime_ns);
        Snapshot {
            trace_ns,
            boottime_ns: trace_ns,
            monotonic_ns: monotonic_ns().wrapping_add(residual),
            realtime_ns: realtime_ns().wrapping_add(residual),
            residual_ns: residual as i64,
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
        let boot = |s: &Snapshot| s.trace_ns.wrapping_sub(s.residual_ns as u64);
        let trace = s1.trace_ns - s0.trace_ns;
        let boot_delta = boot(&s1) - boot(&s0);
        let err = (trace as i64 - boot_delta as i64).unsigned_abs();
        assert!(
            err * 20 < boot_delta,
            "trace clock advanced {trace} ns, BOOTTIME {boot_delta} ns"
        );
        // It runs on BOOTTIME's epoch (within a millisecond, even right after calibration and
        // on a loaded machine), and a snapshot states it as BOOTTIME.
        assert!(s1.residual_ns.unsigned_abs() < 1_000_000, "{s1:?}");
        assert_eq!(s1.boottime_ns, s1.trace_ns);
    }

    #[test]
    fn ticks_convert_with_the_calibrated_scale() {
        static MODEL: Model = Model::new();
        MODEL.start(1000, 5000, 3 << 31);
        let c = Clock {
            source: Source::Tsc,
            model: &MODEL,
        };
        assert_eq!(c.ticks_to_ns(1000), 5000);
        assert_eq!(c.ticks_to_ns(1002), 5003); // 1.5 ns per tick
        assert_eq!(c.ticks_to_ns(998), 4997);
        assert_eq!(c.converter().ns(1002), 5003);
        assert_eq!(c.converter().ns(998), 4997);
    }

    /// What the drainer converts a run with: each line of the newest segment gives exactly the
    /// converter's value for every reading it claims, and claims none it would get wrong, at
    /// the edges of both pieces and before the segment (which an older one converts).
    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe arithmetic on atomics, no unsafe code; slow under Miri"
    )]
    fn a_runs_line_converts_as_the_converter_does() {
        static MODEL: Model = Model::new();
        let sec = 3_000_000_000u64;
        MODEL.start(0, 0, ((1u128 << 32) / 3) as u64);
        // A pairing 400 ns off: the newest segment gets a correcting piece, then the rate.
        MODEL.observe(sec, sec / 3 + 400, || sec);
        let c = Clock {
            source: Source::Tsc,
            model: &MODEL,
        };
        let conv = c.converter();
        let [first, second] = conv.segment.pieces;
        assert!(
            first.slope != second.slope && first.ticks < second.ticks,
            "{first:?} {second:?}"
        );
        let mut probes = Vec::new();
        for edge in [0, sec, first.ticks, second.ticks, u64::MAX - 40] {
            probes.extend((0..80).map(|d| edge.saturating_sub(40).saturating_add(d)));
        }
        let mut claimed = [0usize; 3];
        for &from in &probes {
            let line = conv.linear(from);
            for &t in &probes {
                if let Some(ns) = line.ns(t) {
                    assert_eq!(
                        ns,
                        conv.ns(t),
                        "tick {t} on the line of tick {from}: {line:?}"
                    );
                }
            }
            let k = match line.ns(from) {
                None => 0,
                Some(_) if from < second.ticks => 1,
                Some(_) => 2,
            };
            claimed[k] += 1;
            // A line claims the reading it was made for, unless an older segment converts it.
            assert_eq!(k == 0, from < first.ticks, "tick {from}: {line:?}");
        }
        assert!(claimed.iter().all(|&n| n > 0), "{claimed:?}");
        // BOOTTIME: the identity, for every reading but the one past its span.
        let boot = Clock::BOOTTIME.converter();
        for t in [0, 1, 12345, u64::MAX - 1] {
            assert_eq!(boot.linear(7).ns(t), Some(t));
        }
        assert_eq!(boot.linear(7).ns(u64::MAX), None);
    }

    /// A simulated counter at 3 GHz (`ticks / 3` ns of BOOTTIME) and a model calibrated
    /// `ppm_off` parts per million too fast, from tick 0 = BOOTTIME 0.
    fn simulated(ppm_off: i64) -> (Box<Model>, impl Fn(u64) -> u64) {
        let true_mult = (1u128 << 32) / 3;
        let mult = (true_mult as i128 * (1_000_000 + ppm_off as i128) / 1_000_000) as u64;
        let boot = |ticks: u64| ticks / 3;
        (Model::started(0, 0, mult), boot)
    }

    /// Checks that the model is continuous and increasing across each of its segments'
    /// starts and ends, tick by tick.
    fn assert_continuous(m: &Model) {
        let n = m.newest.load(Ordering::Relaxed);
        for k in 0..SLOTS.min(n + 1) {
            let s = m.slots[(n - k) % SLOTS].read().unwrap();
            for edge in [s.pieces[0].ticks, s.pieces[1].ticks]
                .into_iter()
                .filter(|&e| e >= 30)
            {
                let mut last = m.to_ns(edge - 30);
                for t in edge - 29..edge + 30 {
                    let v = m.to_ns(t);
                    assert!(v >= last, "back at tick {t} ({last} then {v}) in {s:?}");
                    // At most one tick's worth (⌈1/3⌉ ns) plus rounding per step.
                    assert!(v - last <= 1, "jump at tick {t} ({last} then {v}) in {s:?}");
                    last = v;
                }
            }
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe arithmetic on atomics, no unsafe code; slow under Miri"
    )]
    fn the_discipline_brings_a_drifting_clock_onto_boottime_without_steps() {
        let (m, boot) = simulated(12);
        let sec = 3_000_000_000u64;
        let mut errors = Vec::new();
        for i in 1..=20u64 {
            let ticks = i * sec;
            m.observe(ticks, boot(ticks), || ticks);
            assert_continuous(&m);
            errors.push(m.to_ns(ticks + sec / 2) as i64 - boot(ticks + sec / 2) as i64);
        }
        // 12 ppm is 12 µs after the first second; from the third second on, within 100 ns.
        assert!(errors[0].abs() > 1_000, "{errors:?}");
        assert!(errors[3..].iter().all(|e| e.abs() < 100), "{errors:?}");
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe arithmetic on atomics, no unsafe code; slow under Miri"
    )]
    fn a_converted_tick_keeps_its_value_as_segments_are_added() {
        let (m, boot) = simulated(-8);
        let sec = 3_000_000_000u64;
        let mut seen = Vec::new();
        for i in 1..=6u64 {
            let ticks = i * sec;
            // Readings of this second, converted before the next correction is published.
            for t in [ticks - sec / 3, ticks - 7, ticks - 1] {
                seen.push((t, m.to_ns(t)));
            }
            m.observe(ticks, boot(ticks), || ticks);
        }
        for (t, v) in seen {
            assert_eq!(m.to_ns(t), v, "tick {t}");
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe arithmetic on atomics, no unsafe code; slow under Miri"
    )]
    fn a_bad_pairing_bends_the_clock_little_and_a_long_pause_adds_no_error() {
        let (m, boot) = simulated(0);
        let sec = 3_000_000_000u64;
        let ppm = |slope: u64| (slope as f64 / ((1u64 << 32) as f64 / 3.0) - 1.0) * 1e6;
        // A pairing 500 ns off, the worst `SNAPSHOT_WINDOW_NS` lets through.
        m.observe(sec, boot(sec) + 500, || sec);
        let s = m.newest_segment();
        assert!(ppm(s.pieces[0].slope).abs() < 1.5, "{s:?}");
        assert!(ppm(s.rate()).abs() < 1.0, "{s:?}");
        // The correction lasts one horizon: an hour later the error is the rate's (500 ns
        // over a second: 0.5 ppm, 1.8 ms an hour) less what the correction removed, not the
        // correction's rate times the pause.
        let later = sec + 3600 * sec;
        let err = m.to_ns(later) as i64 - boot(later) as i64;
        assert!(err.abs() < 2_000_000, "{err}");
        m.observe(later, boot(later), || later);
        assert_continuous(&m);
        // A model younger than the minimum segment length ignores a measurement.
        let n = m.newest.load(Ordering::Relaxed);
        m.observe(later + 1_000, boot(later), || later + 1_000);
        assert_eq!(m.newest.load(Ordering::Relaxed), n);
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe arithmetic on atomics, no unsafe code; slow under Miri"
    )]
    fn a_bad_calibration_is_corrected_at_a_bounded_rate() {
        let (m, boot) = simulated(2_000);
        let sec = 3_000_000_000u64;
        let true_mult = ((1u64 << 32) / 3) as f64;
        let mut errors = Vec::new();
        for i in 1..=8u64 {
            let ticks = i * sec;
            m.observe(ticks, boot(ticks), || ticks);
            let s = m.newest_segment();
            let (mult, rate) = (s.pieces[0].slope as f64, s.rate() as f64);
            assert!((rate / true_mult - 1.0).abs() < 0.01e-6, "{s:?}");
            assert!((mult / rate - 1.0).abs() <= 500.5e-6, "{s:?}");
            assert_continuous(&m);
            errors.push(m.to_ns(ticks + sec) as i64 - boot(ticks + sec) as i64);
        }
        // 2 ms after a second, then 0.5 ms less each second, then within 100 ns.
        assert!(
            errors
                .windows(2)
                .all(|w| w[1].abs() <= w[0].abs() || w[1].abs() < 100),
            "{errors:?}"
        );
        assert!(errors[5..].iter().all(|e| e.abs() < 100), "{errors:?}");
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe arithmetic on atomics, no unsafe code; slow under Miri"
    )]
    fn a_counter_that_stopped_steps_forward() {
        let (m, boot) = simulated(0);
        let sec = 3_000_000_000u64;
        m.observe(sec, boot(sec), || sec);
        let before = m.to_ns(2 * sec);
        // Suspended for a minute: BOOTTIME went on, the counter did not.
        m.observe(2 * sec, boot(2 * sec) + 60_000_000_000, || 2 * sec);
        let after = 2 * sec + sec / 100;
        let v = m.to_ns(after);
        assert!(v > before);
        let expected = boot(after) + 60_000_000_000;
        assert!(
            (v as i64 - expected as i64).abs() < 1_000,
            "{v} vs {expected}"
        );
        // And the rate is measured from there on.
        let t = 5 * sec;
        m.observe(t, boot(t) + 60_000_000_000, || t);
        let err = m.to_ns(t + sec) as i64 - (boot(t + sec) + 60_000_000_000) as i64;
        assert!(err.abs() < 100, "{err}");
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe arithmetic on atomics, no unsafe code; slow under Miri"
    )]
    fn readings_older_than_every_kept_segment_convert_with_the_oldest() {
        let (m, boot) = simulated(3);
        let sec = 3_000_000_000u64;
        for i in 1..=(SLOTS as u64 + 3) {
            m.observe(i * sec, boot(i * sec), || i * sec);
        }
        let n = m.newest.load(Ordering::Relaxed);
        let oldest = m.slots[(n + 1) % SLOTS].read().unwrap();
        assert_eq!(m.to_ns(10), oldest.ns(10));
    }

    #[test]
    #[cfg_attr(miri, ignore = "many threads and conversions; slow under Miri")]
    fn conversions_stay_increasing_while_segments_are_published() {
        let c = clock();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let stop = std::sync::Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut last = 0;
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) || n < 100_000 {
                        let t = c.now();
                        assert!(t >= last, "back: {last} then {t}");
                        last = t;
                        n += 1;
                    }
                })
            })
            .collect();
        let model = c.model;
        for _ in 0..20 {
            // Publish as fast as the minimum segment length allows.
            std::thread::sleep(Duration::from_millis(105));
            Snapshot::take();
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
        if c.source() != Source::Boottime {
            assert!(model.newest.load(Ordering::Relaxed) >= 2, "{model:?}");
        }
    }
}

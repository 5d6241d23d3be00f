//! What instrumentation costs the instrumented thread, beside the clock it cannot avoid, in
//! one run (group `client`):
//!
//! - `client/zone/enabled`: `let _z = zone!("name")` — a slice begin and end with a static
//!   name, both written into the shared memory buffer of a running in-process session.
//! - `client/zone/disabled`: the same macro whose category the session disabled.
//! - `client/instant`: `instant!("name")`.
//! - `client/counter`: `counter!("name", i)`.
//! - `client/lock/uncontended`: lock + unlock of a `tachyon::sync::Mutex` no other thread
//!   wants (one record queued at the release, with the hold's duration), beside
//!   `client/baseline/std_mutex`, the same on `std::sync::Mutex`. Goal: ≤ 1.5×
//!   `client/zone/enabled`.
//! - `client/frame_mark`: `frame_mark!()` (ends a frame and begins the next on the frames
//!   track: two packets through the thread's state).
//! - `client/message/static`: `message!("text")` (an instant with a `log_message` whose body is
//!   interned).
//! - `client/plot`: `Plot::set` on a number plot.
//! - `client/baseline/two_timestamps`: two raw reads of the trace clock's counter (`rdtsc` on
//!   x86-64): what a zone's begin and end cost in clock reads alone. The goal is a zone at
//!   ≤ 1.2× this.
//! - `client/baseline/speed_of_light`: two 16-byte stores at a moving position in a 4 KiB
//!   buffer: the bytes of a zone, written with no encoding and no bookkeeping.
//! - `client/throughput/two_threads`: two threads each writing zones; one iteration is one
//!   zone on each thread (4 events), so events/s = 4 / time per iteration.
//!
//! After criterion, the bench writes 2M zones on this thread and prints the CPU time the helper
//! threads spent meanwhile (from `/proc/self/task/*/schedstat`), per event: the work the hot
//! path hands to other threads (the SDK's `tachyon-drain` thread encoding the queued events into
//! packets, the in-process service thread copying chunks into the central buffer), then the
//! wall time of stopping that session per event: the read-out of the buffer into the trace.
//! Beside them: the traced thread's own CPU per event, how many events it encoded itself (its
//! queue full, the drainer behind: that encoding is in the traced thread's CPU, not the
//! helpers'), how often another thread took its core (involuntary context switches), how often
//! each helper slept, and each helper's page faults. The total CPU an event costs, the traced
//! thread's plus the helpers', is printed too, and how the flood's time spreads over its blocks
//! of 1 000 zones (slow throughout, or slow in a few stalls).
//! It does so twice: with the central buffer mapped page by page as chunks first reach it (the
//! default; one page fault per 4 KiB chunk on the service thread, since these 2M zones are the
//! buffer's first pass), then prefaulted at the session's start (`Config::prefault_buffer`),
//! which is what a session pays per event once it has gone round its buffer.
//!
//! Run: `cargo bench -p tachyon --bench client`.
//!
//! With `TACHYON_CLIENT_CALLGRIND=N` the bench skips criterion, starts a session and writes N
//! enabled zones in `zones` (after one warm-up zone): run it under callgrind and divide
//! `zones`' inclusive instruction count by N (command in the README).
//!
//! With `TACHYON_CLIENT_STREAM=N` the bench skips criterion, writes N zones into a session
//! streaming into a file every 100 ms (blocks of 20 000 zones, 5 ms apart) and prints
//! the traced thread's and the helper threads' CPU per event (the periods' read-out included),
//! how often each helper slept, and the service thread's page faults: a streamed session's
//! read-out frees the ring, which the writes then reuse.
//!
//! With `TACHYON_CLIENT_RATIO=N` the bench skips criterion too and measures the goal's ratio on
//! a machine others share: N rounds, each timing 2 000 enabled zones then 2 000 pairs of raw
//! counter reads (`client/zone/enabled` and `client/baseline/two_timestamps`, the same code)
//! back to back, and prints per iteration the minimum and median of each, the median and
//! quartiles of the per-round ratio, and the helper threads' CPU per event over the rounds.
//! Load that comes and goes hits both halves of a round alike, which criterion's separate runs
//! cannot promise.
//!
//! With `TACHYON_CLIENT_HOT_CPU=N` the bench skips criterion and measures the hot path alone in
//! the traced thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`: time the thread spends off its core,
//! preempted or waiting, is not in it): N rounds, each emptying this thread's queue untimed (a
//! zone with an argument, which encodes the queue on the thread), then timing 4 096 enabled
//! zones (8 192 records: the queue, 16 384, never fills, so the thread neither waits for the
//! drainer nor encodes) and 4 096 pairs of raw counter reads; prints the median and minimum CPU
//! per zone and per pair, the per-round difference's median and deciles, and how often another
//! thread took this one's core. The drainer and service run as usual meanwhile: the difference
//! is what the hot path costs beside the clock, plus what the helpers' work on the ring and on
//! this core costs this thread.
//!
//! With `TACHYON_CLIENT_LOCK_RATIO=N` the same for the lock goal: N rounds, each timing 2 000
//! uncontended lock + unlock of a `tachyon::sync::Mutex`, 2 000 enabled zones and 2 000
//! lock + unlock of a `std::sync::Mutex` back to back; prints the medians and the per-round
//! ratios lock / zone and lock / std, and the floor: a std lock + unlock with the two counter
//! reads a hold's begin and end need, nothing recorded (what no traced hold can go below), as a
//! ratio to the zone, and the fastest round of each (the ratio of the minima, steadier than
//! the medians when other processes take the CPU); first, the helper threads' CPU per lock
//! record (200 000 holds: what encoding a queued hold costs the drainer). Two passes: the
//! loops back to back, then with the thread's queue emptied before each timed loop (the hot
//! path alone, without the records this thread encodes itself when the drainer falls behind).
//!
//! With `TACHYON_CLIENT_LONG_FLOOD=S` the bench skips criterion and records zones without a
//! pause for S seconds, as the shared peer bench's `span/tachyon` row does (an in-memory
//! session, a 64 MiB buffer), in windows of 2 M zones; per window it prints the thread's time
//! per zone as a ratio to two counter reads (timed first), the share of the events the thread
//! encoded itself, the helpers' CPU per event and their sleeps and preemptions, and the thread's
//! preemptions. Where the 40 ms flood above shows a session's first pass, this shows the state a
//! flood settles in, and whether it changes on its way (docs/data-path.md, "The drainer applies
//! the commits").
//!
//! With `TACHYON_CLIENT_CLOCK_PROBE=N` the bench skips criterion and times, as the fastest of N
//! rounds of 2 000 iterations each, what the counter costs beside the atomics a lock uses:
//! one raw read of the trace clock's counter, two, a locked read-modify-write (`fetch_add`),
//! the two alternating, std's lock + unlock, and std's lock + unlock with two reads: both
//! while it is held (the lock goal's floor), or the first before the lock, clamped to the last
//! holder's end kept beside it (the order a traced hold needs).
//! Where the counter's read overlaps little of the work around it (as on the project's VM),
//! the costs add up, and a read beside an atomic pays part of the atomic's latency too.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use tachyon::{CategoryFilter, Config};

#[path = "support/threads.rs"]
mod threads;
use threads::{this_thread_cpu_ns, thread_cpu_ns, thread_dir};

fn start_session() {
    start_session_with(false);
}

fn start_session_with(prefault_buffer: bool) {
    tachyon::start(Config {
        prefault_buffer,
        output: None,
        // The buffer only has to absorb what the service copies; a ring keeps memory bounded.
        buffer_size: 64 << 20,
        categories: CategoryFilter::new(&[], &["disabled"]),
        ..Config::default()
    })
    .expect("start the session");
}

fn bench(c: &mut Criterion) {
    start_session();
    let mut g = c.benchmark_group("client");
    g.throughput(Throughput::Elements(1));

    g.bench_function("zone/enabled", |b| {
        b.iter(|| {
            let _z = tachyon::zone!("bench zone");
        })
    });
    g.bench_function("zone/disabled", |b| {
        b.iter(|| {
            let _z = tachyon::zone!("disabled", "bench zone");
        })
    });
    g.bench_function("instant", |b| b.iter(|| tachyon::instant!("bench instant")));
    let mut i = 0u32;
    g.bench_function("counter", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            tachyon::counter!("bench counter", black_box(i));
        })
    });

    let lock = tachyon::sync::Mutex::new_named("bench lock", 0u64);
    g.bench_function("lock/uncontended", |b| {
        b.iter(|| {
            *black_box(&lock).lock().unwrap() += 1;
        })
    });
    let std_lock = std::sync::Mutex::new(0u64);
    g.bench_function("baseline/std_mutex", |b| {
        b.iter(|| {
            *black_box(&std_lock).lock().unwrap() += 1;
        })
    });
    g.bench_function("frame_mark", |b| b.iter(|| tachyon::frame_mark!()));
    g.bench_function("message/static", |b| {
        b.iter(|| tachyon::message!("bench message"))
    });
    let plot = tachyon::Plot::new("bench plot", tachyon::PlotKind::Number);
    let mut p = 0u32;
    g.bench_function("plot", |b| {
        b.iter(|| {
            p = p.wrapping_add(1);
            plot.set(black_box(p));
        })
    });

    let clock = tachyon::clock::clock();
    g.bench_function("baseline/two_timestamps", |b| {
        b.iter(|| {
            let a = clock.ticks();
            let b = clock.ticks();
            black_box((a, b))
        })
    });

    let mut buf = vec![0u8; 4096];
    let mut pos = 0usize;
    let block = [0x5au8; 16];
    g.bench_function("baseline/speed_of_light", |b| {
        b.iter(|| {
            if pos + 32 > buf.len() {
                pos = 0;
            }
            buf[pos..pos + 16].copy_from_slice(black_box(&block));
            buf[pos + 16..pos + 32].copy_from_slice(black_box(&block));
            pos += 32;
            black_box(&mut buf);
        })
    });

    g.throughput(Throughput::Elements(4));
    g.bench_function("throughput/two_threads", |b| {
        b.iter_custom(|iters| {
            let barrier = Arc::new(Barrier::new(3));
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let barrier = Arc::clone(&barrier);
                    std::thread::spawn(move || {
                        barrier.wait();
                        let t = Instant::now();
                        for _ in 0..iters {
                            let _z = tachyon::zone!("bench zone");
                        }
                        t.elapsed()
                    })
                })
                .collect();
            barrier.wait();
            let times: Vec<Duration> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            // Both threads ran the same iterations concurrently: the slower one is the time.
            times.into_iter().max().unwrap()
        })
    });
    g.finish();

    let report = tachyon::shutdown().unwrap().unwrap();
    eprintln!(
        "session: {} chunks committed, {} packets dropped, {} stalls",
        report.writers.chunks_committed, report.writers.packets_dropped, report.writers.stalls
    );
    service_cpu_per_event(false);
    service_cpu_per_event(true);
}

/// The threads the hot path hands work to: the SDK's drainer (encoding queued events into
/// packets) and the in-process service (copying committed chunks into the central buffer).
const HELPERS: [&str; 2] = ["tachyon-drain", "tachyon-service"];

fn helpers_cpu_ns() -> [Option<u64>; 2] {
    HELPERS.map(thread_cpu_ns)
}

/// Minor page faults of this process's thread named `name` so far (`stat`'s 10th field): the
/// first write to each page of a fresh central buffer faults, and its cost is in the thread's
/// CPU time (kernel side).
fn thread_minor_faults(name: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(thread_dir(name)?.join("stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(7)?
        .parse()
        .ok()
}

/// Voluntary context switches of this process's thread named `name` so far (`status`'s
/// `voluntary_ctxt_switches`): how often it went to sleep, so how often it was woken.
fn thread_sleeps(name: &str) -> Option<u64> {
    thread_switches(name).map(|(voluntary, _)| voluntary)
}

/// Involuntary context switches of the calling thread so far (`status`'s
/// `nonvoluntary_ctxt_switches`): how often another thread took its core while it ran, a helper
/// woken on its core among them.
fn this_thread_preemptions() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

/// Prints each helper thread's CPU time between `before` and `after`, per event.
fn report_helpers_cpu(before: [Option<u64>; 2], after: [Option<u64>; 2], events: u64) {
    for ((name, b), a) in HELPERS.iter().zip(before).zip(after) {
        match (b, a) {
            (Some(b), Some(a)) => eprintln!(
                "{name} thread CPU: {:.2} ns per event",
                (a - b) as f64 / events as f64
            ),
            _ => eprintln!(
                "{name} thread CPU: not measurable here (no such thread, or no schedstat)"
            ),
        }
    }
}

/// Prints how the flood's time spreads over its blocks of `events` events (`marks`: 0, then the
/// time at each block's end): quantiles of a block's time per event, and every 97th block in
/// order. A run slow throughout (every block slow) and a run slow in stalls (a few blocks where
/// the thread encoded its full queue or waited) have the same mean and call for different
/// causes.
fn report_blocks(marks: &[u64], events: u64) {
    let per_event: Vec<f64> = marks
        .windows(2)
        .map(|w| (w[1] - w[0]) as f64 / events as f64)
        .collect();
    let in_order: Vec<String> = per_event
        .iter()
        .step_by(97)
        .map(|b| format!("{b:.0}"))
        .collect();
    let blocks = sorted(per_event);
    let q = |f: f64| q(&blocks, f);
    eprintln!(
        "flood blocks of 1000 zones, ns per event: p10 {:.1}, p50 {:.1}, p90 {:.1}, p99 {:.1}, \
         max {:.1}; every 97th in order: {}",
        q(0.1),
        q(0.5),
        q(0.9),
        q(0.99),
        q(1.0),
        in_order.join(" ")
    );
}

/// With `prefault`, the session maps its central buffer's pages at start
/// ([`Config::prefault_buffer`]): the service's figure then leaves out the page faults of the
/// buffer's first pass, which a long session pays once.
fn service_cpu_per_event(prefault: bool) {
    const ZONES: u64 = 2_000_000;
    eprintln!(
        "-- {}",
        if prefault {
            "central buffer prefaulted (TACHYON_PREFAULT=1)"
        } else {
            "central buffer mapped on first write (the default)"
        }
    );
    // A fresh session, so the read-out at its end covers exactly these events.
    let t = Instant::now();
    start_session_with(prefault);
    eprintln!("session start: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    // The drainer thread starts on a thread's first event: make sure it runs (the benches
    // before this one may all have been filtered out) and has encoded that event.
    {
        let _z = tachyon::zone!("bench zone");
    }
    std::thread::sleep(Duration::from_millis(20));
    let before = helpers_cpu_ns();
    let faults_before = thread_minor_faults("tachyon-service");
    let drain_faults_before = thread_minor_faults("tachyon-drain");
    let sleeps_before = HELPERS.map(thread_sleeps);
    let owner_before = tachyon::__rt::owner_encoded();
    let preempted_before = this_thread_preemptions();
    let hot_cpu_before = this_thread_cpu_ns();
    const BLOCK: u64 = 1000;
    let mut marks = Vec::with_capacity((ZONES / BLOCK + 1) as usize);
    marks.push(0);
    let t = Instant::now();
    for _ in 0..ZONES / BLOCK {
        for _ in 0..BLOCK {
            let _z = tachyon::zone!("bench zone");
        }
        marks.push(t.elapsed().as_nanos() as u64);
    }
    let hot = t.elapsed();
    report_blocks(&marks, 2 * BLOCK);
    let hot_cpu = this_thread_cpu_ns().zip(hot_cpu_before).map(|(a, b)| a - b);
    let preempted = this_thread_preemptions()
        .zip(preempted_before)
        .map(|(a, b)| a - b);
    // Let the drainer encode what is queued and the service copy out everything committed (it
    // polls every 2 ms).
    std::thread::sleep(Duration::from_millis(50));
    let after = helpers_cpu_ns();
    let faults_after = thread_minor_faults("tachyon-service");
    let drain_faults = thread_minor_faults("tachyon-drain")
        .zip(drain_faults_before)
        .map(|(a, b)| a - b);
    let sleeps_after = HELPERS.map(thread_sleeps);
    let owner = tachyon::__rt::owner_encoded() - owner_before;
    let events = 2 * ZONES;
    for ((name, b), a) in HELPERS.iter().zip(sleeps_before).zip(sleeps_after) {
        if let (Some(b), Some(a)) = (b, a) {
            eprintln!("{name} thread: {} sleeps", a - b);
        }
    }
    eprintln!("events encoded on the traced thread itself: {owner}");
    if let Some(n) = preempted {
        eprintln!("traced thread: {n} involuntary context switches");
    }
    if let Some(f) = drain_faults {
        // The shared memory buffer's pages, on the drainer's first pass round it.
        eprintln!("tachyon-drain thread: {f} minor page faults");
    }
    eprintln!(
        "hot path {:.2} ns per event ({} events)",
        hot.as_nanos() as f64 / events as f64,
        events
    );
    if let Some(ns) = hot_cpu {
        eprintln!(
            "hot thread CPU: {:.2} ns per event",
            ns as f64 / events as f64
        );
    }
    report_helpers_cpu(before, after, events);
    let helpers: Option<u64> = before
        .iter()
        .zip(after)
        .map(|(b, a)| Some(a? - (*b)?))
        .sum();
    if let Some(total) = hot_cpu.zip(helpers).map(|(h, b)| h + b) {
        // What an event costs the machine, wherever it was encoded: the goal's "total CPU
        // per zone" is twice this.
        eprintln!(
            "total CPU (traced thread + helpers): {:.2} ns per event",
            total as f64 / events as f64
        );
    }
    if let (Some(b), Some(a)) = (faults_before, faults_after) {
        eprintln!(
            "tachyon-service thread: {} minor page faults (first writes to the fresh central \
             buffer's pages), one per {:.0} events",
            a - b,
            events as f64 / (a - b).max(1) as f64
        );
    }
    // The ring buffer is read out when the session stops (on the service thread, while this
    // one waits): validation, trusted fields, the `Trace.packet` records. Per event too.
    let t = Instant::now();
    let report = tachyon::shutdown().unwrap().unwrap();
    eprintln!(
        "read-out at stop: {:.2} ns per event ({} bytes of trace)",
        t.elapsed().as_nanos() as f64 / events as f64,
        report.trace.len()
    );
}

/// `n` enabled zones, for callgrind.
#[inline(never)]
fn zones(n: u64) {
    for _ in 0..n {
        let _z = tachyon::zone!("bench zone");
    }
}

/// `TACHYON_CLIENT_STREAM` (module docs): `n` zones into a session streaming into a file every
/// 100 ms, in blocks of 20 000 zones with 5 ms of pause between them (a busy program,
/// not a flood: the read-out keeps up), then the helpers' CPU and the service thread's page
/// faults per event, the read-out of each period included.
fn streamed(n: u64) {
    const BLOCK: u64 = 20_000;
    let path = std::env::temp_dir().join(format!(
        "tachyon-client-stream-{}.pftrace",
        std::process::id()
    ));
    tachyon::start(Config {
        output: Some(path.clone()),
        stream: true,
        stream_period: Duration::from_millis(100),
        buffer_size: 64 << 20,
        categories: CategoryFilter::new(&[], &["disabled"]),
        ..Config::default()
    })
    .expect("start the session");
    zones(1);
    std::thread::sleep(Duration::from_millis(20));
    let before = helpers_cpu_ns();
    let faults_before = thread_minor_faults("tachyon-service");
    let owner_before = tachyon::__rt::owner_encoded();
    let sleeps_before = HELPERS.map(thread_sleeps);
    let hot_cpu_before = this_thread_cpu_ns();
    let t = Instant::now();
    let mut done = 0;
    while done < n {
        zones(BLOCK.min(n - done));
        done += BLOCK;
        std::thread::sleep(Duration::from_millis(5));
    }
    let wall = t.elapsed();
    // The traced thread's CPU: its zones, the pauses' sleeps (a few µs each), and the
    // encoding it did itself.
    let hot_cpu = this_thread_cpu_ns().zip(hot_cpu_before).map(|(a, b)| a - b);
    // The last period's read-out.
    std::thread::sleep(Duration::from_millis(150));
    let after = helpers_cpu_ns();
    let faults = thread_minor_faults("tachyon-service")
        .zip(faults_before)
        .map(|(a, b)| a - b);
    let events = 2 * n;
    eprintln!(
        "streamed every 100 ms: {events} events in {:.2} s, {} encoded on the traced thread",
        wall.as_secs_f64(),
        tachyon::__rt::owner_encoded() - owner_before
    );
    if let Some(ns) = hot_cpu {
        eprintln!(
            "hot thread CPU: {:.2} ns per event",
            ns as f64 / events as f64
        );
    }
    report_helpers_cpu(before, after, events);
    for ((name, b), a) in HELPERS
        .iter()
        .zip(sleeps_before)
        .zip(HELPERS.map(thread_sleeps))
    {
        if let (Some(b), Some(a)) = (b, a) {
            eprintln!("{name} thread: {} sleeps", a - b);
        }
    }
    if let Some(f) = faults {
        eprintln!("tachyon-service thread: {f} minor page faults");
    }
    let report = tachyon::shutdown().unwrap().unwrap();
    eprintln!(
        "{} bytes of trace, {} packets dropped",
        report.bytes, report.writers.packets_dropped
    );
    let _ = std::fs::remove_file(path);
}

/// `TACHYON_CLIENT_RATIO` (module docs).
fn ratio(rounds: usize) {
    const ITERS: u32 = 2_000;
    start_session();
    let clock = tachyon::clock::clock();
    let mut zone_ns = Vec::with_capacity(rounds);
    let mut base_ns = Vec::with_capacity(rounds);
    let mut ratios = Vec::with_capacity(rounds);
    // Warm-up: the thread's writer, its generation, the callsite interned, caches.
    zones(u64::from(ITERS));
    std::thread::sleep(Duration::from_millis(50));
    let before = helpers_cpu_ns();
    for _ in 0..rounds {
        let t = Instant::now();
        zones(u64::from(ITERS));
        let z = t.elapsed().as_secs_f64() * 1e9 / f64::from(ITERS);
        let t = Instant::now();
        for _ in 0..ITERS {
            let a = clock.ticks();
            let b = clock.ticks();
            black_box((a, b));
        }
        let b = t.elapsed().as_secs_f64() * 1e9 / f64::from(ITERS);
        zone_ns.push(z);
        base_ns.push(b);
        ratios.push(z / b);
    }
    std::thread::sleep(Duration::from_millis(50));
    let after = helpers_cpu_ns();
    let report = tachyon::shutdown().unwrap().unwrap();
    report_helpers_cpu(before, after, 2 * u64::from(ITERS) * rounds as u64);
    let (z, b, r) = (sorted(zone_ns), sorted(base_ns), sorted(ratios));
    println!(
        "zone/enabled: min {:.2} ns, median {:.2} ns; two_timestamps: min {:.2} ns, median {:.2} ns",
        z[0],
        q(&z, 0.5),
        b[0],
        q(&b, 0.5)
    );
    println!(
        "ratio per round: median {:.3} (quartiles {:.3}..{:.3}); of the minima {:.3}; {} rounds, {} packets dropped",
        q(&r, 0.5),
        q(&r, 0.25),
        q(&r, 0.75),
        z[0] / b[0],
        r.len(),
        report.writers.packets_dropped
    );
}

/// This thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`, read at once, unlike `schedstat`).
fn thread_cpu_now() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes the `timespec` it is given, a live local.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0;
    assert!(ok, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `TACHYON_CLIENT_HOT_CPU` (module docs).
fn hot_cpu(rounds: usize) {
    const ITERS: u32 = 4_096;
    let rounds = rounds.max(1);
    start_session();
    let clock = tachyon::clock::clock();
    let (mut zone_ns, mut base_ns, mut diff_ns) = (Vec::new(), Vec::new(), Vec::new());
    // Warm-up: the thread's writer, its generation, the callsite interned, caches.
    zones(u64::from(ITERS));
    std::thread::sleep(Duration::from_millis(50));
    let before = helpers_cpu_ns();
    let preempted_before = this_thread_preemptions();
    for _ in 0..rounds {
        // Encodes what the drainer left in this thread's queue, on this thread, untimed.
        drop(tachyon::zone!("bench sync", round = 1u8));
        let t = thread_cpu_now();
        zones(u64::from(ITERS));
        let z = (thread_cpu_now() - t).as_secs_f64() * 1e9 / f64::from(ITERS);
        let t = thread_cpu_now();
        for _ in 0..ITERS {
            let a = clock.ticks();
            let b = clock.ticks();
            black_box((a, b));
        }
        let b = (thread_cpu_now() - t).as_secs_f64() * 1e9 / f64::from(ITERS);
        zone_ns.push(z);
        base_ns.push(b);
        diff_ns.push(z - b);
    }
    let preempted = this_thread_preemptions()
        .zip(preempted_before)
        .map(|(a, b)| a - b);
    let after = helpers_cpu_ns();
    let report = tachyon::shutdown().unwrap().unwrap();
    report_helpers_cpu(before, after, 2 * u64::from(ITERS) * rounds as u64);
    let (z, b, d) = (sorted(zone_ns), sorted(base_ns), sorted(diff_ns));
    let median = |v: &[f64]| q(v, 0.5);
    println!(
        "zone - two_timestamps per round: deciles 1, 3, 5, 7, 9: {:.2}, {:.2}, {:.2}, {:.2}, {:.2} ns; \
         this thread preempted {} times",
        q(&d, 0.1),
        q(&d, 0.3),
        q(&d, 0.5),
        q(&d, 0.7),
        q(&d, 0.9),
        preempted.map_or("?".to_owned(), |n| n.to_string())
    );
    println!(
        "thread CPU: zone/enabled median {:.2} ns (min {:.2}); two_timestamps median {:.2} ns \
         (min {:.2}); zone - two_timestamps per round: median {:.2} ns; {} rounds, {} packets dropped",
        median(&z),
        z[0],
        median(&b),
        b[0],
        median(&d),
        d.len(),
        report.writers.packets_dropped
    );
}

/// `n` uncontended lock + unlock of `lock`.
#[inline(never)]
fn locks(lock: &tachyon::sync::Mutex<u64>, n: u64) {
    for _ in 0..n {
        *black_box(lock).lock().unwrap() += 1;
    }
}

/// `n` lock + unlock of a std mutex.
#[inline(never)]
fn std_locks(lock: &std::sync::Mutex<u64>, n: u64) {
    for _ in 0..n {
        *black_box(lock).lock().unwrap() += 1;
    }
}

/// `n` times what a traced uncontended hold cannot do without: lock + unlock of a std mutex
/// with two counter reads while it is held (the hold's begin and end), nothing recorded.
#[inline(never)]
fn lock_floor(lock: &std::sync::Mutex<u64>, n: u64) {
    let clock = tachyon::clock::clock();
    for _ in 0..n {
        let mut g = black_box(lock).lock().unwrap();
        let begin = clock.ticks();
        *g += 1;
        black_box(clock.ticks().wrapping_sub(begin));
        drop(g);
    }
}

/// `TACHYON_CLIENT_LOCK_RATIO` (module docs).
fn lock_ratio(rounds: usize) {
    const ITERS: u64 = 2_000;
    start_session();
    let lock = tachyon::sync::Mutex::new_named("bench lock", 0u64);
    let std_lock = std::sync::Mutex::new(0u64);
    locks(&lock, ITERS);
    zones(ITERS);
    std::thread::sleep(Duration::from_millis(50));
    // The drainer's CPU for lock records alone: 200 000 holds, then time to encode them.
    let before = helpers_cpu_ns();
    locks(&lock, 100 * ITERS);
    std::thread::sleep(Duration::from_millis(200));
    report_helpers_cpu(before, helpers_cpu_ns(), 200 * ITERS);
    let per = |t: Instant| t.elapsed().as_secs_f64() * 1e9 / ITERS as f64;
    // Two passes: as the loops come, then with this thread's queue emptied before each timed
    // loop (a plot sample goes through the thread's state, which encodes what is queued first):
    // the second times the hot path alone, the first also what this thread encodes itself
    // when the drainer falls behind (on a loaded machine).
    let plot = tachyon::Plot::new("bench drain", tachyon::PlotKind::Number);
    for empty_first in [false, true] {
        let drain = || {
            if empty_first {
                plot.set(0u32);
            }
        };
        let (mut l, mut z, mut s, mut lz, mut ls) = (vec![], vec![], vec![], vec![], vec![]);
        let (mut f, mut fz) = (vec![], vec![]);
        for _ in 0..rounds {
            drain();
            let t = Instant::now();
            locks(&lock, ITERS);
            let a = per(t);
            drain();
            let t = Instant::now();
            zones(ITERS);
            let b = per(t);
            drain();
            let t = Instant::now();
            std_locks(&std_lock, ITERS);
            let c = per(t);
            drain();
            let t = Instant::now();
            lock_floor(&std_lock, ITERS);
            let d = per(t);
            f.push(d);
            fz.push(d / b);
            l.push(a);
            z.push(b);
            s.push(c);
            lz.push(a / b);
            ls.push(a / c);
        }
        let med = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v[v.len() / 4], v[(3 * v.len()) / 4])
        };
        // The fastest round of each: a time slice no other process took a part of, which on a
        // crowded machine the medians are not.
        let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
        let (lm, zm, sm, fm) = (min(&l), min(&z), min(&s), min(&f));
        let (l, z, s, f) = (med(l).0, med(z).0, med(s).0, med(f).0);
        let (lz, ls, fz) = (med(lz), med(ls), med(fz));
        let pass = if empty_first {
            "queue emptied before each loop"
        } else {
            "as the loops come"
        };
        println!(
            "{pass}: lock/uncontended median {l:.2} ns, zone/enabled median {z:.2} ns, \
             std_mutex median {s:.2} ns"
        );
        println!(
            "{pass}: per round: lock/zone median {:.3} (quartiles {:.3}..{:.3}); lock/std \
             median {:.3} (quartiles {:.3}..{:.3}); {rounds} rounds",
            lz.0, lz.1, lz.2, ls.0, ls.1, ls.2
        );
        println!(
            "{pass}: floor (std lock + unlock with two counter reads, nothing recorded) median \
             {f:.2} ns; per round floor/zone median {:.3} (quartiles {:.3}..{:.3})",
            fz.0, fz.1, fz.2
        );
        println!(
            "{pass}: minima: lock/uncontended {lm:.2} ns, zone/enabled {zm:.2} ns, std_mutex \
             {sm:.2} ns, floor {fm:.2} ns; lock/zone {:.3}, floor/zone {:.3}",
            lm / zm,
            fm / zm
        );
    }
    let report = tachyon::shutdown().unwrap().unwrap();
    println!("{} packets dropped", report.writers.packets_dropped);
}

/// The cases of `TACHYON_CLIENT_CLOCK_PROBE`: each a loop of its own (a call per iteration
/// would put a call and a return beside every counter read).
mod probe {
    use std::hint::black_box;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    use tachyon::clock::Clock;

    #[inline(never)]
    pub(super) fn read(c: &Clock, n: u32) {
        for _ in 0..n {
            black_box(c.ticks());
        }
    }

    #[inline(never)]
    pub(super) fn two_reads(c: &Clock, n: u32) {
        for _ in 0..n {
            let a = c.ticks();
            black_box((a, c.ticks()));
        }
    }

    #[inline(never)]
    pub(super) fn fetch_add(w: &AtomicU64, n: u32) {
        for _ in 0..n {
            black_box(black_box(w).fetch_add(1, Ordering::Relaxed));
        }
    }

    #[inline(never)]
    pub(super) fn fetch_add_read(c: &Clock, w: &AtomicU64, n: u32) {
        for _ in 0..n {
            black_box(black_box(w).fetch_add(1, Ordering::Relaxed));
            black_box(c.ticks());
        }
    }

    #[inline(never)]
    pub(super) fn lock(m: &Mutex<u64>, n: u32) {
        for _ in 0..n {
            *black_box(m).lock().unwrap() += 1;
        }
    }

    /// Both reads while the lock is held (the lock goal's floor).
    #[inline(never)]
    pub(super) fn lock_read_read(c: &Clock, m: &Mutex<u64>, n: u32) {
        for _ in 0..n {
            let mut g = black_box(m).lock().unwrap();
            let begin = c.ticks();
            *g += 1;
            black_box(c.ticks().wrapping_sub(begin));
            drop(g);
        }
    }

    /// The first read before the lock's compare-and-swap, clamped to the last holder's end
    /// kept beside the lock (what keeps the holds in order on the lock's track).
    #[inline(never)]
    pub(super) fn read_lock_clamp_read(c: &Clock, m: &Mutex<u64>, last: &AtomicU64, n: u32) {
        for _ in 0..n {
            let t = c.ticks();
            let mut g = black_box(m).lock().unwrap();
            let begin = t.max(last.load(Ordering::Relaxed));
            *g += 1;
            let end = c.ticks();
            last.store(end, Ordering::Relaxed);
            black_box(end.wrapping_sub(begin));
            drop(g);
        }
    }
}

/// `TACHYON_CLIENT_CLOCK_PROBE` (module docs).
fn clock_probe(rounds: usize) {
    use std::sync::atomic::AtomicU64;
    const ITERS: u32 = 2_000;
    let c = tachyon::clock::clock();
    let word = AtomicU64::new(0);
    let lock = std::sync::Mutex::new(0u64);
    let last = AtomicU64::new(0);
    type Case<'a> = (&'static str, Box<dyn Fn() + 'a>);
    let cases: Vec<Case<'_>> = vec![
        ("counter read", Box::new(|| probe::read(c, ITERS))),
        ("two counter reads", Box::new(|| probe::two_reads(c, ITERS))),
        (
            "locked fetch_add",
            Box::new(|| probe::fetch_add(&word, ITERS)),
        ),
        (
            "locked fetch_add and a counter read",
            Box::new(|| probe::fetch_add_read(c, &word, ITERS)),
        ),
        ("std lock + unlock", Box::new(|| probe::lock(&lock, ITERS))),
        (
            "std lock, read, read, unlock (the lock goal's floor)",
            Box::new(|| probe::lock_read_read(c, &lock, ITERS)),
        ),
        (
            "read, std lock, clamp to the last release, read, store it, unlock",
            Box::new(|| probe::read_lock_clamp_read(c, &lock, &last, ITERS)),
        ),
    ];
    let mut best = vec![f64::MAX; cases.len()];
    for _ in 0..rounds {
        for ((_, f), best) in cases.iter().zip(&mut best) {
            let t = Instant::now();
            f();
            *best = best.min(t.elapsed().as_secs_f64() * 1e9 / f64::from(ITERS));
        }
    }
    for ((name, _), best) in cases.iter().zip(&best) {
        println!("{name}: {best:.2} ns");
    }
}

criterion_group!(benches, bench);

fn main() {
    if let Some(n) = std::env::var("TACHYON_CLIENT_CALLGRIND")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        start_session();
        zones(1);
        zones(n);
        tachyon::shutdown().unwrap();
        return;
    }
    if let Some(n) = std::env::var("TACHYON_CLIENT_HOT_CPU")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        hot_cpu(n);
        return;
    }
    if let Some(n) = std::env::var("TACHYON_CLIENT_RATIO")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        ratio(n);
        return;
    }
    if let Some(n) = std::env::var("TACHYON_CLIENT_STREAM")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        streamed(n);
        return;
    }
    if let Some(secs) = std::env::var("TACHYON_CLIENT_LONG_FLOOD")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        long_flood(Duration::from_secs(secs));
        return;
    }
    if let Some(n) = std::env::var("TACHYON_CLIENT_CLOCK_PROBE")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        clock_probe(n);
        return;
    }
    if let Some(n) = std::env::var("TACHYON_CLIENT_LOCK_RATIO")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        lock_ratio(n);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

/// Voluntary and involuntary context switches of this process's thread named `name` so far
/// (`status`'s `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches`).
fn thread_switches(name: &str) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(thread_dir(name)?.join("status")).ok()?;
    let field = |key: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .trim()
            .parse()
            .ok()
    };
    Some((
        field("voluntary_ctxt_switches:")?,
        field("nonvoluntary_ctxt_switches:")?,
    ))
}

/// `TACHYON_CLIENT_LONG_FLOOD` (module docs).
fn long_flood(length: Duration) {
    const WINDOW: u64 = 2_000_000;
    start_session();
    let pairs = 10_000_000u32;
    let t = Instant::now();
    probe::two_reads(tachyon::clock::clock(), pairs);
    let floor = t.elapsed().as_nanos() as f64 / f64::from(pairs);
    eprintln!("two counter reads: {floor:.2} ns");
    eprintln!(
        "window end (ms), ns a zone, x two reads, events encoded on the thread, drainer and \
         service CPU an event (ns), their sleeps/preemptions, the thread's preemptions"
    );
    let mut ratios = Vec::new();
    let start = Instant::now();
    while start.elapsed() < length {
        let owner = tachyon::__rt::owner_encoded();
        let cpu = helpers_cpu_ns();
        let switches = HELPERS.map(thread_switches);
        let preempted = this_thread_preemptions();
        let t = Instant::now();
        for _ in 0..WINDOW {
            let _z = tachyon::zone!("span");
        }
        let zone = t.elapsed().as_nanos() as f64 / WINDOW as f64;
        let events = 2 * WINDOW;
        let owner = tachyon::__rt::owner_encoded() - owner;
        let cpu: Vec<String> = cpu
            .iter()
            .zip(helpers_cpu_ns())
            .map(|(b, a)| match (b, a) {
                (Some(b), Some(a)) => format!("{:.2}", (a - b) as f64 / events as f64),
                _ => "-".into(),
            })
            .collect();
        let switches: Vec<String> = switches
            .iter()
            .zip(HELPERS.map(thread_switches))
            .map(|(b, a)| match (b, a) {
                (Some(b), Some(a)) => format!("{}/{}", a.0 - b.0, a.1 - b.1),
                _ => "-".into(),
            })
            .collect();
        let preempted = this_thread_preemptions()
            .zip(preempted)
            .map_or("-".into(), |(a, b)| (a - b).to_string());
        ratios.push(zone / floor);
        eprintln!(
            "{:6} {zone:6.2} {:5.2}x {:5.1}% drain {} service {} | {} {} | {preempted}",
            start.elapsed().as_millis(),
            zone / floor,
            100.0 * owner as f64 / events as f64,
            cpu[0],
            cpu[1],
            switches[0],
            switches[1],
        );
    }
    let report = tachyon::shutdown()
        .expect("stop the session")
        .expect("a session was running");
    // The first window holds the session's start and the buffer's first pages.
    let settled = sorted(ratios.iter().skip(1).copied().collect());
    if !settled.is_empty() {
        eprintln!(
            "windows after the first, x two reads: p10 {:.2}, median {:.2}, p90 {:.2}, max {:.2}; \
             {} packets dropped",
            q(&settled, 0.1),
            q(&settled, 0.5),
            q(&settled, 0.9),
            q(&settled, 1.0),
            report.writers.packets_dropped
        );
    }
}

/// `v` in ascending order.
fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The `f` quantile of sorted, non-empty `v` (nearest rank).
fn q(v: &[f64], f: f64) -> f64 {
    v[((v.len() - 1) as f64 * f).round() as usize]
}

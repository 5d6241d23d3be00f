//! What the tracking allocator costs, in one run (group `alloc`): a 64-byte allocation, its
//! 64 bytes written, and its free — what `Box::new([0u8; 64])` and its drop do. Every variant
//! runs the same code over a different allocator, because one binary has one global allocator:
//! the `GlobalAlloc` calls go through a non-inlined copy of the allocator shim (`__rust_alloc`,
//! `__rust_dealloc`, which `Box` calls), so the hook is inlined into the shim as in a real
//! program and not into the bench's loop, and `System` pays the same call as the tracked side:
//!
//! - `alloc/system`: `std::alloc::System`, the plain system allocator.
//! - `alloc/tracked/off`: `Tracked<System>` (this binary's global allocator) with no session:
//!   one relaxed load more per call.
//! - `alloc/tracked/exact`: the same while a session records every allocation and free (goal:
//!   ≤ 4× `alloc/system`). The hook appends one record to the thread's ring (the free, right
//!   after, marks it freed instead of appending its own); the `tachyon-memory` thread applies
//!   them to the live table meanwhile, and when it falls behind the ring fills and the
//!   allocating thread waits: the figure includes that back-pressure.
//! - `alloc/tracked/sampled`: the same while a session samples every 4096 bytes on average
//!   (heapprofd's default; goal: ≤ 1.2× `alloc/system`), each sample with its native call
//!   stack (the default, 32 frames deep).
//!
//! Run: `cargo bench -p tachyon --bench alloc`.
//!
//! With `TACHYON_ALLOC_RATIO=N` the bench skips criterion and measures the goals' ratios on a
//! machine others share: per mode (off, exact, sampled) N rounds, each timing 20 000 pairs on
//! `System` then 20 000 on the tracking allocator back to back, and prints the median and
//! quartiles of the per-round ratio (load that comes and goes hits both halves of a round
//! alike, which criterion's separate runs cannot promise); then the same for sampled mode
//! without stacks, sampled mode with an interval no allocation reaches (the hooks' fast paths
//! alone: the countdown and the free's address check) and exact mode with 16-frame stacks on
//! every allocation. Beside each ratio: the allocating thread's own CPU per pair (a wait for a
//! full ring shows in the time, not there) and the `tachyon-memory` thread's, so what tracking
//! costs in CPU is told apart from how the two threads got scheduled. First, the floor of
//! exact mode: the `System` pairs with the two counter reads an exact record per event needs
//! (one at the allocation, one at the free), nothing recorded, as a ratio to `System` alone.
//!
//! `TACHYON_ALLOC_ONLY=LABEL,...` runs only the named rows (for a profiler; the floor is then
//! skipped unless `floor` is named): labels are `MODE/STACKS` as `off/None`, `exact/None`, `sampled:4096/None`,
//! `sampled:4096/Some(0)`, `sampled:1099511627776/Some(0)`, `exact/Some(16)`, and
//! `sampled:1/Some(0)` and `sampled:1/None` (every allocation sampled: the cost of one sample,
//! without and with its stack; run only when named).
//!
//! `TACHYON_ALLOC_DEMO=ROUNDS` (with `--features log-bridge`, which the demo's logging needs)
//! measures the realistic workload instead: the very jobs `tachyon demo` runs
//! (`crates/tachyon-cli/src/demo.rs`, compiled into this bench: a producer, four workers, a
//! metrics thread, every part of the tracing API), traced in-process as `tachyon demo` traces
//! them, with memory tracking off, sampled (4096 bytes, with its default 32-frame stacks and
//! without stacks) and exact. Per round every mode runs for `TACHYON_ALLOC_DEMO_SECONDS`
//! (default 1) of jobs, in an order that rotates from round to round; the figure is the
//! process's CPU time (`getrusage`, every thread: the workload's, the session's and the
//! tracker's) from the session's start to its end, per job done, as a slowdown against the
//! same round's run with tracking off (median and quartiles over the rounds).
//! `TACHYON_ALLOC_DEMO_ONLY=off|sampled|sampled-nostacks|exact` runs one mode only (to count
//! its instructions per job under `valgrind --tool=callgrind`, which the load of a shared
//! machine does not change).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, Criterion, Throughput};
use tachyon::alloc::{MemoryConfig, MemoryMode, Tracked};
use tachyon::Config;

#[path = "support/threads.rs"]
mod threads;
use threads::{this_thread_cpu_ns, thread_cpu_ns};

#[global_allocator]
static ALLOC: Tracked<System> = Tracked::new(System);

/// The allocator shim `Box` calls (`__rust_alloc`): one function, not inlined into the caller,
/// whose body is the global allocator's `alloc`. With `Tracked` installed that body is
/// `Tracked::alloc` (the hook included); with `System` it is std's `__rdl_alloc`, `System::alloc`
/// (reached through one more tail jump, which this copy leaves out: if anything the baseline is
/// a little faster than a real program's). Both allocators go through this same shim here, so
/// the two sides differ only in the allocator.
#[inline(never)]
fn shim_alloc<A: GlobalAlloc>(a: &A, layout: Layout) -> *mut u8 {
    // SAFETY: `pair` passes a non-zero layout.
    unsafe { a.alloc(layout) }
}

/// `__rust_dealloc`, as [`shim_alloc`].
#[inline(never)]
fn shim_dealloc<A: GlobalAlloc>(a: &A, p: *mut u8, layout: Layout) {
    // SAFETY: `pair` passes a block `a` allocated with `layout`, once.
    unsafe { a.dealloc(p, layout) }
}

/// One allocation, its bytes written, its free: what `Box::new([0u8; 64])` and its drop run
/// (through the shims, which `Box` calls and does not inline).
#[inline(always)]
fn pair<A: GlobalAlloc>(a: &A, layout: Layout) {
    let p = shim_alloc(a, layout);
    assert!(!p.is_null());
    // SAFETY: a live block of `layout.size()` = 64 bytes, written within its size.
    unsafe { p.cast::<[u8; 64]>().write(black_box([0u8; 64])) };
    black_box(p);
    shim_dealloc(a, p, layout);
}

fn session(mode: MemoryMode) {
    session_with_stacks(mode, None);
}

/// `stacks`: [`MemoryConfig::callstack_depth`] (`None`: the mode's default).
fn session_with_stacks(mode: MemoryMode, stacks: Option<usize>) {
    tachyon::start(Config {
        output: None,
        buffer_size: 64 << 20,
        memory: MemoryConfig {
            mode,
            counter_period: Duration::from_millis(1),
            callstack_depth: stacks,
            ..MemoryConfig::default()
        },
        ..Config::default()
    })
    .expect("start the session");
}

fn bench(c: &mut Criterion) {
    let layout = Layout::new::<[u8; 64]>();
    let mut g = c.benchmark_group("alloc");
    g.throughput(Throughput::Elements(1));
    g.bench_function("system", |b| b.iter(|| pair(&System, layout)));
    g.bench_function("tracked/off", |b| b.iter(|| pair(&ALLOC, layout)));
    session(MemoryMode::Exact);
    g.bench_function("tracked/exact", |b| b.iter(|| pair(&ALLOC, layout)));
    let report = tachyon::shutdown().expect("stop").expect("a session");
    let exact = report.memory.expect("tracking ran");
    session(MemoryMode::Sampled { interval: 4096 });
    g.bench_function("tracked/sampled", |b| b.iter(|| pair(&ALLOC, layout)));
    let report = tachyon::shutdown().expect("stop").expect("a session");
    let sampled = report.memory.expect("tracking ran");
    g.finish();
    eprintln!("exact session: {exact}");
    eprintln!("sampled session: {sampled}");
}

criterion_group!(benches, bench);

/// The demo's workload, as `tachyon demo` runs it (this bench only uses its `run`).
#[cfg(feature = "log-bridge")]
// Its unit tests come along (benches build with `cfg(test)`) but do not run here.
#[allow(dead_code, unreachable_pub, unused_imports)]
#[path = "../../tachyon-cli/src/demo.rs"]
mod demo;

/// CPU time (ns) of the whole process, every thread (`getrusage(RUSAGE_SELF)`).
#[cfg(feature = "log-bridge")]
fn process_cpu_ns() -> u64 {
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable `rusage`; RUSAGE_SELF needs nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    ns(u.ru_utime) + ns(u.ru_stime)
}

/// `TACHYON_ALLOC_DEMO=ROUNDS`: the demo's jobs with tracking off, sampled and exact (module
/// docs).
#[cfg(feature = "log-bridge")]
fn demo_workload(rounds: usize) {
    let seconds: f64 = std::env::var("TACHYON_ALLOC_DEMO_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let only = std::env::var("TACHYON_ALLOC_DEMO_ONLY").unwrap_or_default();
    let modes: Vec<(&str, MemoryMode, Option<usize>)> = [
        ("off", MemoryMode::Off, None),
        ("sampled", MemoryMode::Sampled { interval: 4096 }, None),
        (
            "sampled-nostacks",
            MemoryMode::Sampled { interval: 4096 },
            Some(0),
        ),
        ("exact", MemoryMode::Exact, None),
    ]
    .into_iter()
    .filter(|(label, _, _)| only.is_empty() || only == *label)
    .collect();
    if modes.is_empty() {
        eprintln!(
            "TACHYON_ALLOC_DEMO_ONLY={only:?}: expected off, sampled, sampled-nostacks or exact"
        );
        return;
    }
    // Per mode: CPU ns per job of each round.
    let mut per_job: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut jobs: Vec<u64> = vec![0; modes.len()];
    for round in 0..rounds {
        for k in 0..modes.len() {
            let m = (round + k) % modes.len();
            let (_, mode, stacks) = modes[m];
            let cpu0 = process_cpu_ns();
            // As `tachyon demo` traces it (CPU usage plots on), in memory instead of a file.
            tachyon::start(Config {
                output: None,
                cpu_usage: true,
                memory: MemoryConfig {
                    mode,
                    callstack_depth: stacks,
                    ..MemoryConfig::default()
                },
                ..Config::default()
            })
            .expect("start the session");
            let summary = demo::run(demo::Settings {
                threads: 4,
                duration: Duration::from_secs_f64(seconds),
            });
            let report = tachyon::shutdown().expect("stop").expect("a session");
            let cpu = process_cpu_ns() - cpu0;
            drop(report);
            let summary = summary.expect("the demo ran");
            per_job[m].push(cpu as f64 / summary.jobs.max(1) as f64);
            jobs[m] += summary.jobs;
        }
    }
    let q = |v: &[f64], f: f64| v[((v.len() - 1) as f64 * f) as usize];
    println!(
        "the demo's jobs ({rounds} rounds of {seconds} s per mode, 4 workers): process CPU per job, and the slowdown against tracking off in the same round"
    );
    for (m, (label, mode, stacks)) in modes.iter().enumerate() {
        let label = match (mode, stacks) {
            (MemoryMode::Sampled { interval }, None) => {
                format!("{label} ({interval}, 32-frame stacks: the default)")
            }
            (MemoryMode::Sampled { interval }, Some(_)) => format!("{label} ({interval})"),
            _ => label.to_string(),
        };
        let mut slow: Vec<f64> = per_job[m]
            .iter()
            .zip(&per_job[0])
            .map(|(t, off)| (t / off - 1.0) * 100.0)
            .collect();
        let mut cpu = per_job[m].clone();
        slow.sort_by(f64::total_cmp);
        cpu.sort_by(f64::total_cmp);
        let slowdown = if modes[0].0 == "off" && m > 0 {
            format!(
                "; slowdown median {:+.1} % (quartiles {:+.1}..{:+.1} %)",
                q(&slow, 0.5),
                q(&slow, 0.25),
                q(&slow, 0.75),
            )
        } else {
            String::new()
        };
        println!(
            "  {label}: {:.0} µs per job (median; rounds {:.0}..{:.0}), {} jobs{slowdown}",
            q(&cpu, 0.5) / 1e3,
            cpu[0] / 1e3,
            cpu[cpu.len() - 1] / 1e3,
            jobs[m],
        );
    }
}

/// CPU time (ns) the calling thread has used.
fn own_cpu_ns() -> u64 {
    this_thread_cpu_ns().unwrap_or(0)
}

fn ratio(rounds: usize) {
    let layout = Layout::new::<[u8; 64]>();
    // `TACHYON_ALLOC_ONLY=exact/None,sampled:4096/Some(0)`: only these rows (for a profiler).
    let only = std::env::var("TACHYON_ALLOC_ONLY").unwrap_or_default();
    const PAIRS: u32 = 20_000;
    let time = |f: &dyn Fn()| {
        let t = std::time::Instant::now();
        for _ in 0..PAIRS {
            f();
        }
        t.elapsed().as_nanos() as f64 / f64::from(PAIRS)
    };
    // The floor of exact mode's "one counter reading and one record per event": the same pairs
    // on `System` with a counter read after the allocation and one before the free, nothing
    // recorded.
    if only.is_empty() || only.split(',').any(|o| o == "floor") {
        let clock = tachyon::clock::clock();
        let (mut ratios, mut sys, mut floor) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let s = time(&|| pair(&System, layout));
            let f = time(&|| {
                let p = shim_alloc(&System, layout);
                assert!(!p.is_null());
                black_box(clock.ticks());
                // SAFETY: as in `pair`.
                unsafe { p.cast::<[u8; 64]>().write(black_box([0u8; 64])) };
                black_box(p);
                black_box(clock.ticks());
                shim_dealloc(&System, p, layout);
            });
            sys.push(s);
            floor.push(f);
            ratios.push(f / s);
        }
        for v in [&mut ratios, &mut sys, &mut floor] {
            v.sort_by(f64::total_cmp);
        }
        let q = |v: &[f64], f: f64| v[((v.len() - 1) as f64 * f) as usize];
        println!(
            "floor (alloc/system + two counter reads, nothing recorded): ratio to alloc/system median {:.2} (quartiles {:.2}..{:.2}); per pair median {:.1} ns vs {:.1} ns",
            q(&ratios, 0.5),
            q(&ratios, 0.25),
            q(&ratios, 0.75),
            q(&floor, 0.5),
            q(&sys, 0.5),
        );
    }
    for (mode, stacks) in [
        (None, None),
        (Some(MemoryMode::Exact), None),
        (Some(MemoryMode::Sampled { interval: 4096 }), None),
        (Some(MemoryMode::Sampled { interval: 4096 }), Some(0)),
        // The sampled hooks' fast paths alone: a 64-byte block never reaches 2^40 bytes.
        (Some(MemoryMode::Sampled { interval: 1 << 40 }), Some(0)),
        (Some(MemoryMode::Exact), Some(16)),
        // Every allocation sampled: what one sample costs (only when asked for by name),
        // without and with its stack.
        (Some(MemoryMode::Sampled { interval: 1 }), Some(0)),
        (Some(MemoryMode::Sampled { interval: 1 }), None),
    ] {
        let label = format!(
            "{}/{stacks:?}",
            mode.map_or("off".into(), |m| m.to_string())
        );
        let asked = only.split(',').any(|o| label == o);
        if (!only.is_empty() || mode == Some(MemoryMode::Sampled { interval: 1 })) && !asked {
            continue;
        }
        if let Some(m) = mode {
            session_with_stacks(m, stacks);
        }
        let mut ratios = Vec::new();
        let (mut sys, mut tracked) = (Vec::new(), Vec::new());
        // The allocating thread's own CPU per pair (waits for a full ring sleep or yield, so
        // they show in the time per pair, not here).
        let (mut sys_cpu, mut tracked_cpu) = (0u64, 0u64);
        for _ in 0..rounds {
            let c0 = own_cpu_ns();
            let s = time(&|| pair(&System, layout));
            let c1 = own_cpu_ns();
            let t = time(&|| pair(&ALLOC, layout));
            let c2 = own_cpu_ns();
            sys_cpu += c1 - c0;
            tracked_cpu += c2 - c1;
            sys.push(s);
            tracked.push(t);
            ratios.push(t / s);
        }
        let pairs = rounds as f64 * f64::from(PAIRS);
        // Over the whole session (the records of every round).
        let mut tracker_cpu_ns = mode.and_then(|_| thread_cpu_ns("tachyon-memory"));
        let summary = mode.map(|_| tachyon::shutdown().expect("stop").expect("a session"));
        for v in [&mut ratios, &mut sys, &mut tracked] {
            v.sort_by(f64::total_cmp);
        }
        let q = |v: &[f64], f: f64| v[((v.len() - 1) as f64 * f) as usize];
        let mut name = match mode {
            None => "tracked/off".to_owned(),
            Some(MemoryMode::Exact) => "tracked/exact".to_owned(),
            Some(m) => format!("tracked/{m}"),
        };
        if let Some(d) = stacks {
            name.push_str(&format!(" (stacks {d})"));
        }
        println!(
            "alloc/{name}: ratio to alloc/system median {:.2} (quartiles {:.2}..{:.2}); per pair median {:.1} ns vs {:.1} ns",
            q(&ratios, 0.5),
            q(&ratios, 0.25),
            q(&ratios, 0.75),
            q(&tracked, 0.5),
            q(&sys, 0.5),
        );
        println!(
            "  allocating thread: {:.1} ns of CPU per pair vs {:.1} ns on System",
            tracked_cpu as f64 / pairs,
            sys_cpu as f64 / pairs
        );
        if let Some(m) = summary.and_then(|r| r.memory) {
            println!("  {m}");
            // The tracker's CPU per allocation it applied (with its free).
            if let (Some(cpu), Some(heap)) = (tracker_cpu_ns.take(), m.heaps.first()) {
                println!(
                    "  tachyon-memory thread: {:.1} ns of CPU per allocation ({} allocations), {:.1} ns per pair",
                    cpu as f64 / heap.alloc_count as f64,
                    heap.alloc_count,
                    cpu as f64 / pairs
                );
            }
        }
    }
}

fn main() {
    if let Some(n) = std::env::var("TACHYON_ALLOC_DEMO")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        #[cfg(feature = "log-bridge")]
        demo_workload(n.max(1));
        #[cfg(not(feature = "log-bridge"))]
        eprintln!(
            "TACHYON_ALLOC_DEMO={n}: the demo's workload needs `--features log-bridge` (its logging goes through the `log` crate)"
        );
        return;
    }
    if let Some(n) = std::env::var("TACHYON_ALLOC_RATIO")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        ratio(n);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

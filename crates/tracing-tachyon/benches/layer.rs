//! The Layer's cost per `tracing` span: `layer/tachyon` (`info_span!`, enter, drop, on a
//! `Registry` with [`TachyonLayer`] installed as the global default, an in-process session
//! recording into a 64 MiB ring buffer) beside `layer/noop` (the same with a Layer that does
//! nothing: the Registry's own floor), and `layer/timestamps` (a Layer that only reads Tachyon's
//! trace clock, raw, at each enter and exit: the floor of any Layer that times spans; on a VM
//! whose `rdtsc` is slow it shows how much of `layer/tachyon` the two reads are).
//!
//! A global default can be installed once per process, so each row runs in a fresh child
//! process of this binary (criterion's arguments passed through): one `cargo bench` run
//! measures all three, one after the other, into the same criterion output.
//!
//! ```text
//! cargo bench -p tracing-tachyon --bench layer -- --sample-size 10 --warm-up-time 1 --measurement-time 3
//! TRACING_TACHYON_BENCH_CLOCK=thread cargo bench -p tracing-tachyon --bench layer
//! ```
//!
//! By default each sample is wall time, as in the peer bench. On a loaded machine (the
//! project's shared VM) a descheduled thread inflates wall time far more than the work itself:
//! `TRACING_TACHYON_BENCH_CLOCK=thread` times the benchmarking thread's own CPU time instead
//! (`CLOCK_THREAD_CPUTIME_ID`), for both rows. The Layer's helper threads (the drainer that
//! encodes, the service that copies chunks) run on other threads and are not counted either
//! way, as in the peer bench.

use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::Criterion;
use tracing_subscriber::layer::SubscriberExt;
use tracing_tachyon::TachyonLayer;

const ROW_VAR: &str = "TRACING_TACHYON_BENCH_ROW";
const CLOCK_VAR: &str = "TRACING_TACHYON_BENCH_CLOCK";

/// Times `iters` spans, by the wall clock or the thread's CPU clock (see the module docs).
fn timed(iters: u64) -> Duration {
    let thread_clock = std::env::var(CLOCK_VAR).is_ok_and(|v| v == "thread");
    if thread_clock {
        let t = cpu_time::ThreadTime::now();
        for _ in 0..iters {
            tracing_span();
        }
        t.elapsed()
    } else {
        let t = Instant::now();
        for _ in 0..iters {
            tracing_span();
        }
        t.elapsed()
    }
}

#[inline(always)]
fn tracing_span() {
    let span = tracing::info_span!("span");
    let entered = span.enter();
    drop(entered);
    drop(black_box(span));
}

fn install<L>(layer: L)
where
    L: tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync + 'static,
{
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
        .expect("first global subscriber of this process");
}

/// A Layer that does nothing.
struct NoopLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for NoopLayer {}

/// A Layer that reads the trace clock (the raw counter, as the queue's records take it) at each
/// enter and exit, and does nothing else.
struct TimestampsLayer(&'static tachyon::clock::Clock);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for TimestampsLayer {
    fn on_enter(&self, _: &tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        black_box(self.0.ticks());
    }

    fn on_exit(&self, _: &tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        black_box(self.0.ticks());
    }
}

/// This thread's involuntary context switches so far (`/proc/thread-self/status`), where
/// the kernel shows them.
fn preemptions() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

fn row(c: &mut Criterion, row: &str) {
    match row {
        "noop" => {
            install(NoopLayer);
            c.bench_function("layer/noop", |b| b.iter_custom(timed));
        }
        "timestamps" => {
            install(TimestampsLayer(tachyon::clock::clock()));
            c.bench_function("layer/timestamps", |b| b.iter_custom(timed));
        }
        "tachyon" => {
            tachyon::start(tachyon::Config {
                output: None,
                buffer_size: 64 << 20,
                ..tachyon::Config::in_memory()
            })
            .expect("start an in-process session");
            install(TachyonLayer::new());
            let owner_before = tachyon::__rt::owner_encoded();
            let preempted_before = preemptions();
            let mut spans = 0u64;
            c.bench_function("layer/tachyon", |b| {
                b.iter_custom(|iters| {
                    spans += iters;
                    timed(iters)
                })
            });
            // Where a slow run's time went: events this thread encoded itself (its queue full,
            // the drainer behind), and how often another thread took its core.
            let owner = tachyon::__rt::owner_encoded() - owner_before;
            let preempted = preemptions().zip(preempted_before).map(|(a, b)| a - b);
            let report = tachyon::shutdown()
                .expect("stop the session")
                .expect("a session was running");
            // Evidence that the spans were recorded, not filtered away.
            eprintln!(
                "layer/tachyon: {spans} spans; {} trace bytes kept (64 MiB ring), {} chunks committed, {} packets dropped; {owner} events encoded on the bench thread, {} preemptions of it",
                report.trace.len(),
                report.writers.chunks_committed,
                report.writers.packets_dropped,
                preempted.map_or_else(|| "?".to_owned(), |n| n.to_string()),
            );
            assert!(
                spans == 0 || report.writers.chunks_committed > 0,
                "nothing was recorded"
            );
        }
        other => panic!("unknown row {other}"),
    }
}

fn main() {
    if let Ok(name) = std::env::var(ROW_VAR) {
        let mut c = Criterion::default().configure_from_args();
        row(&mut c, &name);
        c.final_summary();
        return;
    }
    let exe = std::env::current_exe().expect("this bench's path");
    for name in ["noop", "timestamps", "tachyon"] {
        let status = Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .env(ROW_VAR, name)
            .status()
            .expect("run a row");
        assert!(status.success(), "row {name} failed: {status}");
    }
}

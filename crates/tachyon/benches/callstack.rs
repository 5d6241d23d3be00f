//! What a call stack costs the thread that takes it, beside the clock baseline, in one run:
//!
//! - `callstack/depth_1`, `callstack/depth_10`, `callstack/depth_60`: [`capture`] of 1, 10 and
//!   60 frames (from 64 frames deep), with the feature `dwarf-unwind` (framehop, cached rules):
//!   Tracy's figures for its capture are 98 ns, 306 ns and 1.37 µs (i7 8700K).
//! - `callstack/platform_depth_10`: 10 frames with the platform unwinder
//!   (`_Unwind_Backtrace`), what capture falls back to without the feature.
//! - `callstack/zone_depth_10`: a whole `zone!("..", callstack: 10)` into a running session:
//!   capture, the callstack's interning lookup, the begin and end events.
//! - `client/baseline/two_timestamps`: two raw reads of the trace clock's counter, as in the
//!   `client` bench. The goal: `depth_10` ≤ 10× this.
//!
//! Run: `cargo bench -p tachyon --bench callstack`.

use std::hint::black_box;

use criterion::{criterion_group, Criterion, Throughput};
use tachyon::callstack::{capture, MAX_DEPTH};

/// Runs `f` `depth` frames deeper than here.
#[inline(never)]
fn nest(depth: usize, f: &mut dyn FnMut()) {
    if depth == 0 {
        f();
    } else {
        nest(black_box(depth - 1), f);
    }
    black_box(depth);
}

fn bench(c: &mut Criterion) {
    tachyon::start(tachyon::Config {
        output: None,
        buffer_size: 64 << 20,
        ..tachyon::Config::default()
    })
    .expect("start the session");

    let mut g = c.benchmark_group("callstack");
    g.throughput(Throughput::Elements(1));
    let mut buf = [0u64; MAX_DEPTH];
    for depth in [1usize, 10, 60] {
        nest(64, &mut || {
            g.bench_function(format!("depth_{depth}"), |b| {
                b.iter(|| black_box(capture(&mut buf[..depth], 0)))
            });
        });
    }
    nest(64, &mut || {
        g.bench_function("platform_depth_10", |b| {
            b.iter(|| {
                black_box(tachyon::callstack::capture_with_platform_unwinder(
                    &mut buf[..10],
                    0,
                ))
            })
        });
    });
    nest(64, &mut || {
        g.bench_function("zone_depth_10", |b| {
            b.iter(|| {
                let _z = tachyon::zone!("bench zone", callstack: 10);
            })
        });
    });
    g.finish();

    let mut g = c.benchmark_group("client");
    g.throughput(Throughput::Elements(1));
    let clock = tachyon::clock::clock();
    g.bench_function("baseline/two_timestamps", |b| {
        b.iter(|| {
            let a = clock.ticks();
            let b = clock.ticks();
            black_box((a, b))
        })
    });
    g.finish();
    let _ = tachyon::shutdown();
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}

//! What the tracking allocator costs, in one run (group `alloc`): a 64-byte allocation and its
//! free, as `Box::new([0u8; 64])` makes them.
//!
//! - `alloc/system`: `System.alloc` + `System.dealloc` called directly (the plain system
//!   allocator; this binary's global allocator is the tracking one, so `Box` cannot be used).
//! - `alloc/tracked/off`: the same through `Tracked<System>` (the global allocator here) with no
//!   session: one relaxed load more per call.
//! - `alloc/tracked/exact`: the same while a session records every allocation and free (goal:
//!   ≤ 4× `alloc/system`). The hook appends two records to the thread's ring; the
//!   `tachyon-memory` thread applies them to the live table meanwhile, and when it falls behind
//!   the ring fills and the allocating thread waits: the figure includes that back-pressure.
//! - `alloc/tracked/sampled`: the same while a session samples every 4096 bytes on average
//!   (heapprofd's default; goal: ≤ 1.2× `alloc/system`).
//!
//! Run: `cargo bench -p tachyon --bench alloc`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, Criterion, Throughput};
use tachyon::alloc::{MemoryConfig, MemoryMode, Tracked};
use tachyon::Config;

#[global_allocator]
static ALLOC: Tracked<System> = Tracked::new(System);

fn pair(layout: Layout) {
    let b = Box::new(black_box([0u8; 64]));
    black_box(&b);
    drop(b);
    let _ = layout;
}

fn session(mode: MemoryMode) {
    tachyon::start(Config {
        output: None,
        buffer_size: 64 << 20,
        memory: MemoryConfig {
            mode,
            counter_period: Duration::from_millis(1),
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
    g.bench_function("system", |b| {
        b.iter(|| {
            // SAFETY: a non-zero layout; the block is freed with the same layout.
            unsafe {
                let p = System.alloc(layout);
                black_box(p).write(1);
                System.dealloc(p, layout);
            }
        })
    });
    g.bench_function("tracked/off", |b| b.iter(|| pair(layout)));
    session(MemoryMode::Exact);
    g.bench_function("tracked/exact", |b| b.iter(|| pair(layout)));
    let report = tachyon::shutdown().expect("stop").expect("a session");
    let exact = report.memory.expect("tracking ran");
    session(MemoryMode::Sampled { interval: 4096 });
    g.bench_function("tracked/sampled", |b| b.iter(|| pair(layout)));
    let report = tachyon::shutdown().expect("stop").expect("a session");
    let sampled = report.memory.expect("tracking ran");
    g.finish();
    eprintln!("exact session: {exact}");
    eprintln!("sampled session: {sampled}");
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}

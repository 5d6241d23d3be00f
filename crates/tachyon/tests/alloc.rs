//! The instrumentation does not allocate on the hot path: once a thread has used a callsite in
//! the session (its writer exists, the names are interned), recording a zone, an instant or a
//! counter makes no heap allocation; a disabled callsite makes none, ever.
//!
//! What may allocate, and how it is accounted for: handing a full chunk back to the service
//! allocates the commit request's `Vec` (and a block of the commit channel every 31 commits),
//! see "What allocates" on `TraceWriter`. A chunk holds about 4 KiB and one iteration below
//! writes well under 200 bytes, so an iteration crosses at most one chunk boundary: an
//! iteration that allocates must be one that handed a chunk back, and then allocates at most
//! twice (five when a packet continued into the next chunk and its sizes travel as patches).
//! So the test counts the iterations that allocated, per iteration, and bounds them by
//! the number of chunks the writers committed in the whole session (from the report), which is
//! itself far below the number of iterations: one allocation per event, or per few events,
//! fails it. Nothing else is excused.

mod counting_alloc;

use std::sync::{Mutex, MutexGuard};

use counting_alloc::allocs;
use tachyon::{CategoryFilter, Config, CounterTrack, Track, Unit};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Per-iteration allocation counts of `body` run `n` times.
struct Tally {
    iterations: u64,
    allocating_iterations: u64,
    max_per_iteration: u64,
    total: u64,
}

fn tally(n: u64, mut body: impl FnMut(u64)) -> Tally {
    let mut t = Tally {
        iterations: n,
        allocating_iterations: 0,
        max_per_iteration: 0,
        total: 0,
    };
    for i in 0..n {
        let before = allocs();
        body(i);
        let made = allocs() - before;
        if made > 0 {
            t.allocating_iterations += 1;
            t.max_per_iteration = t.max_per_iteration.max(made);
            t.total += made;
        }
    }
    t
}

/// Checks a tally against the chunks committed in the session (module docs): at most
/// `per_handoff` allocations in an iteration, and no more allocating iterations than chunks.
fn check(what: &str, t: &Tally, chunks_committed: u64, per_handoff: u64) {
    eprintln!(
        "{what}: {} of {} iterations allocated, {} allocations, at most {} in one; \
         {chunks_committed} chunks committed",
        t.allocating_iterations, t.iterations, t.total, t.max_per_iteration
    );
    assert!(
        t.max_per_iteration <= per_handoff,
        "{what}: an iteration allocated {} times (a chunk hand-off allocates at most \
         {per_handoff})",
        t.max_per_iteration
    );
    assert!(
        t.allocating_iterations <= chunks_committed,
        "{what}: {} iterations allocated, more than the {chunks_committed} chunks committed",
        t.allocating_iterations
    );
    // Far below one per iteration: the iterations that allocated are the rare chunk hand-offs.
    assert!(
        t.allocating_iterations * 10 < t.iterations,
        "{what}: {} of {} iterations allocated",
        t.allocating_iterations,
        t.iterations
    );
}

const N: u64 = 20_000;

#[test]
fn enabled_hot_events_do_not_allocate() {
    let _l = lock();
    tachyon::start(Config::in_memory()).unwrap();
    let hot = |i: u64| {
        let _z = tachyon::zone!("alloc zone");
        tachyon::instant!("alloc", "alloc instant");
        tachyon::counter!("alloc int", i as i64);
        tachyon::counter!("alloc float", i as f64 * 0.5, Unit::Bytes);
    };
    // Warm-up: this thread's writer, its generation, every name interned.
    hot(0);
    let hot_tally = tally(N, hot);

    // The general path (arguments, run-time names, tracks, run-time counters) allocates nothing
    // either once warm.
    let track = Track::named("alloc track");
    let counter = CounterTrack::new("alloc dynamic counter", Unit::Count);
    let general = |i: u64| {
        let _z = tachyon::zone!("alloc", "alloc args", n = i, s = "str", f = 0.5, b = true);
        let _d = tachyon::zone!(name: "alloc dynamic name", k = i);
        let slice = tachyon::begin!(&track, "alloc on track");
        tachyon::instant_on!(&track, "alloc instant on track", n = i);
        drop(slice);
        counter.set(i);
    };
    general(0);
    let general_tally = tally(N / 4, general);

    let report = tachyon::shutdown().unwrap().unwrap();
    assert_eq!(report.writers.packets_dropped, 0, "{:?}", report.writers);
    let chunks = report.writers.chunks_committed;
    // Small packets are written whole (`write_small_packet`), never continued into the next
    // chunk: a hand-off is the commit's `Vec` and, every 31 commits, a block of the channel.
    check("zone, instant, counters", &hot_tally, chunks, 2);
    // Packets of the general path may continue into the next chunk; their size fields left in
    // the chunk handed off then travel as patches, committed when the packet ends: two more
    // `Vec`s (the chunk's patches, the list of patched chunks) and maybe a channel block.
    check("arguments, names, tracks", &general_tally, chunks, 5);
    // Everything was recorded: the trace is not empty of what was measured.
    assert!(
        report.trace.len() as u64 > N * 40,
        "{} bytes",
        report.trace.len()
    );
}

#[test]
fn disabled_callsites_never_allocate() {
    let _l = lock();
    let track = Track::named("alloc disabled track");
    let disabled = |i: u64| {
        let _z = tachyon::zone!("off", "disabled zone");
        let _a = tachyon::zone!("off", "disabled args", n = i, s = format!("{i}"));
        tachyon::instant!("off", "disabled instant", v = vec![i; 4].len());
        tachyon::instant!("off", name: format!("disabled {i}"));
        let _s = tachyon::begin!(&track, "off", "disabled on track", n = i);
        tachyon::instant_on!(&track, "off", "disabled instant on track");
    };
    // No session: every callsite registers once (that takes the registry's lock and may grow
    // its list), then reads disabled.
    disabled(0);
    let t = tally(N, disabled);
    assert_eq!(t.total, 0, "no session: {} allocations", t.total);

    // A session that disables the category: the callsites are re-evaluated at start, nothing
    // is written and nothing allocates (not even the arguments' `format!` and `vec!`).
    tachyon::start(Config {
        categories: CategoryFilter::new(&[], &["off"]),
        ..Config::in_memory()
    })
    .unwrap();
    let t = tally(N, disabled);
    let report = tachyon::shutdown().unwrap().unwrap();
    assert_eq!(t.total, 0, "disabled in a session: {} allocations", t.total);
    assert_eq!(report.writers.writers_created, 0, "nothing was written");
}

//! The tracking allocator end to end: a program with a known allocation pattern (a deliberate
//! leak, frees on another thread, a pool), recorded exactly and sampled, checked in the
//! session's summary, the trace's counter tracks and the heap profile the processor imports.

use std::alloc::System;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tachyon::alloc::{MemoryConfig, MemoryMode, MemorySummary, Tracked};
use tachyon::Config;
use tachyon_processor::{Options, TraceProcessor, Value};

mod oracle;

#[global_allocator]
static ALLOC: Tracked<System> = Tracked::new(System);

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn config(mode: MemoryMode) -> Config {
    Config {
        memory: MemoryConfig {
            mode,
            counter_period: Duration::ZERO,
            seed: Some(7),
            ..MemoryConfig::default()
        },
        ..Config::in_memory()
    }
}

const LEAKS: usize = 10;
const LEAK_SIZE: usize = 1000;
const SHARED: usize = 5;
const SHARED_SIZE: usize = 4096;

/// The pattern: 10 × 1000 bytes leaked in zone "leaky", 5 × 4096 bytes allocated in zone
/// "handoff" and freed by another thread.
fn pattern() {
    {
        let _z = tachyon::zone!("leaky");
        for _ in 0..LEAKS {
            let b = vec![7u8; LEAK_SIZE].into_boxed_slice();
            std::hint::black_box(Box::leak(b));
        }
    }
    let blocks: Vec<Box<[u8]>> = {
        let _z = tachyon::zone!("handoff");
        (0..SHARED)
            .map(|i| vec![i as u8; SHARED_SIZE].into_boxed_slice())
            .collect()
    };
    // `blocks`' own Vec is allocated in "handoff" too (SHARED pointers).
    std::thread::spawn(move || drop(std::hint::black_box(blocks)))
        .join()
        .unwrap();
}

fn run(mode: MemoryMode, body: impl FnOnce()) -> (MemorySummary, Vec<u8>) {
    tachyon::start(config(mode)).unwrap();
    body();
    let report = tachyon::shutdown().unwrap().unwrap();
    let memory = report.memory.expect("tracking ran");
    (memory, report.trace)
}

fn site<'a>(m: &'a MemorySummary, zone: &str) -> Option<&'a tachyon::alloc::SiteSummary> {
    let h = &m.heaps[0];
    h.top_allocated
        .iter()
        .find(|s| s.zones.last().map(String::as_str) == Some(zone))
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Integer(i) => *i,
        Value::Null => 0,
        other => panic!("not an integer: {other:?}"),
    }
}

fn query_ints(tp: &TraceProcessor, sql: &str) -> Vec<Vec<i64>> {
    tp.query(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .rows
        .iter()
        .map(|r| r.iter().map(int).collect())
        .collect()
}

#[test]
fn exact_mode_sees_the_pattern_exactly() {
    let _l = lock();
    let (m, trace) = run(MemoryMode::Exact, pattern);
    assert!(tachyon::alloc::is_installed());
    if let Some(p) = std::env::var_os("TACHYON_MEMORY_TRACE_OUT") {
        std::fs::write(p, &trace).unwrap();
    }
    let leaky = site(&m, "leaky").expect("the leaky site");
    assert_eq!(leaky.zones, vec!["leaky".to_owned()]);
    assert_eq!(leaky.alloc_count, LEAKS as u64);
    assert_eq!(leaky.allocated_bytes, (LEAKS * LEAK_SIZE) as u64);
    assert_eq!(leaky.live_bytes, (LEAKS * LEAK_SIZE) as u64);
    let handoff = site(&m, "handoff").expect("the handoff site");
    let vec_bytes = (SHARED * std::mem::size_of::<Box<[u8]>>()) as u64;
    assert_eq!(
        handoff.allocated_bytes,
        (SHARED * SHARED_SIZE) as u64 + vec_bytes
    );
    assert_eq!(handoff.live_bytes, 0, "freed on another thread");
    assert_eq!(handoff.alloc_count, SHARED as u64 + 1);
    // The leak list has "leaky" with exactly its blocks ("(no zone)" holds the tracer's own
    // per-thread state, live until the threads exit).
    let leak = m.heaps[0]
        .top_live
        .iter()
        .find(|s| s.zones == ["leaky"])
        .unwrap_or_else(|| panic!("{:?}", m.heaps[0].top_live));
    assert_eq!((leak.live_bytes, leak.live_count), (10_000, 10));
    assert!(m.heaps[0].top_live.iter().all(|s| s.zones != ["handoff"]));
    assert_eq!(m.lost, 0);
    assert!(m.threads >= 2, "{m:?}");
    assert!(m.dumps >= 1);

    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
    // The live-heap counter: its last sample is the live heap at the end, its max the peak.
    let rows = query_ints(
        &tp,
        "SELECT CAST(max(c.value) AS INT), count(*) FROM counter c JOIN counter_track t ON c.track_id = t.id WHERE t.name = 'Heap'",
    );
    assert_eq!(rows[0][0], m.heaps[0].peak_bytes as i64);
    let last = query_ints(
        &tp,
        "SELECT CAST(c.value AS INT) FROM counter c JOIN counter_track t ON c.track_id = t.id WHERE t.name = 'Heap' ORDER BY c.ts DESC LIMIT 1",
    );
    assert_eq!(last[0][0], m.heaps[0].live_bytes as i64);

    // The heap profile as the processor imports it: per site, the allocation rows and the free
    // rows of the last dump (cumulative since the start) equal the pattern.
    let per_site = |zone: &str| {
        query_ints(
            &tp,
            &format!(
                "SELECT sum(CASE WHEN a.size > 0 THEN a.size END), sum(CASE WHEN a.count > 0 THEN a.count END),                    coalesce(sum(CASE WHEN a.size < 0 THEN a.size END), 0), coalesce(sum(CASE WHEN a.count < 0 THEN a.count END), 0)                  FROM heap_profile_allocation a JOIN stack_profile_callsite c ON a.callsite_id = c.id                  JOIN stack_profile_frame f ON c.frame_id = f.id                  WHERE f.name = '{zone}' AND a.heap_name = 'rust.global'"
            ),
        )[0]
            .clone()
    };
    assert_eq!(per_site("leaky"), vec![10_000, 10, 0, 0]);
    let h = (SHARED * SHARED_SIZE) as i64 + vec_bytes as i64;
    assert_eq!(
        per_site("handoff"),
        vec![h, SHARED as i64 + 1, -h, -(SHARED as i64 + 1)]
    );
    // The processor's memory summary agrees with the session's.
    let report = tp.memory(10).unwrap();
    let global = report
        .iter()
        .find(|r| r.heap_name == "rust.global")
        .unwrap();
    assert_eq!(global.live_bytes, m.heaps[0].live_bytes as i64);
    assert_eq!(global.allocated_bytes, m.heaps[0].allocated_bytes as i64);
    assert_eq!(global.peak_bytes, m.heaps[0].peak_bytes as i64);
    let leak = global
        .top_live
        .iter()
        .find(|s| s.stack == ["leaky"])
        .unwrap();
    assert_eq!((leak.live_bytes, leak.live_count), (10_000, 10));
}

#[test]
fn pools_have_their_own_exact_track() {
    let _l = lock();
    let (m, trace) = run(MemoryMode::Exact, || {
        let arena = tachyon::alloc::pool("arena");
        arena.alloc(0x1000, 100);
        arena.alloc(0x2000, 200);
        arena.free(0x1000);
        arena.free(0x9999); // never allocated: counted, the heap stays ≥ 0
        arena.alloc(0x3000, 50);
        arena.discard();
        arena.alloc(0x1000, 10);
    });
    let pool = m.heaps.iter().find(|h| h.name == "arena").expect("pool");
    assert_eq!(pool.peak_bytes, 300);
    assert_eq!(pool.allocated_bytes, 360);
    assert_eq!(pool.alloc_count, 4);
    assert_eq!(pool.live_bytes, 10);
    assert_eq!(pool.unseen_frees, 1);
    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
    let values = query_ints(
        &tp,
        "SELECT CAST(c.value AS INT) FROM counter c JOIN counter_track t ON c.track_id = t.id WHERE t.name = 'Heap: arena' ORDER BY c.ts, c.id",
    );
    let values: Vec<i64> = values.into_iter().map(|r| r[0]).collect();
    assert_eq!(values, vec![100, 300, 200, 250, 0, 10]);
}

#[test]
fn bad_input_is_counted_never_negative() {
    let _l = lock();
    // A block allocated before tracking, freed during it: an unseen free.
    let before = vec![1u8; 777];
    let (m, _) = run(MemoryMode::Exact, || {
        drop(std::hint::black_box(before));
        // Zero-size blocks: Rust never asks a global allocator for 0 bytes (`GlobalAlloc`
        // forbids it), but a pool may hand one out.
        let zero = tachyon::alloc::pool("zero");
        zero.alloc(0x40, 0);
        zero.free(0x40);
        {
            let _z = tachyon::zone!("grow");
            let mut v = vec![0u8; 16];
            v.reserve(1 << 20); // a realloc that moves: a free and an allocation
            assert_eq!(v.capacity(), 16 + (1 << 20));
            drop(v);
        }
        // A huge request that fails (null): counted.
        let huge = std::alloc::Layout::from_size_align(1 << 62, 8).unwrap();
        // SAFETY: a valid, non-zero layout; a null result is checked.
        let p = unsafe { std::alloc::alloc(huge) };
        assert!(p.is_null());
    });
    let h = &m.heaps[0];
    let grow = site(&m, "grow").expect("the grow site");
    assert_eq!(grow.alloc_count, 2);
    assert_eq!(grow.allocated_bytes, 16 + 16 + (1 << 20));
    assert_eq!(grow.live_bytes, 0);
    assert!(h.unseen_frees >= 1);
    let zero = m
        .heaps
        .iter()
        .find(|h| h.name == "zero")
        .expect("the zero pool");
    assert_eq!(
        (zero.alloc_count, zero.free_count, zero.peak_bytes),
        (1, 1, 0)
    );
    assert!(m.failed >= 1);
    assert!(h.live_bytes < h.peak_bytes);
}

#[test]
fn sampled_mode_estimates_within_bounds() {
    let _l = lock();
    const N: usize = 20_000;
    const SIZE: usize = 512;
    const INTERVAL: u64 = 8192;
    let (m, trace) = run(MemoryMode::Sampled { interval: INTERVAL }, || {
        let _z = tachyon::zone!("sampled leak");
        for _ in 0..N {
            std::hint::black_box(Box::leak(vec![1u8; SIZE].into_boxed_slice()));
        }
    });
    // Sampled allocations carry native stacks by default: the zone's allocations are one
    // site per distinct stack (each also names the zones).
    let h = &m.heaps[0];
    let in_zone: Vec<_> = h
        .top_allocated
        .iter()
        .filter(|s| s.zones.last().map(String::as_str) == Some("sampled leak"))
        .collect();
    assert!(!in_zone.is_empty(), "{:?}", h.top_allocated);
    assert!(in_zone.iter().all(|s| !s.stack.is_empty()), "{in_zone:?}");
    let allocated: u64 = in_zone.iter().map(|s| s.allocated_bytes).sum();
    let live: u64 = in_zone.iter().map(|s| s.live_bytes).sum();
    // True bytes 10 240 000; samples are a Poisson count with mean bytes / interval = 1250,
    // each weighing INTERVAL: the estimate's standard deviation is sqrt(1250) × 8192 ≈ 290 KB.
    // Allow 5 of them (a fixed seed makes the outcome repeatable anyway).
    let truth = (N * SIZE) as f64;
    let est = allocated as f64;
    let sd = (truth / INTERVAL as f64).sqrt() * INTERVAL as f64;
    assert!(
        (est - truth).abs() < 5.0 * sd,
        "estimate {est}, truth {truth}"
    );
    assert_eq!(live, allocated, "nothing freed");
    // The imported profile carries the same estimate, on the same stacks.
    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
    let imported: i64 = in_zone
        .iter()
        .map(|s| allocated_at_stack(&tp, &s.stack))
        .sum();
    assert_eq!(imported, allocated as i64);
}

/// A thread's sampling countdown belongs to its session: after a session whose interval no
/// allocation reaches (the thread's countdown then has about 2^40 bytes left), the next
/// session, sampling every byte, takes this thread's allocations from its first.
#[test]
fn a_new_session_draws_each_threads_countdown_again() {
    let _l = lock();
    let (first, _) = run(MemoryMode::Sampled { interval: 1 << 40 }, || {
        for _ in 0..100 {
            drop(std::hint::black_box(vec![0u8; 64]));
        }
    });
    let sampled: u64 = first.heaps.iter().map(|h| h.alloc_count).sum();
    assert_eq!(sampled, 0, "{first}");
    const N: usize = 100;
    let (second, _) = run(MemoryMode::Sampled { interval: 1 }, || {
        let _z = tachyon::zone!("second session");
        for _ in 0..N {
            std::hint::black_box(Box::leak(vec![1u8; 64].into_boxed_slice()));
        }
    });
    // Every allocation is a sample (gaps of about a byte), weighing its size.
    let live: u64 = second
        .heaps
        .iter()
        .flat_map(|h| &h.top_live)
        .filter(|s| s.zones.last().map(String::as_str) == Some("second session"))
        .map(|s| s.live_bytes)
        .sum();
    assert_eq!(live, (N * 64) as u64, "{second}");
}

/// Bytes the heap profile in `tp` has at exactly the native stack `pcs` (innermost first):
/// the callsite whose frames, leaf to root, have these addresses relative to their binaries.
fn allocated_at_stack(tp: &TraceProcessor, pcs: &[u64]) -> i64 {
    let rel: Vec<String> = pcs
        .iter()
        .map(|&pc| {
            let m = tachyon::callstack::module_of(pc).expect("a frame in a loaded binary");
            m.rel_pc(pc).to_string()
        })
        .collect();
    let sql = "WITH RECURSIVE up(leaf, id, depth, path) AS ( \
          SELECT c.id, c.id, 0, '' FROM stack_profile_callsite c \
          UNION ALL SELECT up.leaf, c.parent_id, up.depth + 1, \
            up.path || (SELECT f.rel_pc FROM stack_profile_frame f WHERE f.id = c.frame_id) || ',' \
          FROM up JOIN stack_profile_callsite c ON c.id = up.id) \
        SELECT up.path, (SELECT coalesce(sum(a.size), 0) FROM heap_profile_allocation a \
          WHERE a.callsite_id = up.leaf AND a.size > 0) FROM up WHERE up.id IS NULL";
    let want = rel.iter().map(|r| format!("{r},")).collect::<String>();
    tp.query(sql)
        .unwrap()
        .rows
        .iter()
        .filter(|r| matches!(&r[0], Value::Text(p) if *p == want))
        .map(|r| int(&r[1]))
        .sum()
}

#[inline(never)]
fn leak_in_a_known_function(n: usize) {
    for _ in 0..n {
        std::hint::black_box(Box::leak(vec![3u8; 2000].into_boxed_slice()));
    }
}

/// Exact mode with native stacks asked for: the leak's site is the stack of the function that
/// leaked (its frames in the test binary's mapping, at addresses a symbolizer can look up),
/// in the summary, in the trace and in the processor's tables.
#[test]
fn allocations_carry_native_call_stacks() {
    let _l = lock();
    let mut cfg = config(MemoryMode::Exact);
    cfg.memory.callstack_depth = Some(16);
    tachyon::start(cfg).unwrap();
    leak_in_a_known_function(7);
    let report = tachyon::shutdown().unwrap().unwrap();
    let m = report.memory.as_ref().expect("tracking ran");
    let f = leak_in_a_known_function as *const () as u64;
    let inside = |pc: u64| pc > f && pc < f + 4096;
    let site = m.heaps[0]
        .top_live
        .iter()
        .find(|s| s.stack.iter().any(|&pc| inside(pc)))
        .unwrap_or_else(|| panic!("no stack through the function: {:?}", m.heaps[0].top_live));
    assert_eq!((site.live_bytes, site.live_count), (14_000, 7));
    assert!(site.stack.len() <= 16);
    assert!(site.zones.is_empty(), "outside every zone");
    let tp = TraceProcessor::from_bytes(&report.trace, &Options::default()).unwrap();
    assert_eq!(allocated_at_stack(&tp, &site.stack), 14_000);
    // The frames are in the test binary's mapping, under its real path and build id.
    let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
    let module = tachyon::callstack::module_of(f).unwrap();
    let rows = tp
        .query(&format!(
            "SELECT m.name, m.build_id FROM stack_profile_frame f JOIN stack_profile_mapping m \
             ON f.mapping = m.id WHERE f.rel_pc = {}",
            module.rel_pc(*site.stack.iter().find(|&&pc| inside(pc)).unwrap())
        ))
        .unwrap()
        .rows;
    assert!(!rows.is_empty());
    let hex: String = module.build_id.iter().map(|b| format!("{b:02x}")).collect();
    assert!(
        rows.iter()
            .any(|r| r[0] == Value::Text(exe.display().to_string())
                && r[1] == Value::Text(hex.clone())),
        "{rows:?} vs {} {hex}",
        exe.display()
    );
    // Perfetto's own trace processor reads the same profile: allocations, leaf frames,
    // mappings (skipped when `trace_processor_shell` is absent).
    let compare =
        "SELECT a.heap_name, a.count, a.size, f.rel_pc, m.name, m.build_id, m.start, m.end \
        FROM heap_profile_allocation a JOIN stack_profile_callsite c ON a.callsite_id = c.id \
        JOIN stack_profile_frame f ON c.frame_id = f.id \
        JOIN stack_profile_mapping m ON f.mapping = m.id ORDER BY a.id";
    if let Some(theirs) = oracle::perfetto_rows(&report.trace, compare) {
        assert_eq!(oracle::our_rows(&tp, compare), theirs);
    }
    // `tachyon stats`' summary lists the site with a stack of frames (unsymbolized here:
    // binary+offset names).
    let report = tp.memory(20).unwrap();
    let global = report
        .iter()
        .find(|r| r.heap_name == "rust.global")
        .unwrap();
    assert!(
        global
            .top_live
            .iter()
            .any(|s| s.live_bytes == 14_000 && s.stack.len() > 1),
        "{:?}",
        global.top_live
    );
}

#[test]
fn threads_starting_and_stopping_and_a_stop_under_load() {
    let _l = lock();
    tachyon::start(config(MemoryMode::Exact)).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Short-lived threads inside long-lived ones.
                    if n % 500 == 0 {
                        std::thread::spawn(move || {
                            let v: Vec<u64> = (0..100).collect();
                            std::hint::black_box(v);
                        })
                        .join()
                        .unwrap();
                    }
                    let v = vec![i as u8; 64 + (n % 512) as usize];
                    std::hint::black_box(&v);
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    // Stop while the workers allocate.
    let report = tachyon::shutdown().unwrap().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        assert!(w.join().unwrap() > 0);
    }
    let m = report.memory.expect("tracking ran");
    assert!(m.heaps[0].alloc_count > 100);
    assert!(m.threads >= 5, "{m:?}");
    let tp = TraceProcessor::from_bytes(&report.trace, &Options::default()).unwrap();
    let rows = query_ints(
        &tp,
        "SELECT count(*) FROM counter c JOIN counter_track t ON c.track_id = t.id WHERE t.name = 'Heap'",
    );
    assert!(rows[0][0] > 0);
    // A second session in the same process works (rings reused, stale records ignored).
    let (m2, _) = run(MemoryMode::Exact, pattern);
    assert_eq!(
        site(&m2, "leaky").map(|s| s.live_bytes),
        Some((LEAKS * LEAK_SIZE) as u64)
    );
}

/// Periodic dumps: several `heap_profile` rows, and the rows Perfetto's own trace processor
/// derives from the trace equal ours (skipped when `trace_processor_shell` is absent).
#[test]
fn periodic_dumps_import_like_perfetto() {
    let _l = lock();
    let mut cfg = config(MemoryMode::Exact);
    cfg.memory.dump_period = Some(Duration::from_millis(10));
    tachyon::start(cfg).unwrap();
    pattern();
    std::thread::sleep(Duration::from_millis(40));
    {
        let _z = tachyon::zone!("late");
        std::hint::black_box(Box::leak(vec![0u8; 3000].into_boxed_slice()));
    }
    let report = tachyon::shutdown().unwrap().unwrap();
    let m = report.memory.unwrap();
    assert!(m.dumps >= 3, "{m:?}");
    let tp = TraceProcessor::from_bytes(&report.trace, &Options::default()).unwrap();
    let q = "SELECT count(*), sum(size), sum(count), sum(CASE WHEN size > 0 THEN size END) FROM heap_profile_allocation";
    let ours = query_ints(&tp, q);
    assert_eq!(ours[0][1], m.heaps[0].live_bytes as i64);
    assert_eq!(ours[0][3], m.heaps[0].allocated_bytes as i64);
    let profiles = query_ints(&tp, "SELECT count(*) FROM heap_profile");
    assert_eq!(profiles[0][0], m.dumps as i64);

    let compare = "SELECT a.ts, a.heap_name, a.count, a.size, \
        (SELECT group_concat(f.name, '>') FROM stack_profile_callsite c JOIN stack_profile_frame f ON c.frame_id = f.id WHERE c.id = a.callsite_id) AS leaf \
        FROM heap_profile_allocation a ORDER BY a.id";
    let mine = oracle::our_rows(&tp, compare);
    assert!(!mine.is_empty());
    if let Some(theirs) = oracle::perfetto_rows(&report.trace, compare) {
        assert_eq!(mine, theirs);
    }
}

/// Blocks freed right after their allocation (one record each, the allocation marked freed)
/// while the tracker takes rings concurrently: some frees come after a pass took their
/// allocation (a claimed allocation: the free is its own record), some race the pass. Every
/// block is counted once, none is seen freed twice or never freed.
#[test]
fn blocks_freed_right_after_are_counted_once_under_concurrent_passes() {
    let _l = lock();
    const THREADS: usize = 2;
    const PAIRS: usize = 10_000;
    const SLOW_EVERY: usize = 500;
    tachyon::start(config(MemoryMode::Exact)).unwrap();
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            std::thread::spawn(|| {
                let _z = tachyon::zone!("pairs");
                for i in 0..PAIRS {
                    let b = std::hint::black_box(Box::new([i as u8; 48]));
                    if i % SLOW_EVERY == 0 {
                        // Long enough for a pass (every millisecond) to take the allocation
                        // before its free.
                        std::thread::sleep(Duration::from_millis(3));
                    }
                    drop(b);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let m = tachyon::shutdown().unwrap().unwrap().memory.unwrap();
    let h = &m.heaps[0];
    let s = site(&m, "pairs").expect("the zone's site");
    // No free is lost: a mark cannot be (it is no record), a free of a claimed allocation is
    // a record, lost only with the counted ones.
    assert_eq!((s.live_bytes, s.live_count), (0, 0), "{s:?}");
    assert_eq!(h.alloc_count - h.free_count, h.live_count);
    assert!(h.implicit_frees <= m.lost, "{h:?}");
    let want = (THREADS * PAIRS) as u64;
    if m.lost == 0 {
        // The common case: every block counted exactly once.
        assert_eq!(s.alloc_count, want, "{s:?}");
        assert_eq!(s.allocated_bytes, want * 48);
    } else {
        // A ring stayed full for 100 ms (a debug build on a loaded machine): only the lost
        // records are missing.
        assert!(
            s.alloc_count <= want && s.alloc_count + m.lost >= want,
            "{s:?} {m:?}"
        );
    }
}

//! Tracy's instrumentation breadth, decoded back from the trace by the independent reader
//! (`model`): locks (holds, waits, flows, shared holds, poisoning, leaked guards), frames,
//! log messages, plots, per-zone data, program info, thread group hints, and bad input. Each
//! test checks exactly the events it expects, and that the trace reads without an unresolved
//! reference or a loss.
//!
//! The SDK has one session per process: the tests of this file take `LOCK` and run one after
//! the other.

mod model;
mod oracle;

use std::sync::{Arc, Barrier, Mutex as StdMutex, MutexGuard as StdGuard};
use std::time::Duration;

use model::{Arg, CounterValue, Event, Kind, Model};
use tachyon::sync::{LockMark, Mutex, RwLock};
use tachyon::{Config, Level, Plot, PlotKind};

static LOCK: StdMutex<()> = StdMutex::new(());

fn lock() -> StdGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` in an in-memory session; the model of its trace, checked for what holds for every
/// trace (no loss, nothing unresolved or malformed).
fn record(f: impl FnOnce()) -> (Model, Vec<u8>) {
    tachyon::start(Config::in_memory()).expect("start");
    f();
    let report = tachyon::shutdown()
        .expect("shutdown")
        .expect("a session ran");
    assert_eq!(report.writers.packets_dropped, 0, "{:?}", report.writers);
    let model = Model::read(&report.trace);
    assert!(model.errors.is_empty(), "{:?}", model.errors);
    assert_eq!(model.skipped, 0);
    let unresolved = model.unresolved();
    assert!(unresolved.is_empty(), "unresolved: {unresolved:#?}");
    (model, report.trace)
}

/// Tracy's CPU usage plots, sampled every 100 ms while a session with `cpu_usage` runs.
#[test]
fn cpu_usage_plots_are_percentages() {
    let _l = lock();
    tachyon::start(Config {
        cpu_usage: true,
        ..Config::in_memory()
    })
    .expect("start");
    // Busy for a while: the process uses CPU, and the sampler wakes a few times.
    let t = std::time::Instant::now();
    let mut x = 0u64;
    while t.elapsed() < Duration::from_millis(450) {
        x = x.wrapping_mul(31).wrapping_add(7);
    }
    std::hint::black_box(x);
    let report = tachyon::shutdown().unwrap().unwrap();
    let m = Model::read(&report.trace);
    assert!(m.errors.is_empty() && m.unresolved().is_empty());
    for name in ["CPU usage (process)", "CPU usage (system)"] {
        let d = track_named(&m, name);
        assert_eq!(d[0].counter, Some((None, Some("%".into()))), "{name}");
        let values: Vec<f64> = m
            .on_track(d[0].uuid)
            .iter()
            .filter_map(|e| match e.counter {
                Some(CounterValue::Double(v)) => Some(v),
                _ => None,
            })
            .collect();
        // At least one sample (the first reading is only the base of the next).
        assert!(!values.is_empty(), "{name}");
        assert!(
            values.iter().all(|v| (0.0..=100.0).contains(v)),
            "{name}: {values:?}"
        );
    }
}

fn track_named<'a>(m: &'a Model, name: &str) -> Vec<&'a model::Descriptor> {
    let mut v: Vec<&model::Descriptor> = m
        .descriptors
        .iter()
        .filter(|d| d.name.as_deref() == Some(name))
        .collect();
    v.dedup_by_key(|d| d.uuid);
    v
}

fn the_track(m: &Model, name: &str) -> u64 {
    let v = track_named(m, name);
    let mut uuids: Vec<u64> = v.iter().map(|d| d.uuid).collect();
    uuids.sort();
    uuids.dedup();
    assert_eq!(uuids.len(), 1, "one track named {name:?}: {v:?}");
    uuids[0]
}

fn tid() -> i64 {
    model::current_tid().expect("Linux")
}

fn arg<'a>(e: &'a Event, key: &str) -> Option<&'a Arg> {
    e.args.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

#[test]
fn a_contended_mutex_records_holds_a_wait_and_a_flow_from_the_holder() {
    let _l = lock();
    // Contention is arranged, not guaranteed (the waiter must block before the holder lets
    // go): up to five attempts, each on a lock of its own; at least one must contend.
    let locks: Vec<Arc<Mutex<u32>>> = (0..5)
        .map(|i| Arc::new(Mutex::with_name(format!("queue {i}"), 0)))
        .collect();
    let mut waiter_tids = Vec::new();
    let (m, _) = record(|| {
        for lock in &locks {
            let barrier = Arc::new(Barrier::new(2));
            let guard = lock.lock().unwrap();
            let waiter = {
                let (lock, barrier) = (Arc::clone(lock), Arc::clone(&barrier));
                std::thread::Builder::new()
                    .name("waiter".into())
                    .spawn(move || {
                        barrier.wait();
                        *lock.lock().unwrap() += 1;
                        tid()
                    })
                    .unwrap()
            };
            barrier.wait();
            std::thread::sleep(Duration::from_millis(30));
            drop(guard);
            waiter_tids.push(waiter.join().unwrap());
        }
    });
    let me = tid();
    let mut contended = 0;
    for (i, &waiter_tid) in waiter_tids.iter().enumerate() {
        let name = format!("queue {i}");
        let track = the_track(&m, &name);
        let holds = m.slices(track);
        assert_eq!(holds.len(), 2, "{name}: two holds");
        let (first, second) = (&holds[0], &holds[1]);
        assert!(first
            .begin
            .name
            .as_deref()
            .unwrap()
            .contains(&format!("({me})")));
        assert!(second
            .begin
            .name
            .as_deref()
            .unwrap()
            .starts_with("waiter ("));
        for h in &holds {
            assert_eq!(h.begin.categories, vec!["tachyon.lock".to_string()]);
            assert!(matches!(arg(h.begin, "lock_id"), Some(Arg::Uint(_))));
            assert_eq!(h.depth, 0);
        }
        // Holds never overlap: the release is recorded before the unlock, the hold after.
        assert!(first.end.unwrap().ts <= second.begin.ts);
        let waiter_track = m.thread_track(waiter_tid);
        let waits: Vec<_> = m
            .slices(m.thread_track(waiter_tid))
            .into_iter()
            .filter(|s| s.begin.name.as_deref() == Some(&format!("wait for {name}")))
            .collect();
        if waits.is_empty() {
            // The waiter got the lock at once: no wait, no flow.
            assert!(first.end.unwrap().flow_ids.is_empty());
            continue;
        }
        contended += 1;
        assert_eq!(waits.len(), 1);
        let w = &waits[0];
        assert_eq!(w.begin.track, waiter_track);
        assert_eq!(arg(w.begin, "lock_id"), arg(second.begin, "lock_id"));
        // The wait began while the first hold ran and ended when the waiter got the lock.
        assert!(w.begin.ts >= first.begin.ts && w.begin.ts <= first.end.unwrap().ts);
        assert!(w.end.unwrap().ts >= first.end.unwrap().ts);
        assert!(w.end.unwrap().ts <= second.begin.ts);
        // The flow: from the hold the waiter waited for, to the wait.
        let flow = first.end.unwrap().flow_ids.clone();
        assert_eq!(flow.len(), 1, "the releaser saw the waiter");
        assert_eq!(w.end.unwrap().terminating_flow_ids, flow);
    }
    assert!(contended > 0, "no attempt contended");
}

/// Many uncontended holds: queued, then encoded by the drainer (or this thread) from the
/// lock's pre-encoded packets; every one reads back with its name, category and argument.
#[test]
fn many_uncontended_holds_read_back_whole() {
    let _l = lock();
    let m1 = Mutex::new_named("busy", 0u64);
    let rw = RwLock::new_named("busy rw", 0u64);
    const N: usize = 3000;
    let (m, _) = record(|| {
        for i in 0..N {
            if i == N - 10 {
                // Holds after a rename carry the new name.
                tachyon::set_thread_name("renamed holder");
            }
            *m1.lock().unwrap() += 1;
            if i % 2 == 0 {
                let _r = rw.read().unwrap();
            } else {
                *rw.write().unwrap() += 1;
            }
        }
    });
    let me = tid();
    let holds = m.slices(the_track(&m, "busy"));
    assert_eq!(holds.len(), N);
    // The first hold carries the lock's id; the pre-encoded ones that follow leave it out.
    let id = arg(holds[0].begin, "lock_id").cloned();
    assert!(matches!(id, Some(Arg::Uint(_))));
    for h in &holds {
        let name = h.begin.name.as_deref().unwrap();
        assert!(name.contains(&format!("({me})")), "{name}");
        assert_eq!(h.begin.categories, vec!["tachyon.lock".to_string()]);
        let a = arg(h.begin, "lock_id").cloned();
        assert!(a.is_none() || a == id, "{a:?}");
        assert!(h.end.is_some());
    }
    let without = holds
        .iter()
        .filter(|h| arg(h.begin, "lock_id").is_none())
        .count();
    assert!(
        without > N / 2,
        "most holds took the pre-encoded path: {without}"
    );
    assert!(holds[N - 11].begin.name.as_deref().unwrap() != "renamed holder ({me})");
    for h in &holds[N - 10..] {
        assert_eq!(
            h.begin.name.as_deref(),
            Some(format!("renamed holder ({me})").as_str())
        );
    }
    let rw_track = the_track(&m, "busy rw");
    assert_eq!(m.slices(rw_track).len(), N / 2);
    let child = m
        .descriptors
        .iter()
        .find(|d| d.parent == Some(rw_track))
        .unwrap();
    assert_eq!(m.slices(child.uuid).len(), N / 2);
}

/// Holds encoded from the lock's pre-encoded packets keep their times exactly, in order with
/// the zones the same thread writes around them and inside them: a hold's begin is written as
/// a delta from the sequence's last packet when nothing came between, and with its absolute
/// time when a zone inside the hold was queued first. Each hold lies between the zone before
/// it and the zone after it, and around the zone inside it, on one clock.
#[test]
fn holds_keep_their_times_among_the_threads_zones() {
    let _l = lock();
    let m1 = Mutex::new_named("ordered", 0u64);
    let rw = RwLock::new_named("ordered rw", 0u64);
    const N: usize = 3000;
    let (m, _) = record(|| {
        for i in 0..N {
            {
                let _z = tachyon::zone!("between");
            }
            if i % 3 == 2 {
                let _r = rw.read().unwrap();
                continue;
            }
            let mut g = m1.lock().unwrap();
            if i % 3 == 1 {
                let _z = tachyon::zone!("inside");
            }
            *g += 1;
        }
        let _z = tachyon::zone!("between");
    });
    let me = tid();
    let zones = m.slices(m.thread_track(me));
    let between: Vec<_> = zones
        .iter()
        .filter(|z| z.begin.name.as_deref() == Some("between"))
        .collect();
    let inside: Vec<_> = zones
        .iter()
        .filter(|z| z.begin.name.as_deref() == Some("inside"))
        .collect();
    assert_eq!(between.len(), N + 1);
    assert_eq!(inside.len(), N / 3);
    let holds = m.slices(the_track(&m, "ordered"));
    assert_eq!(holds.len(), N - N / 3);
    let rw_track = the_track(&m, "ordered rw");
    let child = m
        .descriptors
        .iter()
        .find(|d| d.parent == Some(rw_track))
        .expect("the shared holds' track");
    let shared = m.slices(child.uuid);
    assert_eq!(shared.len(), N / 3);
    assert!(m.slices(rw_track).is_empty());
    let clock = between[0].begin.clock;
    let (mut h, mut s, mut z) = (0, 0, 0);
    for i in 0..N {
        let before = between[i].end.expect("ended");
        let after = between[i + 1].begin;
        let hold = if i % 3 == 2 {
            s += 1;
            &shared[s - 1]
        } else {
            h += 1;
            &holds[h - 1]
        };
        let end = hold.end.expect("every hold ended");
        for e in [before, after, hold.begin, end] {
            assert_eq!(e.clock, clock, "one clock: {e:?}");
        }
        assert!(
            before.ts <= hold.begin.ts,
            "hold {i} begins after the zone before it"
        );
        assert!(hold.begin.ts <= end.ts, "hold {i}");
        assert!(end.ts <= after.ts, "hold {i} ends before the zone after it");
        assert_eq!(hold.depth, 0);
        let name = format!("thread {me}");
        let holder = hold.begin.name.as_deref().unwrap_or_default();
        assert!(
            holder.ends_with(&format!("({me})")) || holder == name,
            "{holder}"
        );
        assert_eq!(hold.begin.categories, vec!["tachyon.lock".to_string()]);
        if i % 3 == 1 {
            let zone = &inside[z];
            z += 1;
            let zone_end = zone.end.expect("ended");
            assert!(
                hold.begin.ts <= zone.begin.ts,
                "hold {i} begins before its zone"
            );
            assert!(zone_end.ts <= end.ts, "hold {i} ends after its zone");
        }
    }
}

/// Two threads taking one mutex in turn, mostly without waiting: a hold's end is read before
/// its unlock and its begin after its acquisition, so on the lock's track the holds follow one
/// another and never overlap (an overlap would pair one thread's begin with the other's end).
#[test]
fn holds_of_two_threads_never_overlap_on_the_lock_track() {
    let _l = lock();
    let m1 = Arc::new(Mutex::new_named("shared counter", 0u64));
    const N: usize = 2000;
    let (m, _) = record(|| {
        let barrier = Arc::new(Barrier::new(2));
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let (m1, barrier) = (Arc::clone(&m1), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    tachyon::set_thread_name(&format!("taker-{t}"));
                    barrier.wait();
                    for i in 0..N {
                        *m1.lock().unwrap() += 1;
                        if i % 64 == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    });
    assert_eq!(*m1.lock().unwrap(), 2 * N as u64);
    let holds = m.slices(the_track(&m, "shared counter"));
    assert_eq!(holds.len(), 2 * N);
    for h in &holds {
        let end = h.end.expect("every hold ended");
        assert_eq!(h.depth, 0, "a hold inside another: {:?}", h.begin);
        assert_eq!(h.begin.seq, end.seq, "begin and end from one thread");
        assert!(h.begin.ts <= end.ts);
    }
}

#[test]
fn rwlock_shared_holds_go_on_per_thread_tracks_under_the_lock() {
    let _l = lock();
    let lock = Arc::new(RwLock::new_named("table", 7u32));
    let mut reader_tids = Vec::new();
    let (m, _) = record(|| {
        let barrier = Arc::new(Barrier::new(2));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (lock, barrier) = (Arc::clone(&lock), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    let g = lock.read().unwrap();
                    // Both read holds overlap.
                    barrier.wait();
                    assert_eq!(*g, 7);
                    drop(g);
                    tid()
                })
            })
            .collect();
        reader_tids = readers.into_iter().map(|r| r.join().unwrap()).collect();
        *lock.write().unwrap() += 1;
        assert!(lock.try_write().is_ok());
    });
    let track = the_track(&m, "table");
    let exclusive = m.slices(track);
    assert_eq!(exclusive.len(), 2, "write() and try_write()");
    for t in &reader_tids {
        let child: Vec<_> = m
            .descriptors
            .iter()
            .filter(|d| {
                d.parent == Some(track)
                    && d.name
                        .as_deref()
                        .is_some_and(|n| n.contains(&t.to_string()))
            })
            .collect();
        assert!(!child.is_empty(), "a shared track for reader {t}");
        assert!(child[0].name.as_deref().unwrap().starts_with("shared: "));
        let holds = m.slices(child[0].uuid);
        assert_eq!(holds.len(), 1);
    }
}

#[test]
fn poisoned_and_leaked_locks_stay_honest() {
    let _l = lock();
    let lock = Arc::new(Mutex::new_named("poisoned", 0));
    let rw = RwLock::new_named("leaky", 0);
    let (m, _) = record(|| {
        let l2 = Arc::clone(&lock);
        let r = std::thread::spawn(move || {
            let _g = l2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(r.is_err());
        assert!(lock.is_poisoned());
        let g = lock.lock().expect_err("poisoned");
        drop(g);
        lock.clear_poison();
        assert!(lock.lock().is_ok());
        std::mem::forget(rw.read().unwrap());
        assert_eq!(*rw.read().unwrap(), 0);
    });
    // The panicking thread's hold ended while it unwound, then two more holds.
    let holds = m.slices(the_track(&m, "poisoned"));
    assert_eq!(holds.len(), 3);
    // The leaked read guard: its hold (which did not wait) never ended, so it is not on the
    // trace; the second read's is, whole.
    let leaky = the_track(&m, "leaky");
    let child = m
        .descriptors
        .iter()
        .find(|d| d.parent == Some(leaky))
        .expect("a shared track");
    let ev: Vec<Kind> = m.on_track(child.uuid).iter().map(|e| e.kind).collect();
    assert_eq!(ev, vec![Kind::Begin, Kind::End]);
}

#[test]
fn lock_mark_instruments_an_existing_lock() {
    let _l = lock();
    static MARK: LockMark = LockMark::new("legacy");
    let (m, _) = record(|| {
        let hold = MARK.acquired();
        drop(hold);
        let wait = MARK.wait();
        let hold = wait.acquired_shared();
        hold.release();
        drop(MARK.wait()); // gave up: nothing recorded
    });
    let track = the_track(&m, "legacy");
    assert_eq!(m.slices(track).len(), 1);
    let me = tid();
    let waits: Vec<_> = m
        .slices(m.thread_track(me))
        .into_iter()
        .filter(|s| s.begin.name.as_deref() == Some("wait for legacy"))
        .collect();
    assert_eq!(waits.len(), 1);
    let child = m
        .descriptors
        .iter()
        .find(|d| d.parent == Some(track))
        .unwrap();
    assert_eq!(m.slices(child.uuid).len(), 1);
}

#[test]
fn frames_are_numbered_slices_per_set() {
    let _l = lock();
    let (m, _) = record(|| {
        for _ in 0..4 {
            tachyon::frame_mark!();
            tachyon::frame_mark!("physics");
        }
        for _ in 0..3 {
            let _f = tachyon::frame!("load");
        }
    });
    let main = the_track(&m, "Frame");
    let ev = m.on_track(main);
    let kinds: Vec<Kind> = ev.iter().map(|e| e.kind).collect();
    // Four marks: frames 1-3 complete, frame 4 open at the end of the trace.
    assert_eq!(
        kinds,
        vec![
            Kind::Begin,
            Kind::End,
            Kind::Begin,
            Kind::End,
            Kind::Begin,
            Kind::End,
            Kind::Begin
        ]
    );
    let begins: Vec<&Event> = ev
        .iter()
        .copied()
        .filter(|e| e.kind == Kind::Begin)
        .collect();
    let first = match arg(begins[0], "frame_number") {
        Some(Arg::Uint(n)) => *n,
        a => panic!("{a:?}"),
    };
    for (i, b) in begins.iter().enumerate() {
        let n = first + i as u64;
        assert_eq!(b.name.as_deref(), Some(format!("Frame {n}").as_str()));
        assert_eq!(b.categories, vec!["tachyon.frame".to_string()]);
    }
    assert_eq!(m.on_track(the_track(&m, "physics")).len(), 7);
    let load = m.slices(the_track(&m, "load"));
    assert_eq!(load.len(), 3);
    assert!(load.iter().all(|s| s.end.is_some() && s.depth == 0));
}

#[test]
fn messages_carry_body_level_location_and_color() {
    let _l = lock();
    let mut lines = Vec::new();
    let (m, _) = record(|| {
        for i in 0..2 {
            tachyon::message!("static text");
            lines.push(line!() - 1);
            tachyon::message!(color: 0xff8000, "formatted {i}");
            lines.push(line!() - 1);
        }
        tachyon::message!(level: Level::Error, "disk {}", "full");
        tachyon::trace!("t");
        tachyon::debug!("d");
        tachyon::info!("i");
        tachyon::warn!("w {}", 1);
        tachyon::fatal!("f");
        tachyon::message!(bytes: b"raw \xff!");
        tachyon::message!("braces {{}}");
    });
    let me = m.thread_track(tid());
    let logs: Vec<&Event> = m
        .on_track(me)
        .into_iter()
        .filter(|e| e.log.is_some())
        .collect();
    let got: Vec<(String, i32, Option<String>)> = logs
        .iter()
        .map(|e| {
            let (body, prio, _) = e.log.clone().unwrap();
            (body, prio, e.name.clone())
        })
        .collect();
    let want = [
        ("static text", 4, "info"),
        ("formatted 0", 4, "info"),
        ("static text", 4, "info"),
        ("formatted 1", 4, "info"),
        ("disk full", 6, "error"),
        ("t", 2, "trace"),
        ("d", 3, "debug"),
        ("i", 4, "info"),
        ("w 1", 5, "warn"),
        ("f", 7, "fatal"),
        ("raw \u{fffd}!", 4, "info"),
        ("braces {}", 4, "info"),
    ];
    let want: Vec<(String, i32, Option<String>)> = want
        .iter()
        .map(|(b, p, n)| (b.to_string(), *p, Some(n.to_string())))
        .collect();
    assert_eq!(got, want);
    for (e, line) in logs.iter().zip(&lines) {
        let (_, _, loc) = e.log.clone().unwrap();
        let (file, _, l) = loc.expect("a source location");
        assert!(file.ends_with("instrumentation.rs"));
        assert_eq!(l, *line);
        assert_eq!(e.kind, Kind::Instant);
        assert_eq!(e.categories, vec!["tachyon.log".to_string()]);
    }
    assert_eq!(arg(logs[1], "color"), Some(&Arg::Str("#ff8000".into())));
    assert_eq!(arg(logs[0], "color"), None);
}

#[test]
fn plots_have_kinds_and_incremental_counters() {
    let _l = lock();
    let (m, _) = record(|| {
        let bytes = Plot::new("heap", PlotKind::Bytes);
        bytes.set(4096u64);
        bytes.set(-1i64);
        let pct = Plot::new("hit rate", PlotKind::Percentage);
        pct.set(97.5);
        let n = Plot::new("items", PlotKind::Number);
        n.set(3);
        let d = Plot::incremental("sent", PlotKind::Bytes);
        d.add(1500);
        d.add(500);
    });
    let desc = |name: &str| track_named(&m, name)[0].clone();
    assert_eq!(
        desc("heap").counter,
        Some((Some(3), None)),
        "UNIT_SIZE_BYTES"
    );
    assert!(!desc("heap").incremental);
    assert_eq!(desc("hit rate").counter, Some((None, Some("%".into()))));
    assert_eq!(desc("items").counter, Some((None, None)));
    assert!(desc("sent").incremental);
    let values = |name: &str| -> Vec<CounterValue> {
        m.on_track(the_track(&m, name))
            .iter()
            .filter_map(|e| e.counter)
            .collect()
    };
    assert_eq!(
        values("heap"),
        vec![CounterValue::Int(4096), CounterValue::Int(-1)]
    );
    assert_eq!(values("hit rate"), vec![CounterValue::Double(97.5)]);
    assert_eq!(
        values("sent"),
        vec![CounterValue::Int(1500), CounterValue::Int(500)]
    );
}

#[test]
fn zone_data_app_info_and_thread_hints() {
    let _l = lock();
    tachyon::app_info!("build {}", 42);
    // Before the session: readers take a thread's rank from its track's first descriptor (the
    // hint is set when a thread starts, as Tracy's `SetThreadNameWithHint` is).
    tachyon::set_thread_name_with_hint("render", 3);
    let (m, trace) = record(|| {
        {
            let z = tachyon::zone!("load");
            z.text("level3.map");
            z.text("second line");
            z.value(42);
            z.color(0x20c020);
            z.name("load level3");
            let inner = tachyon::zone!("inner");
            inner.value(1);
        }
        let _plain = tachyon::zone!("plain");
    });
    let me = m.thread_track(tid());
    let slices = m.slices(me);
    let load = slices
        .iter()
        .find(|s| s.begin.name.as_deref() == Some("load"))
        .unwrap();
    let end = load.end.unwrap();
    assert_eq!(
        arg(end, "text"),
        Some(&Arg::Str("level3.map\nsecond line".into()))
    );
    assert_eq!(arg(end, "value"), Some(&Arg::Uint(42)));
    assert_eq!(arg(end, "color"), Some(&Arg::Str("#20c020".into())));
    assert_eq!(arg(end, "name"), Some(&Arg::Str("load level3".into())));
    let inner = slices
        .iter()
        .find(|s| s.begin.name.as_deref() == Some("inner"))
        .unwrap();
    assert_eq!(
        inner.end.unwrap().args,
        vec![("value".to_string(), Arg::Uint(1))]
    );
    assert_eq!(inner.depth, 1);
    let plain = slices
        .iter()
        .find(|s| s.begin.name.as_deref() == Some("plain"))
        .unwrap();
    assert!(plain.end.unwrap().args.is_empty());
    let info: Vec<&Event> = m
        .events
        .iter()
        .filter(|e| e.name.as_deref() == Some("app info"))
        .collect();
    assert_eq!(info.len(), 1, "once per trace");
    assert_eq!(arg(info[0], "info"), Some(&Arg::Str("build 42".into())));
    assert_eq!(info[0].track, m.process_track(std::process::id() as i32));
    let td = m.thread_descriptors(tid());
    let last = td.last().unwrap();
    assert_eq!(last.thread.as_ref().unwrap().2.as_deref(), Some("render"));
    assert_eq!(last.rank, Some(3));
    thread_hint_orders_threads(&trace, tid());
}

/// The group hint orders threads in readers: the root track asks for explicit thread ordering,
/// so trace processors give the thread its `thread_sort_index_hint` (Tachyon's; Perfetto's
/// `trace_processor_shell` too when it is present).
fn thread_hint_orders_threads(trace: &[u8], tid: i64) {
    use tachyon_processor::{Options, TraceProcessor, Value};
    let sql = format!(
        "SELECT extract_arg(arg_set_id, 'thread_sort_index_hint') FROM thread WHERE tid = {tid}"
    );
    let tp = TraceProcessor::from_bytes(trace, &Options::default()).unwrap();
    let ours = tp.query(&sql).unwrap();
    assert_eq!(ours.rows, vec![vec![Value::Integer(3)]]);
    if let Some(theirs) = oracle::perfetto_rows(trace, &sql) {
        assert_eq!(theirs, ["3"]);
    }
}

#[test]
fn bad_names_and_texts_are_recorded_or_cut_never_a_panic() {
    let _l = lock();
    let huge = "x".repeat(200_000);
    let weird = "a\0b\u{1F600}\n\"";
    let (m, _) = record(|| {
        let a = Mutex::with_name(huge.clone(), ());
        drop(a.lock().unwrap());
        let b = Mutex::with_name("", ());
        drop(b.lock().unwrap());
        let c = Mutex::with_name(weird, ());
        drop(c.lock().unwrap());
        tachyon::message!("{}", huge);
        tachyon::message!("{}", "");
        tachyon::message!("{weird}");
        let z = tachyon::zone!("z");
        z.text(&huge);
        z.text_bytes(&[0xff, 0xfe, b'a']);
        z.name("");
        drop(z);
        Plot::new(huge.clone(), PlotKind::Number).set(1);
        tachyon::set_thread_name_with_hint(&huge, -1);
    });
    let lock_names: Vec<&str> = m
        .events
        .iter()
        .filter(|e| e.categories.iter().any(|c| c == "tachyon.lock"))
        .map(|e| e.track)
        .filter_map(|t| m.descriptors_of(t).first().and_then(|d| d.name.as_deref()))
        .collect();
    assert_eq!(lock_names.len(), 3);
    assert!(lock_names[0].len() <= tachyon::sync::MAX_NAME_LEN + 32);
    assert!(lock_names[0].contains("…[cut"));
    assert_eq!(lock_names[1], "");
    assert_eq!(lock_names[2], weird);
    let bodies: Vec<String> = m
        .events
        .iter()
        .filter_map(|e| e.log.clone())
        .map(|l| l.0)
        .collect();
    assert_eq!(bodies.len(), 3);
    assert!(bodies[0].len() < 70_000 && bodies[0].contains("…[cut"));
    assert_eq!(bodies[1], "");
    assert_eq!(bodies[2], weird);
}

// === The trace processor's tables and statistics, against the model's reading ===

/// Nearest-rank percentile, as the processor's statistics.
fn rank(sorted: &[i64], p: f64) -> i64 {
    let n = sorted.len();
    sorted[((p * n as f64).ceil() as usize).clamp(1, n) - 1]
}

#[test]
fn processor_lock_frame_and_message_stats_match_the_trace() {
    use tachyon_processor::{Options, TraceProcessor};
    let _l = lock();
    let queue = Arc::new(Mutex::new_named("stats queue", 0u32));
    let (m, trace) = record(|| {
        // Three rounds of: this thread holds the lock while two waiters block on it.
        for _ in 0..3 {
            let barrier = Arc::new(Barrier::new(3));
            let g = queue.lock().unwrap();
            let waiters: Vec<_> = (0..2)
                .map(|_| {
                    let (q, b) = (Arc::clone(&queue), Arc::clone(&barrier));
                    std::thread::spawn(move || {
                        b.wait();
                        *q.lock().unwrap() += 1;
                    })
                })
                .collect();
            barrier.wait();
            std::thread::sleep(Duration::from_millis(20));
            drop(g);
            for w in waiters {
                w.join().unwrap();
            }
        }
        for i in 0..6u64 {
            tachyon::frame_mark!("stats frames");
            std::thread::sleep(Duration::from_millis(1 + 3 * (i % 2)));
        }
        tachyon::frame_mark!("stats frames");
        tachyon::message!(level: Level::Warn, "careful");
        tachyon::message!(level: Level::Error, "broken {}", 1);
        tachyon::info!("fine");
    });
    // What the model read.
    let track = the_track(&m, "stats queue");
    let holds = m.slices(track);
    let hold_durs: Vec<i64> = holds
        .iter()
        .map(|s| (s.end.unwrap().ts - s.begin.ts) as i64)
        .collect();
    let waits: Vec<(i64, i64)> = m
        .events
        .iter()
        .filter(|e| e.kind == Kind::Begin && e.name.as_deref() == Some("wait for stats queue"))
        .map(|b| {
            let end = m
                .slices(b.track)
                .into_iter()
                .find(|s| s.begin.index == b.index)
                .unwrap()
                .end
                .unwrap();
            (b.seq as i64, (end.ts - b.ts) as i64)
        })
        .collect();
    assert_eq!(holds.len(), 9);

    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
    let locks = tp.lock_stats().unwrap();
    let l = locks
        .iter()
        .find(|l| l.name == "stats queue")
        .expect("the lock");
    assert_eq!(l.acquisitions, 9);
    assert_eq!(l.shared, 0);
    assert_eq!(l.contended, waits.len() as u64);
    assert_eq!(l.total_wait_ns, waits.iter().map(|w| w.1).sum::<i64>());
    assert_eq!(l.max_wait_ns, waits.iter().map(|w| w.1).max().unwrap_or(0));
    assert_eq!(l.total_hold_ns, hold_durs.iter().sum::<i64>());
    assert_eq!(l.max_hold_ns, *hold_durs.iter().max().unwrap());
    let waiter_total: u64 = l.top_waiters.iter().map(|w| w.1).sum();
    assert!(waiter_total <= l.contended && l.top_waiters.len() <= 3);
    // Each round's waiters blocked while this thread slept with the lock: almost surely both.
    assert!(l.contended >= 1, "no contention recorded");

    let frames = tp.frame_stats().unwrap();
    let f = frames
        .iter()
        .find(|f| f.name == "stats frames")
        .expect("the set");
    // Begin, end, begin, ..., begin: the last frame stays open.
    let ev = m.on_track(the_track(&m, "stats frames"));
    let mut durs: Vec<i64> = ev
        .chunks(2)
        .filter(|p| p.len() == 2)
        .map(|p| {
            assert_eq!((p[0].kind, p[1].kind), (Kind::Begin, Kind::End));
            (p[1].ts - p[0].ts) as i64
        })
        .collect();
    durs.sort();
    assert_eq!(f.count, 6);
    assert_eq!(durs.len(), 6);
    assert_eq!(f.median_ns, rank(&durs, 0.5));
    assert_eq!(f.p90_ns, rank(&durs, 0.9));
    assert_eq!(f.max_ns, durs[5]);
    let mean = durs.iter().sum::<i64>() as f64 / 6.0;
    assert!((f.mean_ns - mean).abs() < 1e-6);
    assert_eq!(
        f.over_2x_median,
        durs.iter().filter(|&&d| d > 2 * f.median_ns).count() as u64
    );

    let msgs = tp.message_stats().unwrap();
    assert_eq!(msgs.total, 3);
    assert_eq!(
        msgs.by_priority,
        vec![(6, "error", 1), (5, "warn", 1), (4, "info", 1)]
    );
    assert_eq!(msgs.notable.len(), 2);
    assert_eq!(msgs.notable[0].3, "careful");
    assert_eq!(msgs.notable[1].3, "broken 1");
    // The zone statistics leave lock holds, waits and frames to their own sections.
    let zones = tp.zone_stats().unwrap();
    assert!(
        zones
            .iter()
            .all(|z| !z.name.starts_with("wait for") && !z.name.starts_with("stats frames")),
        "{zones:?}"
    );
}

/// `android_logs`: Tachyon's processor against Perfetto's `trace_processor_shell` (skipped when
/// the tool is absent).
#[test]
fn android_logs_match_perfettos_trace_processor() {
    use tachyon_processor::{Options, TraceProcessor};
    let _l = lock();
    let (_, trace) = record(|| {
        tachyon::message!("plain");
        tachyon::message!(level: Level::Fatal, "with a \"quote\", a comma");
        std::thread::spawn(|| tachyon::debug!("from {}", "a thread"))
            .join()
            .unwrap();
        tachyon::trace!("verbose");
    });
    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
    let sql = "SELECT prio, tag, msg FROM android_logs ORDER BY ts";
    let ours = oracle::our_rows(&tp, sql);
    assert_eq!(ours.len(), 4);
    assert!(ours[1].starts_with("7,"), "{ours:?}");
    if let Some(theirs) = oracle::perfetto_rows(&trace, sql) {
        assert_eq!(ours, theirs);
    }
}

/// The `log` crate's records, through `tachyon::log_bridge`.
#[cfg(feature = "log-bridge")]
#[test]
fn log_records_become_messages() {
    let _l = lock();
    // Another test binary's logger cannot be here: this is the only one of this process.
    tachyon::log_bridge::init().expect("the first logger");
    let mut line = 0;
    let (m, _) = record(|| {
        log::warn!("disk {}% full", 91);
        line = line!() - 1;
        log::trace!("fine-grained");
    });
    let logs: Vec<_> = m.events.iter().filter_map(|e| e.log.clone()).collect();
    assert_eq!(logs.len(), 2);
    assert_eq!((logs[0].0.as_str(), logs[0].1), ("disk 91% full", 5));
    let (file, func, l) = logs[0].2.clone().unwrap();
    assert!(file.ends_with("instrumentation.rs"), "{file}");
    assert_eq!((func.as_str(), l), ("instrumentation", line));
    assert_eq!((logs[1].0.as_str(), logs[1].1), ("fine-grained", 2));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    /// Any text (empty, control characters, NULs, any length up to past the limits) as a lock
    /// name, a message, a zone's text, a plot's name and a thread's name: recorded (cut past the
    /// limits, with the marker), never a panic, and the trace reads clean.
    #[test]
    fn any_text_is_recorded_or_cut(
        text in proptest::prelude::any::<String>(),
        repeat in 1usize..3000,
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
    ) {
        let _l = lock();
        let long = text.repeat(repeat);
        let (m, _) = record(|| {
            let mutex = Mutex::with_name(long.clone(), ());
            drop(mutex.lock().unwrap());
            tachyon::message!("{long}");
            tachyon::message!(bytes: bytes);
            let z = tachyon::zone!("z");
            z.text(&long);
            z.text_bytes(&bytes);
            drop(z);
            Plot::new(long.clone(), PlotKind::Number).set(1);
            tachyon::set_thread_name_with_hint(&long, 0);
        });
        let logs: Vec<String> = m.events.iter().filter_map(|e| e.log.clone()).map(|l| l.0).collect();
        proptest::prop_assert_eq!(logs.len(), 2);
        if long.len() <= tachyon::MAX_MESSAGE_LEN {
            proptest::prop_assert_eq!(&logs[0], &long);
        } else {
            proptest::prop_assert!(logs[0].contains("…[cut"));
            proptest::prop_assert!(logs[0].len() <= tachyon::MAX_MESSAGE_LEN + 32);
        }
        proptest::prop_assert_eq!(&logs[1], &String::from_utf8_lossy(&bytes).into_owned());
    }
}

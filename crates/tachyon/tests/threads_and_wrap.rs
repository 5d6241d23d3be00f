//! Many threads and a small ring buffer.
//!
//! (a) Threads start and end while a session records (waves of threads, the main thread tracing
//! throughout): each thread's events are all in the trace, balanced, on its own track and
//! sequence, and each thread is named on the trace.
//!
//! (b) A 64 KiB ring buffer wrapped many times with a short incremental-state clear period:
//! chunks were overwritten (the trace says so, and the trace processor's `stats` too), every
//! surviving event that Perfetto's rules do not skip resolves its interned names, and events
//! from the end of the run survive readable.
//!
//! The SDK has one session per process: the tests take `LOCK` and run one after the other.

mod model;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::time::Duration;

use model::{Arg, Kind, Model};
use tachyon::{Config, CounterTrack, Unit};
use tachyon_processor::{Options, TraceProcessor, Value};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes the trace to the temporary directory if the test fails after this point, so a rare
/// failure can be examined offline (with `tachyon query`/`stats`, or `MODEL_DUMP=1`).
struct DumpOnFailure<'a> {
    test: &'static str,
    trace: &'a [u8],
}

impl Drop for DumpOnFailure<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let path =
                std::env::temp_dir().join(format!("{}-{}.pftrace", self.test, std::process::id()));
            match std::fs::write(&path, self.trace) {
                Ok(()) => eprintln!("trace written to {}", path.display()),
                Err(e) => eprintln!("could not write {}: {e}", path.display()),
            }
        }
    }
}

const WAVES: usize = 8;
const THREADS: usize = 8;
const ZONES: i64 = 200;
/// Zones of the main thread per wave.
const MAIN_ZONES: u64 = 500;

/// What one thread of a wave records: `ZONES` zones holding a nested zone each, an instant every
/// tenth zone. Thread `t` of a wave names itself with `set_thread_name` when `t` is odd (the
/// others carry their std name).
fn wave_thread(wave: usize, t: usize) {
    if t % 2 == 1 {
        tachyon::set_thread_name(&format!("renamed {wave}.{t}"));
    }
    for k in 0..ZONES {
        let _z = tachyon::zone!("wave", "wave zone", wave = wave, t = t, k = k);
        let _inner = tachyon::zone!("wave inner");
        if k % 10 == 0 {
            tachyon::instant!("wave instant");
        }
    }
}

#[test]
fn threads_come_and_go_while_tracing() {
    let _l = lock();
    tachyon::start(Config::in_memory()).unwrap();
    let mut main_zones = 0u64;
    let mut tids = BTreeMap::new();
    for wave in 0..WAVES {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                std::thread::Builder::new()
                    .name(format!("wave {wave}.{t}"))
                    .spawn(move || {
                        wave_thread(wave, t);
                        model::current_tid().expect("Linux")
                    })
                    .unwrap()
            })
            .collect();
        // The main thread traces while the wave runs.
        for _ in 0..MAIN_ZONES {
            let _z = tachyon::zone!("main zone");
            tachyon::counter!("main counter", main_zones);
            main_zones += 1;
        }
        for (t, h) in handles.into_iter().enumerate() {
            tids.insert((wave, t), h.join().unwrap());
        }
    }
    let report = tachyon::shutdown().unwrap().unwrap();
    let _dump = DumpOnFailure {
        test: "threads_come_and_go_while_tracing",
        trace: &report.trace,
    };
    assert_eq!(report.writers.packets_dropped, 0, "{:?}", report.writers);
    assert_eq!(report.writers_still_active, 0);

    let m = Model::read(&report.trace);
    assert!(m.errors.is_empty(), "{:?}", m.errors);
    assert_eq!(m.skipped, 0);
    assert_eq!(m.loss_marks, 0);
    assert!(m.unresolved().is_empty(), "{:#?}", m.unresolved());

    // Per thread: its track (from its tid), exactly its events in order, its name. Tracks, not
    // sequences: a writer id freed by an exiting thread is handed out again and continues its
    // packet sequence, so one sequence may hold several threads one after the other.
    let arg = |e: &model::Event, k: &str| match e.args.iter().find(|a| a.0 == k) {
        Some((_, Arg::Uint(v))) => *v as i64,
        Some((_, Arg::Int(v))) => *v,
        other => panic!("argument {k}: {other:?} in {e:?}"),
    };
    let mut expected = Vec::new();
    for k in 0..ZONES {
        expected.push(format!("B wave zone {k}"));
        expected.push("B wave inner".to_owned());
        if k % 10 == 0 {
            expected.push("I wave instant".to_owned());
        }
        expected.push("E".to_owned());
        expected.push("E".to_owned());
    }
    let mut tracks = HashSet::new();
    for (&(wave, t), &tid) in &tids {
        let track = m.thread_track(tid);
        assert!(tracks.insert(track), "two threads on one track");
        let events = m.on_track(track);
        let seq = events[0].seq;
        let got: Vec<String> = events
            .iter()
            .map(|e| {
                // One thread writes one sequence (its writer lives as long as it does).
                assert_eq!(e.seq, seq, "thread {wave}.{t} on two sequences");
                match (e.kind, e.name.as_deref()) {
                    (Kind::Begin, Some("wave zone")) => {
                        assert_eq!((arg(e, "wave"), arg(e, "t")), (wave as i64, t as i64));
                        format!("B wave zone {}", arg(e, "k"))
                    }
                    (Kind::Begin, Some(n)) => format!("B {n}"),
                    (Kind::Instant, Some(n)) => format!("I {n}"),
                    (Kind::End, _) => "E".to_owned(),
                    _ => format!("{e:?}"),
                }
            })
            .collect();
        assert_eq!(got, expected, "thread {wave}.{t}");
        assert_eq!(m.slices(track).len(), 2 * ZONES as usize);
        // The thread is named with the name it chose.
        let names: Vec<Option<String>> = m
            .thread_descriptors(tid)
            .iter()
            .map(|d| d.thread.as_ref().unwrap().2.clone())
            .collect();
        let want = if t % 2 == 1 {
            format!("renamed {wave}.{t}")
        } else {
            format!("wave {wave}.{t}")
        };
        assert_eq!(names.last(), Some(&Some(want)), "{names:?}");
        assert!(names.iter().all(Option::is_some), "{names:?}");
    }
    assert_eq!(tids.len(), WAVES * THREADS);
    // The main thread's zones and counter samples, all there, all balanced.
    let main = m.thread_track(model::current_tid().unwrap());
    let events = m.on_track(main);
    assert_eq!(
        events.iter().filter(|e| e.kind == Kind::Begin).count() as u64,
        main_zones
    );
    assert_eq!(m.slices(main).len() as u64, main_zones);
    let counters: Vec<_> = m
        .events
        .iter()
        .filter(|e| e.kind == Kind::Counter)
        .map(|e| e.counter.unwrap())
        .collect();
    assert_eq!(counters.len() as u64, main_zones);
    assert!(counters
        .iter()
        .enumerate()
        .all(|(i, c)| *c == model::CounterValue::Int(i as i64)));

    // The trace processor sees every thread with its name and every slice.
    let tp = TraceProcessor::from_bytes(&report.trace, &Options::default()).unwrap();
    let loss = tp.data_loss().unwrap();
    assert!(loss.is_empty(), "{loss:#?}");
    let q = tp
        .query("SELECT count(*) FROM slice WHERE name = 'wave zone' AND dur >= 0")
        .unwrap();
    assert_eq!(q.rows, [[Value::Integer((WAVES * THREADS) as i64 * ZONES)]]);
    let q = tp
        .query("SELECT count(*) FROM thread WHERE name LIKE 'wave %' OR name LIKE 'renamed %'")
        .unwrap();
    assert_eq!(q.rows, [[Value::Integer((WAVES * THREADS) as i64)]]);
}

/// Events per burst and bursts per thread in the ring-buffer test.
const BURST: u64 = 8;
const BURSTS: u64 = 600;

/// One writer of the ring-buffer test: bursts of zones, instants and counters with a short
/// sleep between them, so that the 20 ms clear period comes round every few dozen kilobytes
/// while the buffer wraps many times over the run. Each event carries its position `i` in the
/// run.
///
/// The writers keep in step (a barrier per burst): the ring keeps the newest 64 KiB of all
/// sequences together, so a writer that ran ahead and stopped would see its last chunks
/// overwritten by the other's, and its final chunk, cut off from the start of its generation,
/// skipped by the reader. That is how ring buffers work, not what this test is about.
fn ring_writer(id: u64, step: &Barrier) {
    let name = format!("ring dynamic {id}");
    for burst in 0..BURSTS {
        for j in 0..BURST {
            let i = burst * BURST + j;
            let _z = tachyon::zone!("ring", "ring zone", i = i, id = id);
            tachyon::instant!("ring instant", i = i);
            tachyon::instant!(name: name.as_str(), i = i);
            tachyon::counter!("ring counter", i);
        }
        step.wait();
        std::thread::sleep(Duration::from_millis(1));
    }
    tachyon::instant!("ring final", i = BURSTS * BURST, id = id);
}

#[test]
fn a_small_ring_buffer_wraps_and_stays_readable() {
    let _l = lock();
    tachyon::start(Config {
        buffer_size: 64 << 10,
        clear_period: Some(Duration::from_millis(20)),
        ..Config::in_memory()
    })
    .unwrap();
    let step = Arc::new(Barrier::new(2));
    let other = {
        let step = step.clone();
        std::thread::Builder::new()
            .name("ring other".into())
            .spawn(move || ring_writer(1, &step))
            .unwrap()
    };
    ring_writer(0, &step);
    other.join().unwrap();
    let report = tachyon::shutdown().unwrap().unwrap();
    let _dump = DumpOnFailure {
        test: "a_small_ring_buffer_wraps_and_stays_readable",
        trace: &report.trace,
    };
    let m = Model::read(&report.trace);
    assert!(m.errors.is_empty(), "{:?}", m.errors);

    // The buffer wrapped: many chunks overwritten, as the trace's own stats say.
    let stats = m.buffer_stats.expect("a TraceStats packet");
    assert!(
        stats.chunks_overwritten > 0 && stats.write_wrap_count > 3,
        "{stats:?}"
    );
    let tp = TraceProcessor::from_bytes(&report.trace, &Options::default()).unwrap();
    let q = tp
        .query("SELECT value FROM stats WHERE name = 'traced_buf_chunks_overwritten'")
        .unwrap();
    assert_eq!(q.rows, [[Value::Integer(stats.chunks_overwritten as i64)]]);

    // Whatever the rules keep resolves completely.
    let unresolved = m.unresolved();
    assert!(
        unresolved.is_empty(),
        "{} of {} events unresolved, e.g. {:#?}",
        unresolved.len(),
        m.events.len(),
        &unresolved[..unresolved.len().min(3)]
    );
    // The reader agrees: the same slices and counter samples survive, none left unnamed.
    let q = tp
        .query("SELECT count(*) FROM slice WHERE name IS NULL OR name = ''")
        .unwrap();
    assert_eq!(q.rows, [[Value::Integer(0)]]);
    let count = |kinds: &[Kind]| m.events.iter().filter(|e| kinds.contains(&e.kind)).count();
    let q = tp.query("SELECT count(*) FROM slice").unwrap();
    assert_eq!(
        q.rows,
        [[Value::Integer(count(&[Kind::Begin, Kind::Instant]) as i64)]]
    );
    let q = tp.query("SELECT count(*) FROM counter").unwrap();
    assert_eq!(q.rows, [[Value::Integer(count(&[Kind::Counter]) as i64)]]);

    // The end of the run survived, readable, on both threads: its last events are there with
    // their names and arguments; early events are gone.
    let total = BURSTS * BURST;
    for id in 0..2u64 {
        let final_event = m.events.iter().find(|e| {
            e.name.as_deref() == Some("ring final")
                && e.args.contains(&("id".to_owned(), Arg::Uint(id)))
        });
        assert!(
            final_event.is_some(),
            "writer {id}'s last event is not readable; per sequence (packets, skipped, clears, \
             loss marks): {:?}; {stats:?}",
            m.per_sequence
        );
        let positions: Vec<u64> = m
            .events
            .iter()
            .filter(|e| e.args.contains(&("id".to_owned(), Arg::Uint(id))))
            .filter_map(|e| match e.args.first() {
                Some((k, Arg::Uint(i))) if k == "i" => Some(*i),
                _ => None,
            })
            .collect();
        assert!(!positions.is_empty());
        let (min, max) = (
            *positions.iter().min().unwrap(),
            *positions.iter().max().unwrap(),
        );
        assert_eq!(max, total, "writer {id}");
        assert!(
            min > 0,
            "writer {id}: the beginning should have been overwritten"
        );
    }
    // Counter tracks were re-described after the clears: every surviving counter sample's
    // track has a descriptor that the rules kept.
    for e in m.events.iter().filter(|e| e.kind == Kind::Counter) {
        assert!(
            !m.descriptors_of(e.track).is_empty(),
            "counter on an undescribed track: {e:?}"
        );
    }
    for e in &m.events {
        assert!(
            !m.descriptors_of(e.track).is_empty(),
            "event on an undescribed track: {e:?}"
        );
    }
}

/// Threads still tracing when the session stops (one with a macro, one with a run-time
/// `CounterTrack` only): everything they wrote before the stop is in the trace, and their
/// writers are released (flushed) without waiting for the threads to end.
#[test]
fn threads_still_tracing_when_the_session_stops() {
    let _l = lock();
    tachyon::start(Config::in_memory()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(3));
    let spawn = |name: &str, record: fn(u64)| {
        let (stop, ready) = (stop.clone(), ready.clone());
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    record(i);
                    if i == 1000 {
                        ready.wait();
                    }
                    i += 1;
                }
            })
            .unwrap()
    };
    let workers = [
        spawn("busy instants", |i| tachyon::instant!("busy", i = i)),
        spawn("busy counter", |i| {
            thread_local! {
                static TRACK: CounterTrack = CounterTrack::new("busy counter", Unit::Count);
            }
            TRACK.with(|t| t.set(i));
        }),
    ];
    // The workers have recorded samples 0..=1000 each and go on while the session stops.
    ready.wait();
    let report = tachyon::shutdown().unwrap().unwrap();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(
        report.writers_still_active, 0,
        "a busy thread's writer was still open when the session stopped"
    );
    let m = Model::read(&report.trace);
    assert!(m.errors.is_empty() && m.unresolved().is_empty() && m.skipped == 0);
    let instants = m
        .events
        .iter()
        .filter(|e| e.name.as_deref() == Some("busy"))
        .map(|e| match e.args[0] {
            (_, Arg::Uint(i)) => i,
            ref other => panic!("{other:?}"),
        });
    let counters = m.events.iter().filter_map(|e| match e.counter {
        Some(model::CounterValue::Int(i)) => Some(i as u64),
        _ => None,
    });
    for (what, values) in [
        ("instants", instants.collect::<Vec<u64>>()),
        ("counter samples", counters.collect()),
    ] {
        // All of 0..=1000, then whatever came before the stop, in order, without a gap.
        assert!(values.len() > 1000, "{} {what}", values.len());
        assert!(
            values.iter().enumerate().all(|(k, &i)| k as u64 == i),
            "{what} missing: {} recorded, the last {}",
            values.len(),
            values.last().unwrap()
        );
    }
}

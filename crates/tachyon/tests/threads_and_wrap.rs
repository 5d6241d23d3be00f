//! Many threads and a small ring buffer.
//!
//! (a) Threads start and end while a session records (waves of threads, the main thread tracing
//! throughout): each thread's events are all in the trace, balanced, on its own sequence, and
//! each thread is named on the trace.
//!
//! (b) A 64 KiB ring buffer wrapped many times with a short incremental-state clear period:
//! chunks were overwritten (the trace says so, and the trace processor's `stats` too), every
//! surviving event that Perfetto's rules do not skip resolves its interned names, and events
//! from the end of the run survive readable.
//!
//! The SDK has one session per process: the tests take `LOCK` and run one after the other.

mod model;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::time::Duration;

use model::{Arg, Kind, Model};
use tachyon::Config;
use tachyon_processor::{Options, TraceProcessor, Value};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
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
    for wave in 0..WAVES {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                std::thread::Builder::new()
                    .name(format!("wave {wave}.{t}"))
                    .spawn(move || wave_thread(wave, t))
                    .unwrap()
            })
            .collect();
        // The main thread traces while the wave runs.
        for _ in 0..MAIN_ZONES {
            let _z = tachyon::zone!("main zone");
            tachyon::counter!("main counter", main_zones);
            main_zones += 1;
        }
        for h in handles {
            h.join().unwrap();
        }
    }
    let report = tachyon::shutdown().unwrap().unwrap();
    assert_eq!(report.writers.packets_dropped, 0, "{:?}", report.writers);
    assert_eq!(report.writers_still_active, 0);

    let m = Model::read(&report.trace);
    if !m.errors.is_empty() {
        for (i, seq, ts, track) in &m.clears {
            eprintln!("CLEAR #{i} seq {seq} ts {ts} track {track:?}");
        }
        for d in &m.descriptors {
            if d.thread.is_some() {
                eprintln!(
                    "THREAD #{} seq {} uuid {} {:?}",
                    d.index, d.seq, d.uuid, d.thread
                );
            }
        }
    }
    assert!(m.errors.is_empty(), "{:?}", m.errors);
    assert_eq!(m.skipped, 0);
    assert_eq!(m.loss_marks, 0);
    assert!(m.unresolved().is_empty(), "{:#?}", m.unresolved());

    // One sequence per thread; identify each wave thread by the arguments of its zones.
    let mut by_seq: BTreeMap<u32, Vec<&model::Event>> = BTreeMap::new();
    for e in &m.events {
        by_seq.entry(e.seq).or_default().push(e);
    }
    let mut seen: HashMap<(i64, i64), u32> = HashMap::new();
    let mut main_seq = None;
    for (&seq, events) in &by_seq {
        let first = events[0];
        if first.name.as_deref() == Some("main zone") {
            assert!(main_seq.replace(seq).is_none(), "two main sequences");
            let zones = events.iter().filter(|e| e.kind == Kind::Begin).count() as u64;
            assert_eq!(zones, main_zones);
            let counters = events.iter().filter(|e| e.kind == Kind::Counter).count() as u64;
            assert_eq!(counters, main_zones);
            assert_eq!(m.slices(first.track).len() as u64, main_zones);
            continue;
        }
        let arg = |e: &model::Event, k: &str| match e.args.iter().find(|a| a.0 == k) {
            Some((_, Arg::Uint(v))) => *v as i64,
            Some((_, Arg::Int(v))) => *v,
            other => panic!("argument {k}: {other:?} in {e:?}"),
        };
        let (wave, t) = (arg(first, "wave"), arg(first, "t"));
        assert!(
            seen.insert((wave, t), seq).is_none(),
            "thread {wave}.{t} on two sequences"
        );
        // Exactly its events, in order, each zone holding its inner zone.
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
        let got: Vec<String> = events
            .iter()
            .map(|e| {
                if e.track != events[0].track {
                    let ds: Vec<_> = m.descriptors.iter().filter(|d| d.seq == seq).collect();
                    let mut tracks: BTreeMap<u64, usize> = BTreeMap::new();
                    for e in events.iter() { *tracks.entry(e.track).or_default() += 1; }
                    panic!("seq {seq}: tracks {tracks:?}, descriptors {ds:#?}, per_seq {:?}, first {:?} this {:?}", m.per_sequence.get(&seq), events[0], e);
                }
                match (e.kind, e.name.as_deref()) {
                    (Kind::Begin, Some("wave zone")) => {
                        assert_eq!((arg(e, "wave"), arg(e, "t")), (wave, t));
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
        let slices = m.slices(first.track);
        assert_eq!(slices.len(), 2 * ZONES as usize);
        // The thread is named on its own sequence, with the name it chose.
        let names: Vec<Option<String>> = m
            .descriptors
            .iter()
            .filter(|d| d.seq == seq && d.uuid == first.track)
            .map(|d| d.thread.as_ref().expect("a thread descriptor").2.clone())
            .collect();
        let want = if t % 2 == 1 {
            format!("renamed {wave}.{t}")
        } else {
            format!("wave {wave}.{t}")
        };
        assert_eq!(names.last(), Some(&Some(want.clone())), "{names:?}");
        assert!(names.iter().all(|n| n.is_some()));
    }
    assert!(main_seq.is_some(), "the main tracer's events");
    assert_eq!(
        seen.len(),
        WAVES * THREADS,
        "every wave thread has its events"
    );

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
    // The reader's tables agree: no name or category left empty where the model resolved one.
    let q = tp
        .query("SELECT count(*) FROM slice WHERE name IS NULL OR name = ''")
        .unwrap();
    assert_eq!(q.rows, [[Value::Integer(0)]]);

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

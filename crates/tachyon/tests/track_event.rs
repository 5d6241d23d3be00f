//! The instrumentation API end to end: every macro and type records exactly the events it
//! promises, and the trace reads back under Perfetto's per-sequence rules (`model`), with every
//! interned name resolved, begins and ends balanced, timestamps on the trace clock and ordered
//! per thread. One trace is also loaded into the trace processor.
//!
//! The SDK has one session per process: the tests of this file take `LOCK` and run one after
//! the other.

mod model;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use model::{Arg, CounterValue, Event, Kind, Model};
use tachyon::{CategoryFilter, Config, CounterTrack, Flow, Track, Unit};
use tachyon_processor::{Options, TraceProcessor, Value};
use tachyon_protos::counter_descriptor;

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A session's trace and what the model read in it.
struct Run {
    trace: Vec<u8>,
    model: Model,
}

/// Runs `f` in a session with `config` and checks what holds for every trace of this file: no
/// loss, nothing skipped or unresolved, clock snapshots that readers accept, timestamps on the
/// trace clock, between the clock's readings around the session, mapped onto BOOTTIME near the
/// kernel's reading, and ordered per thread and sequence.
fn record(config: Config, f: impl FnOnce()) -> Run {
    let before = tachyon::clock::now();
    let boot_before = tachyon::clock::boottime_ns();
    tachyon::start(config).expect("start");
    f();
    let report = tachyon::shutdown()
        .expect("shutdown")
        .expect("a session ran");
    let after = tachyon::clock::now();
    let boot_after = tachyon::clock::boottime_ns();
    assert_eq!(report.writers.packets_dropped, 0, "{:?}", report.writers);
    assert_eq!(report.writers_still_active, 0);
    let model = Model::read(&report.trace);
    assert!(model.errors.is_empty(), "{:?}", model.errors);
    assert_eq!(
        model.skipped, 0,
        "packets skipped for invalid incremental state"
    );
    assert_eq!(model.loss_marks, 0);
    let unresolved = model.unresolved();
    assert!(unresolved.is_empty(), "unresolved: {unresolved:#?}");
    // Every packet of a sequence is in time order (per clock: the global snapshots are on
    // BOOTTIME), the generation starts included, also where a sequence passes from an exiting
    // thread to a new one.
    let mut on_sequence: std::collections::HashMap<(u32, u32), u64> = Default::default();
    for &(seq, ts, clock) in &model.packet_times {
        let prev = on_sequence.insert((seq, clock), ts).unwrap_or(0);
        assert!(
            prev <= ts,
            "time went back on sequence {seq} (clock {clock}): {prev} then {ts}"
        );
    }
    let mut last: std::collections::HashMap<(u32, u64), u64> = Default::default();
    for e in &model.events {
        assert_eq!(e.clock, tachyon::clock::TRACE_CLOCK_ID, "{e:?}");
        assert!(
            (before..=after).contains(&e.ts),
            "ts {} outside the session [{before}, {after}]: {e:?}",
            e.ts
        );
        let prev = last.insert((e.seq, e.track), e.ts).unwrap_or(0);
        assert!(prev <= e.ts, "time went back on sequence {}: {e:?}", e.seq);
        // The trace clock is BOOTTIME calibrated: within a millisecond of it.
        let boot = model
            .to_boottime(e.clock, e.ts)
            .expect("a clock snapshot maps the trace clock onto BOOTTIME");
        assert!(
            boot + 1_000_000 >= boot_before && boot <= boot_after + 1_000_000,
            "boottime {boot} outside [{boot_before}, {boot_after}]"
        );
    }
    Run {
        trace: report.trace,
        model,
    }
}

fn tid() -> i64 {
    model::current_tid().expect("this test reads /proc/thread-self (Linux)")
}

fn pid() -> i32 {
    std::process::id() as i32
}

/// `B cat:name {args}` / `E` / `I name` / `C value`, for comparing event lists.
fn show(e: &Event) -> String {
    let kind = match e.kind {
        Kind::Begin => "B",
        Kind::End => "E",
        Kind::Instant => "I",
        Kind::Counter => "C",
        Kind::Other(_) => "?",
    };
    let mut out = kind.to_string();
    if let Some(n) = &e.name {
        out.push(' ');
        for c in &e.categories {
            out.push_str(c);
            out.push(':');
        }
        out.push_str(n);
    }
    if !e.args.is_empty() {
        let args: Vec<String> = e.args.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
        out.push_str(&format!(" {{{}}}", args.join(", ")));
    }
    if let Some(c) = e.counter {
        out.push_str(&format!(" {c:?}"));
    }
    out
}

fn shown(events: &[&Event]) -> Vec<String> {
    events.iter().map(|e| show(e)).collect()
}

#[test]
fn zones_and_instants_nest_with_names_and_arguments() {
    let _l = lock();
    let mut lines = Vec::new();
    let run = record(Config::in_memory(), || {
        let (outer, line) = (tachyon::zone!("outer"), line!());
        lines.push(line);
        assert!(outer.is_recording());
        {
            let (_inner, line) = (tachyon::zone!("cat.a", "inner"), line!());
            lines.push(line);
            tachyon::instant!("tick");
            let owned = String::from("owned");
            tachyon::instant!(
                "cat.a",
                "tick with args",
                i = -5i32,
                i64min = i64::MIN,
                u = 7u64,
                umax = u64::MAX,
                usz = 3usize,
                f = 2.5f64,
                f32 = 0.5f32,
                yes = true,
                no = false,
                s = "text",
                owned = owned,
                "literal key" = 3,
                c = 'x',
                none = None::<i32>,
                some = Some(4u8),
            );
        }
        let name = format!("dyn {}", 42);
        let _d = tachyon::zone!(name: name.clone(), k = 1);
        let _d2 = tachyon::zone!("cat.b", name: &name);
        let _d3 = tachyon::zone!(name: "other dynamic");
        tachyon::instant!(name: name.as_str(), again = true);
        // The hot path, many times: interned once, then the stack-encoded form.
        for _ in 0..3 {
            let _z = tachyon::zone!("repeated");
            tachyon::instant!("cat.a", "repeated instant");
        }
        drop(outer);
    });
    let m = &run.model;
    let track = m.thread_track(tid());
    let events = m.on_track(track);
    // Everything this thread wrote went to its own sequence.
    assert!(events.iter().all(|e| e.seq == events[0].seq));
    let mut expected: Vec<String> = vec![
        "B outer",
        "B cat.a:inner",
        "I tick",
        "I cat.a:tick with args {i=Int(-5), i64min=Int(-9223372036854775808), u=Uint(7), \
         umax=Uint(18446744073709551615), usz=Uint(3), f=Double(2.5), f32=Double(0.5), \
         yes=Bool(true), no=Bool(false), s=Str(\"text\"), owned=Str(\"owned\"), \
         literal key=Int(3), c=Str(\"x\"), none=Str(\"None\"), some=Uint(4)}",
        "E",
        "B dyn 42 {k=Int(1)}",
        "B cat.b:dyn 42",
        "B other dynamic",
        "I dyn 42 {again=Bool(true)}",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    for _ in 0..3 {
        expected.extend(["B repeated", "I cat.a:repeated instant", "E"].map(String::from));
    }
    // `outer` ends before the three dynamic zones (dropped explicitly), then they end.
    expected.extend(["E", "E", "E", "E"].map(String::from));
    assert_eq!(shown(&events), expected);

    // Source locations: this file, the macro's line, this module.
    let outer = events[0].location.clone().expect("a source location");
    assert!(outer.0.ends_with("track_event.rs"), "{outer:?}");
    assert_eq!(outer.1, "track_event");
    assert_eq!(outer.2, lines[0]);
    assert_eq!(events[1].location.as_ref().unwrap().2, lines[1]);

    // Nesting: `outer` holds everything up to its end; the dynamic zones nest in each other.
    let slices = m.slices(track);
    let depth = |name: &str| {
        slices
            .iter()
            .filter(|s| s.begin.name.as_deref() == Some(name))
            .map(|s| s.depth)
            .collect::<Vec<_>>()
    };
    assert_eq!(depth("outer"), [0]);
    assert_eq!(depth("inner"), [1]);
    assert_eq!(depth("repeated"), [4, 4, 4]);
    assert_eq!(depth("dyn 42"), [1, 2]);
    assert_eq!(depth("other dynamic"), [3]);
    for s in &slices {
        assert!(s.end.unwrap().ts >= s.begin.ts);
    }
}

#[test]
fn counters_carry_values_and_units() {
    let _l = lock();
    let run = record(Config::in_memory(), || {
        for i in 0..3i64 {
            tachyon::counter!("ints", i - 1);
            tachyon::counter!("floats", i as f64 * 0.25);
            tachyon::counter!("bytes", 4096u64 << i, Unit::Bytes);
            tachyon::counter!("count", 3u32, Unit::Count);
            tachyon::counter!("time", 100i64, Unit::TimeNs);
            tachyon::counter!("rate", 2.5f32, Unit::Named("jobs/s"));
        }
        tachyon::counter!("saturated", u64::MAX);
        let dynamic = CounterTrack::new(format!("dynamic {}", 1), Unit::Bytes);
        dynamic.set(7);
        dynamic.set(-3i64);
        dynamic.set(1.5);
        // The same name as `counter!`: the same track.
        CounterTrack::new("ints", Unit::None).set(100);
    });
    let m = &run.model;
    let process = m.process_track(pid());
    let values = |name: &str| -> Vec<CounterValue> {
        let tracks: Vec<u64> = m
            .descriptors
            .iter()
            .filter(|d| d.name.as_deref() == Some(name))
            .map(|d| d.uuid)
            .collect();
        assert!(!tracks.is_empty(), "no track named {name:?}");
        assert!(
            tracks.iter().all(|&t| t == tracks[0]),
            "{name:?}: several uuids"
        );
        for d in m.descriptors_of(tracks[0]) {
            assert_eq!(
                d.parent,
                Some(process),
                "{name:?} is a process counter track"
            );
            assert!(d.counter.is_some(), "{name:?} has a counter descriptor");
        }
        m.on_track(tracks[0])
            .iter()
            .map(|e| {
                assert_eq!(e.kind, Kind::Counter);
                e.counter.expect("a counter value")
            })
            .collect()
    };
    use CounterValue::{Double, Int};
    assert_eq!(values("ints"), [Int(-1), Int(0), Int(1), Int(100)]);
    assert_eq!(values("floats"), [Double(0.0), Double(0.25), Double(0.5)]);
    assert_eq!(values("bytes"), [Int(4096), Int(8192), Int(16384)]);
    assert_eq!(values("count"), [Int(3); 3]);
    assert_eq!(values("time"), [Int(100); 3]);
    assert_eq!(values("rate"), [Double(2.5); 3]);
    assert_eq!(values("saturated"), [Int(i64::MAX)]);
    assert_eq!(values("dynamic 1"), [Int(7), Int(-3), Double(1.5)]);

    let unit = |name: &str| {
        let d = m
            .descriptors
            .iter()
            .find(|d| d.name.as_deref() == Some(name))
            .unwrap();
        d.counter.clone().unwrap()
    };
    let u = |x: counter_descriptor::Unit| Some(x as i32);
    assert_eq!(unit("ints"), (None, None));
    assert_eq!(
        unit("bytes"),
        (u(counter_descriptor::Unit::SizeBytes), None)
    );
    assert_eq!(unit("count"), (u(counter_descriptor::Unit::Count), None));
    assert_eq!(unit("time"), (u(counter_descriptor::Unit::TimeNs), None));
    assert_eq!(unit("rate"), (None, Some("jobs/s".to_owned())));
    assert_eq!(
        unit("dynamic 1"),
        (u(counter_descriptor::Unit::SizeBytes), None)
    );
}

#[test]
fn flows_link_events_across_threads() {
    let _l = lock();
    let (mut sender, mut receiver) = (0, 0);
    let (mut f1, mut f2) = (Flow::from_id(0), Flow::from_id(0));
    let run = record(Config::in_memory(), || {
        sender = tid();
        let flow = Flow::new();
        let through = Flow::from_id(0x5eed);
        assert_ne!(flow.id(), Flow::new().id(), "flows are unique");
        tachyon::instant!("send", flow: flow, n = 1);
        {
            let _z = tachyon::zone!("relay", flow: through);
        }
        receiver = std::thread::spawn(move || {
            let _z = tachyon::zone!("receive", terminating_flow: flow);
            tachyon::instant!("relay end", terminating_flow: through, flow: flow);
            tid()
        })
        .join()
        .unwrap();
        (f1, f2) = (flow, through);
    });
    let m = &run.model;
    let with_flow = |id: u64, terminating: bool| -> Vec<(String, u64)> {
        m.events
            .iter()
            .filter(|e| {
                let ids = if terminating {
                    &e.terminating_flow_ids
                } else {
                    &e.flow_ids
                };
                ids.contains(&id)
            })
            .map(|e| (e.name.clone().unwrap_or_default(), e.track))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let (ts, tr) = (m.thread_track(sender), m.thread_track(receiver));
    assert_ne!(ts, tr);
    assert_eq!(
        with_flow(f1.id(), false),
        [("relay end".into(), tr), ("send".into(), ts)]
    );
    assert_eq!(with_flow(f1.id(), true), [("receive".to_owned(), tr)]);
    assert_eq!(with_flow(f2.id(), false), [("relay".to_owned(), ts)]);
    assert_eq!(with_flow(f2.id(), true), [("relay end".to_owned(), tr)]);
    // Flows travel with the event, not as separate packets; the send keeps its argument.
    let send = m
        .events
        .iter()
        .find(|e| e.name.as_deref() == Some("send"))
        .unwrap();
    assert_eq!(send.args, [("n".to_owned(), Arg::Int(1))]);
    assert_eq!(send.flow_ids.len(), 1);
}

#[test]
fn tracks_named_and_async() {
    let _l = lock();
    let (mut main, mut other) = (0, 0);
    let mut uuids = (0, 0, 0);
    let run = record(Config::in_memory(), || {
        main = tid();
        let queue = Track::named("io queue");
        assert_eq!(
            Track::named("io queue").uuid(),
            queue.uuid(),
            "same name, same track"
        );
        assert_eq!(queue.name(), "io queue");
        tachyon::instant_on!(&queue, "enqueued", n = 1);
        {
            let _s = tachyon::begin!(&queue, "cat.q", "drain");
            tachyon::instant_on!(&Track::named("io queue"), "inside");
        }
        let a = Track::new_async("request");
        let b = Track::new_async("request");
        assert_ne!(a.uuid(), b.uuid(), "every async track is new");
        let sa = tachyon::begin!(&a, "handle", id = 17);
        let sb = tachyon::begin!(&b, name: format!("handle {}", 18));
        let name = "nested".to_owned();
        let inner = tachyon::begin!(&a, name: name);
        let b2 = b.clone();
        other = std::thread::spawn(move || {
            inner.end();
            drop(sa);
            tachyon::instant_on!(&b2, "progress");
            tid()
        })
        .join()
        .unwrap();
        sb.end();
        uuids = (queue.uuid(), a.uuid(), b.uuid());
    });
    let m = &run.model;
    let process = m.process_track(pid());
    let (queue, a, b) = uuids;
    for (uuid, name) in [(queue, "io queue"), (a, "request"), (b, "request")] {
        let ds = m.descriptors_of(uuid);
        assert!(!ds.is_empty(), "no descriptor for {name}");
        for d in ds {
            assert_eq!(d.name.as_deref(), Some(name));
            assert_eq!(d.parent, Some(process));
            assert!(d.thread.is_none() && d.process.is_none() && d.counter.is_none());
        }
    }
    assert_eq!(
        shown(&m.on_track(queue)),
        ["I enqueued {n=Int(1)}", "B cat.q:drain", "I inside", "E"]
    );
    assert_eq!(
        shown(&m.on_track(a)),
        ["B handle {id=Int(17)}", "B nested", "E", "E"]
    );
    assert_eq!(shown(&m.on_track(b)), ["B handle 18", "I progress", "E"]);
    // The ends on `a` were written by the other thread, on its own sequence.
    let to = m.thread_track(other);
    assert_ne!(m.thread_track(main), to);
    let a_events = m.on_track(a);
    let main_seq = a_events[0].seq;
    assert_eq!(a_events[1].seq, main_seq);
    assert!(a_events[2..].iter().all(|e| e.seq != main_seq));
    assert_eq!(m.on_track(b)[1].seq, a_events[2].seq);
    assert_eq!(m.on_track(b)[2].seq, main_seq);
    // The other thread emitted no events on its own track.
    assert!(m.on_track(to).is_empty());
    let slices = m.slices(a);
    assert_eq!(slices[0].depth, 0);
    assert_eq!(slices[1].depth, 1);
}

#[test]
fn process_and_thread_names() {
    let _l = lock();
    let mut tids = Vec::new();
    let run = record(Config::in_memory(), || {
        tachyon::instant!("before naming");
        tachyon::set_process_name("tachyon test process");
        tachyon::instant!("after naming");
        let named = std::thread::Builder::new()
            .name("std name".into())
            .spawn(|| {
                tachyon::instant!("first");
                tachyon::set_thread_name("renamed");
                tachyon::instant!("second");
                tid()
            })
            .unwrap();
        let early = std::thread::spawn(|| {
            tachyon::set_thread_name("named before tracing");
            tachyon::instant!("only");
            tid()
        });
        let unnamed = std::thread::spawn(|| {
            tachyon::instant!("anonymous");
            tid()
        });
        tids = [named, early, unnamed].map(|h| h.join().unwrap()).to_vec();
    });
    let m = &run.model;
    let names = |tid: i64| -> Vec<Option<String>> {
        m.thread_descriptors(tid)
            .iter()
            .map(|d| {
                let t = d.thread.clone().unwrap();
                assert_eq!(t.0, pid());
                t.2
            })
            .collect()
    };
    let n = names(tids[0]);
    assert_eq!(n.first(), Some(&Some("std name".to_owned())), "{n:?}");
    assert_eq!(n.last(), Some(&Some("renamed".to_owned())), "{n:?}");
    // The rename takes effect on the trace before the event that follows it.
    let renamed_at = m
        .thread_descriptors(tids[0])
        .iter()
        .find(|d| d.thread.as_ref().unwrap().2.as_deref() == Some("renamed"))
        .unwrap()
        .index;
    let second = m
        .events
        .iter()
        .find(|e| e.name.as_deref() == Some("second"))
        .unwrap();
    assert!(renamed_at < second.index);
    assert!(names(tids[1])
        .iter()
        .all(|n| n.as_deref() == Some("named before tracing")));
    assert!(names(tids[2]).iter().all(Option::is_none));
    // The main test thread carries its std name (the test's name).
    let me = names(tid());
    assert_eq!(
        me.first().cloned().flatten().as_deref(),
        std::thread::current().name()
    );

    // Every sequence describes the process; after the rename, with the new name.
    let procs = m.process_descriptors();
    let uuid = procs[0].uuid;
    assert!(procs
        .iter()
        .all(|d| d.uuid == uuid && d.process.as_ref().unwrap().0 == pid()));
    let after = m
        .events
        .iter()
        .find(|e| e.name.as_deref() == Some("after naming"))
        .unwrap();
    let last_before_after = procs
        .iter()
        .rfind(|d| d.seq == after.seq && d.index < after.index)
        .unwrap();
    assert_eq!(
        last_before_after.process.as_ref().unwrap().1.as_deref(),
        Some("tachyon test process")
    );
    for d in procs.iter().filter(|d| d.index > after.index) {
        assert_eq!(
            d.process.as_ref().unwrap().1.as_deref(),
            Some("tachyon test process")
        );
    }
    let tp = TraceProcessor::from_bytes(&run.trace, &Options::default()).unwrap();
    let q = tp
        .query(&format!("SELECT name FROM process WHERE pid = {}", pid()))
        .unwrap();
    assert_eq!(q.rows, [[Value::Text("tachyon test process".into())]]);
    let q = tp
        .query(&format!("SELECT name FROM thread WHERE tid = {}", tids[0]))
        .unwrap();
    assert_eq!(q.rows, [[Value::Text("renamed".into())]]);
}

static EVALUATED: AtomicU64 = AtomicU64::new(0);

fn side_effect() -> u64 {
    EVALUATED.fetch_add(1, Ordering::Relaxed) + 1
}

/// The callsites of the category tests, the same in both sessions.
fn categorized_events(track: &Track) {
    let _a = tachyon::zone!("a.one", "a zone", x = side_effect());
    tachyon::instant!("abc", "a instant");
    let _b = tachyon::zone!("b", "b zone", x = side_effect());
    let _bs = tachyon::zone!("b", "b static");
    tachyon::instant!("b.a", "b instant", x = side_effect());
    tachyon::instant!("uncategorized", y = side_effect());
    tachyon::instant!(name: format!("dynamic {}", side_effect()));
    let _t = tachyon::begin!(track, "b", "b on track", x = side_effect());
    tachyon::instant_on!(track, "b", "b instant on track", x = side_effect());
    tachyon::instant_on!(track, "a", "a instant on track");
    tachyon::counter!("uncategorized counter", side_effect());
}

#[test]
fn categories_filter_events_and_skip_their_arguments() {
    let _l = lock();
    let track = Track::named("category track");
    // Only `a*`: everything else, the uncategorized events included, is off.
    EVALUATED.store(0, Ordering::Relaxed);
    let run = record(
        Config {
            categories: CategoryFilter::new(&["a*"], &["*"]),
            ..Config::in_memory()
        },
        || categorized_events(&track),
    );
    assert_eq!(
        EVALUATED.load(Ordering::Relaxed),
        1,
        "only the enabled zone's argument is evaluated"
    );
    let names: Vec<String> = run.model.events.iter().map(show).collect();
    assert_eq!(
        names,
        [
            "B a.one:a zone {x=Uint(1)}",
            "I abc:a instant",
            "I a:a instant on track",
            "E"
        ]
    );

    // `b` off: the uncategorized events and counters come back, the same callsites re-evaluated.
    EVALUATED.store(0, Ordering::Relaxed);
    let run = record(
        Config {
            categories: CategoryFilter::new(&[], &["b*"]),
            ..Config::in_memory()
        },
        || categorized_events(&track),
    );
    assert_eq!(EVALUATED.load(Ordering::Relaxed), 4);
    let names: Vec<String> = run.model.events.iter().map(show).collect();
    assert_eq!(
        names,
        [
            "B a.one:a zone {x=Uint(1)}",
            "I abc:a instant",
            "I uncategorized {y=Uint(2)}",
            "I dynamic 3",
            "I a:a instant on track",
            "C Int(4)",
            "E"
        ]
    );

    // No session: nothing is evaluated, guards are inert.
    EVALUATED.store(0, Ordering::Relaxed);
    categorized_events(&track);
    let z = tachyon::zone!("a.one", "no session", x = side_effect());
    assert!(!z.is_recording());
    assert_eq!(EVALUATED.load(Ordering::Relaxed), 0);
}

#[test]
fn timestamps_without_the_incremental_clock() {
    let _l = lock();
    let run = record(
        Config {
            incremental_timestamps: false,
            ..Config::in_memory()
        },
        || {
            for i in 0..10 {
                let _z = tachyon::zone!("absolute");
                tachyon::instant!("absolute instant", i = i);
                tachyon::counter!("absolute counter", i);
            }
        },
    );
    let m = &run.model;
    let track = m.thread_track(tid());
    let slices = m.slices(track);
    assert_eq!(slices.len(), 10);
    assert_eq!(m.on_track(track).len(), 30);
    assert_eq!(
        m.events.iter().filter(|e| e.kind == Kind::Counter).count(),
        10
    );
}

#[test]
fn sessions_one_after_the_other() {
    let _l = lock();
    fn events(tag: i32) -> tachyon::ZoneGuard {
        let z = tachyon::zone!("across sessions");
        tachyon::instant!("args across sessions", tag = tag);
        tachyon::counter!("counter across sessions", tag);
        z
    }
    // A zone begun in the first session and ended in the second ends nothing there.
    let mut leftover = None;
    let first = record(Config::in_memory(), || {
        let _z = events(1);
        leftover = Some(tachyon::zone!("left open"));
    });
    let second = record(Config::in_memory(), || {
        drop(leftover.take());
        let _z = events(2);
    });
    for (run, tag) in [(&first, 1), (&second, 2)] {
        let m = &run.model;
        let track = m.thread_track(tid());
        let shown = shown(&m.on_track(track));
        let mut expected = vec![
            "B across sessions".to_owned(),
            format!("I args across sessions {{tag=Int({tag})}}"),
        ];
        if tag == 1 {
            expected.push("B left open".into());
        }
        expected.push("E".into());
        assert_eq!(shown, expected);
        let counters: Vec<_> = m.events.iter().filter_map(|e| e.counter).collect();
        assert_eq!(counters, [CounterValue::Int(tag as i64)]);
    }
}

/// One trace with everything, read by the trace processor: the tables hold what the model
/// holds, and `stats` reports no loss and no error.
#[test]
fn the_trace_processor_reads_the_same_events() {
    let _l = lock();
    let mut worker_tid = 0;
    let run = record(Config::in_memory(), || {
        tachyon::set_thread_name("tp main");
        let flow = Flow::new();
        let track = Track::new_async("tp async");
        {
            let _z = tachyon::zone!("tp", "tp outer", n = 5, s = "str");
            let _i = tachyon::zone!("tp inner", flow: flow);
            tachyon::instant!("tp instant", b = true, f = 0.5);
            for i in 0..5 {
                tachyon::counter!("tp counter", i * 10, Unit::Count);
                tachyon::counter!("tp double", i as f64 / 4.0);
            }
        }
        let slice = tachyon::begin!(&track, "tp async slice");
        worker_tid = std::thread::Builder::new()
            .name("tp worker".into())
            .spawn(move || {
                let _z = tachyon::zone!("tp worker zone", terminating_flow: flow);
                slice.end();
                tid()
            })
            .unwrap()
            .join()
            .unwrap();
    });
    let tp = TraceProcessor::from_bytes(&run.trace, &Options::default()).unwrap();
    let rows = |sql: &str| tp.query(sql).unwrap().rows;
    let loss = tp.data_loss().unwrap();
    assert!(loss.is_empty(), "data loss or errors: {loss:#?}");
    let bad = rows(
        "SELECT name, value FROM stats WHERE severity IN ('error', 'data_loss') AND value != 0",
    );
    assert!(bad.is_empty(), "{bad:?}");

    let t = |s: &str| Value::Text(s.into());
    let i = Value::Integer;
    assert_eq!(
        rows("SELECT name, depth, dur >= 0, category FROM slice ORDER BY ts"),
        [
            vec![t("tp outer"), i(0), i(1), t("tp")],
            vec![t("tp inner"), i(1), i(1), Value::Null],
            vec![t("tp instant"), i(2), i(1), Value::Null],
            vec![t("tp async slice"), i(0), i(1), Value::Null],
            vec![t("tp worker zone"), i(0), i(1), Value::Null],
        ]
    );
    assert_eq!(
        rows("SELECT name FROM slice WHERE dur = 0"),
        [[t("tp instant")]]
    );
    assert_eq!(
        rows(
            "SELECT s.name, a.key, a.display_value FROM slice s JOIN args a USING (arg_set_id) \
             WHERE a.key LIKE 'debug.%' ORDER BY s.ts, a.key"
        ),
        [
            vec![t("tp outer"), t("debug.n"), t("5")],
            vec![t("tp outer"), t("debug.s"), t("str")],
            vec![t("tp instant"), t("debug.b"), t("true")],
            vec![t("tp instant"), t("debug.f"), t("0.5")],
        ]
    );
    assert_eq!(
        rows(
            "SELECT t.name, c.value FROM counter c JOIN counter_track t ON c.track_id = t.id \
             ORDER BY t.name, c.ts"
        ),
        (0..5)
            .map(|k| vec![t("tp counter"), Value::Real(k as f64 * 10.0)])
            .chain((0..5).map(|k| vec![t("tp double"), Value::Real(k as f64 / 4.0)]))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        rows(
            "SELECT o.name, i.name FROM flow f JOIN slice o ON f.slice_out = o.id \
             JOIN slice i ON f.slice_in = i.id"
        ),
        [[t("tp inner"), t("tp worker zone")]]
    );
    assert_eq!(
        rows(&format!(
            "SELECT name FROM thread WHERE tid IN ({}, {}) ORDER BY name",
            tid(),
            worker_tid
        )),
        [[t("tp main")], [t("tp worker")]]
    );
    // The async slice is on a process track, not on either thread's.
    assert_eq!(
        rows(
            "SELECT t.name, p.pid FROM slice s JOIN process_track t ON s.track_id = t.id \
             JOIN process p USING (upid) WHERE s.name = 'tp async slice'"
        ),
        [[t("tp async"), i(pid() as i64)]]
    );
    // The processor saw the same events as the model.
    let model_slices = run
        .model
        .events
        .iter()
        .filter(|e| matches!(e.kind, Kind::Begin | Kind::Instant))
        .count();
    assert_eq!(
        rows("SELECT count(*) FROM slice"),
        [[i(model_slices as i64)]]
    );
}

/// Over a long run the calibrated trace clock drifts from BOOTTIME by a few parts per million:
/// each sequence writes a fresh snapshot of the clocks every second so readers can follow it,
/// with incremental timestamps or without. (The sleep makes the run last over a second; nothing
/// is asserted about how long anything took.)
#[test]
fn clock_snapshots_are_refreshed_during_a_long_run() {
    let _l = lock();
    for incremental in [true, false] {
        let run = record(
            Config {
                incremental_timestamps: incremental,
                ..Config::in_memory()
            },
            || {
                tachyon::instant!("before the pause");
                std::thread::sleep(std::time::Duration::from_millis(1100));
                let _z = tachyon::zone!("after the pause");
                tachyon::counter!("after the pause", 1);
            },
        );
        let m = &run.model;
        let seq = m.on_track(m.thread_track(tid()))[0].seq;
        let on_seq = m.snapshot_sequences.iter().filter(|&&s| s == seq).count();
        assert!(
            on_seq >= 2,
            "incremental {incremental}: {on_seq} clock snapshot(s) on the sequence over 1.1 s"
        );
        assert_eq!(
            shown(&m.on_track(m.thread_track(tid()))),
            ["I before the pause", "B after the pause", "E"]
        );
        let tp = TraceProcessor::from_bytes(&run.trace, &Options::default()).unwrap();
        let loss = tp.data_loss().unwrap();
        assert!(loss.is_empty(), "{loss:#?}");
    }
}

/// Arguments and names far larger than a chunk: the packet continues over several chunks (its
/// sizes patched) and reads back whole.
#[test]
fn payloads_larger_than_a_chunk() {
    let _l = lock();
    let big: String = (0..10_000)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let name: String = "n".repeat(5000);
    let run = record(Config::in_memory(), || {
        for i in 0..3 {
            let _z = tachyon::zone!("big", s = big.as_str(), i = i);
            tachyon::instant!(name: name.as_str(), i = i);
        }
    });
    let m = &run.model;
    let events = m.on_track(m.thread_track(tid()));
    assert_eq!(events.len(), 9);
    for (i, chunk) in events.chunks(3).enumerate() {
        assert_eq!(chunk[0].name.as_deref(), Some("big"));
        assert_eq!(
            chunk[0].args,
            [
                ("s".to_owned(), Arg::Str(big.clone())),
                ("i".to_owned(), Arg::Int(i as i64))
            ]
        );
        assert_eq!(chunk[1].name.as_deref(), Some(name.as_str()));
        assert_eq!(chunk[2].kind, Kind::End);
    }
}

/// An argument whose evaluation traces: the nested events are not recorded (the thread's state
/// is busy with the outer event), the outer one is, and nothing panics or unbalances.
#[test]
fn events_inside_argument_expressions_are_dropped() {
    let _l = lock();
    let run = record(Config::in_memory(), || {
        tachyon::instant!(
            "outer",
            v = {
                tachyon::instant!("nested instant");
                tachyon::counter!("nested counter", 1);
                let z = tachyon::zone!("nested zone");
                assert!(!z.is_recording());
                7
            }
        );
        let _z = tachyon::zone!("after", ok = true);
    });
    let m = &run.model;
    assert_eq!(
        shown(&m.on_track(m.thread_track(tid()))),
        ["I outer {v=Int(7)}", "B after {ok=Bool(true)}", "E"]
    );
    assert!(m.events.iter().all(|e| e.kind != Kind::Counter));
}

/// Zones and instants without arguments are queued on their thread and encoded later
/// (`queue.rs`), events with arguments are written at once: on the thread's track they come out
/// in the order they happened.
#[test]
fn queued_and_direct_events_keep_their_order() {
    let _l = lock();
    let run = record(Config::in_memory(), || {
        for i in 0..3 {
            let _a = tachyon::zone!("a");
            tachyon::instant!("i");
            {
                let _b = tachyon::zone!("b", n = i);
                tachyon::instant!("j");
            }
            tachyon::instant!("k", n = i);
        }
    });
    let m = &run.model;
    let expected: Vec<String> = (0..3)
        .flat_map(|i| {
            [
                "B a".to_owned(),
                "I i".to_owned(),
                format!("B b {{n=Int({i})}}"),
                "I j".to_owned(),
                "E".to_owned(),
                format!("I k {{n=Int({i})}}"),
                "E".to_owned(),
            ]
        })
        .collect();
    assert_eq!(shown(&m.on_track(m.thread_track(tid()))), expected);
}

/// A thread that queued events and then sleeps through the end of the session: its events are
/// in the trace, and the stop did not wait for its writer (`record` checks that no writer was
/// left active).
#[test]
fn a_sleeping_threads_queued_events_reach_the_trace() {
    let _l = lock();
    let (wake, sleep) = std::sync::mpsc::channel::<()>();
    let (send_tid, sleeper_tid) = std::sync::mpsc::channel();
    let (mut sleeper, mut sleeper_tid_value) = (None, 0);
    let run = record(Config::in_memory(), || {
        sleeper = Some(std::thread::spawn(move || {
            for _ in 0..1000 {
                let _z = tachyon::zone!("queued");
                tachyon::instant!("queued instant");
            }
            send_tid.send(tid()).unwrap();
            let _ = sleep.recv();
        }));
        sleeper_tid_value = sleeper_tid.recv().unwrap();
    });
    wake.send(()).unwrap();
    sleeper.unwrap().join().unwrap();
    let m = &run.model;
    let events = shown(&m.on_track(m.thread_track(sleeper_tid_value)));
    let count = |s: &str| events.iter().filter(|e| *e == s).count();
    assert_eq!(
        (count("B queued"), count("I queued instant"), count("E")),
        (1000, 1000, 1000)
    );
    assert_eq!(events.len(), 3000);
}

/// A thread blocked inside an event's argument expression holds its state: the stop neither
/// waits for it forever (the argument here waits for the stop itself) nor loses what other
/// threads queued.
#[test]
fn a_stop_does_not_wait_for_a_thread_blocked_in_an_argument() {
    let _l = lock();
    let (unblock, blocked) = std::sync::mpsc::channel::<u64>();
    let (entered, wait_entered) = std::sync::mpsc::channel::<()>();
    tachyon::start(Config {
        stop_timeout: std::time::Duration::from_millis(100),
        ..Config::in_memory()
    })
    .expect("start");
    let thread = std::thread::spawn(move || {
        tachyon::instant!(
            "blocked",
            v = {
                entered.send(()).unwrap();
                blocked.recv().unwrap()
            }
        );
    });
    wait_entered.recv().unwrap();
    for _ in 0..100 {
        let _z = tachyon::zone!("queued meanwhile");
    }
    let report = tachyon::shutdown()
        .expect("shutdown")
        .expect("a session ran");
    unblock.send(7).unwrap();
    thread.join().unwrap();
    let model = Model::read(&report.trace);
    let queued = model
        .events
        .iter()
        .filter(|e| e.name.as_deref() == Some("queued meanwhile"))
        .count();
    assert_eq!(queued, 100);
}

/// Ten copies of its tokens.
macro_rules! x10 {
    ($($t:tt)*) => { $($t)* $($t)* $($t)* $($t)* $($t)* $($t)* $($t)* $($t)* $($t)* $($t)* };
}

/// 1100 callsites (1000 and 100): interning ids past the first thousand (the per-thread table grows), ids of
/// two varint bytes, every one interned once and then written from its template.
#[test]
fn more_than_a_thousand_callsites() {
    let _l = lock();
    let run = record(Config::in_memory(), || {
        for _ in 0..2 {
            x10!(x10!(x10!(tachyon::instant!("many callsites"););););
            x10!(x10!(tachyon::instant!("cat", "many categorized callsites");););
        }
    });
    let m = &run.model;
    let events = m.on_track(m.thread_track(tid()));
    assert_eq!(events.len(), 2 * 1100);
    let lines: std::collections::BTreeSet<_> =
        events.iter().map(|e| e.location.clone().unwrap()).collect();
    // All from two lines of this file.
    assert_eq!(lines.len(), 2, "{lines:?}");
    for e in &events[..1000] {
        assert_eq!(show(e), "I many callsites");
    }
    for e in &events[1000..1100] {
        assert_eq!(show(e), "I cat:many categorized callsites");
    }
}

/// A session writing its trace to a file, at stop or streamed while tracing: the report names
/// the file and its size, and the file holds the events.
#[test]
fn traces_written_to_a_file() {
    let _l = lock();
    for stream in [false, true] {
        let path = std::env::temp_dir().join(format!(
            "tachyon-track-event-{}-{stream}.pftrace",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        tachyon::start(Config {
            output: Some(path.clone()),
            stream,
            flush_period: stream.then_some(std::time::Duration::from_millis(5)),
            ..Config::default()
        })
        .unwrap();
        for i in 0..100 {
            let _z = tachyon::zone!("to file", i = i);
        }
        let report = tachyon::shutdown().unwrap().unwrap();
        assert_eq!(report.path.as_deref(), Some(path.as_path()));
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(report.bytes, bytes.len() as u64, "stream {stream}");
        let m = Model::read(&bytes);
        assert!(m.errors.is_empty() && m.unresolved().is_empty());
        let events = m.on_track(m.thread_track(tid()));
        assert_eq!(events.len(), 200, "stream {stream}");
        assert_eq!(m.slices(m.thread_track(tid())).len(), 100);
    }
}

/// A flood of zones, queued faster than they are encoded, goes through the drainer's run path
/// (a run of queued begins and ends encoded per chunk, each timestamp converted with the clock's
/// line for the run): every event comes back, in order, each begin at a time between the clock
/// readings taken just before and after its zone opened, with gaps between the zones that give
/// the timestamp's delta one, two and three varint bytes, and some past the three bytes (a
/// packet the run cannot take, so the run ends and starts again after it).
#[test]
fn a_flood_of_zones_comes_back_whole_with_every_delta_width() {
    let _l = lock();
    const ZONES: usize = 40_000;
    let spin = |ns: u64| {
        let t = tachyon::clock::now();
        while tachyon::clock::now() < t + ns {
            std::hint::spin_loop();
        }
    };
    let mut brackets = Vec::with_capacity(ZONES);
    let run = record(Config::in_memory(), || {
        for i in 0..ZONES {
            match i % 8 {
                // Deltas of 128 ns to 16 µs: two varint bytes.
                5 => spin(300),
                // 16 µs to 2 ms: three.
                7 if i % 64 == 7 => spin(20_000),
                _ => {}
            }
            if i % 10_000 == 9_999 {
                // Past the fast path's three bytes (2.1 ms).
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
            let before = tachyon::clock::now();
            let z = tachyon::zone!("flood");
            brackets.push((before, tachyon::clock::now()));
            drop(z);
        }
    });
    let m = &run.model;
    let events = m.on_track(m.thread_track(tid()));
    assert_eq!(events.len(), 2 * ZONES);
    let mut widths = [0usize; 4];
    let mut last_end = 0;
    for (i, pair) in events.chunks(2).enumerate() {
        let (b, e) = (pair[0], pair[1]);
        assert!(
            matches!(b.kind, Kind::Begin) && matches!(e.kind, Kind::End),
            "zone {i}: {} then {}",
            show(b),
            show(e)
        );
        assert_eq!(b.name.as_deref(), Some("flood"), "zone {i}");
        let (lo, hi) = brackets[i];
        assert!(
            (lo..=hi).contains(&b.ts),
            "zone {i} began at {} outside [{lo}, {hi}]",
            b.ts
        );
        assert!(b.ts <= e.ts, "zone {i}: ends at {} before {}", e.ts, b.ts);
        if i > 0 {
            let delta = b.ts - last_end;
            widths[match delta {
                0..128 => 0,
                128..16_384 => 1,
                16_384..2_097_152 => 2,
                _ => 3,
            }] += 1;
        }
        last_end = e.ts;
    }
    eprintln!("begins by delta width (1, 2, 3 varint bytes, past them): {widths:?}");
    // The gaps asked for: two bytes every eighth zone, three every 64th, past them every
    // 10 000th (a loaded machine only makes gaps longer, moving zones to wider deltas).
    assert!(widths[1] + widths[2] + widths[3] >= ZONES / 8, "{widths:?}");
    assert!(widths[2] + widths[3] >= ZONES / 64, "{widths:?}");
    assert!(widths[3] >= ZONES / 10_000 - 1, "{widths:?}");
}

//! The Layer's traces, decoded back: with Tachyon's trace processor (slices, args, flows,
//! tracks) and with the independent packet model the client crate's tests use (no loss, nothing
//! unresolved, time moving forward on every sequence).

#[path = "../../tachyon/tests/model/mod.rs"]
mod model;

use std::sync::{Arc, Barrier, Mutex, MutexGuard};

use model::Model;
use tachyon::Config;
use tachyon_processor::{Options, TraceProcessor, Value};
use tracing::{dispatcher, Dispatch};
use tracing_subscriber::layer::SubscriberExt;
use tracing_tachyon::{SpanMode, TachyonLayer};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn dispatch(layer: TachyonLayer) -> Dispatch {
    Dispatch::new(tracing_subscriber::registry().with(layer))
}

/// Runs `f` in a session with the Layer as this thread's default, and checks the trace as the
/// client crate's tests do: no loss, nothing skipped or unresolved, time forward per sequence.
fn record(config: Config, d: &Dispatch, f: impl FnOnce()) -> TraceProcessor {
    tachyon::start(config).expect("start");
    dispatcher::with_default(d, f);
    let report = tachyon::shutdown().expect("shutdown").expect("a session");
    assert_eq!(report.writers.packets_dropped, 0);
    assert_eq!(report.writers_still_active, 0);
    let m = Model::read(&report.trace);
    assert!(m.errors.is_empty(), "{:?}", m.errors);
    assert_eq!(m.skipped, 0);
    assert_eq!(m.loss_marks, 0);
    assert!(m.unresolved().is_empty(), "{:#?}", m.unresolved());
    let mut last: std::collections::HashMap<(u32, u64), u64> = Default::default();
    for e in &m.events {
        let prev = last.insert((e.seq, e.track), e.ts).unwrap_or(0);
        assert!(prev <= e.ts, "time went back: {e:?}");
    }
    let tp = TraceProcessor::from_bytes(&report.trace, &Options::default()).expect("parse");
    let loss = tp.data_loss().unwrap();
    assert!(loss.is_empty(), "{loss:#?}");
    tp
}

fn rows(tp: &TraceProcessor, sql: &str) -> Vec<Vec<Value>> {
    tp.query(sql).unwrap_or_else(|e| panic!("{sql}: {e}")).rows
}

fn t(s: &str) -> Value {
    Value::Text(s.into())
}

fn i(v: i64) -> Value {
    Value::Integer(v)
}

#[derive(Debug)]
struct Point {
    #[allow(dead_code)]
    x: i32,
}

#[tracing::instrument(fields(kind = "leaf"))]
fn instrumented(n: u64, label: &str) -> u64 {
    tracing::warn!(n, "inside {label}");
    n * 2
}

#[test]
fn spans_nest_with_typed_fields_and_events_with_levels() {
    let _l = lock();
    let mut error_line = 0;
    let tp = record(Config::in_memory(), &dispatch(TachyonLayer::new()), || {
        let outer = tracing::info_span!(
            target: "app::db",
            "query",
            rows = 3u64,
            delta = -4i64,
            ratio = 0.5f64,
            cached = true,
            table = "users",
            at = ?Point { x: 1 },
            late = tracing::field::Empty,
        );
        // Recorded before the entry: the entry's slice carries it.
        outer.record("late", 7u64);
        let _o = outer.enter();
        {
            let _inner = tracing::debug_span!(target: "app::db", "fetch").entered();
            tracing::info!(target: "app::db", bytes = 512u64, "page read");
            error_line = line!() + 1;
            tracing::error!(target: "app::db", code = 7i64, retry = false);
        }
        assert_eq!(instrumented(21, "x"), 42);
    });

    let error_event = format!("event crates/tracing-tachyon/tests/layer.rs:{error_line}");
    let error_event = error_event.as_str();
    assert_eq!(
        rows(
            &tp,
            "SELECT name, depth, category FROM slice WHERE dur > 0 OR name != '' ORDER BY ts, depth"
        ),
        [
            vec![t("query"), i(0), t("app::db")],
            vec![t("fetch"), i(1), t("app::db")],
            vec![t("info"), i(2), t("app::db")],
            vec![t(error_event), i(2), t("app::db")],
            vec![t("instrumented"), i(1), t("layer")],
            vec![t("warn"), i(2), t("layer")],
        ]
    );
    let args = |name: &str| {
        rows(
            &tp,
            &format!(
                "SELECT a.key, a.value_type, a.display_value FROM slice s JOIN args a USING (arg_set_id) \
                 WHERE s.name = '{name}' AND a.key LIKE 'debug.%' ORDER BY a.key"
            ),
        )
    };
    assert_eq!(
        args("query"),
        [
            vec![t("debug.at"), t("string"), t("Point { x: 1 }")],
            vec![t("debug.cached"), t("bool"), t("true")],
            vec![t("debug.delta"), t("int"), t("-4")],
            vec![t("debug.late"), t("uint"), t("7")],
            vec![t("debug.ratio"), t("real"), t("0.5")],
            vec![t("debug.rows"), t("uint"), t("3")],
            vec![t("debug.table"), t("string"), t("users")],
        ]
    );
    assert_eq!(
        args("info"),
        [
            vec![t("debug.bytes"), t("uint"), t("512")],
            vec![t("debug.level"), t("string"), t("INFO")],
            vec![t("debug.message"), t("string"), t("page read")],
        ]
    );
    assert_eq!(
        args(error_event),
        [
            vec![t("debug.code"), t("int"), t("7")],
            vec![t("debug.level"), t("string"), t("ERROR")],
            vec![t("debug.retry"), t("bool"), t("false")],
        ]
    );
    assert_eq!(
        args("instrumented"),
        [
            vec![t("debug.kind"), t("string"), t("leaf")],
            vec![t("debug.label"), t("string"), t("x")],
            vec![t("debug.n"), t("uint"), t("21")],
        ]
    );
    assert_eq!(
        args("warn"),
        [
            vec![t("debug.level"), t("string"), t("WARN")],
            vec![t("debug.message"), t("string"), t("inside x")],
            vec![t("debug.n"), t("uint"), t("21")],
        ]
    );
    // Events are instants; spans have durations.
    assert_eq!(
        rows(&tp, "SELECT name FROM slice WHERE dur = 0 ORDER BY ts"),
        [[t("info")], [t(error_event)], [t("warn")]]
    );
    // Source locations: the span's callsite file and line.
    assert_eq!(
        rows(
            &tp,
            "SELECT a.display_value FROM slice s JOIN args a USING (arg_set_id) \
             WHERE s.name = 'fetch' AND a.key = 'source.file_name'"
        ),
        [[t("crates/tracing-tachyon/tests/layer.rs")]]
    );
}

#[test]
fn follows_from_is_a_flow() {
    let _l = lock();
    let tp = record(Config::in_memory(), &dispatch(TachyonLayer::new()), || {
        let cause = tracing::info_span!("cause");
        let effect = tracing::info_span!("effect");
        {
            let _c = cause.enter();
            effect.follows_from(&cause);
        }
        let _e = effect.enter();
    });
    assert_eq!(
        rows(
            &tp,
            "SELECT p.name, o.name, i.name FROM flow f JOIN slice o ON f.slice_out = o.id \
             JOIN slice i ON f.slice_in = i.id JOIN slice p ON o.parent_id = p.id"
        ),
        [[t("cause"), t("follows_from"), t("effect")]]
    );
}

/// One span entered on two threads (as an async task resumed elsewhere) and entered again on
/// the first: a slice per entry, each on the thread that ran it.
#[test]
fn a_span_entered_on_several_threads_leaves_a_slice_per_entry() {
    let _l = lock();
    let d = dispatch(TachyonLayer::new());
    let mut tids = Vec::new();
    let tp = record(Config::in_memory(), &d, || {
        let span = tracing::info_span!("task", id = 9u64);
        drop(span.enter());
        let (s, d2) = (span.clone(), d.clone());
        let other = std::thread::spawn(move || {
            dispatcher::with_default(&d2, || drop(s.enter()));
            model::current_tid().unwrap()
        })
        .join()
        .unwrap();
        drop(span.enter());
        tids = vec![model::current_tid().unwrap(), other];
    });
    let per_thread = rows(
        &tp,
        "SELECT t.tid, count(*) FROM slice s JOIN thread_track tt ON s.track_id = tt.id \
         JOIN thread t USING (utid) WHERE s.name = 'task' GROUP BY t.tid ORDER BY count(*)",
    );
    assert_eq!(per_thread, [vec![i(tids[1]), i(1)], vec![i(tids[0]), i(2)]]);
    // Each entry carries the span's fields.
    assert_eq!(
        rows(
            &tp,
            "SELECT count(*) FROM slice s JOIN args a USING (arg_set_id) \
             WHERE s.name = 'task' AND a.key = 'debug.id' AND a.int_value = 9"
        ),
        [[i(3)]]
    );
}

/// Async-track mode: a span whose entries run on two threads is one slice on a track of its
/// own, from creation to close; a span that follows from it gets a flow between the tracks.
#[test]
fn async_track_mode_draws_a_span_over_its_whole_life() {
    let _l = lock();
    let d = dispatch(TachyonLayer::new().with_span_mode(SpanMode::AsyncTrack));
    let tp = record(Config::in_memory(), &d, || {
        let span = tracing::info_span!("request", id = 5u64);
        let barrier = Arc::new(Barrier::new(2));
        let (s, d2, b) = (span.clone(), d.clone(), Arc::clone(&barrier));
        let h = std::thread::spawn(move || {
            dispatcher::with_default(&d2, || {
                drop(s.enter());
                b.wait();
            })
        });
        barrier.wait();
        h.join().unwrap();
        drop(span.enter());
        let next = tracing::info_span!("reply");
        next.follows_from(&span);
        drop(next);
        drop(span);
    });
    assert_eq!(
        rows(
            &tp,
            "SELECT s.name, t.name, s.dur > 0 FROM slice s JOIN process_track t ON s.track_id = t.id \
             WHERE s.dur != 0 ORDER BY s.ts"
        ),
        [vec![t("request"), t("request"), i(1)], vec![t("reply"), t("reply"), i(1)]]
    );
    assert_eq!(
        rows(
            &tp,
            "SELECT po.name, pi.name FROM flow f JOIN slice o ON f.slice_out = o.id \
             JOIN slice i ON f.slice_in = i.id JOIN slice po ON o.parent_id = po.id \
             JOIN slice pi ON i.parent_id = pi.id"
        ),
        [[t("request"), t("reply")]]
    );
    assert_eq!(
        rows(
            &tp,
            "SELECT a.int_value FROM slice s JOIN args a USING (arg_set_id) \
             WHERE s.name = 'request' AND a.key = 'debug.id'"
        ),
        [[i(5)]]
    );
}

/// A target is a category: Tachyon's category filter applies on top of `tracing`'s.
#[test]
fn targets_are_categories() {
    let _l = lock();
    let config = Config {
        categories: tachyon::CategoryFilter::new(&[], &["noisy*"]),
        ..Config::in_memory()
    };
    let tp = record(config, &dispatch(TachyonLayer::new()), || {
        let _a = tracing::info_span!(target: "noisy::net", "poll").entered();
        let _b = tracing::info_span!(target: "app", "work", n = 1u64).entered();
        tracing::info!(target: "noisy::net", "dropped");
        tracing::info!(target: "app", "kept");
    });
    assert_eq!(
        rows(&tp, "SELECT name, category FROM slice ORDER BY ts"),
        [vec![t("work"), t("app")], vec![t("info"), t("app")]]
    );
}

/// Guards dropped out of order (the outer span's first): the innermost open slice ends at each
/// exit, so the track still nests, every slice is closed, and the trace passes the checks.
#[test]
fn exits_out_of_order_keep_the_track_nested() {
    let _l = lock();
    let tp = record(Config::in_memory(), &dispatch(TachyonLayer::new()), || {
        let a = tracing::info_span!("a");
        let b = tracing::info_span!("b");
        let ga = a.enter();
        let gb = b.enter();
        drop(ga);
        tracing::info!(after = 1u64);
        drop(gb);
        let _c = tracing::info_span!("c").entered();
    });
    assert_eq!(
        rows(
            &tp,
            "SELECT name, depth, dur > 0 FROM slice WHERE dur != 0 ORDER BY ts, depth"
        ),
        [
            vec![t("a"), i(0), i(1)],
            vec![t("b"), i(1), i(1)],
            vec![t("c"), i(0), i(1)],
        ]
    );
    // The event after the first exit is inside the one slice still open.
    assert_eq!(rows(&tp, "SELECT depth FROM slice WHERE dur = 0"), [[i(1)]]);
    assert_eq!(
        rows(&tp, "SELECT count(*) FROM slice WHERE dur < 0"),
        [[i(0)]]
    );
}

/// Nesting deeper than the Layer's inline entry stack (32 entries, then a spill vector): every
/// level is a closed slice at its own depth, also when a guard in the spilled part is dropped
/// out of order.
#[test]
fn nesting_deeper_than_the_inline_entry_stack() {
    let _l = lock();
    const N: u64 = 40;
    let tp = record(Config::in_memory(), &dispatch(TachyonLayer::new()), || {
        let spans: Vec<_> = (0..N).map(|k| tracing::info_span!("deep", k)).collect();
        let mut guards: Vec<_> = spans.iter().map(|s| s.enter()).collect();
        drop(guards.remove(35));
        while let Some(g) = guards.pop() {
            drop(g);
        }
        let _after = tracing::info_span!("after").entered();
    });
    assert_eq!(
        rows(
            &tp,
            "SELECT count(*), count(DISTINCT depth), min(depth), max(depth) FROM slice \
             WHERE name = 'deep' AND dur >= 0"
        ),
        [[i(N as i64), i(N as i64), i(0), i(N as i64 - 1)]]
    );
    // Every entry was popped: the next span is a root slice again.
    assert_eq!(
        rows(
            &tp,
            "SELECT depth, dur >= 0 FROM slice WHERE name = 'after'"
        ),
        [[i(0), i(1)]]
    );
}

/// Spans without fields entered as soon as they are created (the Layer's hot entry, which
/// skips the registry lookup), nested past the inline entry stack, one of them in a filtered-out
/// category (entered and exited, nothing recorded): every recorded level is a closed slice at
/// its own depth, and the filtered one ends no other slice.
#[test]
fn fieldless_spans_entered_at_creation_nest_past_the_inline_stack() {
    let _l = lock();
    const N: usize = 41;
    fn nest(level: usize) {
        if level == N {
            return;
        }
        let _g = if level == 10 {
            tracing::info_span!(target: "noisy", "level").entered()
        } else {
            tracing::info_span!("level").entered()
        };
        nest(level + 1);
    }
    let config = Config {
        categories: tachyon::CategoryFilter::new(&[], &["noisy*"]),
        ..Config::in_memory()
    };
    let tp = record(config, &dispatch(TachyonLayer::new()), || {
        nest(0);
        let _after = tracing::info_span!("after").entered();
    });
    let recorded = N as i64 - 1;
    assert_eq!(
        rows(
            &tp,
            "SELECT count(*), count(DISTINCT depth), min(depth), max(depth), min(dur >= 0) \
             FROM slice WHERE name = 'level'"
        ),
        [[i(recorded), i(recorded), i(0), i(recorded - 1), i(1)]]
    );
    assert_eq!(
        rows(
            &tp,
            "SELECT depth, dur >= 0 FROM slice WHERE name = 'after'"
        ),
        [[i(0), i(1)]]
    );
}

/// `log` records through `tracing-log`, and `tracing` events whose only field is the message:
/// log messages (`android_logs`) with the level as the priority, instants named after the level
/// with the record's target as the category, inside the span entered then.
#[test]
fn log_records_through_tracing_log() {
    let _l = lock();
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| tracing_log::LogTracer::init().expect("the log tracer"));
    let tp = record(Config::in_memory(), &dispatch(TachyonLayer::new()), || {
        let _s = tracing::info_span!("startup").entered();
        for k in 0..3 {
            log::warn!(target: "legacy::cfg", "missing key {k}");
        }
        log::error!("failed");
        tracing::debug!(target: "app::net", "retrying");
    });
    assert_eq!(
        rows(
            &tp,
            "SELECT name, category, depth FROM slice WHERE dur = 0 ORDER BY ts"
        ),
        [
            vec![t("warn"), t("legacy::cfg"), i(1)],
            vec![t("warn"), t("legacy::cfg"), i(1)],
            vec![t("warn"), t("legacy::cfg"), i(1)],
            vec![t("error"), t("layer"), i(1)],
            vec![t("debug"), t("app::net"), i(1)],
        ]
    );
    // LogMessage.prio: WARN 5, ERROR 6, DEBUG 3 (Android's priorities).
    assert_eq!(
        rows(&tp, "SELECT prio, msg FROM android_logs ORDER BY ts"),
        [
            vec![i(5), t("missing key 0")],
            vec![i(5), t("missing key 1")],
            vec![i(5), t("missing key 2")],
            vec![i(6), t("failed")],
            vec![i(3), t("retrying")],
        ]
    );
}

/// Tokio tasks that move between worker threads: every poll is an entry, on the thread that
/// polled it, and every entry is closed.
#[test]
fn tokio_tasks_across_threads() {
    use tracing::instrument::WithSubscriber;
    use tracing::Instrument;
    let _l = lock();
    let d = dispatch(TachyonLayer::new());
    let tasks = 8;
    let tp = record(Config::in_memory(), &d, || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let handles: Vec<_> = (0..tasks)
                .map(|k| {
                    tokio::spawn(
                        async move {
                            for _ in 0..3 {
                                tokio::task::yield_now().await;
                            }
                            tracing::info!(k, "done");
                        }
                        .instrument(tracing::info_span!("job", k))
                        .with_subscriber(d.clone()),
                    )
                })
                .collect();
            for h in handles {
                h.await.unwrap();
            }
        });
        drop(rt);
    });
    // Every job was polled at least 4 times (3 yields), each poll a closed slice.
    let polls = rows(
        &tp,
        "SELECT count(*), min(dur) > 0, count(DISTINCT arg_set_id) FROM slice WHERE name = 'job'",
    );
    let n = match polls[0][0] {
        Value::Integer(n) => n,
        ref v => panic!("{v:?}"),
    };
    assert!(n >= 4 * tasks, "{polls:?}");
    assert_eq!(polls[0][1], i(1));
    assert_eq!(
        rows(
            &tp,
            "SELECT count(*) FROM slice e JOIN slice p ON e.parent_id = p.id \
             WHERE e.name = 'info' AND p.name = 'job'"
        ),
        [[i(tasks)]]
    );
}

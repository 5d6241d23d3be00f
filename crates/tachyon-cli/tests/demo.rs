//! Runs the real `tachyon demo` and reads its trace back with the trace processor. (The
//! `tachyon` crate's examples are run by its own `tests/examples.rs`.)

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{clean_command, int, tmp_dir};
use tachyon_processor::{Options, TraceProcessor, Value};

/// Runs `program` in `dir` without any `TACHYON_*` variable of the test's environment.
fn run(program: &Path, args: &[&str], dir: &Path) -> Output {
    let out = clean_command(program)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run the program");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed: {:?}\nstdout:\n{}\nstderr:\n{stderr}",
        program.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    out
}

/// The `stats` rows with severity error or data_loss and a non-zero value.
fn error_rows(tp: &TraceProcessor) -> Vec<Vec<Value>> {
    tp.query(
        "SELECT name, idx, severity, value FROM stats \
         WHERE severity IN ('error', 'data_loss') AND value != 0",
    )
    .unwrap()
    .rows
}

fn texts(tp: &TraceProcessor, sql: &str) -> Vec<String> {
    tp.query(sql)
        .unwrap()
        .rows
        .into_iter()
        .map(|r| match &r[0] {
            Value::Text(s) => s.clone(),
            other => format!("{other:?}"),
        })
        .collect()
}

/// Runs `tachyon demo --seconds 1 --threads 2` into a fresh directory; returns the trace path
/// and stdout.
fn demo(name: &str) -> (PathBuf, String) {
    let dir = tmp_dir(name);
    let trace = dir.join("d.pftrace");
    let out = run(
        Path::new(env!("CARGO_BIN_EXE_tachyon")),
        &[
            "demo",
            "--seconds",
            "1",
            "--threads",
            "2",
            "--out",
            trace.to_str().unwrap(),
        ],
        &dir,
    );
    (trace, String::from_utf8(out.stdout).unwrap())
}

#[test]
fn demo_writes_a_trace_with_every_kind_of_event() {
    let (trace, text) = demo("demo_every_kind");
    let abs = std::fs::canonicalize(&trace).unwrap();
    let line = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?}:\n{text}"))
    };
    assert!(line("tachyon demo:").contains("2 worker(s)"), "{text}");
    assert!(line("workload:").contains(" jobs in "), "{text}");
    assert_eq!(line("trace: "), format!("trace: {}", abs.display()));
    let written = line("written: ");
    assert!(
        written.contains(" events in the trace (") && written.ends_with(" bytes"),
        "{text}"
    );
    let events: u64 = written["written: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(events > 100, "{text}");
    let bytes = std::fs::metadata(&trace).unwrap().len();
    assert!(written.ends_with(&format!(", {bytes} bytes")), "{text}");
    line("losses: ");
    // The demo runs with the tracking allocator (issue 18): the memory line, the live-heap
    // track and the heap profile.
    assert!(line("memory (").contains(" allocated in "), "{text}");
    line("top zones by total time");
    assert!(text.lines().any(|l| l.starts_with("job ")), "{text}");
    assert_eq!(
        text.lines().last().unwrap(),
        format!(
            "open it in https://ui.perfetto.dev or run: tachyon stats {}",
            abs.display()
        )
    );

    let tp = TraceProcessor::open(&trace, &Options::default()).unwrap();
    // Issue 7's acceptance check: no error and no data loss in `stats`.
    let bad = error_rows(&tp);
    assert!(bad.is_empty(), "error or data_loss stats: {bad:?}\n{text}");
    assert!(text.contains("losses: none"), "{text}");

    // Slices on several named threads, nested at least three deep.
    let threads = texts(
        &tp,
        "SELECT DISTINCT th.name FROM slice s JOIN thread_track tt ON s.track_id = tt.id \
         JOIN thread th USING (utid) WHERE th.name IS NOT NULL ORDER BY 1",
    );
    for name in ["main", "producer", "worker-0", "worker-1"] {
        assert!(threads.iter().any(|t| t == name), "{name} in {threads:?}");
    }
    assert!(int(&tp, "SELECT max(depth) FROM slice") >= 2);
    // Thread names, including one set with `set_thread_name`, and the process name.
    let names = texts(&tp, "SELECT name FROM thread WHERE name IS NOT NULL");
    assert!(names.iter().any(|n| n == "metrics"), "{names:?}");
    assert_eq!(
        int(
            &tp,
            "SELECT count(*) FROM process WHERE name = 'tachyon-demo'"
        ),
        1
    );

    // Categories, a run-time name, instants.
    let cats = texts(
        &tp,
        "SELECT DISTINCT category FROM slice WHERE category IS NOT NULL ORDER BY 1",
    );
    assert!(
        cats.contains(&"compute".into()) && cats.contains(&"io".into()),
        "{cats:?}"
    );
    assert!(
        int(
            &tp,
            "SELECT count(*) FROM slice WHERE name LIKE 'transform %'"
        ) > 0
    );
    assert!(int(&tp, "SELECT count(*) FROM slice WHERE dur = 0") > 0);

    // Args of every type on the job zones.
    let job_args = texts(
        &tp,
        "SELECT DISTINCT a.key || ':' || a.value_type FROM slice s JOIN args a USING (arg_set_id) \
         WHERE s.name = 'job' ORDER BY 1",
    );
    for arg in [
        "debug.job_id:uint",
        "debug.kind:string",
        "debug.priority:real",
        "debug.repeat:bool",
    ] {
        assert!(job_args.iter().any(|a| a == arg), "{arg} in {job_args:?}");
    }

    // Counters with samples, with their units.
    let counters = texts(
        &tp,
        "SELECT name || ':' || coalesce(unit, '') FROM counter_track t \
         WHERE EXISTS (SELECT 1 FROM counter c WHERE c.track_id = t.id) ORDER BY 1",
    );
    for c in [
        "queue depth:count",
        "bytes processed:bytes",
        "jobs done (worker-0):count",
    ] {
        assert!(counters.iter().any(|n| n == c), "{c} in {counters:?}");
    }
    assert!(
        counters.iter().any(|n| n.starts_with("cache hit ratio")),
        "{counters:?}"
    );

    assert!(
        int(
            &tp,
            "SELECT count(*) FROM counter c JOIN counter_track t ON c.track_id = t.id WHERE t.name = 'Heap'"
        ) > 0
    );
    assert!(
        int(
            &tp,
            "SELECT count(*) FROM heap_profile_allocation a JOIN stack_profile_callsite c \
             ON a.callsite_id = c.id JOIN stack_profile_frame f ON c.frame_id = f.id \
             WHERE f.name = 'job' AND a.size > 0"
        ) > 0,
        "allocations attributed to the job zone"
    );

    // Flows from the producer's enqueue to the workers' job (and, for the locks, between a
    // hold and the wait of the thread that got the lock next: a flow runs from the slice that
    // began first, as in Perfetto, and a wait can begin before the hold it waited out, while
    // a third thread held the lock).
    assert!(int(&tp, "SELECT count(*) FROM flow") > 0);
    assert_eq!(
        int(
            &tp,
            "SELECT count(*) FROM flow f JOIN slice o ON o.id = f.slice_out \
             JOIN slice i ON i.id = f.slice_in WHERE (o.name != 'enqueue' OR i.name != 'job') \
             AND NOT (o.category = 'tachyon.lock' AND i.name LIKE 'wait for %') \
             AND NOT (o.name LIKE 'wait for %' AND i.category = 'tachyon.lock')"
        ),
        0,
        "every flow goes from enqueue to job, or between a lock hold and a wait"
    );

    // Tracy's other instruments: locks (the job queue is contended by design), frames, log
    // messages at several levels, zone values, the program's information.
    let locks = tp.lock_stats().unwrap();
    for name in ["job queue", "results log", "cache capacity"] {
        assert!(
            locks.iter().any(|l| l.name == name && l.acquisitions > 0),
            "{name} in {locks:?}"
        );
    }
    let queue = locks.iter().find(|l| l.name == "job queue").unwrap();
    assert!(queue.contended > 0, "{queue:?}");
    assert!(locks
        .iter()
        .any(|l| l.name == "cache capacity" && l.shared > 0));
    let frames = tp.frame_stats().unwrap();
    assert!(
        frames.iter().any(|f| f.name == "Frame" && f.count > 0),
        "{frames:?}"
    );
    assert!(frames.iter().any(|f| f.name == "read input" && f.count > 0));
    let msgs = tp.message_stats().unwrap();
    assert!(msgs.by_priority.len() >= 3, "{msgs:?}");
    assert!(
        msgs.app_info.iter().any(|a| a.contains("2 workers")),
        "{msgs:?}"
    );
    assert!(
        int(
            &tp,
            "SELECT count(*) FROM slice s JOIN args a USING (arg_set_id) \
             WHERE s.name = 'job' AND a.key = 'debug.value'"
        ) > 0
    );

    // The named GC track and the batches' async tracks.
    assert!(
        int(
            &tp,
            "SELECT count(*) FROM slice s JOIN track t ON s.track_id = t.id \
             WHERE t.name = 'GC' AND s.name = 'collect'"
        ) > 0
    );
    assert!(
        int(
            &tp,
            "SELECT count(*) FROM slice s JOIN track t ON s.track_id = t.id \
             WHERE t.name LIKE 'batch %' AND s.name = 'batch' AND s.dur > 0"
        ) > 0
    );
}

/// `tachyon stats` on a demo trace: the sections for Tracy's other views, with the numbers the
/// processor computes.
#[test]
fn stats_show_app_info_locks_frames_and_messages() {
    let (trace, _) = demo("demo_stats_sections");
    let dir = trace.parent().unwrap().to_path_buf();
    let out = run(
        Path::new(env!("CARGO_BIN_EXE_tachyon")),
        &["stats", trace.to_str().unwrap()],
        &dir,
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let tp = TraceProcessor::open(&trace, &Options::default()).unwrap();
    let section = |title: &str| {
        let start = text
            .find(title)
            .unwrap_or_else(|| panic!("no {title:?} section:\n{text}"));
        text[start..].split("\n\n").next().unwrap().to_owned()
    };
    assert!(
        section("App info").contains("tachyon demo: 2 workers"),
        "{text}"
    );
    let locks = section("Locks (");
    for l in tp.lock_stats().unwrap() {
        let row = locks
            .lines()
            .find(|r| r.starts_with(&l.name))
            .unwrap_or_else(|| panic!("no row for {}:\n{locks}", l.name));
        assert!(
            row.contains(&format!(" {} ", l.acquisitions)),
            "{row} vs {l:?}"
        );
    }
    let frames = section("Frames (");
    let f = tp.frame_stats().unwrap();
    let main = f.iter().find(|f| f.name == "Frame").unwrap();
    let row = frames.lines().find(|r| r.starts_with("Frame ")).unwrap();
    assert!(
        row.contains(&format!(" {} ", main.count)),
        "{row} vs {main:?}"
    );
    let msgs = tp.message_stats().unwrap();
    assert!(
        section("Messages (").starts_with(&format!("Messages ({}:", msgs.total)),
        "{text}"
    );
    // Lock and frame slices stay out of the zone table.
    let zones = section("Zones (");
    assert!(!zones.contains("wait for "), "{zones}");
    assert!(!zones.contains("\nFrame "), "{zones}");
}

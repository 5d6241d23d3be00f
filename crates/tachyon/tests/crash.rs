//! The crash handler against real crashing processes: the `crash` example (cargo builds it
//! before this test) and this test binary itself, re-run as a child with a scenario in
//! [`CHILD_ENV`] (see [`child`]). Each child's trace is read back with the trace processor:
//! it exists, decodes without errors or data loss, holds the zones every thread wrote before
//! the crash, and the crash event is the last event of the crashing thread; the child's exit
//! status (signal, core dump flag) is the one it has with the handler turned off. Nothing waits
//! on time: children synchronize with barriers and die when they crash.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use tachyon_processor::{Crash, Options, TraceProcessor, Value};

mod oracle;

/// Set in a child: the scenario [`child`] runs.
const CHILD_ENV: &str = "TACHYON_CRASH_TEST_CHILD";

/// Zones each thread of the threaded scenario writes before the crash.
const BEFORE: usize = 200;
/// Zones (and instants) each worker of the threaded scenario writes after it, at most.
const AFTER: usize = 5000;
/// Zones each worker of the `queued` scenario leaves in its queue (half the queue's room).
const QUEUED: usize = 4000;

fn examples_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("examples")
}

/// A fresh directory for one child.
fn scratch(name: &str) -> PathBuf {
    // Tests run in parallel, several with the same example: one directory per child.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("crash_{name}_{}_{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A command with no `TACHYON_*` variable of ours leaking in, writing `trace.pftrace` in `dir`.
fn command(exe: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.current_dir(dir);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("TACHYON_") || k == "RUST_BACKTRACE" {
            cmd.env_remove(k);
        }
    }
    cmd.env("TACHYON_OUT", dir.join("trace.pftrace"));
    // Small buffers: the children's memory (and a core dump of it) stays small.
    cmd.env("TACHYON_BUFFER_SIZE", "2M");
    cmd.env("TACHYON_SMB_SIZE", "512K");
    cmd
}

fn example(mode: &str) -> (Command, PathBuf) {
    let exe = examples_dir().join(format!("crash{}", std::env::consts::EXE_SUFFIX));
    assert!(exe.is_file(), "{} is not built", exe.display());
    let dir = scratch(&format!("example_{mode}"));
    let mut cmd = command(&exe, &dir);
    cmd.arg(mode);
    (cmd, dir)
}

fn child_of_this_test(scenario: &str) -> (Command, PathBuf) {
    let dir = scratch(&format!("child_{scenario}"));
    let mut cmd = command(&std::env::current_exe().unwrap(), &dir);
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"]);
    cmd.env(CHILD_ENV, scenario);
    (cmd, dir)
}

fn run(mut cmd: Command) -> Output {
    cmd.output().expect("the child runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn describe(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// The trace the child wrote, decoded; no error or data-loss stat.
fn open_trace(dir: &Path, out: &Output) -> TraceProcessor {
    open_trace_losing(dir, out, &[])
}

/// The trace the child wrote, decoded; its error and data-loss stats are exactly `expected`.
fn open_trace_losing(dir: &Path, out: &Output, expected: &[&str]) -> TraceProcessor {
    let path = dir.join("trace.pftrace");
    assert!(path.is_file(), "no trace written\n{}", describe(out));
    let tp = TraceProcessor::open(&path, &Options::default()).unwrap();
    let bad = tp.data_loss().unwrap();
    let mut names: Vec<&str> = bad.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, expected, "{bad:?}\n{}", describe(out));
    tp
}

fn int(tp: &TraceProcessor, sql: &str) -> i64 {
    match tp.query(sql).unwrap().rows.first().map(|r| &r[0]) {
        Some(Value::Integer(n)) => *n,
        other => panic!("{sql}: {other:?}"),
    }
}

/// The one crash event, on thread `thread`, and the last event that starts on that thread's
/// track.
fn the_crash(tp: &TraceProcessor, thread: &str) -> Crash {
    let crashes = tp.crashes().unwrap();
    assert_eq!(crashes.len(), 1, "{crashes:?}");
    let c = crashes.into_iter().next().unwrap();
    assert_eq!(c.thread.as_deref(), Some(thread), "{c:?}");
    let last = tp
        .query(&format!(
            "SELECT s.name FROM slice s JOIN thread_track tt ON s.track_id = tt.id \
             JOIN thread t USING (utid) WHERE t.tid = {} ORDER BY s.ts DESC, s.id DESC LIMIT 1",
            c.tid.expect("on a thread track")
        ))
        .unwrap();
    assert_eq!(
        last.rows[0][0],
        Value::Text(c.name.clone()),
        "the crash ends the thread"
    );
    c
}

/// Zones named `name` on the thread named `thread`.
fn zones(tp: &TraceProcessor, thread: &str, name: &str) -> i64 {
    int(
        tp,
        &format!(
            "SELECT count(*) FROM slice s JOIN thread_track tt ON s.track_id = tt.id \
             JOIN thread t USING (utid) WHERE t.name = '{thread}' AND s.name = '{name}'"
        ),
    )
}

/// The same child with the handler turned off: the status it would have had without Tachyon.
fn without_handler(mut cmd: Command) -> ExitStatus {
    cmd.env("TACHYON_NO_CRASH_HANDLER", "1");
    run(cmd).status
}

fn assert_same_death(with: &Output, without: ExitStatus) {
    assert_eq!(with.status.signal(), without.signal(), "{}", describe(with));
    assert_eq!(with.status.code(), without.code(), "{}", describe(with));
    assert_eq!(
        with.status.core_dumped(),
        without.core_dumped(),
        "{}",
        describe(with)
    );
}

// === The example's crashes ===

#[test]
fn null_dereference_saves_the_trace_and_dies_of_sigsegv() {
    let (cmd, dir) = example("segv");
    let out = run(cmd);
    assert_died_of(&out, libc::SIGSEGV);
    let tp = open_trace(&dir, &out);
    let c = the_crash(&tp, "main");
    assert_eq!(c.name, "crash: SIGSEGV");
    assert_eq!(c.code.as_deref(), Some("SEGV_MAPERR"));
    assert_eq!(c.address.as_deref(), Some("0x0"));
    // The faulting instruction, as addr2line takes it: in the example's own code (a debug
    // build calls `read_volatile`, where the load faults).
    let module = c.pc_module.clone().expect("pc_module");
    let (path, address) = module.rsplit_once('+').unwrap();
    assert!(path.ends_with("examples/crash"), "{module}");
    if let Ok(a2l) = Command::new("addr2line")
        .args(["-f", "-C", "-i", "-e", path, address])
        .output()
    {
        let function = text(&a2l.stdout);
        assert!(
            function.contains("read_volatile") || function.contains("crash::main"),
            "{function}"
        );
    }
    assert_eq!(zones(&tp, "worker", "work"), 100);
    assert_eq!(zones(&tp, "main", "setup"), 1);
    assert_eq!(zones(&tp, "main", "about to crash"), 1);
    // The zone the crash interrupted never ended.
    assert_eq!(
        int(&tp, "SELECT dur FROM slice WHERE name = 'crashing'"),
        -1
    );
    let (base, _) = example("segv");
    assert_same_death(&out, without_handler(base));
}

/// Perfetto's trace processor sees the crash event on the crashing thread, with its arguments.
#[test]
fn perfettos_trace_processor_shows_the_crash() {
    let Some(shell) = oracle::shell() else {
        return;
    };
    let (cmd, dir) = example("segv");
    let out = run(cmd);
    assert_died_of(&out, libc::SIGSEGV);
    let trace = dir.join("trace.pftrace");
    let crash = oracle::perfetto_rows_of_file(
        &shell,
        &trace,
        "SELECT s.name, t.name AS thread, extract_arg(s.arg_set_id, 'debug.code') AS code \
         FROM slice s JOIN thread_track tt ON s.track_id = tt.id JOIN thread t USING (utid) \
         WHERE s.category = 'tachyon.crash'",
    );
    assert_eq!(crash, ["\"crash: SIGSEGV\",\"main\",\"SEGV_MAPERR\""]);
    // And it finds nothing wrong with the trace.
    let problems = oracle::perfetto_rows_of_file(
        &shell,
        &trace,
        "SELECT name, value FROM stats WHERE value != 0 AND severity IN ('error', 'data_loss')",
    );
    assert!(problems.is_empty(), "{problems:?}");

    // A panic's call stack is Perfetto's inline call stack too: its frames are imported.
    let (cmd, dir) = example("panic");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(101), "{}", describe(&out));
    let frames = oracle::perfetto_rows_of_file(
        &shell,
        &dir.join("trace.pftrace"),
        "SELECT count(*) AS n FROM stack_profile_frame WHERE name = 'crash::main'",
    );
    assert_eq!(frames, ["1"]);
}

#[test]
fn abort_saves_the_trace_and_dies_of_sigabrt() {
    let (cmd, dir) = example("abort");
    let out = run(cmd);
    assert_died_of(&out, libc::SIGABRT);
    let tp = open_trace(&dir, &out);
    let c = the_crash(&tp, "main");
    assert_eq!(c.signal.as_deref(), Some("SIGABRT"));
    assert_eq!(zones(&tp, "worker", "work"), 100);
    let (base, _) = example("abort");
    assert_same_death(&out, without_handler(base));
}

#[test]
fn a_panic_out_of_main_is_recorded_and_the_trace_written_at_exit() {
    let (cmd, dir) = example("panic");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(101), "{}", describe(&out));
    // The default hook, chained after Tachyon's, still printed the message.
    assert!(text(&out.stderr).contains("the example panics on purpose"));
    let tp = open_trace(&dir, &out);
    let crashes = tp.crashes().unwrap();
    assert_eq!(crashes.len(), 1, "{crashes:?}");
    let c = &crashes[0];
    assert_eq!(c.name, "panic");
    assert_eq!(c.thread.as_deref(), Some("main"));
    assert_eq!(c.message.as_deref(), Some("the example panics on purpose"));
    assert!(c.location.as_deref().unwrap().contains("crash.rs"), "{c:?}");
    assert!(
        c.stack
            .first()
            .is_some_and(|f| f.starts_with("crash::main")),
        "the stack starts at the panicking function: {c:?}"
    );
    // Unwinding ended the zones the panic crossed; nothing started after the panic.
    assert_eq!(
        int(
            &tp,
            "SELECT count(*) FROM slice WHERE ts > (SELECT ts FROM slice WHERE name = 'panic')"
        ),
        0
    );
    assert_eq!(zones(&tp, "worker", "work"), 100);
    let (base, _) = example("panic");
    assert_same_death(&out, without_handler(base));
}

#[test]
fn a_stack_overflow_is_caught_on_the_alternate_stack_and_std_still_reports_it() {
    let (cmd, dir) = example("stack-overflow");
    let out = run(cmd);
    // std's handler ran after Tachyon's: its message, and its abort.
    assert!(
        text(&out.stderr).contains("has overflowed its stack"),
        "{}",
        describe(&out)
    );
    assert_died_of(&out, libc::SIGABRT);
    let tp = open_trace(&dir, &out);
    let c = the_crash(&tp, "main");
    assert_eq!(c.name, "crash: stack overflow (SIGSEGV)");
    assert_eq!(c.signal.as_deref(), Some("SIGSEGV"));
    assert_eq!(zones(&tp, "worker", "work"), 100);
    let (base, _) = example("stack-overflow");
    assert_same_death(&out, without_handler(base));
}

/// With core dumps allowed, a crash dumps core with the handler as without it.
#[test]
fn the_core_dump_flag_is_kept() {
    let allow_cores = |cmd: &mut Command| {
        // SAFETY: setrlimit is async-signal-safe, as code between fork and exec must be.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: libc::RLIM_INFINITY,
                    rlim_max: libc::RLIM_INFINITY,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &lim);
                Ok(())
            });
        }
    };
    let (mut cmd, dir) = example("segv");
    allow_cores(&mut cmd);
    let out = run(cmd);
    let (mut base, base_dir) = example("segv");
    allow_cores(&mut base);
    let without = without_handler(base);
    for d in [&dir, &base_dir] {
        for f in std::fs::read_dir(d).unwrap().flatten() {
            if f.file_name().to_string_lossy().starts_with("core") {
                let _ = std::fs::remove_file(f.path());
            }
        }
    }
    assert_same_death(&out, without);
    assert!(dir.join("trace.pftrace").is_file());
    if !without.core_dumped() {
        eprintln!(
            "note: this system writes no core dumps (core_pattern / limits); compared anyway"
        );
    }
}

#[test]
fn with_tachyon_no_crash_handler_nothing_is_saved() {
    let (mut cmd, dir) = example("segv");
    cmd.env("TACHYON_NO_CRASH_HANDLER", "1");
    let out = run(cmd);
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV));
    // The session creates its file when it starts; nothing is written into it.
    let written = std::fs::metadata(dir.join("trace.pftrace")).map_or(0, |m| m.len());
    assert_eq!(written, 0, "{}", describe(&out));
}

// === Scenarios in this test binary ===

#[test]
fn a_crash_on_another_thread_while_others_trace() {
    let (mut cmd, dir) = child_of_this_test("threads");
    // The default buffers (4 MiB SMB, 32 MiB ring): the workers' bounded tracing after the
    // barrier (`AFTER`) fits in either however the threads are scheduled, so nothing wraps,
    // stalls or drops.
    cmd.env_remove("TACHYON_BUFFER_SIZE");
    cmd.env_remove("TACHYON_SMB_SIZE");
    let out = run(cmd);
    assert_died_of(&out, libc::SIGSEGV);
    let tp = open_trace(&dir, &out);
    let c = the_crash(&tp, "crasher");
    assert_eq!(c.address.as_deref(), Some("0x8"));
    for w in ["worker-0", "worker-1", "worker-2"] {
        assert_eq!(zones(&tp, w, "before") as usize, BEFORE, "{w}");
    }
    assert_eq!(zones(&tp, "crasher", "crasher before") as usize, BEFORE);
    // Every zone written before the crash ended before it.
    assert_eq!(
        int(
            &tp,
            &format!(
                "SELECT count(*) FROM slice WHERE name IN ('before', 'crasher before') \
                 AND ts + dur > (SELECT ts FROM slice WHERE category = '{}')",
                tachyon_processor::CRASH_CATEGORY
            )
        ),
        0
    );
}

/// The crash ends the session while the `tachyon-drain` thread encodes the workers' queues:
/// every zone queued before the crash is saved, none is dropped on the way (a drain follows
/// the session its events were recorded in, not the end that arrives halfway through it).
/// Several children, because the crash must catch the drainer in the middle of a queue.
#[test]
fn events_queued_when_the_crash_comes_are_saved() {
    for child in 0..3 {
        let (cmd, dir) = child_of_this_test("queued");
        let out = run(cmd);
        assert_died_of(&out, libc::SIGSEGV);
        let tp = open_trace(&dir, &out);
        the_crash(&tp, "crasher");
        for w in ["worker-0", "worker-1", "worker-2"] {
            assert_eq!(
                zones(&tp, w, "queued") as usize,
                QUEUED,
                "child {child}: {w}"
            );
        }
    }
}

/// Sessions started by `init()` (whose trace is otherwise written at exit) and sessions that
/// stream into their file are saved the same way.
#[test]
fn init_and_streaming_sessions_are_saved_too() {
    let (cmd, dir) = child_of_this_test("init");
    let out = run(cmd);
    assert_died_of(&out, libc::SIGSEGV);
    let tp = open_trace(&dir, &out);
    the_crash(&tp, "child");
    assert_eq!(zones(&tp, "child", "before"), 1);

    let (mut cmd, dir) = example("segv");
    cmd.env("TACHYON_STREAM", "1");
    let out = run(cmd);
    assert_died_of(&out, libc::SIGSEGV);
    let tp = open_trace(&dir, &out);
    the_crash(&tp, "main");
    assert_eq!(zones(&tp, "worker", "work"), 100);
}

/// The handler outlives the session that installed it and saves the next one.
#[test]
fn a_later_session_is_saved_by_the_handler_the_first_installed() {
    let (cmd, dir) = child_of_this_test("second-session");
    let out = run(cmd);
    assert_died_of(&out, libc::SIGSEGV);
    let tp = open_trace(&dir, &out);
    the_crash(&tp, "child");
    assert_eq!(zones(&tp, "child", "second"), 1);
    assert_eq!(zones(&tp, "child", "first"), 0);
    let first = TraceProcessor::open(dir.join("trace.pftrace.first"), &Options::default()).unwrap();
    assert!(first.crashes().unwrap().is_empty());
    assert_eq!(zones(&first, "child", "first"), 1);
}

/// A crash while the thread holds its own tracing state (in an event's argument): nothing
/// waits for that state (its unfinished chunk is lost, and the trace says so: the final flush
/// failed), the rest is saved.
#[test]
fn a_crash_inside_an_events_argument_still_saves_the_trace() {
    let (cmd, dir) = child_of_this_test("in-argument");
    let out = run(cmd);
    assert_died_of(&out, libc::SIGSEGV);
    let tp = open_trace_losing(
        &dir,
        &out,
        &["traced_final_flush_failed", "traced_flushes_failed"],
    );
    let crashes = tp.crashes().unwrap();
    assert_eq!(crashes.len(), 1, "{crashes:?}");
    assert_eq!(crashes[0].thread.as_deref(), Some("child"));
    assert_eq!(zones(&tp, "bystander", "before") as usize, BEFORE);
}

/// Two threads crash at once: one crash is saved, the other waits for it, and the process
/// dies of the signal (no hang).
#[test]
fn two_threads_crashing_at_once_save_one_crash_and_die() {
    let (cmd, dir) = child_of_this_test("two-crashers");
    let out = run(cmd);
    assert_died_of(&out, libc::SIGSEGV);
    let tp = open_trace(&dir, &out);
    let crashes = tp.crashes().unwrap();
    assert_eq!(crashes.len(), 1, "{crashes:?}");
    let thread = crashes[0].thread.clone().unwrap();
    assert!(thread == "crasher-a" || thread == "crasher-b", "{thread}");
    the_crash(&tp, &thread);
    assert_eq!(zones(&tp, "crasher-a", "before"), 1);
    assert_eq!(zones(&tp, "crasher-b", "before"), 1);
}

#[test]
fn a_signal_handler_installed_before_tachyon_still_runs() {
    a_user_signal_handler_runs("handler-before");
}

#[test]
fn a_signal_handler_installed_after_tachyon_runs_and_can_chain_to_it() {
    a_user_signal_handler_runs("handler-after");
}

/// The child installs its own SIGSEGV handler (before or after Tachyon's, by `scenario`) and
/// crashes: the handler runs, the process dies of SIGSEGV, and the trace holds the crash.
fn a_user_signal_handler_runs(scenario: &str) {
    let (cmd, dir) = child_of_this_test(scenario);
    let out = run(cmd);
    assert_died_of(&out, libc::SIGSEGV);
    assert!(
        text(&out.stderr).contains("user handler ran"),
        "{}",
        describe(&out)
    );
    // libtest runs the child's scenario on a thread named after the test.
    the_crash(&open_trace(&dir, &out), "child");
}

/// The child died of `signal`, as it would have without Tachyon.
fn assert_died_of(out: &Output, signal: i32) {
    assert_eq!(out.status.signal(), Some(signal), "{}", describe(out));
}

#[test]
fn panic_hooks_installed_before_and_after_tachyon_still_run() {
    for scenario in ["hook-before", "hook-after"] {
        let (cmd, dir) = child_of_this_test(scenario);
        let out = run(cmd);
        assert_eq!(
            out.status.code(),
            Some(101),
            "{scenario}: {}",
            describe(&out)
        );
        assert!(
            text(&out.stderr).contains("user hook ran"),
            "{scenario}: {}",
            describe(&out)
        );
        let tp = open_trace(&dir, &out);
        let crashes = tp.crashes().unwrap();
        assert_eq!(crashes.len(), 1, "{scenario}: {crashes:?}");
        assert_eq!(crashes[0].message.as_deref(), Some("child panics"));
    }
}

#[test]
fn a_caught_panic_is_recorded_and_tracing_goes_on() {
    let (cmd, dir) = child_of_this_test("caught-panic");
    let out = run(cmd);
    assert!(out.status.success(), "{}", describe(&out));
    let tp = open_trace(&dir, &out);
    let crashes = tp.crashes().unwrap();
    assert_eq!(crashes.len(), 1, "{crashes:?}");
    assert_eq!(crashes[0].message.as_deref(), Some("caught"));
    assert_eq!(crashes[0].thread.as_deref(), Some("panicker"));
    assert_eq!(zones(&tp, "main", "after the panic"), 1);
}

#[test]
fn tachyon_no_crash_handler_installs_nothing() {
    // The check can fail: with the handler, the dispositions change.
    let (cmd, _) = child_of_this_test("dispositions");
    let out = run(cmd);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        text(&out.stdout).contains("dispositions changed"),
        "{}",
        describe(&out)
    );

    let (mut cmd, dir) = child_of_this_test("dispositions");
    cmd.env("TACHYON_NO_CRASH_HANDLER", "1");
    let out = run(cmd);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        text(&out.stdout).contains("dispositions unchanged"),
        "{}",
        describe(&out)
    );
    // And the caught panic left no event: no hook either.
    assert!(open_trace(&dir, &out).crashes().unwrap().is_empty());
}

/// A panic with `panic = "abort"`: a small program built by rustc against this build's
/// `tachyon` (the test binary cannot change its own panic strategy).
#[test]
fn a_panic_with_panic_abort_saves_the_trace_and_aborts() {
    let Some(exe) = build_panic_abort_fixture() else {
        eprintln!("skipped: rustc could not build the panic=abort fixture");
        return;
    };
    let dir = scratch("panic_abort");
    let out = run(command(&exe, &dir));
    assert_died_of(&out, libc::SIGABRT);
    let tp = open_trace(&dir, &out);
    let crashes = tp.crashes().unwrap();
    assert_eq!(crashes.len(), 2, "the panic, then the abort: {crashes:?}");
    assert_eq!(crashes[0].name, "panic");
    assert_eq!(crashes[0].message.as_deref(), Some("fixture panics"));
    assert_eq!(crashes[1].signal.as_deref(), Some("SIGABRT"));
    assert_eq!(crashes[1].cause.as_deref(), Some("panic: fixture panics"));
    assert_eq!(zones(&tp, "main", "fixture zone"), 10);
    let mut base = command(&exe, &dir);
    base.env("TACHYON_NO_CRASH_HANDLER", "1");
    assert_same_death(&out, without_handler(base));
}

fn build_panic_abort_fixture() -> Option<PathBuf> {
    let deps = std::env::current_exe().ok()?.parent()?.to_path_buf();
    // The rlibs this test binary was linked with sit beside it; several builds of `tachyon`
    // (other features) may too: the newest first, and rustc refuses one that does not fit.
    let mut rlibs: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&deps)
        .ok()?
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("libtachyon-") && n.ends_with(".rlib")
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    rlibs.sort_by_key(|r| std::cmp::Reverse(r.0));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/panic_abort.rs");
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("panic_abort_fixture_{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).ok()?;
    let exe = out_dir.join("panic_abort");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    for (_, rlib) in rlibs {
        let status = Command::new(&rustc)
            .args([
                "--edition",
                "2021",
                "-C",
                "panic=abort",
                "-C",
                "debuginfo=0",
            ])
            .arg("--extern")
            .arg(format!("tachyon={}", rlib.display()))
            .arg("-L")
            .arg(format!("dependency={}", deps.display()))
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .output()
            .ok()?;
        if status.status.success() {
            return Some(exe);
        }
        eprintln!("{}: {}", rlib.display(), text(&status.stderr));
    }
    None
}

// === The child side ===

/// Runs the scenario named in [`CHILD_ENV`]; nothing when it is unset (a normal test run).
#[test]
fn child() {
    let Ok(scenario) = std::env::var(CHILD_ENV) else {
        return;
    };
    match scenario.as_str() {
        "threads" => threads(),
        "queued" => queued(),
        "handler-before" => {
            install_user_handler(false);
            start();
            null_deref();
        }
        "handler-after" => {
            start();
            install_user_handler(true);
            null_deref();
        }
        "hook-before" => {
            user_hook();
            start();
            panic!("child panics");
        }
        "hook-after" => {
            start();
            user_hook();
            panic!("child panics");
        }
        "caught-panic" => {
            start();
            tachyon::set_thread_name("main");
            let r = std::thread::Builder::new()
                .name("panicker".into())
                .spawn(|| {
                    let _z = tachyon::zone!("doomed");
                    panic!("caught");
                })
                .unwrap()
                .join();
            assert!(r.is_err());
            drop(tachyon::zone!("after the panic"));
            tachyon::shutdown().unwrap();
        }
        "in-argument" => {
            start();
            std::thread::Builder::new()
                .name("bystander".into())
                .spawn(|| {
                    for _ in 0..BEFORE {
                        let _z = tachyon::zone!("before");
                    }
                })
                .unwrap()
                .join()
                .unwrap();
            // The argument is evaluated while this thread holds its tracing state.
            let _z = tachyon::zone!(
                "test",
                "crashing",
                value = {
                    null_deref();
                    1
                }
            );
        }
        "second-session" => {
            // A first session, ended: its file is written normally.
            let first = std::env::var("TACHYON_OUT").unwrap() + ".first";
            tachyon::start(tachyon::Config {
                output: Some(first.into()),
                ..tachyon::Config::from_env().unwrap()
            })
            .unwrap();
            drop(tachyon::zone!("first"));
            tachyon::shutdown().unwrap();
            // The handler, installed by the first, saves the second.
            start();
            drop(tachyon::zone!("second"));
            null_deref();
        }
        "init" => {
            tachyon::init().unwrap();
            drop(tachyon::zone!("before"));
            null_deref();
        }
        "two-crashers" => {
            start();
            let go = Arc::new(Barrier::new(2));
            let threads: Vec<_> = ["crasher-a", "crasher-b"]
                .into_iter()
                .map(|name| {
                    let go = Arc::clone(&go);
                    std::thread::Builder::new()
                        .name(name.into())
                        .spawn(move || {
                            let _z = tachyon::zone!("before");
                            go.wait();
                            null_deref();
                        })
                        .unwrap()
                })
                .collect();
            for t in threads {
                let _ = t.join();
            }
        }
        "dispositions" => {
            let before = dispositions();
            start();
            let after = dispositions();
            let _ = std::panic::catch_unwind(|| panic!("caught"));
            tachyon::shutdown().unwrap();
            if before == after {
                println!("dispositions unchanged");
            } else {
                println!("dispositions changed");
            }
        }
        other => panic!("unknown scenario {other}"),
    }
}

fn start() {
    tachyon::start(tachyon::Config::from_env().unwrap()).unwrap();
}

#[inline(never)]
fn null_deref() {
    let p: *const u64 = std::hint::black_box(std::ptr::null());
    // SAFETY: none: reads address 0 on purpose, to crash with SIGSEGV.
    let v = unsafe { p.read_volatile() };
    println!("unreachable: {v}");
}

/// Three workers write [`BEFORE`] zones, then keep tracing; once they all have, a fourth
/// thread writes its own and dereferences address 8.
fn threads() {
    workers_then_crash(
        || {
            for _ in 0..BEFORE {
                let _z = tachyon::zone!("before");
            }
        },
        || {
            // Tracing while the crash happens (usually: nothing depends on it), bounded.
            for i in 0..AFTER {
                let _z = tachyon::zone!("after");
                tachyon::instant!("tick");
                if i % 64 == 0 {
                    std::thread::yield_now();
                }
            }
        },
        BEFORE,
    );
}

/// Three workers each queue [`QUEUED`] zones and wait; as soon as they all have, a fourth
/// thread dereferences address 8, usually while the `tachyon-drain` thread is still encoding
/// their queues.
fn queued() {
    workers_then_crash(
        || {
            for _ in 0..QUEUED {
                let _z = tachyon::zone!("queued");
            }
        },
        || {},
        0,
    );
}

/// Starts the session; three workers (`worker-0` to `worker-2`) run `before`, wait for one
/// another, run `after` and park; once they have all waited, a fourth thread (`crasher`) writes
/// `crasher_zones` zones named "crasher before" and dereferences address 8.
fn workers_then_crash(before: fn(), after: fn(), crasher_zones: usize) {
    start();
    let ready = Arc::new(Barrier::new(4));
    for i in 0..3 {
        let ready = Arc::clone(&ready);
        std::thread::Builder::new()
            .name(format!("worker-{i}"))
            .spawn(move || {
                before();
                ready.wait();
                after();
                loop {
                    std::thread::park();
                }
            })
            .unwrap();
    }
    let crasher = std::thread::Builder::new()
        .name("crasher".into())
        .spawn(move || {
            ready.wait();
            for _ in 0..crasher_zones {
                let _z = tachyon::zone!("crasher before");
            }
            let p: *const u64 = std::hint::black_box(std::ptr::without_provenance(8));
            // SAFETY: none: reads address 8 on purpose, to crash with SIGSEGV.
            let v = unsafe { p.read_volatile() };
            println!("unreachable: {v}");
        })
        .unwrap();
    let _ = crasher.join();
    unreachable!("the crash ends the process");
}

static USER_PREVIOUS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A user's SIGSEGV handler: says so on stderr, then either chains to the handler it replaced
/// (`chain`: installed after Tachyon's) or puts the default back and returns (the fault
/// repeats and kills the process).
fn install_user_handler(chain: bool) {
    extern "C" fn user_handler(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        let msg = b"user handler ran\n";
        // SAFETY: write(2) of a static buffer, async-signal-safe.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
        let prev = USER_PREVIOUS.load(std::sync::atomic::Ordering::Relaxed);
        if prev != 0 && prev != libc::SIG_DFL && prev != libc::SIG_IGN {
            // SAFETY: the SA_SIGINFO handler this one replaced (Tachyon's), with the kernel's
            // arguments.
            let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(prev) };
            f(sig, info, ctx);
        } else {
            // SAFETY: resets SIGSEGV to its default action.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
    // SAFETY: installs a complete SA_SIGINFO action whose handler has the matching signature;
    // the previous action is read into `old`.
    unsafe {
        let mut new: libc::sigaction = std::mem::zeroed();
        let mut old: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = user_handler as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut new.sa_mask);
        libc::sigaction(libc::SIGSEGV, &new, &mut old);
        if chain {
            USER_PREVIOUS.store(old.sa_sigaction, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// A user's panic hook that says so on stderr and chains to the hook it replaced.
fn user_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        eprintln!("user hook ran");
        previous(info);
    }));
}

/// The handlers of the crash signals, and whether this thread has an alternate stack.
fn dispositions() -> Vec<usize> {
    let mut v = Vec::new();
    for sig in [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGABRT,
    ] {
        // SAFETY: reads the current action into `old`.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old);
            v.push(old.sa_sigaction);
        }
    }
    v
}

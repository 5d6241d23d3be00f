//! The crash handler: when the process crashes, the trace is saved, then the process dies as it
//! would have without Tachyon.
//!
//! Installed once, by the first session that has somewhere to save the trace (a file, or a
//! `tachyon traced` daemon), unless `TACHYON_NO_CRASH_HANDLER=1`; it acts while such a session
//! runs and forwards to the previous handlers otherwise.
//!
//! # Fatal signals
//!
//! `SIGSEGV`, `SIGBUS`, `SIGILL`, `SIGFPE` and `SIGABRT` get a handler (`SA_SIGINFO |
//! SA_ONSTACK`) that runs on an alternate signal stack, so a stack overflow is caught too: Rust's
//! std gives its own threads one, and every thread Tachyon knows without one gets one of ours
//! (`thread_started`). The handler only does async-signal-safe work:
//!
//! 1. claims the crash with one compare-and-swap on `CRASHER` (the crashing thread's id): a
//!    second crash on another thread waits (bounded) for the first to finish and then dies as it
//!    would have; a crash of the crashing thread itself while the crash is handled (a fault in
//!    the handler, or std's `abort` after its stack-overflow message) goes straight on to the
//!    previous handler;
//! 2. ends the recording (`EPOCH` = 0: every thread's queue closes at its next event), notes the
//!    signal, its code, the faulting address, the interrupted instruction and stack pointers
//!    and the counter's reading in atomics;
//! 3. wakes the `tachyon-crash` helper thread (started with the handler) with one `write(2)` on a
//!    pipe, and waits for it on a futex, at most [`CRASH_BUDGET`] beyond the session's stop
//!    timeout (`Config::stop_timeout`, which the save may spend waiting for busy writers);
//! 4. puts the previous action back and re-raises: a fault returns to the faulting instruction,
//!    which faults again into the previous action; a signal that was sent (`abort`, `kill`) is
//!    sent again to the thread and arrives when the handler returns. The exit status and the core
//!    dump are those the process would have had.
//!
//! The helper, in a normal context, writes the crash event (a `TrackEvent` instant named
//! `crash: SIGSEGV` etc. in category [`CRASH_CATEGORY`], with debug annotations) on the
//! crashing thread's track through a writer of its own, then does what [`shutdown`] does:
//! every thread's queued events are encoded, the writers flush, and the trace file is written
//! (in system mode: the commits are sent to the daemon, which also scrapes what was left in the
//! shared memory when the process dies). It never waits for a lock the crashed thread may hold
//! without the crashed thread's wait being bounded: at worst the trace is lost, never the
//! process's death.
//!
//! Other threads are not frozen (Tracy stops them with a signal whose handler sleeps): a
//! frozen thread may hold a lock the helper needs, the allocator's above all. Closing the
//! queues stops the recording instead; the threads run on until the re-raise ends the process,
//! and flush their own writers when they find the session ended.
//!
//! # Panics
//!
//! A panic hook, chained before the previous one (the user's, or std's default that prints the
//! message), records a `panic` instant with the message, the location and the panicking
//! thread's backtrace, through the helper (the panicking thread may hold a lock the writing
//! needs; its wait is bounded). A panic is not a crash by itself: it may be caught. With
//! `panic = "abort"` the abort that follows is one (`SIGABRT`, whose crash event names the
//! panic as its cause); with unwinding, a panic that ends the process (out of `main`, exit status
//! 101) has the trace written at exit (`at_exit_after_panic`), the session having been left
//! running.
//!
//! # Call stacks
//!
//! A panic's event carries the panicking thread's backtrace (std's, taken in the hook), twice:
//! one `function (file:line:column)` per line in the `stack` annotation (which `tachyon stats`
//! prints), and as Perfetto's inline `TrackEvent.callstack` (which Perfetto's trace processor
//! links to the event). A signal's crash event carries no call stack yet: the crashed thread's
//! stack must be walked in the handler, with async-signal-safe code, from the interrupted
//! context. That is the SDK's call-stack capture's job; it plugs in at `linux.rs`'s `record` (raw frames into
//! the crash record, beside `REC_PC`) and `save_crash` (symbolized by the helper into
//! `CrashEvent::stack`, written both ways as for a panic).
//!
//! # Cost
//!
//! Nothing on the hot path. A thread's first event checks its alternate stack (one
//! `sigaltstack` call). A panic while a session runs captures and symbolizes a backtrace (as
//! std's hook does with `RUST_BACKTRACE=1`) before the previous hook runs.
//!
//! # Limits
//!
//! - A program that recovers from these signals on purpose (a JIT or a garbage collector
//!   catching faults on guard pages, with its handler installed before Tachyon's) sees its first
//!   such fault taken for a crash: the trace is saved and the session ends before its handler
//!   runs. Such programs set `TACHYON_NO_CRASH_HANDLER=1`.
//! - A stack overflow on a thread with no alternate stack (made by foreign code, and never
//!   traced) cannot run any handler: the kernel kills the process, and the trace is lost.
//! - When the crashing thread was inside Tachyon holding its own state (evaluating an event's
//!   argument, say), its unfinished chunk is not flushed (its writer may be mid-packet); every
//!   other thread's events are saved.
//! - An in-memory session ([`Config::in_memory`](crate::Config::in_memory)) has nowhere to
//!   save to: it installs nothing.
//!
//! [`shutdown`]: crate::shutdown

use std::time::Duration;

/// Category of the crash and panic events.
pub const CRASH_CATEGORY: &str = "tachyon.crash";

/// How long a crashing thread waits for its trace to be saved, beyond the session's stop
/// timeout, before it dies anyway (a helper stuck on a lock the crash left held, a disk that
/// does not answer).
pub const CRASH_BUDGET: Duration = Duration::from_secs(10);

/// The environment variable that keeps the handler from being installed.
pub const NO_CRASH_HANDLER_ENV: &str = "TACHYON_NO_CRASH_HANDLER";

#[cfg(target_os = "linux")]
pub(crate) use linux::{arm, disarm, thread_started};

/// Installs the handler if needed and makes it save the session starting now, whose stop
/// waits up to `stop_timeout` for writers (see the module docs). Nothing where signals are not
/// supported.
#[cfg(not(target_os = "linux"))]
pub(crate) fn arm(_stop_timeout: Duration) {}

/// The session ended: the handler forwards to the previous handlers again.
#[cfg(not(target_os = "linux"))]
pub(crate) fn disarm() {}

/// A thread's first event: nothing to do without signal support.
#[cfg(not(target_os = "linux"))]
pub(crate) fn thread_started() {}

/// Whether the environment turns the handler off.
pub(crate) fn disabled_by_env() -> bool {
    disables(std::env::var(NO_CRASH_HANDLER_ENV).ok().as_deref())
}

/// Whether a value of [`NO_CRASH_HANDLER_ENV`] turns the handler off: set to anything but an
/// empty or negative value (`0`, `false`, `no`, `off`).
fn disables(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "" | "0" | "false" | "no" | "off"
        )
    })
}

/// The conventional name of a signal number.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        11 => "SIGSEGV",
        _ => "signal",
    }
}

/// The name of a signal's `si_code` (Linux values; `si_code <= 0` means the signal was sent).
pub fn signal_code_name(sig: i32, code: i32) -> &'static str {
    match (sig, code) {
        (_, 0) => "SI_USER",
        (_, -1) => "SI_QUEUE",
        (_, -6) => "SI_TKILL",
        (_, c) if c < 0 => "sent",
        (11, 1) => "SEGV_MAPERR",
        (11, 2) => "SEGV_ACCERR",
        (11, 3) => "SEGV_BNDERR",
        (11, 4) => "SEGV_PKUERR",
        (7, 1) => "BUS_ADRALN",
        (7, 2) => "BUS_ADRERR",
        (7, 3) => "BUS_OBJERR",
        (4, 1) => "ILL_ILLOPC",
        (4, 2) => "ILL_ILLOPN",
        (4, 3) => "ILL_ILLADR",
        (4, 4) => "ILL_ILLTRP",
        (4, 5) => "ILL_PRVOPC",
        (4, 6) => "ILL_PRVREG",
        (4, 7) => "ILL_COPROC",
        (4, 8) => "ILL_BADSTK",
        (8, 1) => "FPE_INTDIV",
        (8, 2) => "FPE_INTOVF",
        (8, 3) => "FPE_FLTDIV",
        (8, 4) => "FPE_FLTOVF",
        (8, 5) => "FPE_FLTUND",
        (8, 6) => "FPE_FLTRES",
        (8, 7) => "FPE_FLTINV",
        (8, 8) => "FPE_FLTSUB",
        _ => "unknown",
    }
}

/// One debug annotation of a crash event.
#[derive(Clone, Debug)]
enum Arg {
    Str(String),
    Int(i64),
    Ptr(u64),
    Bool(bool),
}

/// A crash or panic event, as the helper writes it.
#[derive(Debug)]
struct CrashEvent {
    /// `crash: SIGSEGV`, `panic`.
    name: String,
    /// Trace-clock nanoseconds.
    ts: u64,
    tid: i64,
    args: Vec<(&'static str, Arg)>,
    /// The call stack, innermost frame first (empty: none recorded).
    stack: Vec<Frame>,
}

/// One frame of a crash's call stack.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Frame {
    function: String,
    file: Option<String>,
    line: Option<u32>,
    column: Option<u32>,
}

impl Frame {
    /// `function (file:line:column)`, as the `stack` annotation lists frames.
    fn line_text(&self) -> String {
        let mut s = self.function.clone();
        if let Some(f) = &self.file {
            s.push_str(" (");
            s.push_str(f);
            for n in [self.line, self.column].into_iter().flatten() {
                s.push_str(&format!(":{n}"));
            }
            s.push(')');
        }
        s
    }
}

/// Writes `ev` into the session `session` (if it is the running one) through a writer of its
/// own: the crashing thread's track descriptor (so the event has its track even when the
/// thread's own descriptor was overwritten in a ring buffer, or it never traced), then the
/// instant. Self-contained packets (no interning, absolute trace-clock timestamp), flushed at
/// once. False if there is no such session or no writer to be had.
fn write_crash_event(session: u32, ev: &CrashEvent) -> bool {
    use crate::track_event::global;
    use crate::track_event::state;
    use tachyon_protos::track_event;

    let Some(handle) = global::current_session(session) else {
        return false;
    };
    let Ok(mut w) = handle.arbiter.create_trace_writer(handle.target_buffer) else {
        return false;
    };
    let pid = global::process().pid;
    let uuid = state::thread_track_uuid(ev.tid);
    let thread_name = state::thread_name_of(ev.tid).or_else(|| os_thread_name(ev.tid));
    let clock_id = crate::clock::TRACE_CLOCK_ID;
    w.write_packet(|p| {
        p.set_timestamp(ev.ts);
        p.set_timestamp_clock_id(clock_id);
        let mut d = p.set_track_descriptor();
        d.set_uuid(uuid);
        let mut t = d.set_thread();
        t.set_pid(pid);
        t.set_tid(ev.tid);
        if let Some(n) = &thread_name {
            t.set_thread_name(n);
        }
    });
    w.write_packet(|p| {
        p.set_timestamp(ev.ts);
        p.set_timestamp_clock_id(clock_id);
        let mut e = p.set_track_event();
        e.set_type(track_event::Type::Instant);
        e.set_track_uuid(uuid);
        e.add_categories(CRASH_CATEGORY);
        e.set_name(&ev.name);
        if let Some(n) = &thread_name {
            let mut a = e.add_debug_annotations();
            a.set_name("thread");
            a.set_string_value(n);
        }
        for (name, value) in &ev.args {
            let mut a = e.add_debug_annotations();
            a.set_name(name);
            match value {
                Arg::Str(s) => a.set_string_value(s),
                Arg::Int(v) => a.set_int_value(*v),
                Arg::Ptr(v) => a.set_pointer_value(*v),
                Arg::Bool(v) => a.set_bool_value(*v),
            }
        }
        if !ev.stack.is_empty() {
            // Twice: as text (every reader shows an argument; `tachyon stats` prints it) and as
            // Perfetto's inline call stack (outermost frame first), which its UI shows as one.
            let text: Vec<String> = ev.stack.iter().map(Frame::line_text).collect();
            let mut a = e.add_debug_annotations();
            a.set_name("stack");
            a.set_string_value(&text.join("\n"));
            drop(a);
            let mut cs = e.set_callstack();
            for f in ev.stack.iter().rev() {
                let mut fr = cs.add_frames();
                fr.set_function_name(&f.function);
                if let Some(file) = &f.file {
                    fr.set_source_file(file);
                }
                if let Some(line) = f.line {
                    fr.set_line_number(line);
                }
            }
        }
    });
    w.flush();
    true
}

/// Where `pc` lies in the process's mappings, as `path+0xADDRESS` with the address
/// `addr2line -e path` takes: the ELF virtual address (`pc` less the load bias of a
/// position-independent file, whose mapping at file offset 0 is its base). From
/// `/proc/self/maps` and the file's ELF header.
fn module_offset(pc: u64) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    // (start, end, file offset, path) of each file mapping.
    let mappings: Vec<(u64, u64, u64, &str)> = maps
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, _perms, offset) = (f.next()?, f.next()?, f.next()?);
            let path = f.nth(2).filter(|p| p.starts_with('/'))?;
            let (start, end) = range.split_once('-')?;
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
                u64::from_str_radix(offset, 16).ok()?,
                path,
            ))
        })
        .collect();
    let &(_, _, _, path) = mappings.iter().find(|m| m.0 <= pc && pc < m.1)?;
    let base = mappings
        .iter()
        .filter(|m| m.3 == path && m.2 == 0)
        .map(|m| m.0)
        .min()?;
    // e_type (little-endian u16 at byte 16): 2 is a fixed-address executable, whose virtual
    // addresses are the run-time ones.
    let mut header = [0u8; 18];
    std::io::Read::read_exact(&mut std::fs::File::open(path).ok()?, &mut header).ok()?;
    if &header[..4] != b"\x7fELF" {
        return None;
    }
    let fixed = u16::from_le_bytes([header[16], header[17]]) == 2;
    let address = if fixed { pc } else { pc - base };
    Some(format!("{path}+{address:#x}"))
}

/// The kernel's name of thread `tid` of this process (at most 15 bytes).
fn os_thread_name(tid: i64) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
    let name = comm.trim_end_matches('\n');
    (!name.is_empty()).then(|| name.to_owned())
}

/// What the panic hook found, for the helper to write.
#[derive(Debug)]
struct PanicRecord {
    /// The session running when the thread panicked.
    session: u32,
    tid: i64,
    ticks: u64,
    message: String,
    location: Option<String>,
    /// Innermost frame first.
    stack: Vec<Frame>,
}

impl PanicRecord {
    fn event(self, clock: &crate::clock::Clock) -> CrashEvent {
        let mut args = vec![("message", Arg::Str(self.message))];
        if let Some(l) = self.location {
            args.push(("location", Arg::Str(l)));
        }
        CrashEvent {
            name: "panic".into(),
            ts: clock.ticks_to_ns(self.ticks),
            tid: self.tid,
            args,
            stack: self.stack,
        }
    }
}

/// The frames of a captured backtrace (std's text form), innermost first, from the frame that
/// panicked: without the panic machinery above it (up to std's `begin_panic` /
/// `rust_begin_unwind` / `core::panicking` frames, and `unwrap`'s and `expect`'s helpers) nor
/// the runtime below `main` (from `__rust_begin_short_backtrace`, where std's own short
/// backtraces stop).
fn trim_backtrace(text: &str) -> Vec<Frame> {
    // A frame is a `N: function` line followed by its `at file:line:column` lines (one per
    // inlined call: the first is the frame's own position).
    let mut frames: Vec<Frame> = Vec::new();
    for line in text.lines().map(str::trim) {
        match line.split_once(": ") {
            Some((n, f)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                frames.push(Frame {
                    function: f.to_owned(),
                    file: None,
                    line: None,
                    column: None,
                });
            }
            _ => {
                let (Some(at), Some(last)) = (line.strip_prefix("at "), frames.last_mut()) else {
                    continue;
                };
                if last.file.is_none() {
                    // `file:line:column`; the file may hold colons itself.
                    let mut parts = at.rsplitn(3, ':');
                    let (c, l, f) = (parts.next(), parts.next(), parts.next());
                    match (
                        f,
                        l.and_then(|l| l.parse().ok()),
                        c.and_then(|c| c.parse().ok()),
                    ) {
                        (Some(f), Some(l), Some(c)) => {
                            last.file = Some(f.to_owned());
                            last.line = Some(l);
                            last.column = Some(c);
                        }
                        _ => last.file = Some(at.to_owned()),
                    }
                }
            }
        }
    }
    // The runtime below `main` (which catches unwinds too) is cut first, so its frames are not
    // taken for the panic's.
    if let Some(end) = frames
        .iter()
        .position(|f| f.function.contains("__rust_begin_short_backtrace"))
    {
        frames.truncate(end);
    }
    let machinery = |f: &str| {
        f.contains("core::panicking::")
            || f.contains("rust_begin_unwind")
            || f.contains("std::panicking::begin_panic")
            || f.contains("rust_panic_with_hook")
            // `unwrap`/`expect` failing: their panic helpers, not the caller.
            || f.contains("unwrap_failed")
            || f.contains("expect_failed")
    };
    let first = frames
        .iter()
        .rposition(|f| machinery(&f.function))
        .map_or(0, |i| i + 1);
    frames.split_off(first)
}

#[cfg(target_os = "linux")]
mod linux;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_turns_the_handler_off_with_any_positive_value() {
        assert!(!disables(None));
        for v in ["", "0", "false", "No", " off "] {
            assert!(!disables(Some(v)), "{v:?}");
        }
        for v in ["1", "true", "yes", "on"] {
            assert!(disables(Some(v)), "{v:?}");
        }
    }

    #[test]
    fn signals_and_codes_have_their_names() {
        assert_eq!(signal_name(11), "SIGSEGV");
        assert_eq!(signal_name(6), "SIGABRT");
        assert_eq!(signal_code_name(11, 1), "SEGV_MAPERR");
        assert_eq!(signal_code_name(8, 1), "FPE_INTDIV");
        assert_eq!(signal_code_name(6, -6), "SI_TKILL");
        assert_eq!(signal_code_name(6, 0), "SI_USER");
    }

    #[test]
    fn a_backtrace_is_cut_to_the_panicking_frames() {
        let text = "   0: std::backtrace::Backtrace::force_capture
             at /rustc/x/library/std/src/backtrace.rs:312:9
   1: tachyon::crash::linux::on_panic
   2: std::panicking::panic_with_hook
             at /rustc/x/library/std/src/panicking.rs:842:13
   3: __rustc::rust_begin_unwind
   4: core::panicking::panic_fmt
             at /rustc/x/library/core/src/panicking.rs:80:14
   5: app::parse
             at ./src/parse.rs:10:5
             at ./src/inline.rs:3:1
   6: app::main
             at ./src/main.rs:4:5
   7: std::sys::backtrace::__rust_begin_short_backtrace
   8: std::rt::lang_start_internal
   9: std::panic::catch_unwind
  10: main";
        let frames = trim_backtrace(text);
        let lines: Vec<String> = frames.iter().map(Frame::line_text).collect();
        assert_eq!(
            lines,
            [
                "app::parse (./src/parse.rs:10:5)",
                "app::main (./src/main.rs:4:5)"
            ]
        );
        assert_eq!(frames[0].line, Some(10));
        assert!(trim_backtrace("").is_empty());
    }
}

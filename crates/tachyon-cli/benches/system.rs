//! System mode: what a zone costs the instrumented thread when the trace goes to a daemon in
//! another process, beside the same zone in-process and the clock reads it cannot avoid; then
//! the sustained event rate several producer processes reach into one daemon session.
//!
//! Criterion, in one run:
//!
//! - `system/zone/enabled`: `let _z = tachyon::zone!("bench zone")` (as `client/zone/enabled`
//!   in `crates/tachyon/benches/client.rs`) in this process, a producer of a `tachyon traced`
//!   daemon running in a child process (this executable re-run as the daemon), into a session
//!   with one 64 MiB ring buffer (the size `tachyon record` uses by default).
//! - `inprocess/zone/enabled`: the same zone into an in-process session
//!   (`tachyon::start(Config { output: None, .. })`, a 64 MiB ring buffer).
//! - `baseline/two_timestamps`: two raw reads of the trace clock's counter, as `client.rs`
//!   reads it (`tachyon::clock::clock().ticks()`).
//!
//! The ratios between them, from the same samples, are printed after criterion.
//!
//! Then the sustained run (printed, not criterion): N = 1, 2, 4 producer processes (this
//! executable re-run as producers), each writing zones as fast as it can on one thread for
//! about a second with the SDK's defaults (4 MiB SMB asked for, stall-then-drop when full),
//! into one session of the daemon streaming into a file every 100 ms from a 64 MiB ring
//! buffer. The file is read back: events counted against what the producers say they wrote,
//! loss counters from the session's `TraceStats`, the producers' own drop counters, and
//! `previous_packet_dropped` marks (read from the raw trace; the trace processor's `stats` has
//! them per buffer as `traced_buf_sequence_packet_loss`). When a full-speed run loses anything, the producers pace
//! themselves to half the rate reached, halving until nothing is lost, then two bisection
//! steps towards the lossy rate; the line `sustained X events/s with zero loss` gives the
//! result for each N. Last, the same producers at full speed into a session that only stores
//! (no streaming, read at the end): the daemon's intake without the file drain, where the
//! only loss is the ring overwriting its oldest events once 64 MiB are written. Then the
//! in-process `write_into_file` figure: N = 1, 2, 4 threads of this process into an in-process
//! session (`Config::stream`, `stream_period` 100 ms, the same 64 MiB ring buffer), counted back
//! from its file and searched for the zero-loss rate the same way (`N=… in-process threads:
//! sustained X events/s with zero loss`); `TACHYON_PREFAULT=1` maps its ring when the session
//! starts. Every round prints the CPU time each thread spent per event.
//!
//! Run: `cargo bench -p tachyon-cli --bench system`. `TACHYON_BENCH_QUICK=1` shortens
//! everything (criterion 0.5 s warm-up and 1 s measurement, 0.5 s producer runs). A criterion
//! filter that does not match `sustained` skips the sustained run.

use std::fs::File;
use std::hint::black_box;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use protozero::{HeapBuffered, ProtoDecoder};
use tachyon::Config;
use tachyon_protos::{trace_config, TraceConfig, TraceStatsView};
use tachyon_traced::{Consumer, Daemon, DaemonConfig};

/// The role of a re-run of this executable: `daemon` or `producer` (absent: the benchmark).
const ROLE: &str = "TACHYON_SYSTEM_BENCH_ROLE";
/// The daemon's socket directory.
const DIR: &str = "TACHYON_SYSTEM_BENCH_DIR";
/// A producer's daemon socket.
const SOCKET: &str = "TACHYON_SYSTEM_BENCH_SOCKET";
/// How long a producer writes, in seconds.
const SECONDS: &str = "TACHYON_SYSTEM_BENCH_SECONDS";
/// A producer's target rate in events per second (0: as fast as it can).
const RATE: &str = "TACHYON_SYSTEM_BENCH_RATE";

/// Central buffer size of every session (`tachyon record`'s default).
const BUFFER_KB: u32 = 64 * 1024;

fn quick() -> bool {
    std::env::var_os("TACHYON_BENCH_QUICK").is_some()
}

/// `TACHYON_PREFAULT=1`: every session's ring is mapped when the session starts, the daemon's
/// (`DaemonConfig::prefault_buffers`, as `tachyon traced --prefault-buffers`) and the
/// in-process one (`Config::prefault_buffer`, as the SDK reads the variable), before the
/// round's clock starts.
fn prefault() -> bool {
    std::env::var_os("TACHYON_PREFAULT").is_some_and(|v| v == "1")
}

// === CPU time per thread ===

/// CPU time (user + system) of each live thread of process `pid` whose name is `comm`, summed,
/// in nanoseconds (`/proc/PID/task/TID/schedstat`, the scheduler's own count, since the thread
/// started), and the share of it spent in the kernel (from the same threads' `stat` ticks).
fn threads_cpu(pid: u32, comm: &str) -> (u64, f64) {
    let c = threads_counts(pid, comm);
    (c.ns, c.kernel)
}

/// What [`threads_cpu`] reads, with the threads' minor page faults and context switches.
#[derive(Clone, Copy, Debug, Default)]
struct ThreadCounts {
    ns: u64,
    kernel: f64,
    /// Clock ticks in user space and in the kernel.
    user: u64,
    system: u64,
    faults: u64,
    switches: u64,
}

fn threads_counts(pid: u32, comm: &str) -> ThreadCounts {
    let (mut ns, mut user, mut system, mut faults, mut switches) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return ThreadCounts::default();
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if name.trim_end() != comm {
            continue;
        }
        let sched = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
        ns += sched
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        let (u, s) = stat_ticks(&stat);
        user += u;
        system += s;
        faults += stat_field(&stat, 10);
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        switches += status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    let kernel = if user + system == 0 {
        0.0
    } else {
        system as f64 / (user + system) as f64
    };
    ThreadCounts {
        ns,
        kernel,
        user,
        system,
        faults,
        switches,
    }
}

/// Field `i` (1-based, as in proc(5); 3 or later) of a `/proc/…/stat` line.
fn stat_field(stat: &str, i: usize) -> u64 {
    stat.rfind(')')
        .and_then(|at| stat[at + 1..].split_whitespace().nth(i - 3)?.parse().ok())
        .unwrap_or(0)
}

/// `utime` and `stime` (clock ticks) of a `/proc/…/stat` line (the fields after the name, which
/// is in parentheses and may hold spaces).
fn stat_ticks(stat: &str) -> (u64, u64) {
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return (0, 0);
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14 and stime 15 (1-based, as in proc(5)).
    let get = |i: usize| f.get(i - 3).and_then(|v| v.parse().ok()).unwrap_or(0);
    (get(14), get(15))
}

/// CPU time of process `pid`, every thread it ever had (exited ones too), in nanoseconds
/// (`/proc/PID/stat` ticks: 10 ms each).
fn process_cpu_ns(pid: u32) -> u64 {
    let (u, s) =
        stat_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default());
    (u + s) * 10_000_000
}

/// This thread's CPU time so far, in nanoseconds.
fn this_thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

// === the roles ===

/// The daemon: runs until its stdin closes (the benchmark process holds it).
fn run_daemon() {
    let dir = PathBuf::from(std::env::var(DIR).expect("the socket directory"));
    let mut config = DaemonConfig::in_dir(&dir);
    config.builtin_data_sources = false;
    config.prefault_buffers = prefault();
    let daemon = Daemon::start(config).expect("start the daemon");
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
        line.clear();
    }
    daemon.shutdown();
}

/// A producer: connects, says `READY`, waits for `go`, writes zones for the given time (as fast
/// as it can, or paced to the given rate), shuts down and prints `RESULT`.
fn run_producer() {
    let socket = PathBuf::from(std::env::var(SOCKET).expect("the producer socket"));
    let seconds: f64 = std::env::var(SECONDS).unwrap().parse().unwrap();
    let rate: f64 = std::env::var(RATE).unwrap().parse().unwrap();
    tachyon::set_process_name("bench producer");
    tachyon::start(Config {
        producer_socket: Some(socket),
        ..Config::default()
    })
    .expect("connect to the daemon");
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let hot_before = this_thread_cpu_ns();
    let (zones, elapsed) = write_zones(seconds, rate);
    let hot_ns = this_thread_cpu_ns() - hot_before;
    // The helpers' CPU since they started (with the session), before the shutdown joins them:
    // the drainer, and the thread that reads the daemon's commands.
    let pid = std::process::id();
    let drain_ns = threads_cpu(pid, "tachyon-drain").0
        + threads_cpu(pid, "tachyon-producer").0
        + threads_cpu(pid, "tachyon-commit").0;
    let report = tachyon::shutdown().unwrap().expect("a session");
    let system = report.system.as_ref().expect("system mode");
    println!(
        "RESULT zones={zones} ns={} hot_ns={hot_ns} drain_ns={drain_ns} dropped={} episodes={} \
         stalls={} started={} lost={}",
        elapsed.as_nanos(),
        report.writers.packets_dropped,
        report.writers.drop_episodes,
        report.writers.stalls,
        system.data_sources_started,
        system.daemon_lost
    );
}

/// Zones on this thread: for `seconds` as fast as it can (`rate` 0), or `rate × seconds` events
/// on a schedule of `rate` events per second; the zones written and the time taken.
///
/// A paced thread writes its whole count whatever the scheduler does: it catches up with the
/// schedule in bursts after each short sleep, and when it cannot keep up (no core, or its
/// writer stalling on a full SMB) it takes longer than `seconds`, so the rate it reports
/// (events over the time taken) is the one it reached, never the target.
fn write_zones(seconds: f64, rate: f64) -> (u64, Duration) {
    let duration = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut zones = 0u64;
    if rate <= 0.0 {
        while start.elapsed() < duration {
            for _ in 0..1000 {
                let _z = tachyon::zone!("bench zone");
            }
            zones += 1000;
        }
    } else {
        // Two events a zone.
        let zones_per_s = rate / 2.0;
        let total = (seconds * zones_per_s) as u64;
        while zones < total {
            let due = ((start.elapsed().as_secs_f64() * zones_per_s) as u64).min(total);
            while zones < due {
                let _z = tachyon::zone!("bench zone");
                zones += 1;
            }
            if zones < total {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
    (zones, start.elapsed())
}

// === processes ===

/// This executable re-run in `role`, stdin and stdout piped; killed on drop.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Proc {
    fn spawn(role: &str, vars: &[(&str, String)]) -> Proc {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TACHYON_") {
                cmd.env_remove(k);
            }
        }
        cmd.env(ROLE, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("re-run the bench executable");
        Proc {
            stdin: child.stdin.take(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
        }
    }

    /// The next line starting with `prefix` (panics at EOF).
    fn line(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "the child exited before printing {prefix}");
            if line.starts_with(prefix) {
                return line.trim().to_owned();
            }
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The daemon child and its sockets.
struct DaemonChild {
    proc: Proc,
    dir: PathBuf,
}

impl DaemonChild {
    fn start() -> DaemonChild {
        let dir = std::env::temp_dir().join(format!("tachyon-bench-system-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        tachyon_ipc::paths::ensure_private_dir(&dir).unwrap();
        let mut vars = vec![(DIR, dir.display().to_string())];
        if prefault() {
            vars.push(("TACHYON_PREFAULT", "1".to_owned()));
        }
        let mut proc = Proc::spawn("daemon", &vars);
        proc.line("READY");
        DaemonChild { proc, dir }
    }

    fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    fn producer_socket(&self) -> PathBuf {
        DaemonConfig::in_dir(&self.dir).producer_socket
    }

    fn consumer(&self) -> Consumer {
        Consumer::connect(&DaemonConfig::in_dir(&self.dir).consumer_socket).unwrap()
    }
}

impl Drop for DaemonChild {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One ring buffer with `track_event`; streaming every `stream_ms` when given.
fn trace_config(stream_ms: Option<u32>) -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    {
        let mut c: TraceConfig<'_> = buf.root();
        {
            let mut b = c.add_buffers();
            b.set_size_kb(BUFFER_KB);
            b.set_fill_policy(trace_config::buffer_config::FillPolicy::RingBuffer);
        }
        {
            let mut ds = c.add_data_sources();
            ds.set_config().set_name("track_event");
        }
        if let Some(ms) = stream_ms {
            c.set_write_into_file(true);
            c.set_file_write_period_ms(ms);
        }
    }
    buf.serialize().unwrap()
}

// === criterion ===

/// Every (iterations, time) sample criterion took, per benchmark id.
static SAMPLES: Mutex<Vec<(&'static str, u64, Duration)>> = Mutex::new(Vec::new());

fn record(id: &'static str, iters: u64, t: Duration) -> Duration {
    SAMPLES.lock().unwrap().push((id, iters, t));
    t
}

/// Median nanoseconds per iteration over the last `n` samples of `id` (the measurement ones:
/// criterion warms up first).
fn median_ns(id: &str, n: usize) -> Option<f64> {
    let samples = SAMPLES.lock().unwrap();
    let mut v: Vec<f64> = samples
        .iter()
        .filter(|s| s.0 == id && s.1 > 0)
        .map(|s| s.2.as_nanos() as f64 / s.1 as f64)
        .collect();
    v = v.split_off(v.len().saturating_sub(n));
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// `{group}/zone/enabled` (its samples kept under `id`) into whatever session is running.
fn bench_zone(c: &mut Criterion, group: &str, id: &'static str) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    g.bench_function("zone/enabled", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                let _z = tachyon::zone!("bench zone");
            }
            record(id, iters, t.elapsed())
        })
    });
    g.finish();
}

fn zones(c: &mut Criterion, daemon: &DaemonChild) {
    // System mode: a session in the daemon first, then this process connects (the SDK's
    // connect waits until the running session is installed).
    let mut consumer = daemon.consumer();
    consumer
        .enable_tracing(&trace_config(None), None)
        .expect("start the daemon session");
    tachyon::start(Config {
        producer_socket: Some(daemon.producer_socket()),
        ..Config::default()
    })
    .expect("connect to the daemon");
    bench_zone(c, "system", "system/zone/enabled");
    let report = tachyon::shutdown().unwrap().expect("a session");
    let system = report.system.as_ref().expect("system mode");
    assert_eq!(system.data_sources_started, 1, "{report}");
    eprintln!(
        "system session: {} chunks committed, {} stalls ({:.1} ms), {} packets dropped",
        report.writers.chunks_committed,
        report.writers.stalls,
        report.writers.stall_ns as f64 / 1e6,
        report.writers.packets_dropped
    );
    consumer.disable_tracing().unwrap();
    consumer
        .wait_for_end(Some(Duration::from_secs(60)))
        .unwrap();
    let _ = consumer.free_buffers();

    // In-process, the same zone.
    tachyon::start(Config {
        output: None,
        buffer_size: (BUFFER_KB as usize) << 10,
        ..Config::default()
    })
    .expect("start the in-process session");
    bench_zone(c, "inprocess", "inprocess/zone/enabled");
    let report = tachyon::shutdown().unwrap().expect("a session");
    eprintln!(
        "in-process session: {} chunks committed, {} stalls, {} packets dropped",
        report.writers.chunks_committed, report.writers.stalls, report.writers.packets_dropped
    );

    let clock = tachyon::clock::clock();
    {
        let mut g = c.benchmark_group("baseline");
        g.throughput(Throughput::Elements(1));
        g.bench_function("two_timestamps", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    let a = clock.ticks();
                    let b = clock.ticks();
                    black_box((a, b));
                }
                record("baseline/two_timestamps", iters, t.elapsed())
            })
        });
        g.finish();
    }
}

fn print_ratios(sample_size: usize) {
    let get = |id| median_ns(id, sample_size);
    let (Some(sys), Some(inp), Some(base)) = (
        get("system/zone/enabled"),
        get("inprocess/zone/enabled"),
        get("baseline/two_timestamps"),
    ) else {
        return;
    };
    println!();
    println!("median of criterion's samples, same run:");
    println!(
        "  system/zone/enabled      {sys:8.2} ns  {:5.2}x two timestamps  {:5.2}x in-process",
        sys / base,
        sys / inp
    );
    println!(
        "  inprocess/zone/enabled   {inp:8.2} ns  {:5.2}x two timestamps",
        inp / base
    );
    println!("  baseline/two_timestamps  {base:8.2} ns");
}

// === sustained throughput ===

/// How a round's session keeps the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Streamed into a file every 100 ms (the sustained case: the buffer is drained as it
    /// fills).
    Stream,
    /// Kept in the ring buffer and read at the end (the daemon's intake alone; a ring that
    /// wraps overwrites the oldest events).
    Ring,
}

/// What one round of N producers did.
#[derive(Debug, Default)]
struct Round {
    producers: usize,
    /// Events (zone begins and ends) the producers wrote.
    written: u64,
    /// Events in the trace.
    in_trace: u64,
    /// The longest producer's writing time.
    seconds: f64,
    /// The producers' own counters: packets dropped when the SMB stayed full (a dropped event
    /// also drops the incremental state the writer re-sends after a loss, so there are more
    /// packets than events), drop episodes, stalls.
    writer_dropped: u64,
    drop_episodes: u64,
    stalls: u64,
    /// From the session's TraceStats: chunks overwritten by the ring, chunks discarded,
    /// ABI violations, packets the writers marked dropped, patches failed.
    overwritten: u64,
    discarded: u64,
    abi_violations: u64,
    writer_packet_loss: u64,
    patches_failed: u64,
    /// Packets marked `previous_packet_dropped` (not first on their sequence).
    sequence_losses: u64,
    /// CPU time, in nanoseconds, of the producers' writing threads (over their writing time),
    /// of their drainers (since their session started; with a producer process's command
    /// and commit-sending threads), of the service thread (the daemon's
    /// `tachyon-traced` over the round, to the end of its final read; in-process the
    /// `tachyon-service` thread from its start to just before the final read), and of the
    /// daemon's other threads (its connection readers; 10 ms ticks).
    hot_ns: u64,
    drain_ns: u64,
    service_ns: u64,
    others_ns: u64,
    /// The share of the service thread's CPU time spent in the kernel (writing the file, the
    /// socket, page faults).
    service_kernel: f64,
    /// The service thread's minor page faults and context switches over the same time.
    service_faults: u64,
    service_switches: u64,
}

impl Round {
    /// Events written that are not in the trace.
    fn events_lost(&self) -> u64 {
        self.written.saturating_sub(self.in_trace)
    }

    /// No event lost and no loss counter set anywhere.
    fn lossless(&self) -> bool {
        self.in_trace == self.written
            && self.writer_dropped == 0
            && self.overwritten == 0
            && self.discarded == 0
            && self.abi_violations == 0
            && self.writer_packet_loss == 0
            && self.patches_failed == 0
            && self.sequence_losses == 0
    }

    fn rate(&self) -> f64 {
        self.written as f64 / self.seconds
    }

    fn print(&self, what: &str) {
        println!(
            "  N={} {what}: {:.2} M events/s written ({} in {:.2} s), {} in the trace, {} lost; \
             writers: {} packets dropped in {} episodes, {} stalls; TraceStats: {} chunks \
             overwritten, {} discarded, {} ABI violations, {} writer packet loss, {} patches \
             failed; {} previous_packet_dropped marks",
            self.producers,
            self.rate() / 1e6,
            self.written,
            self.seconds,
            self.in_trace,
            self.events_lost(),
            self.writer_dropped,
            self.drop_episodes,
            self.stalls,
            self.overwritten,
            self.discarded,
            self.abi_violations,
            self.writer_packet_loss,
            self.patches_failed,
            self.sequence_losses
        );
        let per_event = |ns: u64| ns as f64 / self.written.max(1) as f64;
        println!(
            "      CPU per event: writing threads {:.1} ns, drainers {:.1} ns, service thread \
             {:.1} ns ({:.0} % in the kernel; {} page faults, {} context switches), other \
             daemon threads {:.1} ns; total {:.1} ns ({:.2} cores at this rate)",
            per_event(self.hot_ns),
            per_event(self.drain_ns),
            per_event(self.service_ns),
            self.service_kernel * 100.0,
            self.service_faults,
            self.service_switches,
            per_event(self.others_ns),
            per_event(self.hot_ns + self.drain_ns + self.service_ns + self.others_ns),
            (self.hot_ns + self.drain_ns + self.service_ns + self.others_ns) as f64
                / 1e9
                / self.seconds
        );
    }
}

fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

/// One round: `n` producers for `seconds`, each at `rate` events/s (0: full speed).
fn round(daemon: &DaemonChild, mode: Mode, n: usize, seconds: f64, rate: f64) -> Round {
    let path = daemon.dir.join("round.pftrace");
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let mut consumer = daemon.consumer();
    match mode {
        Mode::Stream => consumer.enable_tracing(&trace_config(Some(100)), Some(&file)),
        Mode::Ring => consumer.enable_tracing(&trace_config(None), None),
    }
    .expect("start the session");
    let socket = daemon.producer_socket().display().to_string();
    let mut producers: Vec<Proc> = (0..n)
        .map(|_| {
            Proc::spawn(
                "producer",
                &[
                    (SOCKET, socket.clone()),
                    (SECONDS, seconds.to_string()),
                    (RATE, rate.to_string()),
                ],
            )
        })
        .collect();
    for p in &mut producers {
        p.line("READY");
    }
    let service_before = threads_counts(daemon.pid(), "tachyon-traced");
    let daemon_before = process_cpu_ns(daemon.pid());
    for p in &mut producers {
        p.send("go");
    }
    let mut r = Round {
        producers: n,
        ..Round::default()
    };
    for p in &mut producers {
        let line = p.line("RESULT");
        assert_eq!(field(&line, "started"), 1, "{line}");
        r.written += 2 * field(&line, "zones");
        r.seconds = r.seconds.max(field(&line, "ns") as f64 / 1e9);
        r.writer_dropped += field(&line, "dropped");
        r.drop_episodes += field(&line, "episodes");
        r.stalls += field(&line, "stalls");
        r.hot_ns += field(&line, "hot_ns");
        r.drain_ns += field(&line, "drain_ns");
    }
    drop(producers);
    consumer.disable_tracing().unwrap();
    let end = consumer
        .wait_for_end(Some(Duration::from_secs(60)))
        .unwrap()
        .expect("the session ended");
    assert_eq!(end.error, None);
    let service_after = threads_counts(daemon.pid(), "tachyon-traced");
    r.service_ns = service_after.ns.saturating_sub(service_before.ns);
    let (user, system) = (
        service_after.user - service_before.user,
        service_after.system - service_before.system,
    );
    r.service_kernel = system as f64 / (user + system).max(1) as f64;
    r.service_faults = service_after.faults.saturating_sub(service_before.faults);
    r.service_switches = service_after
        .switches
        .saturating_sub(service_before.switches);
    r.others_ns =
        (process_cpu_ns(daemon.pid()).saturating_sub(daemon_before)).saturating_sub(r.service_ns);
    let trace = match mode {
        Mode::Stream => std::fs::read(&path).unwrap(),
        Mode::Ring => {
            let mut trace = Vec::new();
            consumer.read_buffers(&mut trace).unwrap();
            trace
        }
    };
    let _ = consumer.free_buffers();
    drop(file);
    let _ = std::fs::remove_file(&path);
    count(&trace, &mut r);
    r
}

/// One in-process round: `n` threads of this process for `seconds`, each at `rate` events/s
/// (0: full speed), into an in-process session (`Config::stream`, every 100 ms) with the same
/// 64 MiB ring buffer; counted back from its file as [`round`] does.
fn inprocess_round(dir: &std::path::Path, n: usize, seconds: f64, rate: f64) -> Round {
    let path = dir.join("inprocess.pftrace");
    tachyon::start(Config {
        output: Some(path.clone()),
        buffer_size: (BUFFER_KB as usize) << 10,
        stream: true,
        stream_period: Duration::from_millis(100),
        // `TACHYON_PREFAULT=1` as the SDK reads it: the ring mapped at the session's start
        // (before the round's clock starts), to tell its first-touch faults apart.
        prefault_buffer: prefault(),
        ..Config::default()
    })
    .expect("start the in-process session");
    // The drainer thread lives as long as the process: its CPU over this round is a difference.
    let pid = std::process::id();
    let (drain_before, _) = threads_cpu(pid, "tachyon-drain");
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(n + 1));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let barrier = std::sync::Arc::clone(&barrier);
            std::thread::Builder::new()
                .name("bench-producer".into())
                .spawn(move || {
                    barrier.wait();
                    let before = this_thread_cpu_ns();
                    let (zones, elapsed) = write_zones(seconds, rate);
                    (zones, elapsed, this_thread_cpu_ns() - before)
                })
                .unwrap()
        })
        .collect();
    barrier.wait();
    let mut r = Round {
        producers: n,
        ..Round::default()
    };
    for t in threads {
        let (zones, elapsed, hot_ns) = t.join().unwrap();
        r.written += 2 * zones;
        r.seconds = r.seconds.max(elapsed.as_secs_f64());
        r.hot_ns += hot_ns;
    }
    // The service thread since the session started, before the shutdown joins it (its final
    // read is not in it), and the drainer over the round so far.
    r.drain_ns = threads_cpu(pid, "tachyon-drain")
        .0
        .saturating_sub(drain_before);
    let service = threads_counts(pid, "tachyon-service");
    (r.service_ns, r.service_kernel) = (service.ns, service.kernel);
    (r.service_faults, r.service_switches) = (service.faults, service.switches);
    let report = tachyon::shutdown().unwrap().expect("a session");
    r.writer_dropped = report.writers.packets_dropped;
    r.drop_episodes = report.writers.drop_episodes;
    r.stalls = report.writers.stalls;
    let trace = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    count(&trace, &mut r);
    r
}

/// Counts the slice begins and ends of a trace, its `previous_packet_dropped` marks, and reads
/// the loss counters of its last `TraceStats`. One pass over each packet's fields.
fn count(trace: &[u8], r: &mut Round) {
    let mut seen: Vec<u32> = Vec::new();
    let mut stats = None;
    let mut d = ProtoDecoder::new(trace);
    while let Ok(Some(f)) = d.read_field() {
        let (mut seq, mut dropped, mut kind) = (0u32, 0u64, 0u32);
        for field in f.as_message().map_while(Result::ok) {
            match field.id() {
                10 => seq = field.as_u32(),
                42 => dropped = field.as_u64(),
                // TrackEvent.type
                11 => {
                    for te in field.as_message().map_while(Result::ok) {
                        if te.id() == 9 {
                            kind = te.as_u32();
                        }
                    }
                }
                35 => stats = Some(field.as_bytes().to_vec()),
                _ => {}
            }
        }
        if seen.contains(&seq) {
            r.sequence_losses += u64::from(dropped != 0);
        } else {
            seen.push(seq);
        }
        // SLICE_BEGIN, SLICE_END.
        r.in_trace += u64::from(kind == 1 || kind == 2);
    }
    let stats = stats.expect("the trace ends with TraceStats");
    let v = TraceStatsView::decode(&stats).unwrap();
    r.discarded = v.chunks_discarded();
    for b in v.buffer_stats() {
        let b = b.unwrap();
        r.overwritten += b.chunks_overwritten();
        r.discarded += b.chunks_discarded();
        r.abi_violations += b.abi_violations();
        r.writer_packet_loss += b.trace_writer_packet_loss();
        r.patches_failed += b.patches_failed();
    }
}

/// Full speed; if anything is lost, halves the rate until nothing is (at most 5 times), then
/// bisects three times between the highest lossless and the lowest lossy rate. Every bound is
/// the rate a round *reached* (events over the longest producer's time), not the one it was
/// paced to, so a round that fell short of its target does not pass for a faster one. A
/// lossless round that reached less than 0.9 of its target (its threads did not get the CPU to
/// keep the schedule) did not test the target, so the target is run once more: on a loaded
/// machine that is what mostly kept the search below the rate the pipeline can take. Returns
/// the reached rate of the fastest lossless round.
fn zero_loss_rate(n: usize, run: impl Fn(f64) -> Round) -> Option<f64> {
    let full = run(0.0);
    full.print("full speed");
    if full.lossless() {
        return Some(full.rate());
    }
    let mut lossy = full.rate();
    let mut lossless: Option<f64> = None;
    // One paced target: whether a round at it was lossless; the bounds follow what it reached.
    let paced = |target: f64, lossless: &mut Option<f64>, lossy: &mut f64| -> bool {
        for attempt in 0..2 {
            let r = run(target / n as f64);
            r.print(&format!(
                "paced to {:.2} M events/s, reached {:.2}",
                target / 1e6,
                r.rate() / 1e6
            ));
            if !r.lossless() {
                *lossy = lossy.min(r.rate());
                return false;
            }
            *lossless = Some(lossless.map_or(r.rate(), |l: f64| l.max(r.rate())));
            if r.rate() >= 0.9 * target || attempt == 1 {
                break;
            }
            println!("      (lossless but short of its target: the same target once more)");
        }
        true
    };
    let mut target = lossy / 2.0;
    for _ in 0..5 {
        if paced(target, &mut lossless, &mut lossy) {
            break;
        }
        target = lossy / 2.0;
    }
    let mut best = lossless?;
    for _ in 0..3 {
        if best >= lossy {
            break;
        }
        paced((best + lossy) / 2.0, &mut lossless, &mut lossy);
        best = lossless.unwrap_or(best);
    }
    Some(best)
}

fn sustained(daemon: &DaemonChild) {
    let seconds = if quick() { 0.5 } else { 1.0 };
    println!();
    println!(
        "sustained throughput: N producer processes, 1 thread each, zones for {seconds} s with \
         the SDK's defaults (4 MiB SMB asked, stall-then-drop), one session streaming its \
         64 MiB ring buffer into a file every 100 ms"
    );
    let mut summary = Vec::new();
    for n in [1, 2, 4] {
        let line = match zero_loss_rate(n, |rate| round(daemon, Mode::Stream, n, seconds, rate)) {
            Some(rate) => format!(
                "N={n}: sustained {:.2} M events/s with zero loss",
                rate / 1e6
            ),
            None => format!("N={n}: no zero-loss rate found"),
        };
        println!("  {line}");
        summary.push(line);
    }
    println!();
    println!(
        "daemon intake without streaming: the same producers at full speed into the 64 MiB ring \
         buffer, read at the end (a wrap overwrites the oldest events: the buffer's capacity, \
         not the intake)"
    );
    for n in [1, 2, 4] {
        let r = round(daemon, Mode::Ring, n, seconds, 0.0);
        r.print("full speed, no streaming");
        summary.push(format!(
            "N={n}, no streaming: {:.2} M events/s into the daemon, {} packets dropped by the \
             writers, {} chunks overwritten by the ring",
            r.rate() / 1e6,
            r.writer_dropped,
            r.overwritten
        ));
    }
    println!();
    println!(
        "in-process write_into_file: N threads of this process, zones for {seconds} s with the \
         SDK's defaults, one in-process session streaming its 64 MiB ring buffer into a file \
         every 100 ms"
    );
    for n in [1, 2, 4] {
        let line = match zero_loss_rate(n, |rate| inprocess_round(&daemon.dir, n, seconds, rate)) {
            Some(rate) => format!(
                "N={n} in-process threads: sustained {:.2} M events/s with zero loss",
                rate / 1e6
            ),
            None => format!("N={n} in-process threads: no zero-loss rate found"),
        };
        println!("  {line}");
        summary.push(line);
    }
    println!();
    for line in summary {
        println!("{line}");
    }
}

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("daemon") => return run_daemon(),
        Ok("producer") => return run_producer(),
        Ok(other) => panic!("unknown role {other}"),
        Err(_) => {}
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let listing = args.iter().any(|a| a == "--list" || a == "--test");
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let run_sustained = !listing
        && (filters.is_empty() || filters.iter().any(|f| "sustained".contains(f.as_str())));

    let sample_size = 100;
    let mut c = Criterion::default().sample_size(sample_size);
    if quick() {
        c = c
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(1));
    }
    let mut c = c.configure_from_args();
    let daemon = DaemonChild::start();
    zones(&mut c, &daemon);
    c.final_summary();
    print_ratios(sample_size);
    if run_sustained {
        sustained(&daemon);
    }
    drop(daemon);
}

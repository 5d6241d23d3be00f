//! System mode end to end with real processes, real sockets and real memfds: the built `tachyon`
//! binary runs as the daemon (`tachyon traced`) and as the consumer (`tachyon record`), this test
//! executable re-runs itself as the producers, and the traces are checked with the trace
//! processor.
//!
//! A producer is this executable run as `--exact child --nocapture --test-threads=1` with
//! `TACHYON_SYSTEM_TEST_ROLE` set: the `child` test then plays that role (in a normal run it
//! returns at once). Children talk to the test in lines: they print on stdout (`WRITTEN`,
//! `READY`, …) and read commands (`go`, `stop`) on stdin.
//!
//! Every wait is bounded by a generous [`TIMEOUT`]; nothing asserts on wall-clock time.
//! Working directories are `target/tmp/sys-*` (the SIGKILL test leaves its trace there).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{clean_command, int, tmp_dir};
use protozero::HeapBuffered;
use tachyon_processor::{Options, TraceProcessor, Value};
use tachyon_protos::{trace_config, TraceConfig, TraceStatsView};
use tachyon_traced::Consumer;

/// Bound on anything the tests wait for (the machine may be slow and busy).
const TIMEOUT: Duration = Duration::from_secs(60);

/// The role a re-executed test binary plays (absent: a normal test run).
const ROLE: &str = "TACHYON_SYSTEM_TEST_ROLE";
/// The daemon's producer socket, for a child.
const SOCKET: &str = "TACHYON_SYSTEM_TEST_SOCKET";
/// A child's tag: its thread names start with it.
const TAG: &str = "TACHYON_SYSTEM_TEST_TAG";
/// Threads a `workers` child runs.
const THREADS: &str = "TACHYON_SYSTEM_TEST_THREADS";
/// Zones each thread of a `workers` child writes.
const ZONES: &str = "TACHYON_SYSTEM_TEST_ZONES";
/// `1`: a `workers` child waits for `go` on stdin between writing and shutting down, then says
/// `DONE` and waits for `exit`.
const WAIT_GO: &str = "TACHYON_SYSTEM_TEST_WAIT_GO";

/// The SIGKILL test's child: zones on its `big` thread (many chunks, most committed) and on
/// its `small` thread (all in the one chunk being written, never committed).
const KILLED_BIG_ZONES: u32 = 3000;
const KILLED_SMALL_ZONES: u32 = 3;

// === processes ===

/// A child process whose stdout lines arrive on a channel and whose stderr is collected.
struct Proc {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Proc {
    fn spawn(what: &str, mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {what}: {e}"));
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, lines) = mpsc::channel();
        {
            let out = child.stdout.take().unwrap();
            let log = stdout.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    log.lock().unwrap().push_str(&format!("{line}\n"));
                    let _ = tx.send(line);
                }
            });
        }
        {
            let mut err = child.stderr.take().unwrap();
            let log = stderr.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = err.read(&mut buf) {
                    log.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        Proc {
            what: what.to_owned(),
            stdin: child.stdin.take(),
            child,
            lines,
            stdout,
            stderr,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it printed so far, for failure messages.
    fn logs(&self) -> String {
        format!(
            "--- {} stdout:\n{}--- {} stderr:\n{}",
            self.what,
            self.stdout.lock().unwrap(),
            self.what,
            self.stderr.lock().unwrap()
        )
    }

    /// Waits for a stdout line holding `prefix`; returns the line from there (libtest may have
    /// printed `test child ... ` before it on the same line).
    fn expect_line(&self, prefix: &str) -> String {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(at) = line.find(prefix) {
                        return line[at..].to_owned();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{}: no line {prefix:?} in time\n{}", self.what, self.logs())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Let the stderr thread catch up before reporting.
                    std::thread::sleep(Duration::from_millis(100));
                    panic!(
                        "{}: exited without printing {prefix:?}\n{}",
                        self.what,
                        self.logs()
                    )
                }
            }
        }
    }

    /// Sends one line to its stdin.
    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{line}").unwrap_or_else(|e| panic!("{}: writing stdin: {e}", self.what));
        stdin.flush().unwrap();
    }

    /// Waits for it to exit (at most [`TIMEOUT`]), closing its stdin first.
    fn wait(&mut self) -> ExitStatus {
        drop(self.stdin.take());
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The reader threads finish at EOF; give them a moment for the logs.
                std::thread::sleep(Duration::from_millis(20));
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("{} did not exit in time\n{}", self.what, self.logs());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for it to exit and asserts it succeeded.
    fn finish(&mut self) {
        let status = self.wait();
        assert!(
            status.success(),
            "{} failed: {status}\n{}",
            self.what,
            self.logs()
        );
        let err = self.stderr.lock().unwrap();
        assert!(!err.contains("panicked"), "{}\n{}", self.what, self.logs());
    }

    fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn tachyon_command() -> Command {
    clean_command(env!("CARGO_BIN_EXE_tachyon"))
}

/// This test executable, re-run to play `role` (see the module docs).
fn child_command(role: &str, vars: &[(&str, String)]) -> Command {
    let mut cmd = clean_command(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(ROLE, role);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd
}

/// A `workers` child: `threads` threads named `{tag}-w{i}`, each writing `zones` zones
/// `test/work` (argument `i`) and one instant `test/done`.
fn spawn_workers(socket: &Path, tag: &str, threads: u32, zones: u32, wait_go: bool) -> Proc {
    let cmd = child_command(
        "workers",
        &[
            (SOCKET, socket.display().to_string()),
            (TAG, tag.to_owned()),
            (THREADS, threads.to_string()),
            (ZONES, zones.to_string()),
            (WAIT_GO, if wait_go { "1" } else { "0" }.to_owned()),
        ],
    );
    Proc::spawn(&format!("producer {tag}"), cmd)
}

/// A fresh directory `target/tmp/sys-{name}`.
fn sys_dir(name: &str) -> PathBuf {
    tmp_dir(&format!("sys-{name}"))
}

/// `tachyon traced` as a child process on private sockets; killed on drop.
struct Traced {
    proc: Proc,
    producer: PathBuf,
    consumer: PathBuf,
}

impl Traced {
    fn start(dir: &Path) -> Traced {
        let producer = dir.join("p.sock");
        let consumer = dir.join("c.sock");
        let mut cmd = tachyon_command();
        cmd.arg("traced")
            .arg("--producer-socket")
            .arg(&producer)
            .arg("--consumer-socket")
            .arg(&consumer);
        let mut proc = Proc::spawn("tachyon traced", cmd);
        let deadline = Instant::now() + TIMEOUT;
        while Consumer::connect(&consumer).is_err() {
            assert!(proc.is_running(), "tachyon traced exited\n{}", proc.logs());
            assert!(
                Instant::now() < deadline,
                "tachyon traced does not answer\n{}",
                proc.logs()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Traced {
            proc,
            producer,
            consumer,
        }
    }

    fn consumer(&self) -> Consumer {
        Consumer::connect(&self.consumer).expect("connect to the consumer socket")
    }
}

// === trace configs and traces ===

/// One ring buffer of `buffer_kb` with `track_event`, and `linux.process_stats` rescanning
/// every `process_stats_poll_ms` when given.
fn trace_config(buffer_kb: u32, process_stats_poll_ms: Option<u32>) -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    {
        let mut c: TraceConfig<'_> = buf.root();
        {
            let mut b = c.add_buffers();
            b.set_size_kb(buffer_kb);
            b.set_fill_policy(trace_config::buffer_config::FillPolicy::RingBuffer);
        }
        {
            let mut ds = c.add_data_sources();
            let mut cfg = ds.set_config();
            cfg.set_name("track_event");
            cfg.set_track_event_config().add_enabled_categories("*");
        }
        if let Some(ms) = process_stats_poll_ms {
            let mut ds = c.add_data_sources();
            let mut cfg = ds.set_config();
            cfg.set_name("linux.process_stats");
            cfg.set_process_stats_config().set_proc_stats_poll_ms(ms);
        }
    }
    buf.serialize().unwrap()
}

/// Stops the consumer's session and reads the whole trace.
fn stop_and_read(c: &mut Consumer) -> Vec<u8> {
    c.disable_tracing().expect("DisableTracing");
    let end = c
        .wait_for_end(Some(TIMEOUT))
        .expect("the session's end")
        .expect("the session ended in time");
    assert_eq!(end.error, None, "the session ended with an error");
    let mut trace = Vec::new();
    c.read_buffers(&mut trace).expect("ReadBuffers");
    trace
}

fn load(trace: &[u8]) -> TraceProcessor {
    TraceProcessor::from_bytes(trace, &Options::default()).expect("the trace loads")
}

fn rows(tp: &TraceProcessor, sql: &str) -> Vec<Vec<Value>> {
    tp.query(sql).unwrap_or_else(|e| panic!("{sql}: {e}")).rows
}

fn text(v: &Value) -> String {
    match v {
        Value::Text(s) => s.clone(),
        Value::Null => String::new(),
        other => format!("{other:?}"),
    }
}

/// The `stats` rows with data loss or errors.
fn loss_rows(tp: &TraceProcessor) -> Vec<Vec<Value>> {
    rows(
        tp,
        "SELECT name, idx, value FROM stats \
         WHERE severity IN ('data_loss', 'error') AND value > 0",
    )
}

/// A stat's value (0 when absent).
fn stat(tp: &TraceProcessor, name: &str) -> i64 {
    int(
        tp,
        &format!("SELECT coalesce(sum(value), 0) FROM stats WHERE name = '{name}'"),
    )
}

/// Slices of process `pid` named `name` on thread `thread`: (count, unfinished).
fn slices_on(tp: &TraceProcessor, pid: u32, thread: &str, name: &str) -> (i64, i64) {
    let r = rows(
        tp,
        &format!(
            "SELECT count(*), coalesce(sum(s.dur < 0), 0) FROM slice s \
             JOIN thread_track tt ON s.track_id = tt.id JOIN thread t USING (utid) \
             JOIN process p USING (upid) \
             WHERE p.pid = {pid} AND t.name = '{thread}' AND s.name = '{name}'"
        ),
    );
    match (&r[0][0], &r[0][1]) {
        (Value::Integer(n), Value::Integer(u)) => (*n, *u),
        other => panic!("{other:?}"),
    }
}

/// Asserts the `workers` child `pid` tagged `tag` is all there: every thread named, every zone
/// finished, one `done` instant per thread.
fn assert_workers_complete(tp: &TraceProcessor, pid: u32, tag: &str, threads: u32, zones: u32) {
    for t in 0..threads {
        let thread = format!("{tag}-w{t}");
        assert_eq!(
            slices_on(tp, pid, &thread, "work"),
            (i64::from(zones), 0),
            "zones of {thread} (pid {pid})"
        );
        assert_eq!(
            slices_on(tp, pid, &thread, "done"),
            (1, 0),
            "instant of {thread} (pid {pid})"
        );
    }
    // Nothing else on the process's threads.
    assert_eq!(
        int(
            tp,
            &format!(
                "SELECT count(*) FROM slice s JOIN thread_track tt ON s.track_id = tt.id \
                 JOIN thread t USING (utid) JOIN process p USING (upid) WHERE p.pid = {pid}"
            )
        ),
        i64::from(threads) * (i64::from(zones) + 1),
        "slices of pid {pid}"
    );
}

/// Packets marked `previous_packet_dropped` other than the first of their sequence (which
/// always is): losses the buffer saw while reading. Checked on the raw trace, which names the
/// sequence (the `stats` table has them per buffer, `traced_buf_sequence_packet_loss`).
fn sequence_losses(trace: &[u8]) -> Vec<(u32, u64)> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    let mut d = protozero::ProtoDecoder::new(trace);
    while let Some(f) = d.read_field().expect("a well-formed Trace") {
        let p = f.as_message();
        let seq = p.find_last_field(10).map_or(0, |f| f.as_u32());
        let dropped = p.find_last_field(42).map_or(0, |f| f.as_u64());
        if !seen.insert(seq) && dropped != 0 {
            out.push((seq, dropped));
        }
    }
    out
}

/// No loss in the trace: neither in its `stats` nor marked on its sequences.
fn assert_no_loss(trace: &[u8], tp: &TraceProcessor) {
    assert_eq!(
        loss_rows(tp),
        Vec::<Vec<Value>>::new(),
        "data loss or errors"
    );
    assert_eq!(
        sequence_losses(trace),
        Vec::new(),
        "packets after a loss: (sequence, previous_packet_dropped)"
    );
}

/// Sum over the buffers of a `TraceStats`' `chunks_written`.
fn chunks_written(stats: &[u8]) -> u64 {
    TraceStatsView::decode(stats)
        .unwrap()
        .buffer_stats()
        .map(|b| b.unwrap().chunks_written())
        .sum()
}

// === the children ===

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

fn read_line() -> String {
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    line.trim().to_owned()
}

fn say(line: &str) {
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

/// Connects this process to the daemon as a producer (the session is already running: the
/// SDK's `Sync` barrier installs it before `start` returns).
fn start_producer(socket: PathBuf) {
    tachyon::start(tachyon::Config {
        producer_socket: Some(socket),
        ..tachyon::Config::default()
    })
    .expect("connect to the daemon");
}

/// Shuts the SDK down and checks nothing was lost on this side.
fn stop_producer() {
    let report = tachyon::shutdown()
        .expect("shutdown")
        .expect("a session was running");
    let system = report.system.as_ref().expect("system mode");
    assert_eq!(report.writers.packets_dropped, 0, "{report}");
    assert_eq!(system.data_sources_started, 1, "{report}");
    assert!(!system.daemon_lost, "{report}");
    say(&format!("REPORT {report}"));
}

/// The entry point of the re-executed children (module docs); nothing in a normal run.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "workers" => child_workers(),
        "killed" => child_killed(),
        "stream" => child_stream(),
        "malicious" => child_malicious(),
        "stress" => child_stress(),
        other => panic!("unknown role {other}"),
    }
}

fn child_workers() {
    let tag = var(TAG);
    let threads: u32 = var(THREADS).parse().unwrap();
    let zones: u32 = var(ZONES).parse().unwrap();
    tachyon::set_process_name(&format!("producer {tag}"));
    start_producer(var(SOCKET).into());
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::Builder::new()
                .name(format!("{tag}-w{t}"))
                .spawn(move || {
                    for k in 0..zones {
                        let _z = tachyon::zone!("test", "work", i = k);
                    }
                    tachyon::instant!("test", "done");
                })
                .unwrap()
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    say("WRITTEN");
    if var(WAIT_GO) == "1" {
        assert_eq!(read_line(), "go");
        stop_producer();
        // Alive until the test has the trace (see the three-producer test).
        say("DONE");
        assert_eq!(read_line(), "exit");
    } else {
        stop_producer();
    }
}

/// The stress test's child: one thread writes `ZONES` zones and an instant as fast as it can
/// into a small SMB with the `Drop` policy (so the SMB overflows and events are lost, counted),
/// then the SDK shuts down and the child says how many the writers dropped.
fn child_stress() {
    let zones: u32 = var(ZONES).parse().unwrap();
    tachyon::set_process_name("stress");
    tachyon::start(tachyon::Config {
        producer_socket: Some(var(SOCKET).into()),
        smb_size: 64 << 10,
        on_full: tachyon::BufferExhaustedPolicy::Drop,
        ..tachyon::Config::default()
    })
    .expect("connect to the daemon");
    std::thread::Builder::new()
        .name("stress".into())
        .spawn(move || {
            for _ in 0..zones {
                let _z = tachyon::zone!("stress", "z");
            }
            tachyon::instant!("stress", "done", zones = zones);
        })
        .unwrap()
        .join()
        .unwrap();
    let report = tachyon::shutdown()
        .expect("shutdown")
        .expect("a session was running");
    assert!(!report.system.as_ref().expect("system mode").daemon_lost);
    say(&format!("DROPPED {}", report.writers.packets_dropped));
}

/// Writes its events, says `READY`, and blocks until the test kills it.
fn child_killed() {
    tachyon::set_process_name("killed");
    start_producer(var(SOCKET).into());
    let (tx, rx) = mpsc::channel();
    for (name, zones) in [("big", KILLED_BIG_ZONES), ("small", KILLED_SMALL_ZONES)] {
        let tx = tx.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for k in 0..zones {
                    let _z = tachyon::zone!("test", "work", i = k);
                }
                // With an argument, the instant is encoded on this thread, after the events
                // still in its queue (a zone's end is queued): when it returns, every event is
                // a packet in the writer's chunk. An event still queued at a SIGKILL was never
                // a packet; that is not what this test is about.
                tachyon::instant!("test", "done", zones = zones);
                tx.send(()).unwrap();
                // Keep the writer (and its chunk being written) until SIGKILL.
                loop {
                    std::thread::park();
                }
            })
            .unwrap();
    }
    rx.recv().unwrap();
    rx.recv().unwrap();
    // Killed at once: the complete chunks the commit thread has not sent yet, and the chunk
    // each thread is writing, reach the trace only through the daemon's scrape. None waits for
    // a patch (a zone's packet cut by a chunk's end is carried whole into the next chunk), so
    // every finished packet is there.
    say("READY");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Writes zones (batches of 5 a millisecond) until `stop` on stdin, then says how many.
fn child_stream() {
    tachyon::set_process_name("streamer");
    // `tachyon record -- PROGRAM` sets it.
    start_producer(var(tachyon_ipc::paths::PRODUCER_SOCK_ENV).into());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !matches!(read_line().as_str(), "stop" | "") {}
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        });
    }
    let n = std::thread::Builder::new()
        .name("streamer".into())
        .spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for _ in 0..5 {
                    let _z = tachyon::zone!("test", "work", i = n);
                    n += 1;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            n
        })
        .unwrap()
        .join()
        .unwrap();
    stop_producer();
    say(&format!("WROTE {n}"));
}

/// A producer speaking the protocol by hand and then lying: garbage in its SMB, commits of
/// chunks out of range, never completed or for a buffer not its own, a patch for a chunk that
/// does not exist, then a frame length beyond the limit; and on a second connection a
/// truncated frame. Says `DISCONNECTED` once the daemon hung up on it.
fn child_malicious() {
    use tachyon_abi::{
        encode_fragment_header, ChunkHeader, ChunkToMove, ChunkToPatch, CommitRequest, PageLayout,
        PageSize, Patch,
    };
    use tachyon_ipc::conn;
    use tachyon_ipc::rpc::{Frame, Msg};
    use tachyon_ipc::shm::SharedMemory;
    use tachyon_protos::{
        DataSourceDescriptor, GetAsyncCommandResponseView, InitializeConnectionRequest,
        RegisterDataSourceRequest,
    };

    let socket = PathBuf::from(var(SOCKET));
    let stream = conn::connect(&socket, Duration::from_secs(5)).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    let (tx, mut rx) = conn::split(stream);
    let send = |request_id: u64, msg: Msg<'_>| {
        tx.send(&Frame { request_id, msg }.encode(), None).unwrap();
    };
    send(
        0,
        Msg::BindService {
            service_name: "ProducerPort",
        },
    );
    let bind = rx.recv().unwrap().expect("the bind reply");
    let (service_id, methods): (u32, Vec<(u32, String)>) =
        match Frame::decode(&bind.body).unwrap().msg {
            Msg::BindServiceReply {
                success: true,
                service_id,
                methods,
            } => (
                service_id,
                methods.iter().map(|(i, n)| (*i, n.to_string())).collect(),
            ),
            other => panic!("bind: {other:?}"),
        };
    let method = |name: &str| methods.iter().find(|(_, n)| n == name).unwrap().0;
    let invoke = |request_id: u64, name: &str, args: &[u8]| {
        send(
            request_id,
            Msg::InvokeMethod {
                service_id,
                method_id: method(name),
                args,
                drop_reply: false,
            },
        );
    };
    let mut init = HeapBuffered::new();
    {
        let mut r: InitializeConnectionRequest<'_> = init.root();
        r.set_shared_memory_size_hint_bytes(64 * 1024);
        r.set_shared_memory_page_size_hint_bytes(4096);
        r.set_producer_name("malicious");
    }
    invoke(1, "InitializeConnection", &init.serialize().unwrap());
    invoke(2, "GetAsyncCommand", &[]);
    let mut register = HeapBuffered::new();
    {
        let mut r: RegisterDataSourceRequest<'_> = register.root();
        let mut d: DataSourceDescriptor<'_> = r.set_data_source_descriptor();
        d.set_name("track_event");
    }
    invoke(3, "RegisterDataSource", &register.serialize().unwrap());

    // The SMB, then the start of the session's track_event instance (its global buffer).
    let mut smb = None;
    let target = loop {
        let r = rx.recv().unwrap().expect("commands from the daemon");
        let frame = Frame::decode(&r.body).unwrap();
        if frame.request_id != 2 {
            continue;
        }
        let Msg::InvokeMethodReply { reply, .. } = frame.msg else {
            panic!("{:?}", frame.msg)
        };
        let cmd = GetAsyncCommandResponseView::decode(reply).unwrap();
        if cmd.has_setup_tracing() {
            let fd = r.fd.expect("SetupTracing carries the SMB");
            smb = Some(SharedMemory::map(fd, 4096, 32 << 20).unwrap());
        } else if cmd.has_start_data_source() {
            let start = cmd.start_data_source().unwrap();
            break start.config().unwrap().target_buffer() as u16;
        }
    };
    let smb = smb.expect("SetupTracing before StartDataSource");
    let abi = smb.producer_view(PageSize::Kib4).unwrap();
    let chunk = |writer: u16, id: u32| {
        (0..abi.num_pages())
            .find_map(|page| {
                abi.try_acquire_any_chunk_for_writing(
                    page,
                    PageLayout::Div4,
                    ChunkHeader::new(writer, id),
                )
                .ok()
            })
            .expect("a free chunk")
    };
    // Garbage in a complete chunk: a fragment claiming more than the chunk holds, noise after.
    let mut garbage = chunk(1, 0);
    for _ in 0..3 {
        garbage.increment_packet_count().unwrap();
    }
    garbage
        .write_payload(0, &encode_fragment_header(100_000).unwrap())
        .unwrap();
    garbage.write_payload(4, &[0xff; 64]).unwrap();
    let garbage_at = (garbage.page_idx() as u32, garbage.chunk_idx() as u32);
    abi.release_chunk_as_complete(garbage).unwrap();
    // A chunk left being written, one complete chunk sent to a buffer that is not ours.
    let open = chunk(2, 0);
    let open_at = (open.page_idx() as u32, open.chunk_idx() as u32);
    let mut foreign = chunk(3, 0);
    foreign.increment_packet_count().unwrap();
    let foreign_at = (foreign.page_idx() as u32, foreign.chunk_idx() as u32);
    abi.release_chunk_as_complete(foreign).unwrap();
    let mv = |(page, chunk): (u32, u32), target_buffer: u16| ChunkToMove {
        page,
        chunk,
        target_buffer,
    };
    let lies = CommitRequest {
        chunks_to_move: vec![
            mv(garbage_at, target),
            mv((60_000, 0), target),
            mv((0, 3), target),
            mv(open_at, target),
            mv(foreign_at, target.wrapping_add(1000)),
        ],
        chunks_to_patch: vec![ChunkToPatch {
            target_buffer: target,
            writer_id: 77,
            chunk_id: 12345,
            patches: vec![Patch {
                offset: 10_000,
                data: [0x81, 0x80, 0x80, 0x00],
            }],
            has_more_patches: false,
        }],
        flush_request_id: None,
    };
    for (i, part) in tachyon_ipc::commit::encode_commit(&lies).iter().enumerate() {
        invoke(10 + i as u64, "CommitData", part);
    }
    // A length prefix far beyond the frame limit: the daemon must hang up.
    // (The daemon may hang up as soon as it has read the prefix: later writes may fail.)
    let mut raw = tx.socket();
    let _ = raw.write_all(&0x7fff_fff0u32.to_le_bytes());
    let _ = raw.write_all(&[0u8; 64]);
    let end = loop {
        match rx.recv() {
            Ok(Some(_)) => {}
            other => break other,
        }
    };
    // The end of the stream or a reset, not our read timeout.
    if let Err(e) = &end {
        assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the daemon did not hang up: {e}"
        );
    }
    // A second connection: a frame cut short, then gone.
    let truncated = conn::connect(&socket, Duration::from_secs(5)).unwrap();
    let _ = (&truncated).write_all(&1000u32.to_le_bytes());
    let _ = (&truncated).write_all(&[0x08; 10]);
    drop(truncated);
    drop(smb);
    say("DISCONNECTED");
}

// === the tests ===

/// Three producer processes of four named threads each into one session, with
/// `linux.process_stats`: one trace with every process and thread named and every event.
#[test]
fn three_producer_processes_of_four_threads_make_one_complete_trace() {
    const ZONES_PER_THREAD: u32 = 2000;
    let dir = sys_dir("three");
    let traced = Traced::start(&dir);
    let mut c = traced.consumer();
    c.enable_tracing(&trace_config(16 * 1024, Some(100)), None)
        .expect("EnableTracing");
    let mut producers: Vec<(String, Proc)> = (1..=3)
        .map(|i| {
            let tag = format!("p{i}");
            let p = spawn_workers(&traced.producer, &tag, 4, ZONES_PER_THREAD, true);
            (tag, p)
        })
        .collect();
    for (_, p) in &producers {
        p.expect_line("WRITTEN");
    }
    // All three are alive: the flush makes linux.process_stats rescan /proc and name them.
    assert!(
        c.flush(Duration::from_secs(20)).expect("Flush"),
        "every producer acknowledged the flush"
    );
    let pids: Vec<u32> = producers.iter().map(|(_, p)| p.pid()).collect();
    for (_, p) in &mut producers {
        p.send("go");
    }
    // Disconnected, but kept alive (not exited) until the session ended: see the report on
    // linux.process_stats renaming exiting processes.
    for (_, p) in &producers {
        p.expect_line("DONE");
    }
    let trace = stop_and_read(&mut c);
    for (_, p) in &mut producers {
        p.send("exit");
        p.finish();
    }
    let tp = load(&trace);
    assert_no_loss(&trace, &tp);
    let exe = std::env::current_exe().unwrap().display().to_string();
    for ((tag, _), pid) in producers.iter().zip(&pids) {
        assert_workers_complete(&tp, *pid, tag, 4, ZONES_PER_THREAD);
        // Named by linux.process_stats from /proc: its first argument and command line.
        let named = rows(
            &tp,
            &format!("SELECT name, cmdline FROM process WHERE pid = {pid}"),
        );
        assert_eq!(named.len(), 1, "one process {pid}: {named:?}");
        assert_eq!(text(&named[0][0]), exe, "name of process {pid}");
        assert_eq!(
            text(&named[0][1]),
            format!("{exe} --exact child --nocapture --test-threads=1"),
            "cmdline of process {pid}"
        );
        // Every thread named: the workers by their thread descriptors, and the SDK's own
        // threads, which write no track events, by linux.process_stats alone.
        let threads = rows(
            &tp,
            &format!(
                "SELECT t.name FROM thread t JOIN process p USING (upid) \
                 WHERE p.pid = {pid} ORDER BY 1"
            ),
        );
        let threads: Vec<String> = threads.iter().map(|r| text(&r[0])).collect();
        for name in (0..4)
            .map(|t| format!("{tag}-w{t}"))
            .chain(["tachyon-commit".to_owned()])
        {
            assert!(threads.contains(&name), "{name} in {threads:?} (pid {pid})");
        }
        assert!(
            threads.iter().all(|t| !t.is_empty()),
            "unnamed threads in {threads:?} (pid {pid})"
        );
    }
    drop(traced);
}

/// A producer SIGKILLed mid-trace: every packet it had finished is in the trace, those in
/// committed chunks and those only in the chunks it was writing (scraped by the daemon).
///
/// `TACHYON_SYSTEM_TEST_KILL_AT_ONCE=1` kills it as soon as it has written (the daemon may then
/// have nothing but what it scrapes); `TACHYON_SYSTEM_TEST_KILL_REPEAT=N` runs it N times
/// in a row, each with its own daemon (CI runs it 50 times killed at once).
#[test]
fn a_producer_killed_mid_trace_loses_nothing_it_had_written() {
    let at_once = std::env::var("TACHYON_SYSTEM_TEST_KILL_AT_ONCE").is_ok_and(|v| v == "1");
    let repeat: u32 = std::env::var("TACHYON_SYSTEM_TEST_KILL_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for round in 0..repeat {
        kill_a_producer_mid_trace(round, at_once);
    }
}

fn kill_a_producer_mid_trace(round: u32, at_once: bool) {
    let dir = match round {
        0 => sys_dir("killed"),
        _ => sys_dir(&format!("killed-{round}")),
    };
    let traced = Traced::start(&dir);
    let mut c = traced.consumer();
    c.enable_tracing(&trace_config(8 * 1024, None), None)
        .expect("EnableTracing");
    let vars = [(SOCKET, traced.producer.display().to_string())];
    let mut victim = Proc::spawn("killed producer", child_command("killed", &vars));
    victim.expect_line("READY");
    // Unless killed at once, some of it is committed already (the big thread filled many
    // chunks).
    let deadline = Instant::now() + TIMEOUT;
    while !at_once && chunks_written(&c.trace_stats().unwrap()) == 0 {
        assert!(
            Instant::now() < deadline,
            "no chunk was committed\n{}",
            victim.logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = victim.pid();
    victim.child.kill().unwrap(); // SIGKILL
    let status = victim.wait();
    assert!(!status.success());
    let trace = stop_and_read(&mut c);
    std::fs::write(dir.join("trace.pftrace"), &trace).unwrap();
    let tp = load(&trace);
    let what = format!("round {round} (trace in {})", dir.display());
    assert_eq!(
        slices_on(&tp, pid, "big", "work"),
        (i64::from(KILLED_BIG_ZONES), 0),
        "{what}"
    );
    assert_eq!(slices_on(&tp, pid, "big", "done"), (1, 0), "{what}");
    // Never committed: only the daemon's scrape of the dead producer's SMB has these.
    assert_eq!(
        slices_on(&tp, pid, "small", "work"),
        (i64::from(KILLED_SMALL_ZONES), 0),
        "{what}"
    );
    assert_eq!(slices_on(&tp, pid, "small", "done"), (1, 0), "{what}");
    assert_no_loss(&trace, &tp);
    drop(traced);
}

/// Zones each stress producer writes (two events each).
const STRESS_ZONES: u32 = 100_000;

/// Four producers writing at full speed into small SMBs at once: exact accounting end to end.
/// For each producer, the events in the trace plus the events its writers say they dropped
/// are exactly the events it wrote (the daemon loses none: its buffer holds everything), and
/// the drops the writers reported in the trace (`tachyon_packets_dropped`, which `tachyon
/// stats` sums per sequence) are never more than that.
#[test]
fn four_producers_at_full_speed_are_accounted_for_exactly() {
    let dir = sys_dir("stress");
    let traced = Traced::start(&dir);
    let mut c = traced.consumer();
    c.enable_tracing(&trace_config(256 * 1024, None), None)
        .expect("EnableTracing");
    let vars = [
        (SOCKET, traced.producer.display().to_string()),
        (ZONES, STRESS_ZONES.to_string()),
    ];
    let mut producers: Vec<Proc> = (0..4)
        .map(|i| {
            Proc::spawn(
                &format!("stress producer {i}"),
                child_command("stress", &vars),
            )
        })
        .collect();
    let mut dropped = std::collections::HashMap::new();
    for p in &mut producers {
        let line = p.expect_line("DROPPED ");
        let n: u64 = line["DROPPED ".len()..].trim().parse().unwrap();
        dropped.insert(p.pid(), n);
        p.finish();
    }
    let trace = stop_and_read(&mut c);
    std::fs::write(dir.join("trace.pftrace"), &trace).unwrap();
    // Per pid: track events in the trace, and the drops the writers reported in it.
    let mut events: std::collections::HashMap<u32, (u64, u64)> = Default::default();
    let mut d = protozero::ProtoDecoder::new(&trace);
    while let Some(f) = d.read_field().expect("a well-formed Trace") {
        let p = f.as_message();
        let pid = p.find_last_field(79).map_or(0, |f| f.as_u32());
        let e = events.entry(pid).or_default();
        e.0 += u64::from(p.find_field(11).is_some());
        e.1 += p.find_field(1900).map_or(0, |f| f.as_u64());
    }
    let written = 2 * u64::from(STRESS_ZONES) + 1;
    eprintln!("events written per producer: {written}; dropped by pid: {dropped:?}; in the trace (events, reported dropped) by pid: {events:?}");
    for (pid, lost) in &dropped {
        let (read, reported) = events.get(pid).copied().unwrap_or_default();
        assert_eq!(
            read + lost,
            written,
            "pid {pid}: {read} events in the trace, {lost} dropped by its writers"
        );
        assert!(reported <= *lost, "pid {pid}: {reported} reported, {lost}");
    }
    // Nothing lost in the daemon: its only losses are the writers' own.
    let tp = load(&trace);
    for name in [
        "traced_buf_chunks_overwritten",
        "traced_buf_chunks_discarded",
        "traced_buf_abi_violations",
        "traced_buf_patches_failed",
    ] {
        assert_eq!(stat(&tp, name), 0, "{name}");
    }
    drop(traced);
}

/// `tachyon record -- PROGRAM` exits with the program's status and removes the embedded
/// daemon's private directory.
#[test]
fn record_passes_the_programs_exit_status_on_and_cleans_up() {
    let dir = sys_dir("status");
    for (script, code) in [("exit 0", 0), ("exit 3", 3), ("kill -TERM $$", 128 + 15)] {
        let mut cmd = tachyon_command();
        cmd.current_dir(&dir)
            .args(["record", "-o", "t.pftrace", "--consumer-socket"])
            .arg(dir.join("nobody.sock"))
            .args(["--", "sh", "-c", script]);
        let mut record = Proc::spawn("tachyon record", cmd);
        let pid = record.pid();
        let status = record.wait();
        assert_eq!(status.code(), Some(code), "{script}\n{}", record.logs());
        let private = std::env::temp_dir().join(format!("tachyon-record-{pid}"));
        assert!(!private.exists(), "{} left behind", private.display());
        // The trace is written whatever the program's status.
        load(&std::fs::read(dir.join("t.pftrace")).unwrap());
    }
}

/// `tachyon record -o FILE -- PROGRAM` with no daemon: the embedded one records both demos.
#[test]
fn record_with_a_program_and_no_daemon_traces_both_processes() {
    let dir = sys_dir("embedded");
    let t = env!("CARGO_BIN_EXE_tachyon");
    let script = format!(
        "'{t}' demo --seconds 0.3 --threads 2 --out a.pftrace & \
         '{t}' demo --seconds 0.3 --threads 2 --out b.pftrace & wait"
    );
    let out = dir.join("all.pftrace");
    let mut cmd = tachyon_command();
    cmd.current_dir(&dir)
        .arg("record")
        .arg("-o")
        .arg(&out)
        // Nothing listens there: record starts its embedded daemon.
        .arg("--consumer-socket")
        .arg(dir.join("nobody.sock"))
        .args(["--", "sh", "-c", &script]);
    let mut record = Proc::spawn("tachyon record", cmd);
    record.finish();
    let stdout = record.stdout.lock().unwrap().clone();
    assert_eq!(
        stdout
            .matches("1 tracing session recorded the demo")
            .count(),
        2,
        "{}",
        record.logs()
    );
    // The demos wrote no file of their own: the trace is the consumer's.
    assert!(!dir.join("a.pftrace").exists() && !dir.join("b.pftrace").exists());
    let all = std::fs::read(&out).unwrap();
    let tp = load(&all);
    let per_pid = rows(
        &tp,
        "SELECT p.pid, p.name, count(*) FROM slice s JOIN thread_track tt ON s.track_id = tt.id \
         JOIN thread t USING (utid) JOIN process p USING (upid) GROUP BY p.pid ORDER BY 1",
    );
    assert_eq!(per_pid.len(), 2, "two processes with slices: {per_pid:?}");
    for r in &per_pid {
        assert!(!text(&r[1]).is_empty(), "a named process: {per_pid:?}");
        assert!(matches!(r[2], Value::Integer(n) if n > 10), "{per_pid:?}");
    }
    assert_no_loss(&all, &tp);
}

/// Streaming through the CLI: the file grows while the producer writes, a copy of it taken at
/// any moment is a trace, and the final file has every event.
#[test]
fn record_streams_into_a_file_that_is_a_trace_at_every_moment() {
    let dir = sys_dir("stream");
    let traced = Traced::start(&dir);
    let config = dir.join("stream.pbtxt");
    std::fs::write(
        &config,
        "buffers { size_kb: 16384 fill_policy: RING_BUFFER }\n\
         data_sources { config { name: \"track_event\" } }\n\
         write_into_file: true\n\
         file_write_period_ms: 100\n\
         flush_period_ms: 100\n",
    )
    .unwrap();
    let out = dir.join("stream.pftrace");
    let mut cmd = tachyon_command();
    cmd.arg("record")
        .arg("-c")
        .arg(&config)
        .arg("-o")
        .arg(&out)
        .arg("--consumer-socket")
        .arg(&traced.consumer)
        .env(tachyon_ipc::paths::PRODUCER_SOCK_ENV, &traced.producer)
        .arg("--")
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(ROLE, "stream");
    // The program inherits record's stdin and stdout: `stop` reaches it, `WROTE` comes back.
    let mut record = Proc::spawn("tachyon record (streaming)", cmd);

    let slices = |bytes: &[u8]| {
        let tp = TraceProcessor::from_bytes(bytes, &Options::default())
            .unwrap_or_else(|e| panic!("a copy of {} bytes does not load: {e}", bytes.len()));
        int(&tp, "SELECT count(*) FROM slice WHERE name = 'work'")
    };
    let mut sizes = Vec::new();
    let mut copies: Vec<(usize, i64)> = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while copies.len() < 2 {
        assert!(
            Instant::now() < deadline && record.is_running(),
            "the file did not grow: sizes {sizes:?}, copies {copies:?}\n{}",
            record.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
        let bytes = std::fs::read(&out).unwrap_or_default();
        if sizes.last() != Some(&bytes.len()) {
            sizes.push(bytes.len());
        }
        if bytes.is_empty() {
            continue;
        }
        let n = slices(&bytes);
        // The second copy must be a later point of the run than the first.
        if n > 0 && copies.last().is_none_or(|&(_, prev)| n > prev) {
            copies.push((bytes.len(), n));
        }
    }
    record.send("stop");
    record.finish();
    let wrote: i64 = record
        .expect_line("WROTE ")
        .trim_start_matches("WROTE ")
        .parse()
        .unwrap();
    let final_bytes = std::fs::read(&out).unwrap();
    sizes.push(final_bytes.len());
    assert!(
        sizes.windows(2).all(|w| w[0] <= w[1]),
        "the file only grows: {sizes:?}"
    );
    assert!(copies[0].0 < copies[1].0 && copies[1].0 < final_bytes.len());
    let tp = load(&final_bytes);
    assert_eq!(
        int(
            &tp,
            "SELECT count(*) FROM slice WHERE name = 'work' AND dur >= 0"
        ),
        wrote,
        "every zone in the final file (copies had {copies:?}); sequence losses {:?}; stats {:?}",
        sequence_losses(&final_bytes),
        rows(&tp, "SELECT name, idx, value FROM stats WHERE value != 0")
    );
    assert_no_loss(&final_bytes, &tp);
    drop(traced);
}

/// A malicious producer beside a good one, in separate processes: the good one's events are
/// all there, the lies are counted, and the daemon keeps serving.
#[test]
fn a_malicious_producer_is_cut_off_and_the_good_one_is_intact() {
    const ZONES_PER_THREAD: u32 = 1000;
    let dir = sys_dir("malicious");
    let mut traced = Traced::start(&dir);
    let mut c = traced.consumer();
    c.enable_tracing(&trace_config(8 * 1024, None), None)
        .expect("EnableTracing");
    let mut bad = Proc::spawn(
        "malicious producer",
        child_command(
            "malicious",
            &[(SOCKET, traced.producer.display().to_string())],
        ),
    );
    let mut good = spawn_workers(&traced.producer, "good", 2, ZONES_PER_THREAD, false);
    bad.expect_line("DISCONNECTED");
    bad.finish();
    good.finish();
    let trace = stop_and_read(&mut c);
    let tp = load(&trace);
    assert_workers_complete(&tp, good.pid(), "good", 2, ZONES_PER_THREAD);
    // The chunks it lied about were discarded and counted (out of range, never completed, not
    // its buffer); its garbage chunk broke the ABI (or was skipped as corrupt).
    assert!(
        stat(&tp, "traced_chunks_discarded") >= 3,
        "{:?}",
        rows(&tp, "SELECT name, idx, value FROM stats WHERE value != 0")
    );
    assert_eq!(
        int(
            &tp,
            &format!(
                "SELECT count(*) FROM slice s JOIN thread_track tt ON s.track_id = tt.id \
                 JOIN thread t USING (utid) JOIN process p USING (upid) WHERE p.pid = {}",
                bad.pid()
            )
        ),
        0
    );
    drop(c);

    // The daemon still serves: a new session records a new producer.
    assert!(traced.proc.is_running(), "{}", traced.proc.logs());
    let mut c = traced.consumer();
    c.enable_tracing(&trace_config(1024, None), None)
        .expect("EnableTracing after the attack");
    let mut again = spawn_workers(&traced.producer, "again", 1, 10, false);
    again.finish();
    let trace = stop_and_read(&mut c);
    let tp = load(&trace);
    assert_workers_complete(&tp, again.pid(), "again", 1, 10);
    assert_no_loss(&trace, &tp);
}

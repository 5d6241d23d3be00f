//! System mode against a minimal daemon written here with `tachyon-ipc` (the real one lives in
//! another crate): real Unix sockets, a real sealed memfd, the producer port's messages.
//!
//! The host applies commits as the daemon does (`ServiceView` copy, `TraceBuffer`), and never
//! scrapes: the SDK's writers in this process store into their chunks with plain stores, so the
//! host reads only chunks committed Complete (the acquiring CAS orders the read after the
//! writer's last store).
//!
//! The SDK has one session per process: the tests of this file take `LOCK`.

mod model;

use std::collections::HashMap;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use model::{Kind, Model};
use protozero::HeapBuffered;
use tachyon::backend::PageSize;
use tachyon::Config;
use tachyon_ipc::conn::{self, FrameSender};
use tachyon_ipc::rpc::{self, producer_port, Frame, Msg};
use tachyon_ipc::shm::SharedMemory;
use tachyon_protos::{
    GetAsyncCommandResponse, InitializeConnectionRequestView, NotifyDataSourceStoppedRequestView,
    RegisterDataSourceRequestView,
};
use tachyon_service::{
    apply_commit, CommitStats, FillPolicy, PacketWriter, ProducerIdentity, ProducerState,
    TraceBuffer,
};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Generous bound for anything the host waits for.
const WAIT: Duration = Duration::from_secs(10);

// === The test host ===

/// What the host does on its own.
#[derive(Clone, Copy, Debug)]
struct Behaviour {
    /// Answers `RegisterDataSource` (else the producer waits in vain).
    answer_register: bool,
    /// Sets up tracing and starts this track_event instance right after answering the
    /// registration, before the producer's `Sync` is answered (a daemon already tracing).
    start_on_register: Option<u64>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            answer_register: true,
            start_on_register: Some(7),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum HostEvent {
    Initialized {
        producer_name: String,
        smb_size_hint: u32,
        page_size_hint: u32,
        scraping_mode: i32,
    },
    Registered {
        name: String,
        will_notify_on_stop: bool,
        handles_incremental_state_clear: bool,
    },
    Commit {
        moves: usize,
        flush: Option<u64>,
    },
    Stopped(u64),
    Closed,
}

struct HostState {
    smb: SharedMemory,
    producer: ProducerState,
    buffers: Vec<TraceBuffer>,
    stats: CommitStats,
    /// The request id of `GetAsyncCommand`.
    commands: Option<u64>,
    writer: PacketWriter,
    /// Everything read out of the buffers so far, as a trace.
    trace: Vec<u8>,
}

struct Host {
    path: PathBuf,
    state: Arc<Mutex<HostState>>,
    tx: Arc<Mutex<Option<FrameSender>>>,
    events: Receiver<HostEvent>,
    thread: Option<JoinHandle<()>>,
}

/// The track_event config of instance `id`: buffer 0, category `off` disabled.
fn start_command(id: u64) -> Vec<u8> {
    command(|c| {
        let mut s = c.set_start_data_source();
        s.set_new_instance_id(id);
        let mut cfg = s.set_config();
        cfg.set_name("track_event");
        cfg.set_target_buffer(0);
        cfg.set_track_event_config().add_disabled_categories("off");
    })
}

fn command(build: impl FnOnce(&mut GetAsyncCommandResponse<'_>)) -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    {
        let mut c: GetAsyncCommandResponse<'_> = buf.root();
        build(&mut c);
    }
    buf.serialize().unwrap()
}

fn send_command(tx: &FrameSender, st: &HostState, cmd: &[u8], with_smb: bool) {
    let id = st.commands.expect("GetAsyncCommand came first");
    let frame = rpc::method_reply(id, true, true, cmd);
    let fd = with_smb.then(|| st.smb.fd());
    tx.send(&frame, fd).expect("send a command");
}

impl Host {
    fn start(name: &str, behaviour: Behaviour) -> Host {
        let path = std::env::temp_dir().join(format!(
            "tachyon-system-test-{}-{name}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let state = Arc::new(Mutex::new(HostState {
            smb: SharedMemory::create("tachyon-test-smb", 1 << 20).unwrap(),
            producer: ProducerState::new(1, vec![0]),
            buffers: vec![TraceBuffer::new(16 << 20, FillPolicy::RingBuffer)],
            stats: CommitStats::default(),
            commands: None,
            writer: PacketWriter::new(),
            trace: Vec::new(),
        }));
        let tx = Arc::new(Mutex::new(None));
        let (events_tx, events) = mpsc::channel();
        let thread = {
            let (state, tx) = (state.clone(), tx.clone());
            std::thread::spawn(move || serve(listener, &state, &tx, &events_tx, behaviour))
        };
        Host {
            path,
            state,
            tx,
            events,
            thread: Some(thread),
        }
    }

    fn config(&self) -> Config {
        Config {
            producer_socket: Some(self.path.clone()),
            stop_timeout: Duration::from_millis(200),
            ..Config::in_memory()
        }
    }

    fn send(&self, cmd: &[u8]) {
        let tx = self.tx.lock().unwrap();
        let st = self.state.lock().unwrap();
        send_command(tx.as_ref().expect("connected"), &st, cmd, false);
    }

    /// Waits for the first event `pred` accepts (skipping others).
    fn wait_for(&self, what: &str, pred: impl Fn(&HostEvent) -> bool) -> HostEvent {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(e) if pred(&e) => return e,
                Ok(_) => {}
                Err(_) => panic!("the host waited in vain for {what}"),
            }
        }
    }

    fn flush(&self, request_id: u64) {
        self.send(&command(|c| {
            c.set_flush().set_request_id(request_id);
        }));
        self.wait_for(
            "the flush acknowledgement",
            |e| matches!(e, HostEvent::Commit { flush: Some(id), .. } if *id == request_id),
        );
    }

    /// Reads out what the buffers hold now (`last`: everything, counting what is incomplete
    /// as lost) and returns the whole trace read so far.
    fn trace(&self, last: bool) -> Vec<u8> {
        let mut st = self.state.lock().unwrap();
        let st = &mut *st;
        let identity = ProducerIdentity {
            pid: std::process::id() as i32,
            uid: 0,
        };
        for b in &mut st.buffers {
            b.read_packets(last, |info, fragments| {
                st.writer
                    .write_packet(info, fragments, identity, &mut st.trace);
            });
        }
        st.trace.clone()
    }

    /// Hangs up on the producer.
    fn close(&self) {
        if let Some(tx) = self.tx.lock().unwrap().as_ref() {
            tx.shutdown();
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.close();
        let _ = std::fs::remove_file(&self.path);
        if let Some(t) = self.thread.take() {
            if !std::thread::panicking() {
                t.join().expect("the host thread panicked");
            }
        }
    }
}

/// The host's connection: one producer, served until it hangs up.
fn serve(
    listener: UnixListener,
    state: &Mutex<HostState>,
    tx_slot: &Mutex<Option<FrameSender>>,
    events: &Sender<HostEvent>,
    behaviour: Behaviour,
) {
    let (stream, _) = listener.accept().unwrap();
    let (tx, mut rx) = conn::split(stream);
    *tx_slot.lock().unwrap() = Some(tx.clone());
    let methods: HashMap<u32, &str> = producer_port::METHODS.iter().copied().collect();
    loop {
        let body = match rx.recv() {
            Ok(Some(r)) => r.body,
            _ => {
                let _ = events.send(HostEvent::Closed);
                return;
            }
        };
        let frame = Frame::decode(&body).expect("the producer sends well-formed frames");
        let request = frame.request_id;
        let (method_id, args) = match frame.msg {
            Msg::BindService { service_name } => {
                let services = [(producer_port::NAME, 1, producer_port::METHODS)];
                // A closed peer (after the test ended) is fine.
                let _ = tx.send(&rpc::bind_reply(request, service_name, &services), None);
                continue;
            }
            Msg::InvokeMethod {
                method_id, args, ..
            } => (method_id, args),
            other => panic!("unexpected message from the producer: {other:?}"),
        };
        let reply = |bytes: &[u8]| {
            let _ = tx.send(&rpc::method_reply(request, true, false, bytes), None);
        };
        match methods[&method_id] {
            "InitializeConnection" => {
                let r = InitializeConnectionRequestView::decode(args).unwrap();
                let _ = events.send(HostEvent::Initialized {
                    producer_name: r.producer_name().unwrap().to_owned(),
                    smb_size_hint: r.shared_memory_size_hint_bytes(),
                    page_size_hint: r.shared_memory_page_size_hint_bytes(),
                    scraping_mode: r.smb_scraping_mode_raw(),
                });
                reply(&[]);
            }
            "GetAsyncCommand" => state.lock().unwrap().commands = Some(request),
            "RegisterDataSource" => {
                let r = RegisterDataSourceRequestView::decode(args).unwrap();
                let d = r.data_source_descriptor().unwrap();
                let _ = events.send(HostEvent::Registered {
                    name: d.name().unwrap().to_owned(),
                    will_notify_on_stop: d.will_notify_on_stop(),
                    handles_incremental_state_clear: d.handles_incremental_state_clear(),
                });
                if behaviour.answer_register {
                    reply(&[]);
                }
                if let Some(id) = behaviour.start_on_register {
                    let st = state.lock().unwrap();
                    let setup = command(|c| {
                        c.set_setup_tracing().set_shared_buffer_page_size_kb(4);
                    });
                    send_command(&tx, &st, &setup, true);
                    send_command(&tx, &st, &start_command(id), false);
                }
            }
            "Sync" => reply(&[]),
            "CommitData" => {
                let d = tachyon_ipc::commit::decode_commit(args).expect("a valid commit");
                assert_eq!(d.invalid_entries, 0);
                let mut st = state.lock().unwrap();
                let st = &mut *st;
                let view = st.smb.service_view(PageSize::Kib4).unwrap();
                apply_commit(
                    &view,
                    &mut st.producer,
                    &d.request,
                    &mut st.buffers,
                    &mut st.stats,
                );
                let _ = events.send(HostEvent::Commit {
                    moves: d.request.chunks_to_move.len(),
                    flush: d.request.flush_request_id,
                });
            }
            "NotifyDataSourceStopped" => {
                let r = NotifyDataSourceStoppedRequestView::decode(args).unwrap();
                let _ = events.send(HostEvent::Stopped(r.data_source_id()));
            }
            other => panic!("the host does not expect {other}"),
        }
    }
}

// === Helpers ===

fn named<'m>(m: &'m Model, name: &str, kind: Kind) -> Vec<&'m model::Event> {
    m.events
        .iter()
        .filter(|e| e.kind == kind && e.name.as_deref() == Some(name))
        .collect()
}

fn is_recording() -> bool {
    tachyon::zone!("test", "probe").is_recording()
}

// === Tests ===

#[test]
fn traces_into_the_daemon_flushes_clears_and_stops() {
    let _g = lock();
    let host = Host::start("main", Behaviour::default());
    tachyon::set_process_name("system-test");
    tachyon::start(host.config()).expect("connect to the test host");

    // The handshake, as PROTOCOL.md has it.
    let init = host.wait_for("InitializeConnection", |e| {
        matches!(e, HostEvent::Initialized { .. })
    });
    assert_eq!(
        init,
        HostEvent::Initialized {
            producer_name: "system-test".into(),
            smb_size_hint: 4 << 20,
            page_size_hint: 4096,
            scraping_mode: 1,
        }
    );
    let registered = host.wait_for("RegisterDataSource", |e| {
        matches!(e, HostEvent::Registered { .. })
    });
    assert_eq!(
        registered,
        HostEvent::Registered {
            name: "track_event".into(),
            will_notify_on_stop: true,
            handles_incremental_state_clear: true,
        }
    );
    // The host started the data source while handling the registration: `start` returned
    // after the session was installed, so the first event records.
    assert!(
        is_recording(),
        "the daemon's session is running when start returns"
    );
    assert!(
        !tachyon::zone!("off", "hidden").is_recording(),
        "the config's disabled category"
    );

    // Two threads trace and exit (their writers flush as they go).
    let workers: Vec<_> = (0..2)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..300u32 {
                    let _z = tachyon::zone!("work", "step", i = i, thread = t);
                    tachyon::instant!("tick");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    host.flush(77);
    let m = Model::read(&host.trace(false));
    assert!(m.errors.is_empty(), "{:?}", m.errors);
    let steps = named(&m, "step", Kind::Begin);
    assert_eq!(steps.len(), 600, "every zone of the exited threads");
    let seqs: std::collections::HashSet<u32> = steps.iter().map(|e| e.seq).collect();
    assert_eq!(seqs.len(), 2, "one sequence per thread");
    assert!(named(&m, "hidden", Kind::Begin).is_empty());

    // A busy thread flushes at its next event after the flush request.
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _z = tachyon::zone!("work", "busy");
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    host.flush(78);
    let deadline = Instant::now() + WAIT;
    let busy_seq = loop {
        let m = Model::read(&host.trace(false));
        if let Some(e) = named(&m, "busy", Kind::Begin).first() {
            break e.seq;
        }
        assert!(Instant::now() < deadline, "the busy thread never flushed");
        std::thread::sleep(Duration::from_millis(5));
    };

    // A second instance while one runs is not traced, but its stop is answered.
    host.send(&start_command(8));
    host.send(&command(|c| {
        c.set_stop_data_source().set_instance_id(8);
    }));
    host.wait_for("the second instance's stop", |e| {
        *e == HostEvent::Stopped(8)
    });
    assert!(is_recording(), "the first instance still traces");

    // Clearing the incremental state starts a new generation on the busy thread's sequence.
    host.send(&command(|c| {
        c.set_clear_incremental_state().add_data_source_ids(7);
    }));
    std::thread::sleep(Duration::from_millis(20));
    host.flush(79);
    let deadline = Instant::now() + WAIT;
    loop {
        let m = Model::read(&host.trace(false));
        let clears = m.per_sequence.get(&busy_seq).map_or(0, |s| s[2]);
        if clears >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no second generation ({clears} clears)"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // Stop: acknowledged, and nothing records any more.
    host.send(&command(|c| {
        c.set_stop_data_source().set_instance_id(7);
    }));
    host.wait_for("NotifyDataSourceStopped", |e| *e == HostEvent::Stopped(7));
    assert!(!is_recording(), "stopped");
    stop.store(true, Ordering::Relaxed);
    busy.join().unwrap();

    let report = tachyon::shutdown().unwrap().expect("a session ran");
    assert_eq!(report.path, None);
    assert_eq!(report.bytes, 0);
    let system = report.system.clone().expect("system mode");
    assert_eq!(system.socket, host.path);
    assert_eq!(system.data_sources_started, 1);
    assert!(!system.daemon_lost);
    assert_eq!(system.commits_dropped, 0);
    assert_eq!(report.writers.packets_dropped, 0);
    assert!(report.to_string().starts_with("traced into the daemon at "));
    host.wait_for("the hang-up", |e| *e == HostEvent::Closed);
    assert!(!tachyon::is_active());

    let m = Model::read(&host.trace(true));
    assert!(m.errors.is_empty(), "{:?}", m.errors);
    assert_eq!(m.skipped, 0);
    assert_eq!(m.loss_marks, 0);
    assert!(m.unresolved().is_empty(), "{:#?}", m.unresolved());
    assert_eq!(named(&m, "step", Kind::Begin).len(), 600);
    assert_eq!(named(&m, "tick", Kind::Instant).len(), 600);
    assert!(!named(&m, "busy", Kind::Begin).is_empty());
    let pid = std::process::id() as i32;
    assert!(m
        .process_descriptors()
        .iter()
        .any(|d| d.process == Some((pid, Some("system-test".into())))));
    let st = host.state.lock().unwrap();
    assert_eq!(st.stats, CommitStats::default(), "no chunk refused");
    assert_eq!(st.buffers[0].losses().total(), 0);
}

#[test]
fn the_daemon_going_away_stops_tracing_without_blocking() {
    let _g = lock();
    let host = Host::start("gone", Behaviour::default());
    tachyon::start(host.config()).expect("connect to the test host");
    assert!(is_recording());
    let stop = Arc::new(AtomicBool::new(false));
    let tracer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _z = tachyon::zone!("work", "after", n = n);
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    host.close();
    host.wait_for("the hang-up", |e| *e == HostEvent::Closed);
    let deadline = Instant::now() + Duration::from_secs(2);
    while is_recording() {
        assert!(
            Instant::now() < deadline,
            "still recording after the daemon left"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Zones are back to a disabled callsite's cost.
    let t = Instant::now();
    for i in 0..100_000u32 {
        let z = tachyon::zone!("work", "cheap", i = i);
        assert!(!z.is_recording());
    }
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    stop.store(true, Ordering::Relaxed);
    assert!(tracer.join().expect("no panic on the tracing thread") > 0);

    let t = Instant::now();
    let report = tachyon::shutdown().unwrap().expect("a session ran");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let system = report.system.expect("system mode");
    assert!(system.daemon_lost);
    assert_eq!(system.data_sources_started, 1);
    assert!(!tachyon::is_active());
    // A new session can start afterwards.
    tachyon::start(Config::in_memory()).unwrap();
    assert!(is_recording());
    tachyon::shutdown().unwrap();
}

#[test]
fn no_daemon_means_no_tracing_quickly() {
    let _g = lock();
    let dir = std::env::temp_dir();
    let pid = std::process::id();

    // Nothing at the path.
    let missing = dir.join(format!("tachyon-system-test-{pid}-missing.sock"));
    let t = Instant::now();
    let e = tachyon::start(Config {
        producer_socket: Some(missing.clone()),
        ..Config::in_memory()
    })
    .unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    assert!(!tachyon::is_active());
    assert!(!is_recording());

    // A socket nobody accepts on: the bind reply never comes.
    let silent = dir.join(format!("tachyon-system-test-{pid}-silent.sock"));
    let _ = std::fs::remove_file(&silent);
    let listener = UnixListener::bind(&silent).unwrap();
    let t = Instant::now();
    assert!(tachyon::start(Config {
        producer_socket: Some(silent.clone()),
        ..Config::in_memory()
    })
    .is_err());
    assert!(
        t.elapsed() <= tachyon::backend::DAEMON_CONNECT_BUDGET + Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert!(!tachyon::is_active());
    drop(listener);
    let _ = std::fs::remove_file(&silent);

    // A daemon that never answers the registration.
    let host = Host::start(
        "mute",
        Behaviour {
            answer_register: false,
            start_on_register: None,
        },
    );
    let t = Instant::now();
    let e = tachyon::start(host.config()).unwrap_err();
    assert!(
        t.elapsed() <= tachyon::backend::DAEMON_CONNECT_BUDGET + Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    assert!(!tachyon::is_active());
    host.wait_for("the hang-up", |e| *e == HostEvent::Closed);
    drop(host);

    // `init` with TACHYON_PRODUCER_SOCK naming a dead path: a line on stderr, no error, no
    // tracing. (Edition 2021: `set_var` is safe; this file's tests run one at a time and read
    // no other variables meanwhile.)
    std::env::set_var("TACHYON_PRODUCER_SOCK", &missing);
    let t = Instant::now();
    let r = tachyon::init();
    std::env::remove_var("TACHYON_PRODUCER_SOCK");
    r.expect("a missing daemon is not an error for init");
    assert!(t.elapsed() < Duration::from_secs(1));
    assert!(!tachyon::is_active());
    assert!(!is_recording());
}

/// An example in its own process traces into the host: real cross-process shared memory.
#[test]
fn an_example_process_traces_into_the_daemon() {
    let _g = lock();
    let exe = std::env::current_exe().unwrap();
    let exe = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(format!("quickstart{}", std::env::consts::EXE_SUFFIX));
    assert!(exe.is_file(), "{} is not built", exe.display());
    let host = Host::start("example", Behaviour::default());
    let mut cmd = std::process::Command::new(&exe);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TACHYON_") {
            cmd.env_remove(k);
        }
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("system_example");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = cmd
        .current_dir(&dir)
        .env("TACHYON_PRODUCER_SOCK", &host.path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("traced into the daemon at "), "{stdout}");
    assert!(
        !dir.join("quickstart.pftrace").exists(),
        "no file of its own"
    );
    host.wait_for("the hang-up", |e| *e == HostEvent::Closed);
    let m = Model::read(&host.trace(true));
    assert!(m.errors.is_empty(), "{:?}", m.errors);
    assert!(m.unresolved().is_empty());
    assert!(named(&m, "fib", Kind::Begin).len() > 100);
    assert_eq!(named(&m, "step", Kind::Begin).len(), 100);
    assert!(m.process_descriptors().iter().any(|d| d
        .process
        .as_ref()
        .and_then(|p| p.1.as_deref())
        == Some("quickstart")));
}

//! Live capture: the process listens on a TCP port ([`Config::listen`](crate::Config::listen),
//! `TACHYON_LISTEN`) and streams its trace to `tachyon capture` while it records (Tracy's
//! client/worker design, Perfetto's format). The protocol is `tachyon-capture`'s.
//!
//! ```text
//!  threads ─▶ writers ─▶ SMB ─commits─▶ tachyon-cap-svc thread ─▶ central ring buffer
//!                                        (ServiceCore, in memory)       │ drain every 5 ms,
//!                                                                       ▼ only while attached
//!                                        Output queue (≤ OUTPUT_CAP bytes of records)
//!                                                                       ▼
//!  capture ◀── LZ4 frames ── tachyon-cap-tx thread (per connection: handshake, send)
//! ```
//!
//! Memory stays bounded when the capture reads slower than the process writes: the connection
//! thread blocks on the socket, the output queue fills, the service thread stops draining, the
//! central ring buffer overwrites its oldest chunks (counted, and marked on the sequences that
//! lost packets), and when the shared memory buffer fills the writers drop (counted, marked).
//! No instrumented thread ever waits for the network.
//!
//! Each connection gets a session of its own, so each capture is a complete trace: a session
//! starts a new writer on every thread at its next event, which re-emits its process, thread,
//! track and counter descriptors and interned data, and a zone whose begin was recorded in
//! another session (or in none) leaves its end out. Without on-demand mode the first session
//! starts with the process (what happens before the capture attaches waits in the central
//! buffer); with it (`TACHYON_ON_DEMAND=1`) nothing is recorded until a capture attaches.
//! One capture at a time: another gets a "busy" answer.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tachyon_abi::{OwnedSmb, PageSize};
use tachyon_capture::frame::{AppStatus, FrameEncoder, HEADER_LEN};
use tachyon_capture::protocol::{
    self, Hello, Status, CAP_RAW_FRAMES, DEFAULT_PORT, PORT_ATTEMPTS, PROTOCOL_VERSION,
};
use tachyon_capture::registry;
use tachyon_service::{
    BufferSpec, DataSourceSpec, FillPolicy, ProducerIdentity, ServiceCore, SessionConfig,
};

use crate::track_event::global::{self, SessionHandle};
use crate::track_event::state::{self, drain_all, request_flush_pass, Drain};
use crate::track_event::CategoryFilter;
use crate::writer::{commit_channel, ArbiterConfig, ArbiterStats, CommitReceiver, SmbArbiter};
use crate::BufferExhaustedPolicy;

/// How long a capture has to complete its handshake (a slow or silent peer is closed then).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// At most this many handshakes in progress; connections beyond are closed at once.
const MAX_PENDING_HANDSHAKES: usize = 4;
/// The service thread reads the central buffer out this often while a capture is attached.
const WRITE_PERIOD: Duration = Duration::from_millis(5);
/// Writers are asked to commit their partly filled chunks this often (what a live view needs).
const FLUSH_PERIOD: Duration = Duration::from_millis(100);
/// The service thread's poll interval when idle.
const TICK: Duration = Duration::from_millis(1);
/// Bytes of read-out records waiting for the connection thread, at most; past this the service
/// leaves data in the central buffer. A quarter of the central buffer, within these bounds.
const OUTPUT_CAP: usize = 8 << 20;
const MIN_OUTPUT_CAP: usize = 64 << 10;
/// Emptied output vectors kept for the service's next read-outs, at most (their pages are
/// already mapped: a fresh vector per read-out costs page faults on every one).
const MAX_SPARES: usize = 3;
/// A status frame this often.
const STATUS_PERIOD: Duration = Duration::from_millis(250);
/// Socket write timeout: how often a blocked sender looks at its flags.
const WRITE_SLICE: Duration = Duration::from_millis(50);
/// At exit, the longest wait for the rest of the trace to reach the capture.
pub const EXIT_SEND_BUDGET: Duration = Duration::from_secs(5);

/// How the capture backend records (from [`Config`](crate::Config)).
#[derive(Clone, Debug)]
pub(crate) struct CaptureOptions {
    pub(crate) listen: SocketAddr,
    pub(crate) token: Option<Vec<u8>>,
    pub(crate) on_demand: bool,
    pub(crate) buffer_size: usize,
    pub(crate) smb_size: usize,
    pub(crate) on_full: BufferExhaustedPolicy,
    pub(crate) categories: CategoryFilter,
    pub(crate) clear_period: Option<Duration>,
    pub(crate) incremental_timestamps: bool,
    pub(crate) stop_timeout: Duration,
    /// Announce the listener by UDP to this address ([`tachyon_capture::announce`]).
    pub(crate) announce: Option<SocketAddr>,
}

/// What the capture backend did, in [`Report::capture`](crate::Report::capture).
#[derive(Clone, Debug, Default)]
pub struct CaptureReport {
    /// The address it listened on (with the port actually bound).
    pub addr: Option<SocketAddr>,
    /// Captures that were welcomed.
    pub captures: u64,
    /// Captures refused (busy, wrong token or version, exiting).
    pub refused: u64,
    /// Recording sessions (one per capture; plus the first one before any capture attached).
    pub sessions: u64,
    /// `Trace.packet` records sent to captures.
    pub records_sent: u64,
    /// Uncompressed bytes sent.
    pub bytes_sent: u64,
    /// Bytes on the wire (LZ4 frames with their headers).
    pub wire_bytes: u64,
    /// The process recorded but no capture ever attached (without on-demand mode): what it
    /// recorded was not sent anywhere.
    pub never_captured: bool,
    /// At exit the capture did not take the rest of the trace within [`EXIT_SEND_BUDGET`].
    pub exit_send_timed_out: bool,
}

// === Output: what the service thread has read out, waiting for the connection thread ===

#[derive(Debug, Default)]
struct OutQ {
    items: VecDeque<Vec<u8>>,
    bytes: usize,
    /// The session ended: everything it will ever produce is in `items`.
    finished: bool,
    /// A capture is attached (the service reads out only then).
    attached: bool,
    /// Emptied vectors (at most [`MAX_SPARES`], each of at most the queue's capacity) the
    /// sending thread hands back for the service's next read-outs.
    spares: Vec<Vec<u8>>,
}

#[derive(Debug, Default)]
struct Output {
    cap: usize,
    q: Mutex<OutQ>,
    cv: Condvar,
    /// Chunks the central buffer overwrote or refused (published by the service thread).
    chunks_lost: AtomicU64,
    /// The writers' drops over the whole session (set before the session's end is read out).
    packets_dropped: AtomicU64,
}

enum Pop {
    Item(Vec<u8>),
    Finished,
    Empty,
}

impl Output {
    fn lock(&self) -> MutexGuard<'_, OutQ> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wants_data(&self) -> bool {
        let q = self.lock();
        q.attached && q.bytes < self.cap
    }

    fn push(&self, bytes: Vec<u8>, last: bool) {
        let mut q = self.lock();
        if !bytes.is_empty() && (q.attached || last) {
            q.bytes += bytes.len();
            q.items.push_back(bytes);
        } else {
            self.keep_spare(&mut q, bytes);
        }
        if last {
            q.finished = true;
        }
        self.cv.notify_all();
    }

    /// Gives a sent (or unused) vector back for a later read-out.
    fn recycle(&self, bytes: Vec<u8>) {
        let mut q = self.lock();
        self.keep_spare(&mut q, bytes);
    }

    fn keep_spare(&self, q: &mut OutQ, mut bytes: Vec<u8>) {
        let cap = bytes.capacity();
        if cap > 0 && cap <= self.cap.max(MIN_OUTPUT_CAP) && q.spares.len() < MAX_SPARES {
            bytes.clear();
            q.spares.push(bytes);
        }
    }

    /// An emptied vector for the next read-out (a new one when none was given back).
    fn spare(&self) -> Vec<u8> {
        self.lock().spares.pop().unwrap_or_default()
    }

    fn pop(&self, wait: Duration) -> Pop {
        let mut q = self.lock();
        if q.items.is_empty() && !q.finished {
            q = self
                .cv
                .wait_timeout(q, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        match q.items.pop_front() {
            Some(b) => {
                q.bytes -= b.len();
                Pop::Item(b)
            }
            None if q.finished => Pop::Finished,
            None => Pop::Empty,
        }
    }

    fn set_attached(&self, on: bool) {
        self.lock().attached = on;
    }
}

// === One recording session ===

enum Control {
    Stop,
}

/// A recording session: its arbiter (what threads write through) and its service thread.
struct LiveSession {
    arbiter: Arc<SmbArbiter>,
    control: Sender<Control>,
    thread: Option<JoinHandle<io::Result<()>>>,
    output: Arc<Output>,
    stop_timeout: Duration,
}

impl std::fmt::Debug for LiveSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSession").finish_non_exhaustive()
    }
}

fn start_session(o: &CaptureOptions) -> io::Result<LiveSession> {
    let smb = Arc::new(
        OwnedSmb::new(o.smb_size, PageSize::Kib4)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?,
    );
    let (sink, commits) = commit_channel();
    let config = ArbiterConfig {
        buffer_exhausted_policy: o.on_full,
        ..ArbiterConfig::default()
    };
    // SAFETY: the only other user of the buffer is this session's service thread, which copies
    // chunks only after their writers released them (committed) and never scrapes, so no chunk
    // a writer is writing is ever read concurrently.
    let arbiter = unsafe { SmbArbiter::new(smb.clone(), config, sink) };
    let session_config = SessionConfig {
        buffers: vec![BufferSpec {
            size_bytes: o.buffer_size,
            // Newest data wins when the capture falls behind: the stream goes on, with the
            // overwritten chunks counted.
            policy: FillPolicy::RingBuffer,
        }],
        data_sources: vec![DataSourceSpec::new("track_event", 0)],
        flush_period: Some(FLUSH_PERIOD),
        flush_timeout: o.stop_timeout,
        write_into_file: true,
        output_path: None,
        incremental_state_clear_period: o.clear_period,
        ..SessionConfig::default()
    };
    let mut core = ServiceCore::in_memory(session_config);
    let producer = core.add_producer(ProducerIdentity {
        pid: std::process::id() as i32,
        uid: crate::session::current_uid(),
    });
    let output = Arc::new(Output {
        cap: (o.buffer_size / 4).clamp(MIN_OUTPUT_CAP, OUTPUT_CAP),
        ..Output::default()
    });
    let (control, control_rx) = mpsc::channel();
    let svc_output = output.clone();
    let svc_arbiter = Arc::downgrade(&arbiter);
    let clear_period = o.clear_period;
    let thread = std::thread::Builder::new()
        .name("tachyon-cap-svc".into())
        .spawn(move || {
            let run = Service {
                core,
                producer,
                smb,
                commits,
                control: control_rx,
                output: svc_output,
                arbiter: svc_arbiter,
                clear_period,
            };
            run.run()
        })?;
    let handle = SessionHandle {
        session: global::next_session_number(),
        arbiter: arbiter.clone(),
        target_buffer: 0,
        incremental_timestamps: o.incremental_timestamps,
    };
    global::install(handle, o.categories.clone());
    Ok(LiveSession {
        arbiter,
        control,
        thread: Some(thread),
        output,
        stop_timeout: o.stop_timeout,
    })
}

/// Ends a session as `shutdown` ends an in-process one: queued events first, then the
/// session ends in the track event layer, writers flush (waiting up to the stop timeout), and
/// the service reads everything out with the final `TraceStats` into the output, which is then
/// finished. Returns the writers' counters and how many had not flushed.
fn end_session(mut live: LiveSession) -> (ArbiterStats, usize) {
    drain_all(Drain::FlushAll);
    global::end_session();
    state::release_thread_writer();
    drain_all(Drain::Release);
    let a = &live.arbiter;
    a.request_flush();
    a.drop_thread_writers();
    a.close();
    let deadline = Instant::now() + live.stop_timeout;
    while a.active_writers() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let still = a.active_writers();
    let stats = a.stats();
    live.output
        .packets_dropped
        .store(stats.packets_dropped, Ordering::Relaxed);
    let _ = live.control.send(Control::Stop);
    if let Some(t) = live.thread.take() {
        if let Ok(Err(e)) | Err(e) = t.join().map_err(|_| io::Error::other("panicked")) {
            eprintln!("tachyon: the capture service thread failed: {e}");
        }
    }
    // The output is finished by the service thread; if it failed, finish it here.
    live.output.push(Vec::new(), true);
    global::disable_callsites();
    (stats, still)
}

/// The service thread of one session.
struct Service {
    core: ServiceCore,
    producer: tachyon_service::ProducerId,
    smb: Arc<OwnedSmb>,
    commits: CommitReceiver,
    control: Receiver<Control>,
    output: Arc<Output>,
    arbiter: std::sync::Weak<SmbArbiter>,
    clear_period: Option<Duration>,
}

impl Service {
    fn run(mut self) -> io::Result<()> {
        let view = self.smb.service();
        let start = Instant::now();
        let mut next_write = start + WRITE_PERIOD;
        let mut next_flush = start + FLUSH_PERIOD;
        let mut next_clear = self.clear_period.map(|p| start + p);
        let mut commits_open = true;
        loop {
            let mut busy = false;
            while commits_open {
                match self.commits.try_recv() {
                    Ok(Some(req)) => {
                        self.core.commit(self.producer, &view, &req);
                        busy = true;
                    }
                    Ok(None) => break,
                    Err(_) => commits_open = false,
                }
            }
            let msg = if busy {
                self.control.try_recv().ok()
            } else {
                self.control.recv_timeout(TICK).ok()
            };
            if let Some(Control::Stop) = msg {
                while let Ok(Some(req)) = self.commits.try_recv() {
                    self.core.commit(self.producer, &view, &req);
                }
                self.core.remove_producer(self.producer);
                let result = self.core.end();
                self.publish_losses();
                // The end of the trace goes out whatever the queue holds: it is bounded by the
                // central buffer, and it is what makes the capture a complete trace.
                self.output.push(self.core.take_output(), true);
                return result;
            }
            let now = Instant::now();
            if now >= next_write {
                if self.output.wants_data() {
                    self.core.drain(false)?;
                    // The next read-out writes into a vector the sending thread is done with.
                    let records = self.core.take_output_into(self.output.spare());
                    self.output.push(records, false);
                }
                self.publish_losses();
                next_write = now + WRITE_PERIOD;
            }
            if now >= next_flush {
                if let Some(a) = self.arbiter.upgrade() {
                    a.request_flush();
                    request_flush_pass();
                }
                self.core.record_flush(true);
                next_flush = now + FLUSH_PERIOD;
            }
            if let (Some(at), Some(p)) = (next_clear, self.clear_period) {
                if now >= at {
                    global::clear_incremental_state();
                    next_clear = Some(now + p);
                }
            }
        }
    }

    fn publish_losses(&self) {
        let lost: u64 = self
            .core
            .buffers()
            .iter()
            .map(|b| b.stats().chunks_overwritten + b.stats().chunks_discarded)
            .sum();
        self.output.chunks_lost.store(lost, Ordering::Relaxed);
    }
}

// === The server: listener, handshakes, the connection ===

#[derive(Debug, Default)]
struct State {
    /// The recording session, if one runs.
    session: Option<LiveSession>,
    /// A capture holds the connection slot.
    attached: bool,
    /// ... and was welcomed: its session records.
    welcomed: bool,
    /// The process is stopping: no new captures.
    closing: bool,
    /// The connection's socket (to cut it when the exit budget runs out).
    conn: Option<TcpStream>,
    report: CaptureReport,
    writers: ArbiterStats,
    writers_still_active: usize,
}

#[derive(Debug)]
struct Shared {
    options: CaptureOptions,
    addr: SocketAddr,
    state: Mutex<State>,
    cv: Condvar,
    /// Serializes session starts and ends (the track event layer has one session at a time).
    lifecycle: Mutex<()>,
    stop_listener: AtomicBool,
    /// The exit budget ran out: the connection thread gives up sending.
    abort: AtomicBool,
    pending_handshakes: AtomicUsize,
    hello: Hello,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lifecycle(&self) -> MutexGuard<'_, ()> {
        self.lifecycle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the running session, if any (whoever takes it ends it).
    fn end_running_session(&self) {
        let _lc = self.lifecycle();
        let live = self.lock().session.take();
        if let Some(live) = live {
            let (w, still) = end_session(live);
            let mut st = self.lock();
            add_stats(&mut st.writers, &w);
            st.writers_still_active = still;
        }
    }
}

fn add_stats(sum: &mut ArbiterStats, s: &ArbiterStats) {
    sum.writers_created += s.writers_created;
    sum.chunks_committed += s.chunks_committed;
    sum.stalls += s.stalls;
    sum.stall_ns += s.stall_ns;
    sum.packets_dropped += s.packets_dropped;
    sum.drop_episodes += s.drop_episodes;
    sum.chunk_release_errors += s.chunk_release_errors;
}

/// The capture backend: listens for captures and records for them. See the module docs.
#[derive(Debug)]
pub struct CaptureServer {
    shared: Arc<Shared>,
    listener: Option<JoinHandle<()>>,
    registration: Option<registry::Registration>,
}

/// What [`CaptureServer::stop`] found.
#[derive(Debug)]
pub(crate) struct CaptureStop {
    pub(crate) report: CaptureReport,
    pub(crate) writers: ArbiterStats,
    pub(crate) writers_still_active: usize,
}

impl CaptureServer {
    /// Binds the listener (the default port and the next ones when it is taken), registers in
    /// the discovery directory and, without on-demand mode, starts recording.
    pub(crate) fn start(options: CaptureOptions) -> io::Result<CaptureServer> {
        let listener = bind(options.listen)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let clock = crate::clock::clock();
        let hello = Hello {
            program: global::process_name(),
            pid: std::process::id(),
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "unknown".into()),
            start_unix_ns: crate::clock::realtime_ns(),
            clock: format!(
                "{:?} counter, {:.4} ns per tick; timestamps in CLOCK_BOOTTIME nanoseconds",
                clock.source(),
                clock.ns_per_tick()
            ),
            on_demand: options.on_demand,
        };
        let shared = Arc::new(Shared {
            addr,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            lifecycle: Mutex::new(()),
            stop_listener: AtomicBool::new(false),
            abort: AtomicBool::new(false),
            pending_handshakes: AtomicUsize::new(0),
            hello,
            options,
        });
        {
            let mut st = shared.lock();
            st.report.addr = Some(addr);
            if !shared.options.on_demand {
                st.session = Some(start_session(&shared.options)?);
                st.report.sessions += 1;
            }
        }
        let registration = registry::register(
            &registry::default_dir(),
            &registry::Entry {
                pid: std::process::id(),
                name: shared.hello.program.clone(),
                addr: addr.ip().to_string(),
                port: addr.port(),
                version: PROTOCOL_VERSION,
            },
        )
        .map_err(|e| eprintln!("tachyon: not listed for `tachyon capture --list`: {e}"))
        .ok();
        let s = shared.clone();
        let listener = std::thread::Builder::new()
            .name("tachyon-cap-lsn".into())
            .spawn(move || listen(s, listener))?;
        Ok(CaptureServer {
            shared,
            listener: Some(listener),
            registration,
        })
    }

    /// The address captures connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// Whether a capture is attached (welcomed, its session recording) now.
    pub fn is_attached(&self) -> bool {
        self.shared.lock().welcomed
    }

    /// A handle that waits for the first capture (usable without holding the server).
    pub(crate) fn waiter(&self) -> CaptureWaiter {
        CaptureWaiter(self.shared.clone())
    }

    /// Stops listening; with a capture attached, ends the session and sends it the rest of the
    /// trace (at most [`EXIT_SEND_BUDGET`]), then closes. Never fails.
    pub(crate) fn stop(mut self) -> CaptureStop {
        self.shared.lock().closing = true;
        self.shared.stop_listener.store(true, Ordering::Relaxed);
        if let Some(l) = self.listener.take() {
            let _ = l.join();
        }
        let never_captured = {
            let st = self.shared.lock();
            st.session.is_some() && st.report.captures == 0
        };
        self.shared.end_running_session();
        let deadline = Instant::now() + EXIT_SEND_BUDGET;
        let mut st = self.shared.lock();
        while st.attached {
            let now = Instant::now();
            if now >= deadline {
                st.report.exit_send_timed_out = true;
                self.shared.abort.store(true, Ordering::Relaxed);
                if let Some(c) = &st.conn {
                    let _ = c.shutdown(Shutdown::Both);
                }
                // The connection thread notices within one write slice.
                let (g, _) = self
                    .shared
                    .cv
                    .wait_timeout(st, WRITE_SLICE * 4)
                    .unwrap_or_else(|e| e.into_inner());
                st = g;
                break;
            }
            st = self
                .shared
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        st.report.never_captured = never_captured;
        drop(self.registration.take());
        CaptureStop {
            report: st.report.clone(),
            writers: st.writers,
            writers_still_active: st.writers_still_active,
        }
    }
}

/// Waits for a capture to attach ([`Config::wait_for_capture`](crate::Config::wait_for_capture)).
#[derive(Debug)]
pub(crate) struct CaptureWaiter(Arc<Shared>);

impl CaptureWaiter {
    /// True once a capture has been welcomed; false after `timeout` without one.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.0.lock();
        while st.report.captures == 0 {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = self
                .0
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.0.addr
    }

    fn welcomed(&self) -> bool {
        self.0.lock().welcomed
    }
}

/// With the live-capture backend running: waits up to `timeout` until a capture is attached
/// (one attached now, or the first to come). False without that backend or on timeout.
pub fn wait_for_capture(timeout: Duration) -> bool {
    let Some(w) = crate::init::capture_waiter() else {
        return false;
    };
    let deadline = Instant::now() + timeout;
    while !w.welcomed() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    if addr.port() != DEFAULT_PORT {
        return TcpListener::bind(addr);
    }
    // The default port is a guess, not a promise: like Tracy, try the next ones when taken.
    let mut last = None;
    for p in DEFAULT_PORT..DEFAULT_PORT + PORT_ATTEMPTS {
        match TcpListener::bind(SocketAddr::new(addr.ip(), p)) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("at least one attempt"))
}

/// The opt-in UDP announcer: a socket and the datagram it sends every
/// [`announce::PERIOD`](tachyon_capture::announce::PERIOD).
struct Announcer {
    socket: std::net::UdpSocket,
    datagram: Vec<u8>,
    next: Instant,
}

impl Announcer {
    fn new(shared: &Shared) -> Option<Announcer> {
        let to = shared.options.announce?;
        match tachyon_capture::announce::sender(to) {
            Ok(socket) => Some(Announcer {
                socket,
                datagram: tachyon_capture::announce::encode(
                    shared.hello.pid,
                    shared.addr.port(),
                    PROTOCOL_VERSION,
                    &shared.hello.program,
                ),
                next: Instant::now(),
            }),
            Err(e) => {
                eprintln!("tachyon: cannot announce the capture listener to {to}: {e}");
                None
            }
        }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        if now >= self.next {
            // A lost or refused datagram is not an error: the next one goes a period later.
            let _ = self.socket.send(&self.datagram);
            self.next = now + tachyon_capture::announce::PERIOD;
        }
    }
}

fn listen(shared: Arc<Shared>, listener: TcpListener) {
    let mut announcer = Announcer::new(&shared);
    while !shared.stop_listener.load(Ordering::Relaxed) {
        if let Some(a) = &mut announcer {
            a.tick();
        }
        match listener.accept() {
            Ok((stream, _)) => {
                if shared.pending_handshakes.load(Ordering::Relaxed) >= MAX_PENDING_HANDSHAKES {
                    // Too many peers mid-handshake (slow or hostile ones): this one is closed.
                    continue;
                }
                shared.pending_handshakes.fetch_add(1, Ordering::Relaxed);
                let s = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("tachyon-cap-tx".into())
                    .spawn(move || serve(s, stream));
                if spawned.is_err() {
                    shared.pending_handshakes.fetch_sub(1, Ordering::Relaxed);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// One connection: the handshake, then (if welcomed) the capture.
fn serve(shared: Arc<Shared>, stream: TcpStream) {
    let claimed = handshake(&shared, &stream);
    shared.pending_handshakes.fetch_sub(1, Ordering::Relaxed);
    let Some(claimed) = claimed else {
        let _ = stream.shutdown(Shutdown::Both);
        return;
    };
    run_connection(&shared, &stream, &claimed.output, claimed.raw_frames);
    let _ = stream.shutdown(Shutdown::Both);
    let mut st = shared.lock();
    st.attached = false;
    st.welcomed = false;
    st.conn = None;
    shared.cv.notify_all();
}

/// Reads the capture's request and answers it. `Some(output)` when welcomed: the connection
/// slot is ours and a session records into its output.
fn handshake(shared: &Shared, stream: &TcpStream) -> Option<Claimed> {
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).ok()?;
    let _ = stream.set_nodelay(true);
    let refuse = |status: Status, message: String| {
        let _ = protocol::write_reply(&mut &*stream, status, message.as_bytes());
        shared.lock().report.refused += 1;
        None
    };
    // Garbage, a silent peer, a peer that closes: dropped without an answer.
    let req = protocol::read_request(&mut &*stream).ok()?;
    if !protocol::speaks(req.version) {
        return refuse(
            Status::VersionMismatch,
            format!(
                "protocol version mismatch: the program speaks {}, the capture version {}",
                protocol::versions_spoken(),
                req.version
            ),
        );
    }
    // Uncompressed frames only to a capture on this machine that asked for them (over a
    // network LZ4's saving is worth its CPU).
    let peer_local = stream.peer_addr().is_ok_and(|a| a.ip().is_loopback());
    let caps = if peer_local {
        req.caps & CAP_RAW_FRAMES
    } else {
        0
    };
    if let Some(token) = &shared.options.token {
        if !protocol::token_matches(token, &req.token) {
            return refuse(
                Status::BadToken,
                "wrong or missing capture token (the program sets TACHYON_CAPTURE_TOKEN; pass it with --token)".into(),
            );
        }
    }
    {
        let mut st = shared.lock();
        if st.closing {
            drop(st);
            return refuse(Status::Refused, "the program is exiting".into());
        }
        if st.attached {
            drop(st);
            return refuse(
                Status::Busy,
                format!(
                    "busy: another capture is attached to {} (pid {}); one capture at a time",
                    shared.hello.program, shared.hello.pid
                ),
            );
        }
        st.attached = true;
        st.conn = stream.try_clone().ok();
    }
    let release = |why: String| {
        let mut st = shared.lock();
        st.attached = false;
        st.conn = None;
        st.report.refused += 1;
        drop(st);
        shared.cv.notify_all();
        let _ = protocol::write_reply(&mut &*stream, Status::Refused, why.as_bytes());
        None
    };
    let output = {
        let _lc = shared.lifecycle();
        let mut st = shared.lock();
        if st.closing {
            drop(st);
            return release("the program is exiting".into());
        }
        if st.session.is_none() {
            drop(st);
            match start_session(&shared.options) {
                Ok(live) => {
                    st = shared.lock();
                    st.session = Some(live);
                    st.report.sessions += 1;
                }
                Err(e) => return release(format!("the program cannot start recording: {e}")),
            }
        }
        let output = st.session.as_ref().expect("a session").output.clone();
        output.set_attached(true);
        output
    };
    if protocol::write_welcome(&mut &*stream, req.version, &shared.hello, caps).is_err() {
        // The capture left during the handshake: its session ends and the slot is free again.
        shared.end_running_session();
        let mut st = shared.lock();
        st.attached = false;
        st.conn = None;
        drop(st);
        shared.cv.notify_all();
        return None;
    }
    let mut st = shared.lock();
    st.report.captures += 1;
    st.welcomed = true;
    shared.cv.notify_all();
    Some(Claimed {
        output,
        raw_frames: caps & CAP_RAW_FRAMES != 0,
    })
}

/// A welcomed capture: the output its session records into, and how frames are sent.
struct Claimed {
    output: Arc<Output>,
    /// Uncompressed data frames were granted.
    raw_frames: bool,
}

/// Why a connection ended.
#[derive(PartialEq, Eq)]
enum End {
    /// The trace is complete and sent.
    Done,
    /// The capture went away (or the socket failed, or the exit budget ran out).
    Gone,
}

/// Streams `output` to the capture until the trace ends (the capture asked to stop, or the
/// process stops) or the capture goes away.
fn run_connection(
    shared: &Arc<Shared>,
    stream: &TcpStream,
    output: &Arc<Output>,
    raw_frames: bool,
) {
    let stop_requested = Arc::new(AtomicBool::new(false));
    let gone = Arc::new(AtomicBool::new(false));
    // The capture's commands: `CMD_STOP`; anything else is ignored; EOF or an error is the
    // capture going away. Bytes are read in small pieces and dropped: a chatty peer costs
    // nothing but reads.
    if let Ok(mut rx) = stream.try_clone() {
        let _ = rx.set_read_timeout(None);
        let (stop, gone) = (stop_requested.clone(), gone.clone());
        let _ = std::thread::Builder::new()
            .name("tachyon-cap-rx".into())
            .spawn(move || {
                let mut b = [0u8; 64];
                loop {
                    match rx.read(&mut b) {
                        Ok(0) | Err(_) => {
                            gone.store(true, Ordering::Relaxed);
                            return;
                        }
                        Ok(n) => {
                            if b[..n].contains(&protocol::CMD_STOP) {
                                stop.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
    }
    let _ = stream.set_write_timeout(Some(WRITE_SLICE));
    let mut encoder = FrameEncoder::new();
    let mut status = AppStatus::default();
    let mut last_status = Instant::now();
    let mut ended_by_us = false;
    let end = loop {
        if gone.load(Ordering::Relaxed) || shared.abort.load(Ordering::Relaxed) {
            break End::Gone;
        }
        if stop_requested.load(Ordering::Relaxed) && !ended_by_us {
            // Ends the session: its last read and TraceStats land in the output, which is
            // then finished; the loop sends them and the end frame.
            ended_by_us = true;
            shared.end_running_session();
        }
        let send = |bytes: &[u8]| send_all(stream, &[], bytes, &gone, &shared.abort);
        match output.pop(Duration::from_millis(20)) {
            Pop::Item(records) => {
                let n = count_records(&records);
                status.records_sent += n;
                status.bytes_sent += records.len() as u64;
                let sent = if raw_frames {
                    // Each frame's header and its records, in one write, straight from the
                    // read-out.
                    FrameEncoder::raw_frames(&records).try_fold(0u64, |wire, (head, piece)| {
                        send_all(stream, &head, piece, &gone, &shared.abort)
                            .map(|()| wire + (HEADER_LEN + piece.len()) as u64)
                    })
                } else {
                    let frames = encoder.data(&records);
                    send(frames).map(|()| frames.len() as u64)
                };
                let bytes = records.len() as u64;
                output.recycle(records);
                let Ok(wire) = sent else {
                    break End::Gone;
                };
                let mut st = shared.lock();
                st.report.records_sent += n;
                st.report.bytes_sent += bytes;
                st.report.wire_bytes += wire;
            }
            Pop::Finished => {
                status.packets_dropped = output.packets_dropped.load(Ordering::Relaxed);
                status.chunks_lost = output.chunks_lost.load(Ordering::Relaxed);
                let _ = send(&FrameEncoder::status(&status));
                let _ = send(&FrameEncoder::end());
                break End::Done;
            }
            Pop::Empty => {}
        }
        if last_status.elapsed() >= STATUS_PERIOD {
            last_status = Instant::now();
            let st = shared.lock();
            let live = st
                .session
                .as_ref()
                .map(|s| s.arbiter.stats().packets_dropped);
            drop(st);
            // This session's drops (each capture is its own trace).
            status.packets_dropped = live
                .unwrap_or(0)
                .max(output.packets_dropped.load(Ordering::Relaxed));
            status.chunks_lost = output.chunks_lost.load(Ordering::Relaxed);
            if send(&FrameEncoder::status(&status)).is_err() {
                break End::Gone;
            }
        }
    };
    if end == End::Gone {
        // Nobody to send the rest to: the session ends (its output is dropped with it).
        let ours = {
            let st = shared.lock();
            st.session
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(&s.output, output))
        };
        if ours {
            shared.end_running_session();
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Writes all of `head` then `body` (one `writev` while both are left), retrying while the
/// capture is slow, until it is done, the capture is gone, or the exit budget ran out.
fn send_all(
    mut stream: &TcpStream,
    head: &[u8],
    body: &[u8],
    gone: &AtomicBool,
    abort: &AtomicBool,
) -> io::Result<()> {
    let mut pos = 0;
    while pos < head.len() + body.len() {
        let written = if pos < head.len() {
            stream.write_vectored(&[IoSlice::new(&head[pos..]), IoSlice::new(body)])
        } else {
            stream.write(&body[pos - head.len()..])
        };
        match written {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => pos += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                if gone.load(Ordering::Relaxed) || abort.load(Ordering::Relaxed) {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// How many `Trace.packet` records `bytes` holds (our own read-out: well-formed).
fn count_records(bytes: &[u8]) -> u64 {
    let mut n = 0;
    let mut pos = 1; // past the tag byte of the first record
    while pos < bytes.len() {
        let mut len = 0u64;
        let mut shift = 0;
        while pos < bytes.len() {
            let b = bytes[pos];
            pos += 1;
            len |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        pos += len as usize + 1; // the record, then the next tag byte
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_counted() {
        let mut b = Vec::new();
        for len in [0usize, 3, 200] {
            b.push(0x0a);
            if len < 128 {
                b.push(len as u8);
            } else {
                b.extend_from_slice(&[(len as u8) | 0x80, (len >> 7) as u8]);
            }
            b.extend(std::iter::repeat_n(0u8, len));
        }
        assert_eq!(count_records(&b), 3);
        assert_eq!(count_records(&[]), 0);
    }

    #[test]
    fn sent_vectors_come_back_for_the_next_read_outs() {
        let out = Output {
            cap: MIN_OUTPUT_CAP,
            ..Output::default()
        };
        out.set_attached(true);
        // Nothing given back yet: a new vector.
        assert_eq!(out.spare().capacity(), 0);
        let mut v = Vec::with_capacity(4096);
        v.extend_from_slice(&[1, 2, 3]);
        let at = v.as_ptr();
        out.push(v, false);
        let Pop::Item(sent) = out.pop(Duration::ZERO) else {
            panic!("an item")
        };
        out.recycle(sent);
        // The same allocation, emptied.
        let again = out.spare();
        assert_eq!(
            (again.as_ptr(), again.len(), again.capacity()),
            (at, 0, 4096)
        );
        // At most MAX_SPARES are kept, none larger than the queue, and an empty read-out's
        // vector is kept rather than dropped.
        for _ in 0..MAX_SPARES + 2 {
            out.recycle(Vec::with_capacity(64));
        }
        out.recycle(Vec::with_capacity(MIN_OUTPUT_CAP * 2));
        out.push(Vec::with_capacity(8), false);
        let q = out.lock();
        assert_eq!(q.spares.len(), MAX_SPARES);
        assert!(q.spares.iter().all(|s| s.capacity() == 64 && s.is_empty()));
        assert!(q.items.is_empty());
    }
}

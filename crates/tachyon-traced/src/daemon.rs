//! Starting and stopping the daemon: the two listening sockets, one acceptor thread per socket,
//! one reader thread per connection, and the service thread they all feed.
//!
//! ```text
//!  producer socket ── acceptor ──┐ per connection: reader thread (blocking FrameReceiver::recv)
//!  consumer socket ── acceptor ──┤        │ Event::{Connected, Frame, Closed}
//!                                │        ▼
//!  built-in probes thread ───────┴─▶ mpsc ─▶ service thread (owns every producer, consumer,
//!     (commits, flush acks)                   session and buffer; all timers; all writes)
//! ```
//!
//! Readers never touch state: they decode nothing, they only cut frames (bounded by
//! `tachyon-ipc`) and queue them, at most [`limits::MAX_QUEUED_FRAMES`] per connection. The
//! service thread answers through each connection's `FrameSender`, whose socket has a write
//! timeout, so a peer that stops reading is disconnected instead of blocking the daemon.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tachyon_ipc::conn::{peer_credentials, split, FrameReceiver};
use tachyon_ipc::paths;

use crate::config::{limits, DaemonConfig};
use crate::service::{ConnShared, Event, Kind, Service};

/// Counters of a running daemon, for `tachyon traced`'s status line and for tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DaemonStats {
    /// Producer connections open now.
    pub producers_connected: u32,
    /// Producer connections ever accepted.
    pub producers_seen: u64,
    /// Producer connections closed on accept because `max_producers` were connected.
    pub producers_refused: u64,
    /// Consumer connections open now.
    pub consumers_connected: u32,
    /// Consumer connections ever accepted.
    pub consumers_seen: u64,
    /// Consumer connections closed on accept because `max_consumers` were connected.
    pub consumers_refused: u64,
    /// Connections closed because they broke the protocol (a malformed or unexpected frame, a
    /// bad length prefix, a stream cut inside a frame, a malformed request).
    pub protocol_errors: u64,
    /// Frames refused as malformed or out of bounds (each also closes its connection).
    pub frames_rejected: u64,
    /// Connections closed because the peer did not read what the daemon wrote in time.
    pub slow_peers_disconnected: u64,
    /// Well-formed requests refused (a data source over the limits, a bad trace config…).
    pub requests_refused: u64,
    /// `CommitData` requests handled.
    pub commits: u64,
    /// Chunks producers asked to move.
    pub chunks_committed: u64,
    /// Chunks refused before reaching any session: their target buffer does not exist or
    /// belongs to a session the producer does not write to (still freed in the producer's
    /// SMB). Chunks refused inside a session are in that session's `TraceStats`.
    pub chunks_discarded: u64,
    /// Patches refused for the same reasons.
    pub patches_discarded: u64,
    /// Commit entries dropped while decoding (invalid patches, inline chunk data).
    pub invalid_commit_entries: u64,
    /// Shared memory buffers that could not be created.
    pub smb_failures: u64,
    /// Data sources registered now (built-in ones not included).
    pub data_sources_registered: u32,
    /// Tracing sessions started.
    pub sessions_started: u64,
    /// Tracing sessions existing now (running or ended but not freed).
    pub sessions_active: u32,
    /// Flushes started (consumer, periodic and final ones).
    pub flushes_requested: u64,
    /// Flushes every producer acknowledged in time.
    pub flushes_succeeded: u64,
    /// Flushes that timed out.
    pub flushes_failed: u64,
}

/// The tracing daemon. See the [crate docs](crate).
#[derive(Debug)]
pub struct Daemon;

impl Daemon {
    /// Binds both sockets (replacing stale socket files, refusing live ones) and starts the
    /// daemon's threads. A missing socket directory is created private to the user (0700), and
    /// the default one is checked to be.
    pub fn start(config: DaemonConfig) -> io::Result<DaemonHandle> {
        for socket in [&config.producer_socket, &config.consumer_socket] {
            prepare_dir(socket)?;
        }
        let producer_listener =
            paths::bind_listener(&config.producer_socket, config.producer_socket_mode)?;
        let consumer_listener =
            match paths::bind_listener(&config.consumer_socket, config.consumer_socket_mode) {
                Ok(l) => l,
                Err(e) => {
                    drop(producer_listener);
                    let _ = std::fs::remove_file(&config.producer_socket);
                    return Err(e);
                }
            };
        let (events, rx) = mpsc::channel();
        let stats = Arc::new(Mutex::new(DaemonStats::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let next_conn = Arc::new(AtomicU64::new(1));
        let service = Service::new(config.clone(), events.clone(), stats.clone());
        let mut handle = DaemonHandle {
            producer_socket: config.producer_socket.clone(),
            consumer_socket: config.consumer_socket.clone(),
            stats,
            events: events.clone(),
            stop: stop.clone(),
            threads: Vec::new(),
            listeners: Vec::new(),
            service: None,
        };
        handle.service = Some(
            std::thread::Builder::new()
                .name("tachyon-traced".into())
                .spawn(move || service.run(rx))?,
        );
        for (listener, kind, max) in [
            (producer_listener, Kind::Producer, config.max_producers),
            (consumer_listener, Kind::Consumer, config.max_consumers),
        ] {
            handle.listeners.push(listener.try_clone()?);
            let acceptor = Acceptor {
                listener,
                kind,
                max,
                live: Arc::new(AtomicUsize::new(0)),
                write_timeout: config.write_timeout,
                events: events.clone(),
                stop: stop.clone(),
                next_conn: next_conn.clone(),
            };
            let name = match kind {
                Kind::Producer => "tachyon-traced-producers",
                Kind::Consumer => "tachyon-traced-consumers",
            };
            handle.threads.push(
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || acceptor.run())?,
            );
        }
        Ok(handle)
    }
}

/// Makes sure the directory of `socket` exists: created private (0700) when missing; the
/// default directory must be private to the user (see [`paths::ensure_private_dir`]).
fn prepare_dir(socket: &Path) -> io::Result<()> {
    let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    if dir == paths::default_dir() || !dir.exists() {
        paths::ensure_private_dir(dir)?;
    }
    Ok(())
}

/// A running daemon. Dropping it shuts it down, as [`shutdown`](Self::shutdown) does.
#[derive(Debug)]
pub struct DaemonHandle {
    producer_socket: PathBuf,
    consumer_socket: PathBuf,
    stats: Arc<Mutex<DaemonStats>>,
    events: Sender<Event>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// The listening sockets, to wake the acceptors when the socket files are gone.
    listeners: Vec<UnixListener>,
    service: Option<JoinHandle<()>>,
}

impl DaemonHandle {
    /// Where producers connect.
    pub fn producer_socket(&self) -> &Path {
        &self.producer_socket
    }

    /// Where consumers connect.
    pub fn consumer_socket(&self) -> &Path {
        &self.consumer_socket
    }

    /// A snapshot of the counters (updated by the service thread after every event).
    pub fn stats(&self) -> DaemonStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the daemon: sessions are freed (a session streaming to a file gets its final
    /// `TraceStats` first), every connection is closed, the threads are joined and the socket
    /// files removed.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        let Some(service) = self.service.take() else {
            return;
        };
        self.stop.store(true, Ordering::SeqCst);
        // Wake the acceptors, which check `stop` after every accept: a connection, or (should
        // someone have removed the socket file) a shutdown of the listening socket, which makes
        // a blocked `accept` fail on Linux.
        for (path, listener) in [&self.producer_socket, &self.consumer_socket]
            .into_iter()
            .zip(&self.listeners)
        {
            if UnixStream::connect(path).is_err() {
                let _ = rustix::net::shutdown(listener, rustix::net::Shutdown::Read);
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = self.events.send(Event::Shutdown);
        let _ = service.join();
        for path in [&self.producer_socket, &self.consumer_socket] {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for DaemonHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}

// === impl Acceptor ===

/// Accepts the connections of one socket.
struct Acceptor {
    listener: UnixListener,
    kind: Kind,
    max: usize,
    /// Connections of this socket whose reader thread runs.
    live: Arc<AtomicUsize>,
    write_timeout: Duration,
    events: Sender<Event>,
    stop: Arc<AtomicBool>,
    next_conn: Arc<AtomicU64>,
}

impl Acceptor {
    fn run(self) {
        loop {
            let accepted = self.listener.accept();
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            match accepted {
                Ok((stream, _)) => self.admit(stream),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Out of descriptors or memory: back off instead of spinning.
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    fn admit(&self, stream: UnixStream) {
        if self.live.load(Ordering::SeqCst) >= self.max {
            let _ = self.events.send(Event::Refused { kind: self.kind });
            return;
        }
        let creds = match peer_credentials(&stream) {
            Ok(c) => c,
            Err(_) => return,
        };
        if stream.set_write_timeout(Some(self.write_timeout)).is_err() {
            return;
        }
        let (tx, rx) = split(stream);
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(ConnShared::default());
        self.live.fetch_add(1, Ordering::SeqCst);
        let _ = self.events.send(Event::Connected {
            conn,
            kind: self.kind,
            tx: tx.clone(),
            creds,
            shared: shared.clone(),
        });
        let reader = Reader {
            conn,
            rx,
            shared,
            events: self.events.clone(),
            live: self.live.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name("tachyon-traced-conn".into())
            .stack_size(256 * 1024)
            .spawn(move || reader.run());
        if spawned.is_err() {
            self.live.fetch_sub(1, Ordering::SeqCst);
            tx.shutdown();
            let _ = self.events.send(Event::Closed { conn, error: None });
        }
    }
}

/// Reads one connection's frames and queues them for the service thread.
struct Reader {
    conn: u64,
    rx: FrameReceiver,
    shared: Arc<ConnShared>,
    events: Sender<Event>,
    live: Arc<AtomicUsize>,
}

impl Reader {
    fn run(mut self) {
        loop {
            // Back-pressure: a peer sending faster than the service handles waits here.
            while self.shared.queued.load(Ordering::Acquire) >= limits::MAX_QUEUED_FRAMES {
                if self.shared.closed.load(Ordering::Acquire) {
                    self.live.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let event = match self.rx.recv() {
                Ok(Some(r)) => {
                    self.shared.queued.fetch_add(1, Ordering::AcqRel);
                    Event::Frame {
                        conn: self.conn,
                        body: r.body,
                        fd: r.fd,
                    }
                }
                Ok(None) => Event::Closed {
                    conn: self.conn,
                    error: None,
                },
                Err(e) => Event::Closed {
                    conn: self.conn,
                    error: Some(e),
                },
            };
            let last = matches!(event, Event::Closed { .. });
            if self.events.send(event).is_err() || last {
                break;
            }
        }
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

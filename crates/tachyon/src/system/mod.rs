//! System mode: this process is a producer of a `tachyon traced` daemon, which owns the trace.
//!
//! The design (threads, batching, the daemon going away) is documented on [`SystemSession`],
//! where users read it.

mod commands;
mod outbox;
mod smb;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use protozero::HeapBuffered;
use tachyon_ipc::rpc::{self, producer_port};
use tachyon_protos::{
    initialize_connection_request::ProducerSMBScrapingMode, InitializeConnectionRequest,
    RegisterDataSourceRequest,
};

use commands::{io_error, Handshake, RequestIds, Shared};
use outbox::Outbox;

use crate::track_event::state::{drain_all, Drain};
use crate::writer::{ArbiterStats, BufferExhaustedPolicy, SmbArbiter};

/// The longest [`start`](crate::start) takes in system mode: connecting, binding and the
/// handshake.
pub const DAEMON_CONNECT_BUDGET: Duration = Duration::from_secs(1);

/// The bind reply must come within this (the rest of [`DAEMON_CONNECT_BUDGET`] is the handshake's).
const BIND_TIMEOUT: Duration = Duration::from_millis(500);

/// The longest one write to the socket may block. Only the sender thread writes after the
/// handshake: a daemon that reads nothing for this long is taken for gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// The page size this SDK asks for (the daemon decides; 4 KiB is Perfetto's default).
const PAGE_SIZE_HINT: u32 = 4096;

/// How a system-mode connection is set up (from [`Config`](crate::Config)).
#[derive(Clone, Debug)]
pub(crate) struct SystemOptions {
    /// The daemon's producer socket.
    pub(crate) socket: PathBuf,
    /// Shared memory buffer size asked for (the daemon clamps it to 4 KiB..=32 MiB).
    pub(crate) smb_size_hint: usize,
    /// The writers' policy when the buffer is full.
    pub(crate) on_full: BufferExhaustedPolicy,
    /// Delta-encoded timestamps on the incremental clock.
    pub(crate) incremental_timestamps: bool,
    /// How long `shutdown` waits for other threads' writers.
    pub(crate) stop_timeout: Duration,
    /// The producer's name for the daemon.
    pub(crate) producer_name: String,
}

/// A connection to a `tachyon traced` daemon: this process's [`Backend`](crate::Backend) in
/// system mode.
///
/// The daemon hands the process a shared memory buffer (a sealed memfd); the same
/// [`SmbArbiter`] and [`TraceWriter`](crate::backend::TraceWriter)s as in-process write into it, and
/// commits travel over the producer socket (`crates/tachyon-ipc/PROTOCOL.md`).
///
/// # Threads
///
/// ```text
///  traced threads ── zone!/… ──▶ TraceWriter ──▶ chunk in the daemon's SMB
///        │ chunk complete: DaemonCommitSink (mutex + push; wakes the sender if idle)
///        ▼
///  Outbox ──▶ tachyon-commit thread: waits 1 ms for the burst, merges, CommitData ──▶ socket
///        ▲                                                        (bounded write timeout)
///        │ flush acks, NotifyDataSourceStopped (queued after the commits before them)
///  tachyon-producer thread ◀── replies and the command stream (GetAsyncCommand) ◀── socket
///        setup_tracing: map the memfd, make the arbiter
///        start/stop_data_source: install / end the track event session
///        flush, clear_incremental_state
/// ```
///
/// # Connecting
///
/// [`start`](crate::start) binds `ProducerPort`, then sends `InitializeConnection` (the SMB
/// size hint, 4 KiB pages, the process name, scraping enabled), `GetAsyncCommand`,
/// `RegisterDataSource{track_event}` and `Sync`, and waits until the registration and the
/// `Sync` were answered: a daemon already tracing starts the data source while handling the
/// registration, so when `Sync` returns the session is installed and the first event after
/// `start` is recorded. All of it within [`DAEMON_CONNECT_BUDGET`] (1 s); a daemon that does
/// not answer `Sync` costs that second, one that never answers the registration makes `start`
/// fail.
///
/// # Commands
///
/// - `setup_tracing`: maps the memfd that comes with it (sealed, 4 KiB..=32 MiB) and makes the
///   arbiter, which lives for the connection.
/// - `start_data_source`: installs a track event session on that arbiter, writing to the
///   config's `target_buffer` with the categories of its `track_event_config`.
/// - `stop_data_source`: ends it; threads tracing at that moment let go of their writers at
///   their next event (they get 50 ms), idle threads keep their chunk being written, which the
///   daemon scrapes (scraping is why the connection asks for it). Then
///   `NotifyDataSourceStopped`, after the commits made before it.
/// - `flush`: asks every writer to flush at its next event, waits 2 ms so that busy threads do,
///   and acknowledges with a `CommitData` carrying the request id, after every commit queued
///   before it.
/// - `clear_incremental_state`: every thread starts a new generation at its next event.
///
/// # The daemon going away
///
/// The end of the connection, a failed or timed-out write (the sender thread's only; a traced
/// thread never touches the socket), or a command that breaks the protocol: the session ends in
/// the track event layer, the arbiter is closed, what is queued is dropped (counted in
/// [`SystemReport::commits_dropped`]), and once busy threads had a moment to let go of their
/// writers every callsite reads disabled again: `zone!` costs one relaxed load and records
/// nothing. Nothing panics and nothing waits for long. The arbiter and the mapping live on in
/// the writers idle threads still hold (an `Arc`), until those threads exit or trace in a later
/// session; nothing is leaked. [`shutdown`](crate::shutdown) is still needed before another
/// [`start`](crate::start).
///
/// # One track_event instance at a time
///
/// The track event layer has one session per process (one category filter on the callsites, one
/// writer per thread). If the daemon starts a second track_event instance while one runs (two
/// tracing sessions both wanting it), the second is not traced: a line goes to stderr once, and
/// its stop is still answered.
pub struct SystemSession {
    shared: Arc<Shared>,
    commands: Option<JoinHandle<()>>,
    sender: Option<JoinHandle<()>>,
}

impl fmt::Debug for SystemSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SystemSession")
            .field("socket", &self.shared.options.socket)
            .field("connected", &self.shared.is_connected())
            .field("tracing", &self.shared.is_tracing())
            .finish_non_exhaustive()
    }
}

/// What a system-mode session did, in [`Report::system`](crate::Report::system).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemReport {
    /// The daemon's producer socket.
    pub socket: PathBuf,
    /// Track event instances the daemon started and this process traced (0: the daemon ran no
    /// tracing session that wanted track events while connected, and nothing was recorded).
    pub data_sources_started: u64,
    /// The connection ended before [`shutdown`](crate::shutdown): the daemon went away (or
    /// broke the protocol) and tracing stopped then.
    pub daemon_lost: bool,
    /// Commit requests dropped because the daemon was gone (their chunks never reached it).
    pub commits_dropped: u64,
}

impl SystemSession {
    /// Connects to the daemon and registers the `track_event` data source (see above).
    /// Takes at most [`DAEMON_CONNECT_BUDGET`] (unless the daemon's listen backlog is full, where the
    /// kernel's `connect` itself waits).
    pub(crate) fn connect(options: SystemOptions) -> io::Result<SystemSession> {
        let deadline = Instant::now() + DAEMON_CONNECT_BUDGET;
        let (caller, replies) = rpc::connect(
            &options.socket,
            producer_port::NAME,
            WRITE_TIMEOUT,
            BIND_TIMEOUT,
        )?;
        let ids = match send_handshake(&caller, &options) {
            Ok(ids) => ids,
            Err(e) => {
                caller.shutdown();
                return Err(e);
            }
        };
        let shared = Arc::new(Shared::new(options, Arc::new(Outbox::default()), caller));
        let (tx, rx) = mpsc::channel();
        let commands = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("tachyon-producer".into())
                .spawn(move || commands::run_commands(&shared, replies, ids, tx))
        };
        let commands = match commands {
            Ok(h) => h,
            Err(e) => {
                shared.caller.shutdown();
                return Err(e);
            }
        };
        let mut session = SystemSession {
            shared,
            commands: Some(commands),
            sender: None,
        };
        if let Err(e) = session.await_handshake(&rx, &ids, deadline) {
            session.stop();
            return Err(e);
        }
        session.shared.establish();
        let sender = {
            let shared = session.shared.clone();
            std::thread::Builder::new()
                .name("tachyon-commit".into())
                .spawn(move || {
                    outbox::run_sender(&shared.outbox, &shared.caller, |e| {
                        shared.lose(&format!("sending to the daemon failed: {e}"));
                    });
                })
        };
        match sender {
            Ok(h) => session.sender = Some(h),
            Err(e) => {
                session.stop();
                return Err(e);
            }
        }
        Ok(session)
    }

    fn await_handshake(
        &self,
        rx: &mpsc::Receiver<Handshake>,
        ids: &RequestIds,
        deadline: Instant,
    ) -> io::Result<()> {
        let (mut registered, mut synced) = (false, ids.sync.is_none());
        while !(registered && synced) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Handshake::Registered) => registered = true,
                Ok(Handshake::Synced) => synced = true,
                Ok(Handshake::Failed(why)) => return Err(io_error(why)),
                Err(_) if registered => {
                    // Registered, but `Sync` went unanswered: the daemon may not implement it.
                    // Tracing works; a session already running may start a moment later.
                    return Ok(());
                }
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the daemon did not register the track_event data source within {} ms",
                            DAEMON_CONNECT_BUDGET.as_millis()
                        ),
                    ))
                }
            }
        }
        Ok(())
    }

    /// The daemon's producer socket.
    pub fn socket(&self) -> &Path {
        &self.shared.options.socket
    }

    /// Whether the connection is up (not lost, not shut down).
    pub fn is_connected(&self) -> bool {
        self.shared.is_connected()
    }

    /// Whether the daemon has a track_event instance running in this process now.
    pub fn is_tracing(&self) -> bool {
        self.shared.is_tracing()
    }

    /// The arbiter over the daemon's buffer, once the daemon set it up.
    pub fn arbiter(&self) -> Option<Arc<SmbArbiter>> {
        self.shared.arbiter()
    }

    /// Ends the session: the running instance ends in the track event layer, this thread's
    /// writer flushes, other threads get up to `stop_timeout` to let go of theirs, every
    /// callsite reads disabled, what is queued is sent, and the connection is closed (the
    /// daemon scrapes what idle threads left in their chunks). Never fails.
    pub(crate) fn stop(mut self) -> SystemStop {
        // As the in-process shutdown: queued events first, idle threads' writers after.
        drain_all(Drain::FlushAll);
        let closed = self.shared.close();
        crate::track_event::state::release_thread_writer();
        let mut writers_still_active = 0;
        let mut writers = ArbiterStats::default();
        if let Some(a) = &closed.arbiter {
            a.request_flush();
            drain_all(Drain::Release);
            a.drop_thread_writers();
            // Writers still held are dropped (and flush) at their thread's next use.
            a.close();
            if closed.was_tracing {
                commands::wait_for_writers(a, self.shared.options.stop_timeout);
            }
            writers_still_active = a.active_writers();
            writers = a.stats();
        }
        crate::track_event::global::disable_callsites();
        self.shared.outbox.close();
        if let Some(h) = self.sender.take() {
            let _ = h.join();
        }
        self.shared.caller.shutdown();
        if let Some(h) = self.commands.take() {
            let _ = h.join();
        }
        SystemStop {
            report: SystemReport {
                socket: self.shared.options.socket.clone(),
                data_sources_started: closed.started,
                daemon_lost: closed.lost,
                commits_dropped: self.shared.outbox.commits_dropped(),
            },
            writers,
            writers_still_active,
        }
    }
}

/// What [`SystemSession::stop`] found.
#[derive(Debug)]
pub(crate) struct SystemStop {
    pub(crate) report: SystemReport,
    pub(crate) writers: ArbiterStats,
    pub(crate) writers_still_active: usize,
}

/// Sends the handshake's requests (they are answered on the command thread).
fn send_handshake(caller: &rpc::Caller, options: &SystemOptions) -> io::Result<RequestIds> {
    let mut init = HeapBuffered::new();
    {
        let mut r: InitializeConnectionRequest<'_> = init.root();
        r.set_shared_memory_page_size_hint_bytes(PAGE_SIZE_HINT);
        r.set_shared_memory_size_hint_bytes(
            u32::try_from(options.smb_size_hint).unwrap_or(u32::MAX),
        );
        r.set_producer_name(&options.producer_name);
        // Idle threads keep their chunk being written; the daemon must scrape it.
        r.set_smb_scraping_mode(ProducerSMBScrapingMode::SmbScrapingEnabled);
    }
    let mut register = HeapBuffered::new();
    {
        let mut r: RegisterDataSourceRequest<'_> = register.root();
        let mut d = r.set_data_source_descriptor();
        d.set_name("track_event");
        d.set_will_notify_on_stop(true);
        d.set_handles_incremental_state_clear(true);
    }
    let encode = |b: HeapBuffered| {
        b.serialize()
            .map_err(|e| io::Error::other(format!("encoding a request: {e:?}")))
    };
    let initialize = caller.invoke("InitializeConnection", &encode(init)?, None, false)?;
    // The command stream opens before the registration (as Perfetto's producers do), so the
    // commands the registration causes can come before its reply.
    let commands = caller.invoke("GetAsyncCommand", &[], None, false)?;
    let register = caller.invoke("RegisterDataSource", &encode(register)?, None, false)?;
    let sync = match caller.invoke("Sync", &[], None, false) {
        Ok(id) => Some(id),
        Err(e) if e.kind() == io::ErrorKind::Unsupported => None,
        Err(e) => return Err(e),
    };
    Ok(RequestIds {
        initialize,
        commands,
        register,
        sync,
    })
}

//! The command thread (`tachyon-producer`): reads the daemon's replies and commands and drives
//! the track event layer, and the state it shares with the sender thread and `shutdown`.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tachyon_ipc::rpc::{Caller, Replies, Reply};
use tachyon_protos::{
    get_async_command_response, DataSourceConfigView, GetAsyncCommandResponseView,
    RegisterDataSourceResponseView,
};

use super::outbox::{notify_stopped, DaemonCommitSink, Outbox, Outgoing};
use super::smb::DaemonSmb;
use super::SystemOptions;
use crate::track_event::global::{self, SessionHandle};
use crate::track_event::state::{drain_all, Drain};
use crate::track_event::CategoryFilter;
use crate::writer::{ArbiterConfig, SmbArbiter};

/// How long a `stop_data_source` waits for busy threads to let go of their writers (they do at
/// their next event) before it answers. Idle threads keep their chunk, which the daemon scrapes;
/// so this only decides whether a busy thread's last chunk arrives committed or scraped.
const STOP_GRACE: Duration = Duration::from_millis(50);

/// How long a flush waits after asking writers to flush before it queues the acknowledgement,
/// so that threads tracing right now (an event every few microseconds) have committed first.
const FLUSH_GRACE: Duration = Duration::from_millis(2);

/// Ids of the track_event instances remembered without being traced (see `State::ignored`).
const MAX_IGNORED: usize = 64;

/// The requests whose replies the command thread waits for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestIds {
    pub(crate) initialize: u64,
    pub(crate) commands: u64,
    pub(crate) register: u64,
    /// `None` when the daemon does not offer `Sync`.
    pub(crate) sync: Option<u64>,
}

/// What the command thread tells `connect` during the handshake.
#[derive(Debug)]
pub(crate) enum Handshake {
    /// `RegisterDataSource` was accepted.
    Registered,
    /// The reply to `Sync` came: every command the registration caused was handled before it.
    Synced,
    /// The daemon refused, or the connection ended.
    Failed(String),
}

#[derive(Debug, Default)]
struct State {
    /// Created at `setup_tracing`; lives for the connection.
    arbiter: Option<Arc<SmbArbiter>>,
    /// The track_event instance being traced.
    instance: Option<u64>,
    /// Instances started while another ran (or that could not start): not traced, answered at
    /// their stop.
    ignored: Vec<u64>,
    /// The one-at-a-time message was printed.
    warned_second_instance: bool,
    /// The handshake completed (before, failures are `connect`'s to report).
    established: bool,
    /// No more sessions: shutdown began or the daemon is gone.
    closed: bool,
    /// Closed because of the daemon (its end, an error, a protocol violation).
    lost: bool,
    /// Instances traced so far.
    started: u64,
}

/// State shared by the command thread, the sender thread and the session's owner.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) options: SystemOptions,
    pub(crate) outbox: Arc<Outbox>,
    pub(crate) caller: Caller,
    state: Mutex<State>,
}

/// Waits until `arbiter` has no writers left or `timeout` passed.
pub(crate) fn wait_for_writers(arbiter: &SmbArbiter, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while arbiter.active_writers() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// What `Shared::close` found.
#[derive(Debug)]
pub(crate) struct Closed {
    pub(crate) arbiter: Option<Arc<SmbArbiter>>,
    /// A track_event instance was being traced.
    pub(crate) was_tracing: bool,
    pub(crate) lost: bool,
    pub(crate) started: u64,
}

impl Shared {
    pub(crate) fn new(options: SystemOptions, outbox: Arc<Outbox>, caller: Caller) -> Self {
        Shared {
            options,
            outbox,
            caller,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn is_connected(&self) -> bool {
        !self.lock().closed
    }

    /// The handshake completed: from now on losing the daemon is reported on stderr.
    pub(crate) fn establish(&self) {
        self.lock().established = true;
    }

    pub(crate) fn is_tracing(&self) -> bool {
        self.lock().instance.is_some()
    }

    pub(crate) fn arbiter(&self) -> Option<Arc<SmbArbiter>> {
        self.lock().arbiter.clone()
    }

    /// No session from now on (shutdown): ends the running one in the track event layer.
    /// Callsites stay as they are: the caller disables them once writers had their chance.
    pub(crate) fn close(&self) -> Closed {
        let mut st = self.lock();
        st.closed = true;
        let was_tracing = st.instance.take().is_some();
        if was_tracing {
            global::end_session();
        }
        Closed {
            arbiter: st.arbiter.clone(),
            was_tracing,
            lost: st.lost,
            started: st.started,
        }
    }

    /// The daemon is gone (or broke the protocol): stop tracing, drop what cannot be sent, hang
    /// up. Idempotent; a no-op once shutdown began.
    pub(crate) fn lose(&self, why: &str) {
        let mut st = self.lock();
        if st.closed {
            return;
        }
        st.closed = true;
        st.lost = true;
        let was_tracing = st.instance.take().is_some();
        if was_tracing {
            global::end_session();
        }
        let arbiter = st.arbiter.clone();
        let established = st.established;
        drop(st);
        self.outbox.kill();
        self.caller.shutdown();
        if established {
            eprintln!(
                "tachyon: tracing into the daemon at {} stopped: {why}",
                self.options.socket.display()
            );
        }
        if let Some(a) = arbiter {
            // Writers of a closed arbiter are dropped at their thread's next event; their
            // commits go nowhere (the outbox is dead) and the chunks stay Complete, which no
            // longer matters.
            a.close();
            if was_tracing {
                // Threads that trace now let go of their writers at their next event (an
                // enabled callsite reaches the thread's state, which sees the session ended).
                // Idle threads keep theirs, and with it the mapping, until they exit.
                wait_for_writers(&a, STOP_GRACE);
            }
        }
        if was_tracing {
            global::disable_callsites();
        }
    }

    // === Commands ===

    fn setup_tracing(&self, page_size_kb: u32, fd: Option<OwnedFd>) -> Result<(), String> {
        let mut st = self.lock();
        if st.arbiter.is_some() {
            // Once per connection (PROTOCOL.md); a repeat changes nothing.
            return Ok(());
        }
        let fd = fd.ok_or("setup_tracing came without the shared memory descriptor")?;
        let smb = DaemonSmb::map(fd, page_size_kb)
            .map_err(|e| format!("cannot map the daemon's shared memory: {e}"))?;
        let config = ArbiterConfig {
            buffer_exhausted_policy: self.options.on_full,
            ..ArbiterConfig::default()
        };
        let sink = DaemonCommitSink(self.outbox.clone());
        // SAFETY: `SmbArbiter::new` asks that nothing in this process accesses a chunk's payload
        // while its writer may be writing it. In system mode nothing in this process reads the
        // buffer at all except the arbiter and its writers: the service is the daemon, another
        // process with its own mapping, which copies chunks before parsing them and scrapes
        // chunks being written through atomics, tolerating any bytes (the arbiter's contract
        // places it outside this concern). This process keeps no other view of the mapping:
        // `DaemonSmb` hands out only the producer view the arbiter asks for.
        let arbiter = unsafe { SmbArbiter::new(Arc::new(smb), config, sink) };
        st.arbiter = Some(arbiter);
        Ok(())
    }

    fn start_data_source(&self, id: u64, config: Option<DataSourceConfigView<'_>>) {
        let parsed = config
            .ok_or_else(|| "no config".to_owned())
            .and_then(|c| parse_config(&c));
        let mut st = self.lock();
        if st.closed {
            return;
        }
        let remember = |st: &mut State| {
            if st.ignored.len() == MAX_IGNORED {
                st.ignored.remove(0);
            }
            st.ignored.push(id);
        };
        let (target_buffer, filter) = match parsed {
            Ok(p) => p,
            Err(e) => {
                eprintln!(
                    "tachyon: the daemon's track_event config {id} is unusable ({e}); not traced"
                );
                remember(&mut st);
                return;
            }
        };
        let Some(arbiter) = st.arbiter.clone() else {
            eprintln!("tachyon: the daemon started track_event {id} before setting up shared memory; not traced");
            remember(&mut st);
            return;
        };
        if let Some(current) = st.instance {
            // The track event layer has one session per process: its callsites hold one
            // category filter, its threads one writer each. A second instance (a second
            // tracing session wanting track_event) is not traced by this process.
            if !st.warned_second_instance {
                st.warned_second_instance = true;
                eprintln!(
                    "tachyon: the daemon started a second track_event instance ({id}) while {current} runs; this process traces one at a time, {id} is ignored"
                );
            }
            remember(&mut st);
            return;
        }
        let handle = SessionHandle {
            session: global::next_session_number(),
            arbiter,
            target_buffer,
            incremental_timestamps: self.options.incremental_timestamps,
        };
        global::install(handle, filter);
        st.instance = Some(id);
        st.started += 1;
    }

    fn stop_data_source(&self, id: u64) {
        // Queued events reach the writers before the session ends (without this lock: encoding
        // may commit chunks); then the writers of threads not tracing now flush and drop (see
        // `state::drain_all`).
        drain_all(Drain::FlushAll);
        let mut st = self.lock();
        if st.instance == Some(id) {
            st.instance = None;
            global::end_session();
            let arbiter = st.arbiter.clone();
            drop(st);
            if let Some(a) = &arbiter {
                a.request_flush();
                drain_all(Drain::Release);
                wait_for_writers(a, STOP_GRACE.min(self.options.stop_timeout));
            }
            // Only this thread installs sessions, so none started during the wait.
            if self.lock().instance.is_none() {
                global::disable_callsites();
            }
        } else {
            st.ignored.retain(|&i| i != id);
            drop(st);
        }
        // Queued after the commits of the writers that flushed above.
        self.outbox.push(notify_stopped(id));
    }

    fn flush(&self, request_id: u64) {
        if let Some(a) = self.arbiter() {
            if self.is_tracing() {
                a.request_flush();
                drain_all(Drain::FlushAll);
                std::thread::sleep(FLUSH_GRACE);
            }
        }
        self.outbox.push(Outgoing::FlushAck(request_id));
    }

    fn clear_incremental_state(&self) {
        if self.is_tracing() {
            global::clear_incremental_state();
        }
    }

    /// One command of the async stream. An error is a protocol violation.
    fn command(&self, payload: &[u8], fd: Option<OwnedFd>) -> Result<(), String> {
        let bad = |e: protozero::DecodeError| format!("malformed command from the daemon: {e}");
        let c = GetAsyncCommandResponseView::decode(payload).map_err(bad)?;
        if c.has_setup_tracing() {
            let s = c.setup_tracing().map_err(bad)?;
            self.setup_tracing(s.shared_buffer_page_size_kb(), fd)?;
        } else if c.has_start_data_source() {
            let s: get_async_command_response::StartDataSourceView<'_> =
                c.start_data_source().map_err(bad)?;
            let config = if s.has_config() {
                Some(s.config().map_err(bad)?)
            } else {
                None
            };
            self.start_data_source(s.new_instance_id(), config);
        } else if c.has_stop_data_source() {
            let s = c.stop_data_source().map_err(bad)?;
            self.stop_data_source(s.instance_id());
        } else if c.has_flush() {
            let f = c.flush().map_err(bad)?;
            self.flush(f.request_id());
        } else if c.has_clear_incremental_state() {
            self.clear_incremental_state();
        }
        // `setup_data_source` (Perfetto sends it before the start) and anything newer: nothing
        // to do.
        Ok(())
    }
}

/// The target buffer and the category filter of a track_event instance.
fn parse_config(c: &DataSourceConfigView<'_>) -> Result<(u16, CategoryFilter), String> {
    let target = c.target_buffer();
    let target_buffer = u16::try_from(target)
        .map_err(|_| format!("target buffer {target} does not fit the chunk ABI's 16 bits"))?;
    let filter = if c.has_track_event_config() {
        let t = c
            .track_event_config()
            .map_err(|e| format!("malformed track_event_config: {e}"))?;
        CategoryFilter::from_config(&t).map_err(|e| format!("malformed track_event_config: {e}"))?
    } else {
        CategoryFilter::all()
    };
    Ok((target_buffer, filter))
}

/// The command thread: reads until the connection ends. During the handshake it reports to
/// `connect` through `handshake`; after it, the end of the connection means the daemon is gone.
pub(crate) fn run_commands(
    shared: &Shared,
    mut replies: Replies,
    ids: RequestIds,
    handshake: mpsc::Sender<Handshake>,
) {
    let why = loop {
        let reply = match replies.recv() {
            Ok(Some(r)) => r,
            Ok(None) => break "the daemon closed the connection".to_owned(),
            Err(e) => break format!("reading from the daemon failed: {e}"),
        };
        if let Err(why) = handle_reply(shared, reply, &ids, &handshake) {
            break why;
        }
    };
    // During the handshake `connect` reports the failure (and shuts the connection down); the
    // send fails harmlessly once it stopped listening.
    let _ = handshake.send(Handshake::Failed(why.clone()));
    shared.lose(&why);
}

fn handle_reply(
    shared: &Shared,
    reply: Reply,
    ids: &RequestIds,
    handshake: &mpsc::Sender<Handshake>,
) -> Result<(), String> {
    let id = reply.request_id;
    if id == ids.commands {
        if !reply.success || !reply.has_more {
            return Err("the daemon ended the command stream".into());
        }
        return shared.command(&reply.payload, reply.fd);
    }
    if id == ids.initialize {
        if !reply.success {
            return Err(format!(
                "the daemon refused the connection: {}",
                String::from_utf8_lossy(&reply.payload)
            ));
        }
    } else if id == ids.register {
        let error = RegisterDataSourceResponseView::decode(&reply.payload)
            .ok()
            .and_then(|r| r.error().ok().map(str::to_owned))
            .unwrap_or_default();
        if !reply.success || !error.is_empty() {
            return Err(format!(
                "the daemon refused the track_event data source: {}",
                if error.is_empty() {
                    String::from_utf8_lossy(&reply.payload).into_owned()
                } else {
                    error
                }
            ));
        }
        let _ = handshake.send(Handshake::Registered);
    } else if Some(id) == ids.sync {
        // Any answer, even an error, says the daemon handled everything sent before.
        let _ = handshake.send(Handshake::Synced);
    }
    // Replies to anything else (a `CommitData` reply the daemon sent anyway): nothing to do.
    Ok(())
}

/// An error naming what failed.
pub(crate) fn io_error(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionRefused, why)
}

//! The service thread: the only owner of the daemon's state.
//!
//! Everything arrives as an [`Event`] on one channel (connections, frames, hang-ups, the
//! built-in probes' commits and acknowledgements), is handled to completion, and then the
//! timers are checked ([`Service::tick`]): session duration, periodic flush, periodic file
//! write, incremental-state clear, flush and stop timeouts. The thread sleeps in
//! `recv_timeout` until the next deadline.
//!
//! Sending can fail (a peer that does not read within the write timeout, or is gone): the
//! connection is then put on a list and disconnected once the current event is handled
//! ([`Service::reap`]), so no handler has to cope with state vanishing under it.
//!
//! - `producer.rs`: the producer port (binding, registration, commits, the command stream).
//! - `consumer.rs`: the consumer port (enable, disable, flush, read, stats, free).
//! - `session.rs`: sessions: buffers with global ids, data source instances, flushes, stop.

mod consumer;
mod producer;
mod session;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tachyon_abi::{ChunkToMove, ChunkToPatch, CommitRequest, ServiceView};
use tachyon_ipc::conn::{FrameSender, PeerCredentials};
use tachyon_service::ProducerIdentity;

use crate::builtin::Builtin;
use crate::config::DaemonConfig;
use crate::daemon::DaemonStats;

use consumer::Consumer;
use producer::Producer;
use session::Session;

/// While a periodic write is under way in steps, at most this many events are handled
/// between two steps (a flood of frames does not hold the read-out up for ever).
const MAX_EVENTS_BETWEEN_STEPS: usize = 4096;

/// A connection, numbered by the acceptors (never reused).
pub(crate) type ConnId = u64;
/// A tracing session.
pub(crate) type SessionId = u64;

/// Which socket a connection came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Producer,
    Consumer,
}

/// What a connection's reader shares with the service thread.
#[derive(Debug, Default)]
pub(crate) struct ConnShared {
    /// Frames queued and not handled yet.
    pub(crate) queued: AtomicUsize,
    /// The service dropped the connection: the reader stops.
    pub(crate) closed: AtomicBool,
}

/// Everything the service thread reacts to.
#[derive(Debug)]
pub(crate) enum Event {
    /// A connection was accepted (its reader starts right after).
    Connected {
        conn: ConnId,
        kind: Kind,
        tx: FrameSender,
        creds: PeerCredentials,
        shared: Arc<ConnShared>,
    },
    /// A connection was refused (over the limit).
    Refused { kind: Kind },
    /// A frame, with the descriptor that came with it.
    Frame {
        conn: ConnId,
        body: Vec<u8>,
        fd: Option<OwnedFd>,
    },
    /// End of stream (`None`) or a receive error (a protocol error for `InvalidData` and
    /// `UnexpectedEof`).
    Closed {
        conn: ConnId,
        error: Option<io::Error>,
    },
    /// A commit of the built-in probes' writers.
    BuiltinCommit(CommitRequest),
    /// The built-in probes finished a flush.
    BuiltinFlushed { request_id: u64 },
    /// A built-in probe instance stopped (its last data committed before this event).
    BuiltinStopped { instance_id: u64 },
    /// The daemon is shutting down.
    Shutdown,
}

/// Who writes into a session: a producer connection or the daemon's built-in probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Who {
    Conn(ConnId),
    Builtin,
}

/// The service thread's state. See the module docs.
pub(crate) struct Service {
    config: DaemonConfig,
    events: Sender<Event>,
    producers: HashMap<ConnId, Producer>,
    consumers: HashMap<ConnId, Consumer>,
    sessions: BTreeMap<SessionId, Session>,
    /// Global buffer id → (session, buffer index in the session).
    buffer_map: HashMap<u16, (SessionId, u16)>,
    /// Where the search for a free global buffer id starts (ids come back late).
    next_buffer: u16,
    next_session: SessionId,
    next_instance: u64,
    next_flush: u64,
    builtin: Option<Builtin>,
    builtin_identity: ProducerIdentity,
    /// Connections to disconnect once the current event is handled.
    doomed: Vec<ConnId>,
    data_sources_seen: u64,
    stats: DaemonStats,
    published: Arc<Mutex<DaemonStats>>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("producers", &self.producers.len())
            .field("consumers", &self.consumers.len())
            .field("sessions", &self.sessions.len())
            .finish_non_exhaustive()
    }
}

impl Service {
    pub(crate) fn new(
        config: DaemonConfig,
        events: Sender<Event>,
        published: Arc<Mutex<DaemonStats>>,
    ) -> Service {
        Service {
            config,
            events,
            producers: HashMap::new(),
            consumers: HashMap::new(),
            sessions: BTreeMap::new(),
            buffer_map: HashMap::new(),
            next_buffer: 0,
            next_session: 1,
            next_instance: 1,
            next_flush: 1,
            builtin: None,
            builtin_identity: ProducerIdentity {
                pid: std::process::id() as i32,
                uid: rustix::process::getuid().as_raw() as i32,
            },
            doomed: Vec::new(),
            data_sources_seen: 0,
            stats: DaemonStats::default(),
            published,
        }
    }

    /// The service thread's loop.
    pub(crate) fn run(mut self, events: Receiver<Event>) {
        loop {
            let event = match self.next_deadline() {
                Some(at) => events.recv_timeout(at.saturating_duration_since(Instant::now())),
                None => events.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match event {
                Ok(Event::Shutdown) | Err(RecvTimeoutError::Disconnected) => break,
                Ok(event) => self.handle(event),
                Err(RecvTimeoutError::Timeout) => {}
            }
            if self.sessions.values().any(|s| s.writing) {
                // A periodic write is under way in steps: everything that arrived meanwhile
                // (the producers' commits, above all) is handled before the next step, so
                // that their chunks go back to them while the read-out goes on.
                let mut shutdown = false;
                for _ in 0..MAX_EVENTS_BETWEEN_STEPS {
                    self.reap();
                    match events.try_recv() {
                        Ok(Event::Shutdown) => {
                            shutdown = true;
                            break;
                        }
                        Ok(event) => self.handle(event),
                        Err(_) => break,
                    }
                }
                if shutdown {
                    break;
                }
            }
            loop {
                self.reap();
                self.tick(Instant::now());
                if self.doomed.is_empty() {
                    break;
                }
            }
            self.publish();
        }
        self.shutdown();
        self.publish();
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Connected {
                conn,
                kind,
                tx,
                creds,
                shared,
            } => match kind {
                Kind::Producer => {
                    self.stats.producers_connected += 1;
                    self.stats.producers_seen += 1;
                    self.producers
                        .insert(conn, Producer::new(tx, creds, shared));
                }
                Kind::Consumer => {
                    self.stats.consumers_connected += 1;
                    self.stats.consumers_seen += 1;
                    self.consumers.insert(conn, Consumer::new(tx, shared));
                }
            },
            Event::Refused { kind } => match kind {
                Kind::Producer => self.stats.producers_refused += 1,
                Kind::Consumer => self.stats.consumers_refused += 1,
            },
            Event::Frame { conn, body, fd } => {
                if let Some(p) = self.producers.get(&conn) {
                    p.shared.queued.fetch_sub(1, Ordering::AcqRel);
                    // Producers never pass descriptors to the daemon (it creates every SMB):
                    // one that does only has it closed.
                    drop(fd);
                    self.on_producer_frame(conn, &body);
                } else if let Some(c) = self.consumers.get(&conn) {
                    c.shared.queued.fetch_sub(1, Ordering::AcqRel);
                    self.on_consumer_frame(conn, &body, fd);
                }
            }
            Event::Closed { conn, error } => {
                let known =
                    self.producers.contains_key(&conn) || self.consumers.contains_key(&conn);
                if known {
                    if let Some(e) = error {
                        if matches!(
                            e.kind(),
                            io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
                        ) {
                            self.stats.frames_rejected += 1;
                            self.stats.protocol_errors += 1;
                        }
                    }
                    self.disconnect(conn);
                }
            }
            Event::BuiltinCommit(req) => self.apply_commit(Who::Builtin, &req),
            Event::BuiltinFlushed { request_id } => self.on_flush_ack(Who::Builtin, request_id),
            Event::BuiltinStopped { instance_id } => {
                self.on_instance_stopped(Who::Builtin, instance_id)
            }
            Event::Shutdown => {}
        }
    }

    /// Closes a connection that broke the protocol.
    fn violation(&mut self, conn: ConnId) {
        self.stats.protocol_errors += 1;
        self.doom(conn);
    }

    /// Disconnects `conn` once the current event is handled.
    fn doom(&mut self, conn: ConnId) {
        if !self.doomed.contains(&conn) {
            self.doomed.push(conn);
        }
    }

    /// Counts a failed send: the peer is gone or did not read in time.
    fn send_failed(&mut self, conn: ConnId, e: &io::Error) {
        if e.kind() == io::ErrorKind::TimedOut {
            self.stats.slow_peers_disconnected += 1;
        }
        self.doom(conn);
    }

    fn reap(&mut self) {
        while let Some(conn) = self.doomed.pop() {
            self.disconnect(conn);
        }
    }

    /// Forgets a connection: a producer's SMB is scraped into every session it writes to first;
    /// a consumer's session is freed.
    fn disconnect(&mut self, conn: ConnId) {
        if let Some(p) = self.producers.remove(&conn) {
            p.close();
            self.stats.producers_connected -= 1;
            self.stats.data_sources_registered -= p.data_sources.len() as u32;
            self.detach_producer(conn, &p);
        } else if let Some(mut c) = self.consumers.remove(&conn) {
            if c.timed_out() {
                self.stats.slow_peers_disconnected += 1;
            }
            c.close();
            self.stats.consumers_connected -= 1;
            if let Some(sid) = c.session {
                self.destroy_session(sid, false);
            }
        }
    }

    // === commits ===

    /// Routes a commit to the sessions its target buffers belong to. A chunk for a buffer that
    /// does not exist, or of a session `who` does not write to, is freed and counted, never
    /// copied; so is a patch.
    fn apply_commit(&mut self, who: Who, req: &CommitRequest) {
        self.stats.commits += 1;
        self.stats.chunks_committed += req.chunks_to_move.len() as u64;
        let Service {
            producers,
            sessions,
            buffer_map,
            builtin,
            stats,
            ..
        } = self;
        let view = match who {
            Who::Conn(c) => producers.get(&c).and_then(Producer::service_view),
            Who::Builtin => builtin.as_ref().map(Builtin::service_view),
        };
        let Some(view) = view else {
            // No SMB yet: nothing to free, nothing to copy.
            stats.chunks_discarded += req.chunks_to_move.len() as u64;
            stats.patches_discarded += req
                .chunks_to_patch
                .iter()
                .map(|p| p.patches.len().max(1) as u64)
                .sum::<u64>();
            return;
        };
        let route = |global: u16| -> Option<SessionId> {
            let &(sid, _) = buffer_map.get(&global)?;
            sessions
                .get(&sid)
                .filter(|s| s.members.contains_key(&who))
                .map(|_| sid)
        };
        let mut split: BTreeMap<SessionId, CommitRequest> = BTreeMap::new();
        for mv in &req.chunks_to_move {
            match route(mv.target_buffer) {
                Some(sid) => split
                    .entry(sid)
                    .or_default()
                    .chunks_to_move
                    .push(ChunkToMove {
                        target_buffer: buffer_map[&mv.target_buffer].1,
                        ..*mv
                    }),
                None => {
                    stats.chunks_discarded += 1;
                    free_chunk(&view, mv);
                }
            }
        }
        for p in &req.chunks_to_patch {
            match route(p.target_buffer) {
                Some(sid) => split
                    .entry(sid)
                    .or_default()
                    .chunks_to_patch
                    .push(ChunkToPatch {
                        target_buffer: buffer_map[&p.target_buffer].1,
                        ..p.clone()
                    }),
                None => stats.patches_discarded += p.patches.len().max(1) as u64,
            }
        }
        for (sid, part) in split {
            let session = sessions
                .get_mut(&sid)
                .expect("routed to an existing session");
            let producer = session.members[&who];
            session.core.commit(producer, &view, &part);
        }
    }

    // === stats ===

    pub(super) fn publish(&mut self) {
        self.stats.sessions_active = self.sessions.len() as u32;
        *self.published.lock().unwrap_or_else(|e| e.into_inner()) = self.stats;
    }

    /// Service-wide counts for a session's `TraceStats`.
    fn service_wide(&self) -> tachyon_service::ServiceWideStats {
        tachyon_service::ServiceWideStats {
            producers_connected: self.stats.producers_connected,
            producers_seen: self.stats.producers_seen,
            data_sources_registered: self.stats.data_sources_registered,
            data_sources_seen: self.data_sources_seen,
            tracing_sessions: self.sessions.len() as u32,
        }
    }

    /// Daemon shutdown: every session freed, every connection closed.
    fn shutdown(&mut self) {
        let sessions: Vec<SessionId> = self.sessions.keys().copied().collect();
        for sid in sessions {
            if let Some(s) = self.sessions.get_mut(&sid) {
                s.error
                    .get_or_insert_with(|| "the tracing daemon shut down".into());
            }
            self.destroy_session(sid, true);
        }
        for (_, p) in self.producers.drain() {
            p.close();
        }
        for (_, c) in self.consumers.drain() {
            c.close_and_wait();
        }
        self.stats.producers_connected = 0;
        self.stats.consumers_connected = 0;
        self.stats.data_sources_registered = 0;
        self.builtin = None;
    }
}

/// Gives a refused chunk back to its producer (Complete → BeingRead → Free) without reading
/// it, so that refusing a chunk never leaks it. A chunk that is not Complete is left alone.
fn free_chunk(view: &ServiceView<'_>, mv: &ChunkToMove) {
    if let Ok(chunk) = view.try_acquire_chunk_for_reading(mv.page as usize, mv.chunk as usize) {
        let _ = view.release_chunk_as_free(chunk);
    }
}

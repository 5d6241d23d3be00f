//! Tracing sessions in the daemon.
//!
//! A session is a [`ServiceCore`] (its central buffers, read-out, output) plus what only a
//! multi-producer service needs:
//!
//! - **Global buffer ids.** Sessions coexist, so each of a session's buffers gets a daemon-wide
//!   id, and that is the `target_buffer` producers stamp on their chunks. A commit is routed by
//!   it, and accepted only from a producer that is a *member* of the session (it has had a data
//!   source instance started there); anything else is discarded and the chunk freed.
//! - **Instances**: one per (data source in the config, producer that registered it), started
//!   when the session starts or when a matching producer registers later.
//! - **Flushes**: `Flush{request_id}` to every member with a running instance, completed when all
//!   acknowledge (`CommitData.flush_request_id`) or at the timeout; then every member's SMB is
//!   scraped. Consumer-requested, periodic (`flush_period_ms`) and final flushes work alike.
//! - **Stop**: final flush → `StopDataSource` → wait (bounded) for `NotifyDataSourceStopped`
//!   from producers that promised it → scrape → end of the output → the deferred
//!   `EnableTracing` reply.
//!
//! Scraping a producer that writes to several sessions is ambiguous for writers that never
//! committed (a chunk header does not name its buffer): such chunks are left alone (see
//! [`ServiceCore::scrape_with`]); a producer in one session, whose SMB held no chunk when it
//! joined (none left from an earlier session), has them scraped into the target buffer of its
//! data source.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use tachyon_ipc::rpc::method_reply;
use tachyon_service::{ProducerId, ServiceCore, SessionConfig, STREAM_STEP_CHUNKS};

use super::producer::{Command, Producer};
use super::{ConnId, Service, SessionId, Who};
use crate::config::limits;
use crate::wire;

/// A data source instance.
#[derive(Debug)]
pub(super) struct Instance {
    pub(super) id: u64,
    pub(super) who: Who,
    /// Index of its data source in the session config.
    pub(super) spec: usize,
    /// Buffer index (in the session) it writes to.
    pub(super) target: u16,
    pub(super) stopped: bool,
    pub(super) notify_on_stop: bool,
    pub(super) handles_clear: bool,
}

/// Why a flush was started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Purpose {
    /// A consumer's `Flush` (answered on completion).
    Consumer { conn: ConnId, request_id: u64 },
    /// `flush_period_ms`.
    Periodic,
    /// The flush that starts the stop.
    Stop,
}

#[derive(Debug)]
pub(super) struct PendingFlush {
    id: u64,
    waiting: BTreeSet<Who>,
    deadline: Instant,
    purpose: Purpose,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    Running,
    /// The final flush is out.
    Flushing,
    /// `StopDataSource` is out; waiting for instances to stop until `deadline`.
    Stopping {
        deadline: Instant,
    },
    /// Output ended; buffers kept until freed.
    Ended,
}

/// One tracing session. See the module docs.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) consumer: ConnId,
    /// The `EnableTracing` request to answer when the session ends.
    enable_request: Option<u64>,
    pub(super) core: ServiceCore,
    /// Global id of each buffer.
    buffers: Vec<u16>,
    /// Producers writing into the session, with their id in `core`.
    pub(super) members: HashMap<Who, ProducerId>,
    instances: Vec<Instance>,
    pub(super) state: State,
    flushes: Vec<PendingFlush>,
    stop_at: Option<Instant>,
    next_flush: Option<Instant>,
    next_write: Option<Instant>,
    /// A periodic write's read-out is under way, in steps between which the service thread
    /// handles what arrived (see [`ServiceCore::drain_some`]).
    pub(super) writing: bool,
    next_clear: Option<Instant>,
    pub(super) error: Option<String>,
}

impl Session {
    fn config(&self) -> &SessionConfig {
        self.core.config()
    }

    fn streaming(&self) -> bool {
        self.config().write_into_file
    }

    /// The earliest moment something must happen in this session.
    fn deadline(&self, now: Instant) -> Option<Instant> {
        let mut at: Option<Instant> = None;
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                at = Some(at.map_or(t, |a| a.min(t)));
            }
        };
        for f in &self.flushes {
            consider(Some(if f.waiting.is_empty() {
                now
            } else {
                f.deadline
            }));
        }
        match self.state {
            State::Running => {
                consider(self.stop_at);
                consider(self.next_flush);
                consider(self.next_write);
                consider(self.writing.then_some(now));
                consider(self.next_clear);
            }
            State::Stopping { deadline } => {
                let all = self.instances.iter().all(|i| i.stopped);
                consider(Some(if all { now } else { deadline }));
            }
            State::Flushing | State::Ended => {}
        }
        at
    }

    /// Whether `who` has an instance of data source `spec` here.
    fn has_instance(&self, who: Who, spec: usize) -> bool {
        self.instances
            .iter()
            .any(|i| i.who == who && i.spec == spec)
    }
}

/// Advances a periodic timer past `now`.
fn advance(next: &mut Option<Instant>, period: Option<Duration>, now: Instant) {
    if let (Some(at), Some(period)) = (next.as_mut(), period) {
        while *at <= now {
            *at += period;
        }
    }
}

impl Service {
    // === creation ===

    /// `EnableTracing`: validates the config, creates the session and its buffers, starts its
    /// data sources. Errors are the deferred reply, sent at once.
    pub(super) fn enable_tracing(
        &mut self,
        conn: ConnId,
        request_id: u64,
        trace_config: &[u8],
        fd: Option<OwnedFd>,
    ) {
        match self.create_session(conn, request_id, trace_config, fd) {
            Ok(sid) => {
                self.stats.sessions_started += 1;
                self.consumers
                    .get_mut(&conn)
                    .expect("known consumer")
                    .session = Some(sid);
                self.start_session_instances(sid);
            }
            Err(error) => {
                self.stats.requests_refused += 1;
                let reply = method_reply(
                    request_id,
                    true,
                    false,
                    &wire::enable_tracing_response(Some(&error)),
                );
                self.send_to_consumer(conn, &reply);
            }
        }
    }

    fn create_session(
        &mut self,
        conn: ConnId,
        request_id: u64,
        trace_config: &[u8],
        fd: Option<OwnedFd>,
    ) -> Result<SessionId, String> {
        if self.consumers[&conn].session.is_some() {
            return Err("this connection already has a tracing session".into());
        }
        let mut config =
            SessionConfig::from_trace_config(trace_config).map_err(|e| e.to_string())?;
        if config.buffers.len() > limits::MAX_BUFFERS_PER_SESSION {
            return Err(format!(
                "{} buffers (at most {})",
                config.buffers.len(),
                limits::MAX_BUFFERS_PER_SESSION
            ));
        }
        let total: usize = config.buffers.iter().map(|b| b.size_bytes).sum();
        if total > limits::MAX_SESSION_BUFFER_BYTES {
            return Err(format!(
                "buffers of {total} bytes in all (at most {})",
                limits::MAX_SESSION_BUFFER_BYTES
            ));
        }
        let in_use: usize = self
            .sessions
            .values()
            .flat_map(|s| s.config().buffers.iter().map(|b| b.size_bytes))
            .sum();
        if in_use + total > self.config.max_buffer_bytes {
            return Err(format!(
                "buffers of {total} bytes, with the {in_use} bytes the daemon's other sessions \
                 hold, go beyond its limit of {} bytes",
                self.config.max_buffer_bytes
            ));
        }
        if config.data_sources.len() > limits::MAX_DATA_SOURCES_PER_SESSION {
            return Err(format!(
                "{} data sources (at most {})",
                config.data_sources.len(),
                limits::MAX_DATA_SOURCES_PER_SESSION
            ));
        }
        // A start command carries the data source's config: it must fit a frame.
        if config
            .data_sources
            .iter()
            .any(|d| d.config.len() > 64 * 1024)
        {
            return Err("a data source config is larger than 64 KiB".into());
        }
        let file =
            match (config.write_into_file, fd) {
                (true, Some(fd)) => Some(File::from(fd)),
                (true, None) => return Err(
                    "write_into_file needs the output file's descriptor passed with EnableTracing \
                     (the daemon never opens output_path itself)"
                        .into(),
                ),
                (false, _) => None,
            };
        // The daemon writes only into descriptors consumers pass: opening a path would let a
        // consumer write anywhere the daemon can.
        config.output_path = None;
        config.prefault_buffers = self.config.prefault_buffers;
        let buffers = self.allocate_buffers(config.buffers.len())?;
        let sid = self.next_session;
        self.next_session += 1;
        for (i, g) in buffers.iter().enumerate() {
            self.buffer_map.insert(*g, (sid, i as u16));
        }
        let now = Instant::now();
        let in_period = |p: Option<Duration>| p.map(|p| now + p);
        let write_period = config.write_into_file.then_some(config.file_write_period);
        let session = Session {
            consumer: conn,
            enable_request: Some(request_id),
            stop_at: in_period(config.duration),
            next_flush: in_period(config.flush_period),
            next_write: in_period(write_period),
            writing: false,
            next_clear: in_period(config.incremental_state_clear_period),
            core: match file {
                Some(f) => ServiceCore::with_file(config, f),
                None => ServiceCore::in_memory(config),
            },
            buffers,
            members: HashMap::new(),
            instances: Vec::new(),
            state: State::Running,
            flushes: Vec::new(),
            error: None,
        };
        self.sessions.insert(sid, session);
        Ok(sid)
    }

    /// `n` free global buffer ids, searched from a rotating cursor so that an id comes back
    /// only after the others were used (a late commit for a freed id then finds nothing).
    fn allocate_buffers(&mut self, n: usize) -> Result<Vec<u16>, String> {
        let mut ids = Vec::with_capacity(n);
        let mut candidate = self.next_buffer;
        // Id 0xffff is the codec's "invalid buffer".
        for _ in 0..u16::MAX {
            if ids.len() == n {
                break;
            }
            if candidate != tachyon_ipc::commit::INVALID_BUFFER
                && !self.buffer_map.contains_key(&candidate)
            {
                ids.push(candidate);
            }
            candidate = candidate.wrapping_add(1);
        }
        if ids.len() < n {
            return Err("no free buffer ids".into());
        }
        self.next_buffer = candidate;
        Ok(ids)
    }

    /// Starts the session's data sources on every producer offering them, and built-in ones.
    fn start_session_instances(&mut self, sid: SessionId) {
        let mut conns: Vec<ConnId> = self.producers.keys().copied().collect();
        conns.sort_unstable();
        for conn in conns {
            self.start_instances_for(sid, Who::Conn(conn));
        }
        if self.config.builtin_data_sources {
            self.start_instances_for(sid, Who::Builtin);
        }
    }

    /// After a registration: starts the producer's new data sources in every running session.
    pub(super) fn start_pending_instances(&mut self, conn: ConnId) {
        let sids: Vec<SessionId> = self.sessions.keys().copied().collect();
        for sid in sids {
            self.start_instances_for(sid, Who::Conn(conn));
        }
    }

    /// Starts, in a running session, every data source `who` offers and does not run there yet.
    fn start_instances_for(&mut self, sid: SessionId, who: Who) {
        let Some(session) = self.sessions.get(&sid) else {
            return;
        };
        if session.state != State::Running {
            return;
        }
        let specs: Vec<usize> = session
            .config()
            .data_sources
            .iter()
            .enumerate()
            .filter(|(i, spec)| {
                !session.has_instance(who, *i)
                    && match who {
                        Who::Conn(c) => self.producers.get(&c).is_some_and(|p| {
                            p.descriptor(&spec.name).is_some()
                                && spec.producer_filter.accepts(&p.name)
                        }),
                        Who::Builtin => {
                            crate::builtin::is_builtin(&spec.name)
                                && spec.producer_filter.accepts(crate::builtin::PRODUCER_NAME)
                        }
                    }
            })
            .map(|(i, _)| i)
            .collect();
        for spec in specs {
            self.start_instance(sid, who, spec);
        }
    }

    fn start_instance(&mut self, sid: SessionId, who: Who, spec_idx: usize) {
        let Service {
            producers,
            sessions,
            builtin,
            events,
            stats,
            next_instance,
            builtin_identity,
            ..
        } = self;
        // Sessions other than this one that `who` writes into.
        let elsewhere = sessions
            .iter()
            .any(|(s, session)| *s != sid && session.members.contains_key(&who));
        let session = sessions.get_mut(&sid).expect("checked by the caller");
        let spec = session.config().data_sources[spec_idx].clone();
        let global = session.buffers[spec.target_buffer as usize];
        let id = *next_instance;
        match who {
            Who::Conn(conn) => {
                let p = producers.get_mut(&conn).expect("checked by the caller");
                if p.ensure_smb().is_err() {
                    stats.smb_failures += 1;
                    return;
                }
                let d = p.descriptor(&spec.name).expect("checked by the caller");
                let instance = Instance {
                    id,
                    who,
                    spec: spec_idx,
                    target: spec.target_buffer,
                    stopped: false,
                    notify_on_stop: d.will_notify_on_stop,
                    handles_clear: d.handles_incremental_state_clear,
                };
                let identity = p.identity;
                if !session.members.contains_key(&who) {
                    let member = session.core.add_producer(identity);
                    session.members.insert(who, member);
                    // Chunks already in its SMB are another session's: its writers that
                    // never commit cannot be told apart from them.
                    p.ambiguous_writers |= elsewhere || p.smb_holds_chunks();
                }
                session.instances.push(instance);
                *next_instance += 1;
                let config = wire::rewrite_data_source_config(&spec.config, global, sid);
                let command = Command::Encoded(wire::start_data_source(id, &config));
                self.send_command(conn, command);
            }
            Who::Builtin => {
                let Some(probe) = tachyon_probes::create_probe(&spec.name, &spec.config) else {
                    return;
                };
                if builtin.is_none() {
                    match crate::builtin::Builtin::start(events.clone()) {
                        Ok(b) => *builtin = Some(b),
                        Err(_) => {
                            stats.smb_failures += 1;
                            return;
                        }
                    }
                }
                let identity = *builtin_identity;
                session
                    .members
                    .entry(who)
                    .or_insert_with(|| session.core.add_producer(identity));
                session.instances.push(Instance {
                    id,
                    who,
                    spec: spec_idx,
                    target: spec.target_buffer,
                    stopped: false,
                    // The probes thread always reports a stop.
                    notify_on_stop: true,
                    // `linux.process_stats` writes its whole tree again.
                    handles_clear: true,
                });
                *next_instance += 1;
                builtin
                    .as_ref()
                    .expect("started above")
                    .start_probe(id, probe, global);
            }
        }
    }

    // === timers ===

    /// The earliest deadline of any session.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let now = Instant::now();
        self.sessions.values().filter_map(|s| s.deadline(now)).min()
    }

    /// Runs everything that is due.
    pub(super) fn tick(&mut self, now: Instant) {
        let sids: Vec<SessionId> = self.sessions.keys().copied().collect();
        for sid in sids {
            self.tick_session(sid, now);
        }
    }

    fn tick_session(&mut self, sid: SessionId, now: Instant) {
        // Flushes that completed or timed out.
        loop {
            let Some(session) = self.sessions.get_mut(&sid) else {
                return;
            };
            let Some(i) = session
                .flushes
                .iter()
                .position(|f| f.waiting.is_empty() || now >= f.deadline)
            else {
                break;
            };
            let flush = session.flushes.remove(i);
            self.complete_flush(sid, flush);
        }
        let Some(session) = self.sessions.get_mut(&sid) else {
            return;
        };
        match session.state {
            State::Running => {
                if session.stop_at.is_some_and(|t| now >= t) {
                    self.begin_stop(sid);
                    return;
                }
                let config = session.config();
                let flush_period = config.flush_period;
                let flush_timeout = config.flush_timeout;
                let write_period = config.write_into_file.then_some(config.file_write_period);
                let clear_period = config.incremental_state_clear_period;
                if session.next_flush.is_some_and(|t| now >= t) {
                    advance(&mut session.next_flush, flush_period, now);
                    let pending = session
                        .flushes
                        .iter()
                        .any(|f| f.purpose == Purpose::Periodic);
                    if !pending {
                        self.start_flush(sid, Purpose::Periodic, flush_timeout);
                    }
                }
                let Some(session) = self.sessions.get_mut(&sid) else {
                    return;
                };
                if session.next_write.is_some_and(|t| now >= t) {
                    advance(&mut session.next_write, write_period, now);
                    session.writing = true;
                }
                if session.writing {
                    self.write_step(sid);
                }
                let Some(session) = self.sessions.get_mut(&sid) else {
                    return;
                };
                if session.next_clear.is_some_and(|t| now >= t) {
                    advance(&mut session.next_clear, clear_period, now);
                    self.clear_incremental_state(sid);
                }
            }
            State::Stopping { deadline } => {
                if now >= deadline || session.instances.iter().all(|i| i.stopped) {
                    self.end_session(sid);
                }
            }
            State::Flushing | State::Ended => {}
        }
    }

    /// Streams what is complete to the session's file; a write error or a full file stops
    /// the session.
    fn write_to_file(&mut self, sid: SessionId) {
        let Some(session) = self.sessions.get_mut(&sid) else {
            return;
        };
        // A whole pass (it finishes a periodic one under way).
        session.writing = false;
        let result = session.core.drain(false);
        self.after_write(sid, result);
    }

    /// One step of the periodic write's read-out ([`STREAM_STEP_CHUNKS`] chunks): the service
    /// loop handles the commits that arrived before the next step, so producers get their
    /// chunks back while a period's data is read out and written.
    fn write_step(&mut self, sid: SessionId) {
        let Some(session) = self.sessions.get_mut(&sid) else {
            return;
        };
        let result = session.core.drain_some(STREAM_STEP_CHUNKS).map(|complete| {
            session.writing = !complete;
        });
        self.after_write(sid, result);
    }

    fn after_write(&mut self, sid: SessionId, result: std::io::Result<()>) {
        let Some(session) = self.sessions.get_mut(&sid) else {
            return;
        };
        if let Err(e) = result {
            session.writing = false;
            session
                .error
                .get_or_insert_with(|| format!("writing the trace failed: {e}"));
            self.begin_stop(sid);
        } else if session.core.file_full() {
            session.writing = false;
            self.begin_stop(sid);
        }
    }

    fn clear_incremental_state(&mut self, sid: SessionId) {
        let Some(session) = self.sessions.get(&sid) else {
            return;
        };
        let groups = running_by_who(&session.instances, |i| i.handles_clear);
        for (who, ids) in groups {
            match who {
                Who::Conn(conn) => {
                    let command = Command::Encoded(wire::clear_incremental_state(&ids));
                    self.send_command(conn, command);
                }
                Who::Builtin => {
                    if let Some(b) = &self.builtin {
                        b.clear(ids);
                    }
                }
            }
        }
    }

    // === flushes ===

    /// Sends `Flush` to every member with a running instance (and the built-in probes).
    pub(super) fn start_flush(&mut self, sid: SessionId, purpose: Purpose, timeout: Duration) {
        let Some(session) = self.sessions.get_mut(&sid) else {
            return;
        };
        let id = self.next_flush;
        self.next_flush += 1;
        self.stats.flushes_requested += 1;
        let groups = running_by_who(&session.instances, |_| true);
        session.flushes.push(PendingFlush {
            id,
            waiting: groups.keys().copied().collect(),
            deadline: Instant::now() + timeout,
            purpose,
        });
        for (who, ids) in groups {
            match who {
                Who::Conn(conn) => {
                    self.send_command(conn, Command::Encoded(wire::flush(&ids, id)));
                }
                Who::Builtin => {
                    if let Some(b) = &self.builtin {
                        b.flush(id, ids);
                    }
                }
            }
        }
    }

    /// A flush acknowledgement: `who` committed what it had when asked.
    pub(super) fn on_flush_ack(&mut self, who: Who, request_id: u64) {
        for session in self.sessions.values_mut() {
            for f in session.flushes.iter_mut().filter(|f| f.id == request_id) {
                f.waiting.remove(&who);
            }
        }
    }

    fn complete_flush(&mut self, sid: SessionId, flush: PendingFlush) {
        let ok = flush.waiting.is_empty();
        self.scrape_session(sid);
        if ok {
            self.stats.flushes_succeeded += 1;
        } else {
            self.stats.flushes_failed += 1;
        }
        let Some(session) = self.sessions.get_mut(&sid) else {
            return;
        };
        if matches!(flush.purpose, Purpose::Stop) {
            session.core.record_final_flush(ok);
        } else {
            session.core.record_flush(ok);
        }
        if session.streaming() && session.state == State::Running {
            self.write_to_file(sid);
        }
        match flush.purpose {
            Purpose::Consumer { conn, request_id } => {
                self.send_to_consumer(conn, &method_reply(request_id, ok, false, &[]));
            }
            Purpose::Periodic => {}
            Purpose::Stop => self.stop_instances(sid),
        }
    }

    /// Copies what every member producer has in its SMB into the session.
    fn scrape_session(&mut self, sid: SessionId) {
        let members: Vec<(ConnId, ProducerId)> = match self.sessions.get(&sid) {
            Some(s) => s
                .members
                .iter()
                .filter_map(|(who, pid)| match who {
                    Who::Conn(c) => Some((*c, *pid)),
                    // In-process memory the probes write with plain stores: never scraped (they
                    // flush instead).
                    Who::Builtin => None,
                })
                .collect(),
            None => return,
        };
        for (conn, pid) in members {
            let Some(p) = self.producers.get(&conn) else {
                continue;
            };
            scrape_into(&mut self.sessions, &self.buffer_map, sid, conn, pid, p);
        }
    }

    // === stopping ===

    /// Starts the stop: the final flush (then [`stop_instances`](Self::stop_instances)).
    pub(super) fn begin_stop(&mut self, sid: SessionId) {
        let Some(session) = self.sessions.get_mut(&sid) else {
            return;
        };
        if session.state != State::Running {
            return;
        }
        session.state = State::Flushing;
        // The final read at the end of the session reads what a periodic pass had left.
        session.writing = false;
        let timeout = session.config().flush_timeout;
        self.start_flush(sid, Purpose::Stop, timeout);
    }

    /// Sends `StopDataSource` to every running instance; waits at most
    /// `data_source_stop_timeout_ms` for those that promised to say they stopped.
    fn stop_instances(&mut self, sid: SessionId) {
        let Some(session) = self.sessions.get_mut(&sid) else {
            return;
        };
        let timeout = session.config().data_source_stop_timeout;
        session.state = State::Stopping {
            deadline: Instant::now() + timeout,
        };
        let mut to_stop = Vec::new();
        for i in session.instances.iter_mut().filter(|i| !i.stopped) {
            to_stop.push((i.who, i.id));
            if !i.notify_on_stop {
                i.stopped = true;
            }
        }
        for (who, id) in to_stop {
            self.send_stop(who, id);
        }
    }

    fn send_stop(&mut self, who: Who, instance: u64) {
        match who {
            Who::Conn(conn) => {
                self.send_command(conn, Command::Encoded(wire::stop_data_source(instance)));
            }
            Who::Builtin => {
                if let Some(b) = &self.builtin {
                    b.stop(instance);
                }
            }
        }
    }

    /// `NotifyDataSourceStopped` (or the probes thread's equivalent).
    pub(super) fn on_instance_stopped(&mut self, who: Who, instance: u64) {
        for session in self.sessions.values_mut() {
            for i in session
                .instances
                .iter_mut()
                .filter(|i| i.who == who && i.id == instance)
            {
                i.stopped = true;
            }
        }
    }

    /// `UnregisterDataSource`: its instances stop.
    pub(super) fn stop_instances_named(&mut self, conn: ConnId, name: &str) {
        let mut to_stop = Vec::new();
        for session in self.sessions.values_mut() {
            let specs = &session.core.config().data_sources;
            for i in session.instances.iter_mut() {
                if i.who == Who::Conn(conn) && !i.stopped && specs[i.spec].name == name {
                    i.stopped = true;
                    to_stop.push(i.id);
                }
            }
        }
        for id in to_stop {
            self.send_stop(Who::Conn(conn), id);
        }
    }

    /// The last scrape, the end of the output, the deferred `EnableTracing` reply. The buffers
    /// stay (for `ReadBuffers`) until the consumer frees them.
    fn end_session(&mut self, sid: SessionId) {
        self.scrape_session(sid);
        let wide = self.service_wide();
        let Some(session) = self.sessions.get_mut(&sid) else {
            return;
        };
        session.core.set_service_wide_stats(wide);
        if let Err(e) = session.core.end() {
            session
                .error
                .get_or_insert_with(|| format!("writing the trace failed: {e}"));
        }
        for (_, pid) in session.members.drain() {
            session.core.remove_producer(pid);
        }
        for i in &mut session.instances {
            i.stopped = true;
        }
        session.state = State::Ended;
        let flushes: Vec<PendingFlush> = session.flushes.drain(..).collect();
        for f in flushes {
            if let Purpose::Consumer { conn, request_id } = f.purpose {
                self.send_to_consumer(conn, &method_reply(request_id, false, false, &[]));
            }
        }
        self.reply_enable(sid);
    }

    fn reply_enable(&mut self, sid: SessionId) {
        let Some(session) = self.sessions.get_mut(&sid) else {
            return;
        };
        if let Some(request_id) = session.enable_request.take() {
            let conn = session.consumer;
            let body = wire::enable_tracing_response(session.error.as_deref());
            self.send_to_consumer(conn, &method_reply(request_id, true, false, &body));
        }
    }

    /// Frees a session (`FreeBuffers`, consumer gone, daemon shutdown): running instances are
    /// stopped, a file gets its end, the buffers and their global ids are released.
    pub(super) fn destroy_session(&mut self, sid: SessionId, reply: bool) {
        if reply {
            self.reply_enable(sid);
        }
        let Some(mut session) = self.sessions.remove(&sid) else {
            return;
        };
        for g in &session.buffers {
            self.buffer_map.remove(g);
        }
        if session.streaming() {
            // `end` writes only once; the consumer is gone, so a write error has nobody to go to.
            let _ = session.core.end();
        }
        for i in session.instances.iter().filter(|i| !i.stopped) {
            self.send_stop(i.who, i.id);
        }
        if let Some(c) = self.consumers.get_mut(&session.consumer) {
            if c.session == Some(sid) {
                c.session = None;
            }
        }
    }

    /// A producer is gone: its SMB is scraped into every session it wrote to, then it leaves
    /// them (its instances count as stopped, its flush acknowledgements are no longer awaited).
    pub(super) fn detach_producer(&mut self, conn: ConnId, p: &Producer) {
        let who = Who::Conn(conn);
        let sids: Vec<(SessionId, ProducerId)> = self
            .sessions
            .iter()
            .filter_map(|(sid, s)| s.members.get(&who).map(|pid| (*sid, *pid)))
            .collect();
        for (sid, pid) in sids {
            scrape_into(&mut self.sessions, &self.buffer_map, sid, conn, pid, p);
            let session = self.sessions.get_mut(&sid).expect("listed above");
            session.core.remove_producer(pid);
            session.members.remove(&who);
            for i in session.instances.iter_mut().filter(|i| i.who == who) {
                i.stopped = true;
            }
            for f in &mut session.flushes {
                f.waiting.remove(&who);
            }
        }
    }
}

/// Scrapes producer `conn`'s SMB into session `sid` (as its member `pid`). A writer that never
/// committed goes where `RegisterTraceWriter` said, or, for a producer whose SMB never held two
/// sessions' chunks (`Producer::ambiguous_writers`), to the buffer of its data source in this
/// session; else it is left alone.
fn scrape_into(
    sessions: &mut BTreeMap<SessionId, Session>,
    buffer_map: &HashMap<u16, (SessionId, u16)>,
    sid: SessionId,
    conn: ConnId,
    pid: ProducerId,
    p: &Producer,
) {
    if !p.scraping {
        return;
    }
    let Some(view) = p.service_view() else {
        return;
    };
    let who = Who::Conn(conn);
    let Some(session) = sessions.get_mut(&sid) else {
        return;
    };
    let fallback = if p.ambiguous_writers {
        None
    } else {
        session
            .instances
            .iter()
            .find(|i| i.who == who)
            .map(|i| i.target)
    };
    session
        .core
        .scrape_with(pid, &view, |writer| match p.writer_buffers.get(&writer) {
            Some(global) => match buffer_map.get(global) {
                Some(&(s, local)) if s == sid => Some(local),
                _ => None,
            },
            None => fallback,
        });
}

/// The ids of the instances still running that `pick` selects, by who runs them (one command
/// per connection, or to the probes thread).
fn running_by_who(
    instances: &[Instance],
    pick: impl Fn(&Instance) -> bool,
) -> BTreeMap<Who, Vec<u64>> {
    let mut groups: BTreeMap<Who, Vec<u64>> = BTreeMap::new();
    for i in instances.iter().filter(|i| !i.stopped && pick(i)) {
        groups.entry(i.who).or_default().push(i.id);
    }
    groups
}

//! The consumer port: one tracing session per consumer connection.
//!
//! The consumer socket is the privileged one (mode 0600), but its requests are still parsed as
//! untrusted: a malformed frame or request closes the connection, and every size in a trace
//! config is bounded before anything is allocated for it.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;

use tachyon_ipc::conn::FrameSender;
use tachyon_ipc::rpc::{bind_reply, consumer_port, method_reply, Frame, Msg};
use tachyon_protos::{EnableTracingRequestView, FlushRequestView};

use super::session::{Purpose, State};
use super::{ConnId, ConnShared, Service, SessionId};
use crate::wire;

/// The service id of `ConsumerPort` on the consumer socket.
const SERVICE_ID: u32 = 1;

/// Bytes of replies a consumer may leave unread before `ReadBuffers` stops taking data out of
/// its session's buffers for it: what a slow consumer has not read yet waits in the central
/// buffer (where an overwrite is counted) rather than in daemon memory without bound.
const CONSUMER_BACKLOG_LIMIT: usize = 64 << 20;

/// What the service thread and a consumer's sender thread share.
#[derive(Debug, Default)]
struct Backlog {
    /// Bytes queued and not written to the socket yet.
    bytes: AtomicUsize,
    /// A write timed out: the consumer did not read (the socket is shut down after it).
    timed_out: AtomicBool,
}

/// One consumer connection.
#[derive(Debug)]
pub(super) struct Consumer {
    tx: FrameSender,
    /// Frames for the consumer's sender thread (`tachyon-consumer-tx`), which writes them in
    /// order: the service thread never waits for a consumer to read (a `ReadBuffers` reply can
    /// be tens of MiB), so producers' commits keep flowing meanwhile.
    out: Option<Sender<Vec<u8>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    backlog: Arc<Backlog>,
    pub(super) shared: Arc<ConnShared>,
    bound: bool,
    /// Its session, from `EnableTracing` until `FreeBuffers`.
    pub(super) session: Option<SessionId>,
}

impl Consumer {
    pub(super) fn new(tx: FrameSender, shared: Arc<ConnShared>) -> Self {
        let backlog = Arc::new(Backlog::default());
        let (out, frames) = mpsc::channel::<Vec<u8>>();
        let writer = tx.clone();
        let b = Arc::clone(&backlog);
        let spawned = std::thread::Builder::new()
            .name("tachyon-consumer-tx".into())
            .spawn(move || {
                for frame in frames {
                    let sent = writer.send(&frame, None);
                    b.bytes.fetch_sub(frame.len(), Ordering::AcqRel);
                    if let Err(e) = sent {
                        if e.kind() == std::io::ErrorKind::TimedOut {
                            b.timed_out.store(true, Ordering::Release);
                        }
                        break;
                    }
                }
                // Failed, or closed by the service once everything queued was written: the
                // reader then sees the end of the stream (and the service forgets the
                // connection if it has not already).
                writer.shutdown();
            });
        let (out, thread) = match spawned {
            Ok(t) => (Some(out), Some(t)),
            // Without a thread, sends fail and the connection is dropped.
            Err(_) => (None, None),
        };
        Consumer {
            tx,
            out,
            thread,
            backlog,
            shared,
            bound: false,
            session: None,
        }
    }

    /// Queues a frame for the sender thread; false if it is gone (the connection failed).
    fn send(&self, frame: &[u8]) -> bool {
        let Some(out) = &self.out else {
            return false;
        };
        self.backlog.bytes.fetch_add(frame.len(), Ordering::AcqRel);
        out.send(frame.to_vec()).is_ok()
    }

    /// Whether the consumer left so much unread that `ReadBuffers` should wait.
    fn backlogged(&self) -> bool {
        self.backlog.bytes.load(Ordering::Acquire) > CONSUMER_BACKLOG_LIMIT
    }

    /// Whether its connection ended because it did not read within the write timeout.
    pub(super) fn timed_out(&self) -> bool {
        self.backlog.timed_out.load(Ordering::Acquire)
    }

    /// Closes the connection: the sender thread writes what is queued (each write bounded by
    /// the write timeout), then shuts the socket down, which stops the reader.
    pub(super) fn close(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.out = None;
        if self.thread.is_none() {
            self.tx.shutdown();
        }
    }

    /// [`close`](Self::close), then waits until what was queued is written (daemon shutdown:
    /// the last replies, e.g. an error for a session the shutdown ended, reach the consumer).
    pub(super) fn close_and_wait(mut self) {
        self.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Service {
    pub(super) fn on_consumer_frame(&mut self, conn: ConnId, body: &[u8], fd: Option<OwnedFd>) {
        let Ok(frame) = Frame::decode(body) else {
            self.stats.frames_rejected += 1;
            self.violation(conn);
            return;
        };
        let request_id = frame.request_id;
        match frame.msg {
            Msg::BindService { service_name } => {
                let reply = bind_reply(
                    request_id,
                    service_name,
                    &[(consumer_port::NAME, SERVICE_ID, consumer_port::METHODS)],
                );
                let c = self.consumers.get_mut(&conn).expect("known consumer");
                c.bound |= service_name == consumer_port::NAME;
                self.send_to_consumer(conn, &reply);
            }
            Msg::InvokeMethod {
                service_id,
                method_id,
                args,
                ..
            } => {
                if !self.consumers[&conn].bound || service_id != SERVICE_ID {
                    self.violation(conn);
                    return;
                }
                self.invoke_consumer(conn, request_id, method_id, args, fd);
            }
            _ => {
                self.stats.frames_rejected += 1;
                self.violation(conn);
            }
        }
    }

    fn invoke_consumer(
        &mut self,
        conn: ConnId,
        request_id: u64,
        method_id: u32,
        args: &[u8],
        fd: Option<OwnedFd>,
    ) {
        use consumer_port::*;
        let session = self.consumers[&conn].session;
        match method_id {
            ENABLE_TRACING => {
                let Ok(v) = EnableTracingRequestView::decode(args) else {
                    return self.violation(conn);
                };
                let config = if v.has_trace_config() {
                    match v.trace_config() {
                        Ok(c) => c.bytes(),
                        Err(_) => return self.violation(conn),
                    }
                } else {
                    &[]
                };
                self.enable_tracing(conn, request_id, config, fd);
            }
            DISABLE_TRACING => {
                self.send_to_consumer(conn, &method_reply(request_id, true, false, &[]));
                if let Some(sid) = session {
                    self.begin_stop(sid);
                }
            }
            READ_BUFFERS => self.read_buffers(conn, request_id, session),
            FREE_BUFFERS => {
                if let Some(sid) = session {
                    self.destroy_session(sid, true);
                }
                self.send_to_consumer(conn, &method_reply(request_id, true, false, &[]));
            }
            FLUSH => {
                let Ok(v) = FlushRequestView::decode(args) else {
                    return self.violation(conn);
                };
                let running = session
                    .and_then(|sid| self.sessions.get(&sid).map(|s| (sid, s)))
                    .filter(|(_, s)| s.state == State::Running)
                    .map(|(sid, s)| (sid, s.core.config().flush_timeout));
                match running {
                    Some((sid, default_timeout)) => {
                        let timeout = match v.timeout_ms() {
                            0 => default_timeout,
                            ms => std::time::Duration::from_millis(ms as u64),
                        };
                        let purpose = Purpose::Consumer { conn, request_id };
                        self.start_flush(sid, purpose, timeout);
                    }
                    None => {
                        self.send_to_consumer(conn, &method_reply(request_id, false, false, &[]));
                    }
                }
            }
            GET_TRACE_STATS => {
                let wide = self.service_wide();
                let stats = match session.and_then(|sid| self.sessions.get_mut(&sid)) {
                    Some(s) => {
                        s.core.set_service_wide_stats(wide);
                        s.core.trace_stats()
                    }
                    None => wire::service_trace_stats(&wide),
                };
                let body = wire::trace_stats_response(&stats);
                self.send_to_consumer(conn, &method_reply(request_id, true, false, &body));
            }
            _ => {
                self.send_to_consumer(conn, &method_reply(request_id, false, false, &[]));
            }
        }
    }

    /// `ReadBuffers`: what is complete now (all of it, with the final `TraceStats` packet, once
    /// the session ended), as a stream of `ReadBuffersResponse`s.
    fn read_buffers(&mut self, conn: ConnId, request_id: u64, session: Option<SessionId>) {
        let wide = self.service_wide();
        let Some(s) = session.and_then(|sid| self.sessions.get_mut(&sid)) else {
            self.send_to_consumer(conn, &method_reply(request_id, false, false, &[]));
            return;
        };
        let backlogged = self.consumers.get(&conn).is_some_and(Consumer::backlogged);
        if backlogged {
            // What it has not read yet is enough: the rest stays in the buffers for its next
            // read (an empty answer now, so it comes back).
            self.send_to_consumer(conn, &method_reply(request_id, true, false, &[]));
            return;
        }
        if s.state != State::Ended {
            s.core.set_service_wide_stats(wide);
            if let Err(e) = s.core.drain(false) {
                s.error
                    .get_or_insert_with(|| format!("reading the buffers failed: {e}"));
            }
        }
        let records = s.core.take_output();
        let responses = wire::read_buffers_responses(&records);
        let n = responses.len();
        for (i, r) in responses.iter().enumerate() {
            let has_more = i + 1 < n;
            if !self.send_to_consumer(conn, &method_reply(request_id, true, has_more, r)) {
                return;
            }
        }
        if n == 0 {
            self.send_to_consumer(conn, &method_reply(request_id, true, false, &[]));
        }
    }

    /// Sends a frame to a consumer; false (and the consumer is dropped) if that failed.
    pub(super) fn send_to_consumer(&mut self, conn: ConnId, frame: &[u8]) -> bool {
        // Whoever reads the counters after this reply sees what led to it.
        self.publish();
        let Some(c) = self.consumers.get(&conn) else {
            return false;
        };
        if c.send(frame) {
            return true;
        }
        let e = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        self.send_failed(conn, &e);
        false
    }
}

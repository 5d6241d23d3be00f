//! The consumer port: one tracing session per consumer connection.
//!
//! The consumer socket is the privileged one (mode 0600), but its requests are still parsed as
//! untrusted: a malformed frame or request closes the connection, and every size in a trace
//! config is bounded before anything is allocated for it.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tachyon_ipc::conn::FrameSender;
use tachyon_ipc::rpc::{bind_reply, consumer_port, method_reply, Frame, Msg};
use tachyon_protos::{EnableTracingRequestView, FlushRequestView};

use super::session::{Purpose, State};
use super::{ConnId, ConnShared, Service, SessionId};
use crate::wire;

/// The service id of `ConsumerPort` on the consumer socket.
const SERVICE_ID: u32 = 1;

/// One consumer connection.
#[derive(Debug)]
pub(super) struct Consumer {
    tx: FrameSender,
    pub(super) shared: Arc<ConnShared>,
    bound: bool,
    /// Its session, from `EnableTracing` until `FreeBuffers`.
    pub(super) session: Option<SessionId>,
}

impl Consumer {
    pub(super) fn new(tx: FrameSender, shared: Arc<ConnShared>) -> Self {
        Consumer {
            tx,
            shared,
            bound: false,
            session: None,
        }
    }

    /// Closes the socket and stops the reader.
    pub(super) fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.tx.shutdown();
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
        match c.tx.send(frame, None) {
            Ok(()) => true,
            Err(e) => {
                self.send_failed(conn, &e);
                false
            }
        }
    }
}

//! The consumer side of the consumer socket: what `tachyon record` uses to run a session.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use protozero::HeapBuffered;
use tachyon_ipc::rpc::{self, consumer_port, Caller, Replies, Reply};
use tachyon_protos::{
    EnableTracingRequest, EnableTracingResponseView, FlushRequest, GetTraceStatsResponseView,
    ReadBuffersResponseView,
};

/// How long a request may wait for its reply (beyond a flush's own timeout).
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a write to the daemon may block.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest packet accepted from the daemon (Perfetto's packet limit).
const MAX_PACKET: usize = 256 << 20;

/// How a session ended: the daemon's deferred answer to `EnableTracing`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionEnd {
    /// Why it ended abnormally (a bad config, a write error, the daemon shutting down).
    pub error: Option<String>,
}

/// A connection to the daemon's consumer socket, running at most one tracing session.
///
/// Every call is synchronous: it sends a request and reads replies until its own arrives. The
/// session's end (the reply to `EnableTracing`, which the daemon sends only when the session
/// stops) may arrive meanwhile; it is kept for [`wait_for_end`](Self::wait_for_end).
#[derive(Debug)]
pub struct Consumer {
    caller: Caller,
    replies: Replies,
    /// The `EnableTracing` request awaiting its (deferred) reply.
    enable_request: Option<u64>,
    ended: Option<SessionEnd>,
}

impl Consumer {
    /// Connects to the consumer socket at `path` and binds `ConsumerPort`.
    pub fn connect(path: &Path) -> io::Result<Consumer> {
        let (caller, replies) =
            rpc::connect(path, consumer_port::NAME, WRITE_TIMEOUT, REPLY_TIMEOUT)?;
        Ok(Consumer {
            caller,
            replies,
            enable_request: None,
            ended: None,
        })
    }

    /// Starts a session with an encoded Perfetto `TraceConfig`. With `write_into_file` in the
    /// config, `output` must be given: its descriptor is passed to the daemon, which streams
    /// the trace into it. Returns once the daemon accepted the config (an error names what it
    /// refused).
    pub fn enable_tracing(&mut self, trace_config: &[u8], output: Option<&File>) -> io::Result<()> {
        if self.enable_request.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "this consumer already runs a session",
            ));
        }
        let mut buf = HeapBuffered::new();
        buf.root::<EnableTracingRequest<'_>>()
            .message()
            .append_bytes(
                EnableTracingRequest::TRACE_CONFIG_FIELD_NUMBER,
                trace_config,
            );
        let args = buf.serialize().expect("heap buffers do not fail");
        let id = self
            .caller
            .invoke("EnableTracing", &args, output.map(|f| f.as_fd()), false)?;
        self.enable_request = Some(id);
        self.ended = None;
        // A round trip: the daemon handles requests in order, so a refused config's reply (sent
        // at once) arrives before this one.
        self.call("GetTraceStats", &[], REPLY_TIMEOUT)?;
        match self.ended.take() {
            Some(SessionEnd { error: Some(e) }) => {
                // Refused: no session, this consumer may try again.
                self.enable_request = None;
                Err(io::Error::new(io::ErrorKind::InvalidInput, e))
            }
            ended => {
                self.ended = ended;
                Ok(())
            }
        }
    }

    /// Asks every producer of the session to commit what it holds, waiting up to `timeout`
    /// (0: the config's `flush_timeout_ms`). True when all of them acknowledged in time.
    pub fn flush(&mut self, timeout: Duration) -> io::Result<bool> {
        let mut buf = HeapBuffered::new();
        buf.root::<FlushRequest<'_>>()
            .set_timeout_ms(timeout.as_millis().min(u32::MAX as u128) as u32);
        let args = buf.serialize().expect("heap buffers do not fail");
        let wait = timeout.max(tachyon_service::DEFAULT_FLUSH_TIMEOUT) + REPLY_TIMEOUT;
        Ok(self.call("Flush", &args, wait)?.success)
    }

    /// Stops the session (final flush, data sources stopped, buffers scraped); returns at once.
    /// [`wait_for_end`](Self::wait_for_end) tells when it has stopped.
    pub fn disable_tracing(&mut self) -> io::Result<()> {
        self.call("DisableTracing", &[], REPLY_TIMEOUT)?;
        Ok(())
    }

    /// Waits until the session ended (duration elapsed, disabled, file full), at most
    /// `timeout` (`None`: no limit). `Ok(None)` on timeout.
    pub fn wait_for_end(&mut self, timeout: Option<Duration>) -> io::Result<Option<SessionEnd>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        while self.ended.is_none() {
            if self.enable_request.is_none() {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "no tracing session was started",
                ));
            }
            match self.next_reply(deadline)? {
                Some(_) => {}
                None => return Ok(None),
            }
        }
        Ok(self.ended.clone())
    }

    /// The session's `TraceStats` (encoded `perfetto.protos.TraceStats`): bytes written,
    /// producers connected, losses. Without a session, only the service-wide counters.
    pub fn trace_stats(&mut self) -> io::Result<Vec<u8>> {
        let reply = self.call("GetTraceStats", &[], REPLY_TIMEOUT)?;
        let v = GetTraceStatsResponseView::decode(&reply.payload).map_err(invalid)?;
        Ok(v.trace_stats().map_err(invalid)?.bytes().to_vec())
    }

    /// Reads what the session's buffers hold now (everything, with the final `TraceStats`
    /// packet, once the session ended) and writes it to `out` as `Trace.packet` records, so
    /// `out` is a trace file. Returns the bytes written. A session streaming to a file has
    /// nothing to read here.
    pub fn read_buffers(&mut self, out: &mut impl Write) -> io::Result<u64> {
        let id = self.caller.invoke("ReadBuffers", &[], None, false)?;
        let deadline = Some(Instant::now() + REPLY_TIMEOUT);
        let mut written = 0u64;
        let mut packet = Vec::new();
        loop {
            let reply = self.reply_to(id, deadline)?;
            if !reply.success {
                return Err(io::Error::other(
                    "the daemon refused ReadBuffers (no session)",
                ));
            }
            if !reply.payload.is_empty() {
                let v = ReadBuffersResponseView::decode(&reply.payload).map_err(invalid)?;
                for slice in v.slices() {
                    let slice = slice.map_err(invalid)?;
                    if packet.len() + slice.data().len() > MAX_PACKET {
                        return Err(invalid("a packet larger than 256 MiB"));
                    }
                    packet.extend_from_slice(slice.data());
                    if slice.last_slice_for_packet() {
                        let mut record = Vec::with_capacity(packet.len() + 6);
                        tachyon_service::write_record(&mut record, &[&packet]);
                        out.write_all(&record)?;
                        written += record.len() as u64;
                        packet.clear();
                    }
                }
            }
            if !reply.has_more {
                return Ok(written);
            }
        }
    }

    /// Frees the session and its buffers (stopping it first if it still runs).
    pub fn free_buffers(&mut self) -> io::Result<()> {
        self.call("FreeBuffers", &[], REPLY_TIMEOUT)?;
        self.enable_request = None;
        Ok(())
    }

    // === plumbing ===

    /// Invokes a method and returns its (single) reply.
    fn call(&mut self, method: &str, args: &[u8], timeout: Duration) -> io::Result<Reply> {
        let id = self.caller.invoke(method, args, None, false)?;
        self.reply_to(id, Some(Instant::now() + timeout))
    }

    /// Reads replies until the one to `id`.
    fn reply_to(&mut self, id: u64, deadline: Option<Instant>) -> io::Result<Reply> {
        loop {
            match self.next_reply(deadline)? {
                Some(r) if r.request_id == id => return Ok(r),
                Some(_) => {}
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the tracing daemon did not answer in time",
                    ))
                }
            }
        }
    }

    /// The next reply (`None` at the deadline); the deferred `EnableTracing` reply is recorded
    /// on the way.
    fn next_reply(&mut self, deadline: Option<Instant>) -> io::Result<Option<Reply>> {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        self.set_deadline(deadline)?;
        let reply = match self.replies.recv() {
            Ok(Some(r)) => r,
            Ok(None) => return Err(closed()),
            // A read timeout leaves a partly received frame buffered: the next call resumes.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        if Some(reply.request_id) == self.enable_request && !reply.has_more {
            let error = EnableTracingResponseView::decode(&reply.payload)
                .ok()
                .filter(|v| v.has_error())
                .and_then(|v| v.error().ok().map(str::to_owned));
            self.ended = Some(SessionEnd { error });
        }
        Ok(Some(reply))
    }

    fn set_deadline(&self, deadline: Option<Instant>) -> io::Result<()> {
        let timeout = deadline.map(|d| {
            d.saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        });
        self.replies.set_read_timeout(timeout)
    }
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the tracing daemon closed the connection",
    )
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

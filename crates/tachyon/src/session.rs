//! The in-process backend: a tracing session whose service is a thread of this process.
//!
//! The shared memory buffer is ordinary process memory ([`OwnedSmb`]); writers hand chunks to
//! the service thread over a lock-free channel; the service copies them into its central
//! buffers and writes the trace — at stop, or streamed while tracing with `write_into_file`.
//!
//! The service never scrapes chunks here: writers store into their chunks with plain stores,
//! so reading a chunk a live writer may be writing would be a data race. Instead every writer
//! flushes on [`InProcessSession::flush`]/[`stop`](InProcessSession::stop) requests (at its
//! next packet), when its thread exits, and when dropped. A thread that stays idle across the
//! stop keeps its last, unfinished chunk: [`StopReport::writers_still_active`] says how many,
//! and the trace's `TraceStats` say the final flush failed (`traced_final_flush_failed`).

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tachyon_abi::{CommitRequest, OwnedSmb, PageSize};
use tachyon_service::{
    CommitPump, CommitSource, InProcessService, ProducerHooks, ProducerIdentity, SessionConfig,
};

use crate::track_event::state::{drain_all, request_flush_pass, Drain};
use crate::writer::{commit_channel, ArbiterConfig, CommitReceiver, SmbArbiter};

impl CommitSource for CommitReceiver {
    fn try_next(&mut self) -> Result<Option<CommitRequest>, ()> {
        self.try_recv().map_err(|_| ())
    }
}

/// How the process side of an in-process session is set up.
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    /// Size of the shared memory buffer (a multiple of the page size).
    pub smb_size: usize,
    /// Page size of the shared memory buffer.
    pub page_size: PageSize,
    /// Chunk layout and the writers' buffer-exhaustion policy.
    pub arbiter: ArbiterConfig,
}

impl Default for SessionOptions {
    /// 4 MiB of 4 KiB pages (in-process memory is cheap; Perfetto's system default is 256 KiB),
    /// StallThenDrop.
    fn default() -> Self {
        SessionOptions {
            smb_size: 4 << 20,
            page_size: PageSize::Kib4,
            arbiter: ArbiterConfig::default(),
        }
    }
}

/// What [`InProcessSession::stop`] found.
#[derive(Debug)]
pub struct StopReport {
    /// The trace, when the session kept it in memory (no `output_path`); empty otherwise.
    pub trace: Vec<u8>,
    /// Writers that had not flushed when the session stopped (threads idle since the stop
    /// request): the packets in their current chunk are not in the trace.
    pub writers_still_active: usize,
    /// The writers' counters at stop (drops, stalls, chunks).
    pub arbiter: crate::ArbiterStats,
}

/// A running in-process tracing session. See the module docs.
#[derive(Debug)]
pub struct InProcessSession {
    arbiter: Arc<SmbArbiter>,
    service: Option<InProcessService>,
    flush_timeout: Duration,
}

impl InProcessSession {
    /// Starts a session with default [`SessionOptions`].
    pub fn start(config: SessionConfig) -> io::Result<Self> {
        Self::start_with(config, SessionOptions::default())
    }

    /// Starts a session.
    pub fn start_with(config: SessionConfig, options: SessionOptions) -> io::Result<Self> {
        Self::start_with_clear_hook(config, options, Box::new(|| {}))
    }

    /// Starts a session whose periodic incremental-state clear (`clear_period_ms`) calls
    /// `clear_incremental_state` (the SDK's track-event layer bumps its epoch there).
    pub fn start_with_clear_hook(
        config: SessionConfig,
        options: SessionOptions,
        clear_incremental_state: Box<dyn Fn() + Send>,
    ) -> io::Result<Self> {
        let smb = Arc::new(
            OwnedSmb::new(options.smb_size, options.page_size)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?,
        );
        let (sink, receiver) = commit_channel();
        let flush_timeout = config.flush_timeout;
        let identity = ProducerIdentity {
            pid: std::process::id() as i32,
            uid: current_uid(),
        };
        // SAFETY: the only other user of the buffer in this process is the service thread, which
        // copies chunks only after writers released them (Complete) and never scrapes (the
        // service is always flushed and stopped with `scrape = false` below), so no chunk a
        // writer is writing is ever read concurrently.
        let arbiter = unsafe { SmbArbiter::new(smb.clone(), options.arbiter, sink) };
        // The periodic flush (`flush_period_ms`) asks writers to commit at their next packet.
        let hook_arbiter = Arc::downgrade(&arbiter);
        let flush_writers = Box::new(move || {
            if let Some(a) = hook_arbiter.upgrade() {
                a.request_flush();
                // Threads that are not tracing now flush too (with their queued events), on
                // the drainer's thread: this one frees the chunks encoding may need.
                request_flush_pass();
            }
        });
        let hooks = ProducerHooks {
            flush_writers,
            clear_incremental_state,
        };
        let service = InProcessService::start_with_hooks(config, smb, receiver, identity, hooks)?;
        Ok(InProcessSession {
            arbiter,
            service: Some(service),
            flush_timeout,
        })
    }

    /// The arbiter writers come from ([`SmbArbiter::with_thread_writer`] and friends).
    pub fn arbiter(&self) -> &Arc<SmbArbiter> {
        &self.arbiter
    }

    /// Applies the commits waiting for the service on the thread that calls it: for a thread
    /// that commits many chunks, such as the SDK's drainer ([`CommitPump`]).
    pub fn commit_pump(&self) -> Option<CommitPump> {
        self.service.as_ref().map(InProcessService::commit_pump)
    }

    /// Asks every writer to flush at its next packet, flushes this thread's writers now, and
    /// lets the service apply what was committed (and stream it, with `write_into_file`).
    pub fn flush(&self) -> bool {
        self.arbiter.request_flush();
        drain_all(Drain::FlushAll);
        self.arbiter.drop_thread_writers();
        self.service
            .as_ref()
            .is_some_and(|s| s.flush(false, self.flush_timeout))
    }

    /// Stops the session: asks writers to flush, closes the arbiter (thread-local writers are
    /// dropped at their next use), waits up to the flush timeout for writers to finish, then
    /// stops the service, which reads everything out and writes the final `TraceStats`.
    pub fn stop(mut self) -> io::Result<StopReport> {
        self.arbiter.request_flush();
        self.arbiter.drop_thread_writers();
        self.arbiter.close();
        let deadline = Instant::now() + self.flush_timeout;
        while self.arbiter.active_writers() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let writers_still_active = self.arbiter.active_writers();
        let arbiter = self.arbiter.stats();
        let service = self.service.take().expect("stopped once");
        let trace = service.stop_after_final_flush(false, writers_still_active == 0)?;
        Ok(StopReport {
            trace,
            writers_still_active,
            arbiter,
        })
    }
}

#[cfg(target_os = "linux")]
pub(crate) fn current_uid() -> i32 {
    extern "C" {
        fn getuid() -> u32;
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { getuid() as i32 }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn current_uid() -> i32 {
    0
}

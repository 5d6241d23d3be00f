//! The in-process service: a thread that owns a [`ServiceCore`], receives the commits of the
//! process's own writers through a channel (std's unbounded `mpsc`, a lock-free hand-off: a
//! sender never waits for the service), copies their chunks out of the process's shared memory
//! buffer, streams the trace to its file when asked to, and writes the end of the trace at stop.

use std::io;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tachyon_abi::{CommitRequest, OwnedSmb};

use crate::readout::ProducerIdentity;
use crate::session::{ServiceCore, SessionConfig, STREAM_STEP_CHUNKS};
use crate::trace_buffer::ProducerId;

/// How long the service thread sleeps when no commit is waiting. The thread polls rather than
/// blocks: a blocked receiver makes every sender pay a futex wake-up (10–30 ns per packet
/// measured on the writer side), a polling one costs the writers nothing.
const TICK: Duration = Duration::from_millis(2);

/// Where the service thread gets commits from.
pub trait CommitSource: Send + 'static {
    /// The next commit if one is waiting, `Ok(None)` if none is, `Err(())` once every sender is
    /// gone and nothing is left.
    #[allow(clippy::result_unit_err)]
    fn try_next(&mut self) -> Result<Option<CommitRequest>, ()>;
}

impl CommitSource for Receiver<CommitRequest> {
    fn try_next(&mut self) -> Result<Option<CommitRequest>, ()> {
        match self.try_recv() {
            Ok(r) => Ok(Some(r)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(()),
        }
    }
}

/// What the service thread asks of the producer side of the process (Perfetto's producer
/// commands, as plain calls: the producer is this process).
pub struct ProducerHooks {
    /// `Flush`: writers commit what they hold (at their next packet).
    pub flush_writers: Box<dyn Fn() + Send>,
    /// `ClearIncrementalState`: writers start a new generation of interned data.
    pub clear_incremental_state: Box<dyn Fn() + Send>,
}

impl std::fmt::Debug for ProducerHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerHooks").finish_non_exhaustive()
    }
}

#[derive(Debug)]
enum Control {
    Flush {
        scrape: bool,
        done: Sender<()>,
    },
    Stop {
        scrape: bool,
        final_flush: Option<bool>,
    },
}

/// A running in-process session. See the module docs.
#[derive(Debug)]
pub struct InProcessService {
    control: Sender<Control>,
    thread: Option<JoinHandle<io::Result<Vec<u8>>>>,
}

impl InProcessService {
    /// Starts the service thread for one session: `smb` is the process's shared memory buffer,
    /// `commits` the receiving end its writers commit to, `identity` the process itself.
    pub fn start(
        config: SessionConfig,
        smb: Arc<OwnedSmb>,
        commits: impl CommitSource,
        identity: ProducerIdentity,
    ) -> io::Result<Self> {
        let hooks = ProducerHooks {
            flush_writers: Box::new(|| {}),
            clear_incremental_state: Box::new(|| {}),
        };
        Self::start_with_hooks(config, smb, commits, identity, hooks)
    }

    /// [`start`](Self::start), with the producer side's [`ProducerHooks`] called on the
    /// session's periods: `flush_writers` every `flush_period_ms` (the writers commit what they
    /// hold, and the commits that follow are applied, and streamed with `write_into_file`),
    /// `clear_incremental_state` every `incremental_state_config.clear_period_ms`.
    pub fn start_with_hooks(
        config: SessionConfig,
        smb: Arc<OwnedSmb>,
        commits: impl CommitSource,
        identity: ProducerIdentity,
        hooks: ProducerHooks,
    ) -> io::Result<Self> {
        let mut core = ServiceCore::new(config)?;
        let producer = core.add_producer(identity);
        let (control, control_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("tachyon-service".into())
            .spawn(move || run(core, producer, smb, commits, control_rx, hooks))?;
        Ok(InProcessService {
            control,
            thread: Some(thread),
        })
    }

    /// Applies every commit sent so far, optionally scrapes the shared memory buffer for
    /// finished packets not yet committed, and (with `write_into_file`) writes what is complete
    /// to the file. Waits at most `timeout`; returns whether the flush completed in time.
    ///
    /// Scraping copies chunks writers may still be writing: call it with `scrape` only when no
    /// writer thread is writing concurrently (e.g. after they flushed), since the bytes a writer
    /// stores are plain stores, not atomics.
    pub fn flush(&self, scrape: bool, timeout: Duration) -> bool {
        let (done, done_rx) = mpsc::channel();
        if self.control.send(Control::Flush { scrape, done }).is_err() {
            return false;
        }
        done_rx.recv_timeout(timeout).is_ok()
    }

    /// Stops the session: applies the remaining commits (waiting until every sender is gone
    /// or the channel is empty), optionally scrapes, reads everything out and writes the
    /// `TraceStats` packet. Returns the trace if it was kept in memory (no output path).
    pub fn stop(self, scrape: bool) -> io::Result<Vec<u8>> {
        self.stop_with(scrape, None)
    }

    /// [`stop`](Self::stop) after the process side's final flush: `succeeded` says whether
    /// every writer committed what it held in time. The outcome goes into the `TraceStats`
    /// (`final_flush_outcome`), so a trace missing a late writer's last chunk says so.
    pub fn stop_after_final_flush(self, scrape: bool, succeeded: bool) -> io::Result<Vec<u8>> {
        self.stop_with(scrape, Some(succeeded))
    }

    fn stop_with(mut self, scrape: bool, final_flush: Option<bool>) -> io::Result<Vec<u8>> {
        let _ = self.control.send(Control::Stop {
            scrape,
            final_flush,
        });
        match self.thread.take().expect("stopped once").join() {
            Ok(r) => r,
            Err(_) => Err(io::Error::other("the tachyon service thread panicked")),
        }
    }
}

impl Drop for InProcessService {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self.control.send(Control::Stop {
                scrape: false,
                final_flush: None,
            });
            let _ = t.join();
        }
    }
}

fn run(
    mut core: ServiceCore,
    producer: ProducerId,
    smb: Arc<OwnedSmb>,
    mut commits: impl CommitSource,
    control: Receiver<Control>,
    hooks: ProducerHooks,
) -> io::Result<Vec<u8>> {
    let view = smb.service();
    let start = Instant::now();
    let write_period = core
        .config()
        .write_into_file
        .then(|| core.config().file_write_period);
    let mut next_write = write_period.map(|p| start + p);
    let flush_period = core.config().flush_period;
    let mut next_flush = flush_period.map(|p| start + p);
    let clear_period = core.config().incremental_state_clear_period;
    let mut next_clear = clear_period.map(|p| start + p);
    let mut commits_open = true;
    // A streaming pass under way (its steps alternate with the commits).
    let mut streaming = false;
    loop {
        let mut busy = streaming;
        while commits_open {
            match commits.try_next() {
                Ok(Some(req)) => {
                    core.commit(producer, &view, &req);
                    busy = true;
                }
                Ok(None) => break,
                Err(()) => commits_open = false,
            }
        }
        let msg = if busy {
            control.try_recv().ok()
        } else {
            control.recv_timeout(TICK).ok()
        };
        if let Some(msg) = msg {
            // Everything committed before the request is applied first.
            while let Ok(Some(req)) = commits.try_next() {
                core.commit(producer, &view, &req);
            }
            match msg {
                Control::Flush { scrape, done } => {
                    if scrape {
                        core.scrape(producer, &view);
                    }
                    core.record_flush(true);
                    if write_period.is_some() {
                        // A whole pass (it finishes one under way).
                        core.drain(false)?;
                        streaming = false;
                    }
                    let _ = done.send(());
                }
                Control::Stop {
                    scrape,
                    final_flush,
                } => {
                    if scrape {
                        core.scrape(producer, &view);
                    }
                    if let Some(ok) = final_flush {
                        core.record_final_flush(ok);
                    }
                    core.remove_producer(producer);
                    return core.finish();
                }
            }
        }
        if let (Some(at), Some(period)) = (next_write, write_period) {
            if Instant::now() >= at {
                streaming = true;
                next_write = Some(at + period);
            }
        }
        if streaming {
            streaming = !core.drain_some(STREAM_STEP_CHUNKS)?;
        }
        if let (Some(at), Some(period)) = (next_flush, flush_period) {
            if Instant::now() >= at {
                // Writers commit at their next packet; their commits arrive in later turns.
                (hooks.flush_writers)();
                core.record_flush(true);
                next_flush = Some(at + period);
            }
        }
        if let (Some(at), Some(period)) = (next_clear, clear_period) {
            if Instant::now() >= at {
                // Producers re-emit interned data and descriptors at their next packet.
                (hooks.clear_incremental_state)();
                next_clear = Some(at + period);
            }
        }
    }
}

//! The in-process service: a thread that drives a [`ServiceCore`], receives the commits of the
//! process's own writers through a channel (std's unbounded `mpsc`, a lock-free hand-off: a
//! sender never waits for the service), copies their chunks out of the process's shared memory
//! buffer, streams the trace to its file when asked to, and writes the end of the trace at stop.
//!
//! The commits waiting in the channel may also be applied by another thread of the process,
//! through a [`CommitPump`] (the core and the channel's receiving end sit behind one lock): the
//! SDK's drainer applies them after each of its passes, on the core it already runs on, instead
//! of leaving them to the service thread's next turn (see [`CommitPump`] for why).

use std::io;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tachyon_abi::{CommitRequest, OwnedSmb};

use crate::readout::ProducerIdentity;
use crate::session::{ServiceCore, SessionConfig, STREAM_STEP_CHUNKS};
use crate::trace_buffer::ProducerId;

/// How long the service thread sleeps when no commit is waiting. The thread polls rather than
/// blocks: a blocked receiver makes every sender pay a futex wake-up (10–30 ns per packet
/// measured on the writer side), a polling one costs the writers nothing. (While the SDK's
/// drainer works, it applies the commits itself: [`CommitPump`].)
const TICK: Duration = Duration::from_millis(2);

/// The most commits a [`CommitPump`] applies in one call (about 1 MiB of 4 KiB chunks): a
/// thread that pumps between its own work (the drainer, between passes) gets back to it, and
/// what is left waits for its next call or the service thread's turn. A drainer's pass in a
/// flood commits a few dozen.
pub const PUMP_STEP: usize = 256;

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
    pump: CommitPump,
}

/// What the service thread and the [`CommitPump`]s share: the core and the commits' receiving
/// end, behind one lock, so that commits are applied one at a time and in the order they were
/// sent, whoever applies them.
struct Applier<C> {
    /// `None` once the session has stopped (the service thread took it to finish the trace).
    core: Option<ServiceCore>,
    commits: C,
    /// Whether a sender may still send (the channel has not reported every sender gone).
    commits_open: bool,
    producer: ProducerId,
    smb: Arc<OwnedSmb>,
}

impl<C: CommitSource> Applier<C> {
    /// Applies the commits waiting in the channel, at most `max`; how many.
    fn apply_waiting(&mut self, max: usize) -> usize {
        let Some(core) = self.core.as_mut() else {
            return 0;
        };
        let view = self.smb.service();
        let mut n = 0;
        while self.commits_open && n < max {
            match self.commits.try_next() {
                Ok(Some(req)) => {
                    core.commit(self.producer, &view, &req);
                    n += 1;
                }
                Ok(None) => break,
                Err(()) => self.commits_open = false,
            }
        }
        n
    }
}

/// The applier behind a [`CommitPump`], its commit source's type erased.
trait ApplyWaiting: Send + Sync {
    fn apply_waiting_now(&self) -> usize;
}

impl<C: CommitSource> ApplyWaiting for Mutex<Applier<C>> {
    fn apply_waiting_now(&self) -> usize {
        // Busy (the service thread applies, flushes or streams) or poisoned: the service
        // thread applies them at its next turn.
        self.try_lock()
            .map_or(0, |mut a| a.apply_waiting(PUMP_STEP))
    }
}

/// Applies an in-process session's waiting commits on the calling thread: for the thread that
/// produces most of them. The SDK's drainer encodes the threads' queued events into chunks and
/// commits them; left to the service thread, which wakes every [`TICK`], those commits are
/// copied in bursts of 2 ms worth of events (about a millisecond of copying in a flood), while
/// the drainer, which shares a core with the service thread on a machine with a core to spare,
/// waits for it, and the traced threads' queues fill meanwhile and are encoded on the traced
/// threads' own time. Applied by the drainer after each pass, the copying comes in small steps
/// between its passes, with no thread switch (docs/data-path.md).
///
/// Cheap to clone; does nothing once the session stopped.
///
/// A panic while applying a commit (a bug in the service) unwinds into the caller and leaves
/// the lock poisoned: pumps then do nothing, and the service thread goes on with the core.
#[derive(Clone)]
pub struct CommitPump {
    applier: Weak<dyn ApplyWaiting>,
}

impl CommitPump {
    /// Applies the commits waiting now, at most [`PUMP_STEP`] (none if the service thread is
    /// applying, flushing or streaming at this moment: it applies them itself); how many.
    pub fn apply_waiting(&self) -> usize {
        self.applier.upgrade().map_or(0, |a| a.apply_waiting_now())
    }
}

impl std::fmt::Debug for CommitPump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitPump").finish_non_exhaustive()
    }
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
        let applier = Arc::new(Mutex::new(Applier {
            core: Some(core),
            commits,
            commits_open: true,
            producer,
            smb,
        }));
        let weak: Weak<Mutex<Applier<_>>> = Arc::downgrade(&applier);
        let pump = CommitPump { applier: weak };
        let thread = std::thread::Builder::new()
            .name("tachyon-service".into())
            .spawn(move || run(applier, control_rx, hooks))?;
        Ok(InProcessService {
            control,
            thread: Some(thread),
            pump,
        })
    }

    /// A handle that applies this session's waiting commits on the thread that calls it
    /// ([`CommitPump`]).
    pub fn commit_pump(&self) -> CommitPump {
        self.pump.clone()
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

fn lock<C>(applier: &Mutex<Applier<C>>) -> MutexGuard<'_, Applier<C>> {
    // A pump that panicked applying a commit (a bug) may have left that commit half applied;
    // the session still goes on and ends with what the core holds (its read-out checks every
    // chunk it reads, as it does a producer's), rather than losing the whole trace.
    applier.lock().unwrap_or_else(|e| e.into_inner())
}

fn run<C: CommitSource>(
    applier: Arc<Mutex<Applier<C>>>,
    control: Receiver<Control>,
    hooks: ProducerHooks,
) -> io::Result<Vec<u8>> {
    let start = Instant::now();
    let periods = lock(&applier).core.as_ref().map(|core| {
        let config = core.config();
        (
            config.write_into_file.then_some(config.file_write_period),
            config.flush_period,
            config.incremental_state_clear_period,
        )
    });
    let Some((write_period, flush_period, clear_period)) = periods else {
        return Err(io::Error::other("the in-process session's core is gone"));
    };
    let mut next_write = write_period.map(|p| start + p);
    let mut next_flush = flush_period.map(|p| start + p);
    let mut next_clear = clear_period.map(|p| start + p);
    // A streaming pass under way (its steps alternate with the commits).
    let mut streaming = false;
    loop {
        let busy = lock(&applier).apply_waiting(usize::MAX) > 0 || streaming;
        // Waits without the lock: a pump applies meanwhile.
        let msg = if busy {
            control.try_recv().ok()
        } else {
            control.recv_timeout(TICK).ok()
        };
        let mut guard = lock(&applier);
        if msg.is_some() {
            // Everything committed before the request is applied first.
            guard.apply_waiting(usize::MAX);
        }
        let a = &mut *guard;
        let producer = a.producer;
        let view = a.smb.service();
        let Some(core) = a.core.as_mut() else {
            return Err(io::Error::other("the in-process session's core is gone"));
        };
        if let Some(msg) = msg {
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
                    let core = a.core.take().expect("checked above");
                    drop(guard);
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
        let now = Instant::now();
        let flush = next_flush.is_some_and(|at| now >= at);
        let clear = next_clear.is_some_and(|at| now >= at);
        if flush {
            core.record_flush(true);
        }
        // The hooks run without the lock: they are the producer side's code.
        drop(guard);
        if let (true, Some(at), Some(period)) = (flush, next_flush, flush_period) {
            // Writers commit at their next packet; their commits arrive in later turns.
            (hooks.flush_writers)();
            next_flush = Some(at + period);
        }
        if let (true, Some(at), Some(period)) = (clear, next_clear, clear_period) {
            // Producers re-emit interned data and descriptors at their next packet.
            (hooks.clear_incremental_state)();
            next_clear = Some(at + period);
        }
    }
}

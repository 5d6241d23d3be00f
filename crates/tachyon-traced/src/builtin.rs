//! The daemon's own producer: the built-in data sources of `tachyon-probes`
//! (`linux.process_stats`, `linux.sys_stats`, `linux.perf`), run on one probes thread.
//!
//! The probes write with the SDK's `TraceWriter` into an in-process [`OwnedSmb`] through an
//! [`SmbArbiter`], whose commits go to the service thread as [`Event::BuiltinCommit`], the same
//! way a producer's `CommitData` would, and are routed by global buffer id like any other. The
//! daemon's pid and uid are the packets' trusted identity.
//!
//! That memory is **never scraped**: the writers store into their chunks with plain stores, so a
//! service-thread read of a chunk being written would be a data race. Instead the probes thread
//! flushes its writers after every poll and on every flush and stop request, and reports
//! ([`Event::BuiltinFlushed`], [`Event::BuiltinStopped`]) only after the commits are sent, on the
//! same channel, so they are applied first.
//!
//! The service thread never waits for the probes thread (flushes and stops are acknowledged by
//! events), so the two cannot deadlock; a writer that finds the buffer full waits at most the
//! arbiter's bounded stall and then drops (counted in the trace).

use std::io;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tachyon::backend::{ArbiterConfig, CommitSink, OwnedSmb, PageSize, SmbArbiter, TraceWriter};
use tachyon_abi::{CommitRequest, ServiceView};
use tachyon_probes::Probe;

use crate::service::Event;

/// Size of the probes' shared memory buffer.
const SMB_SIZE: usize = 1 << 20;
/// The shortest poll period honoured (a config asking for less gets this).
const MIN_POLL_PERIOD: Duration = Duration::from_millis(10);

/// The producer name of the daemon's own data sources, as `producer_name_filter` sees it
/// (Perfetto's probes are `perfetto.traced_probes`).
pub(crate) const PRODUCER_NAME: &str = "tachyon.traced_probes";

/// Whether `name` is a data source the daemon provides itself.
pub fn is_builtin(name: &str) -> bool {
    name == tachyon_probes::PROCESS_STATS
        || name == tachyon_probes::SYS_STATS
        || name == tachyon_probes::PERF
}

enum Command {
    Start {
        instance: u64,
        probe: Box<dyn Probe>,
        target_buffer: u16,
    },
    Flush {
        request_id: u64,
        instances: Vec<u64>,
    },
    Stop {
        instance: u64,
    },
    Clear {
        instances: Vec<u64>,
    },
}

/// The probes thread and its buffer.
pub(crate) struct Builtin {
    tx: Option<Sender<Command>>,
    smb: Arc<OwnedSmb>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Builtin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builtin").finish_non_exhaustive()
    }
}

/// Hands the probes' commits to the service thread (never blocks: the channel is unbounded,
/// and bounded in practice by the number of chunks in the buffer).
struct EventSink(Sender<Event>);

impl CommitSink for EventSink {
    fn commit(&self, request: CommitRequest) {
        let _ = self.0.send(Event::BuiltinCommit(request));
    }
}

impl Builtin {
    /// Creates the buffer, the arbiter and the probes thread.
    pub(crate) fn start(events: Sender<Event>) -> io::Result<Builtin> {
        let smb = Arc::new(
            OwnedSmb::new(SMB_SIZE, PageSize::Kib4)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?,
        );
        // SAFETY: the only other user of this buffer in the process is the service thread,
        // which only acquires chunks the writers released as Complete (through the commits of
        // `EventSink`) and never scrapes it (`Service::scrape_session` skips `Who::Builtin`),
        // so no chunk a writer is writing is ever read concurrently.
        #[allow(unsafe_code)]
        let arbiter = unsafe {
            SmbArbiter::new(
                smb.clone(),
                ArbiterConfig::default(),
                EventSink(events.clone()),
            )
        };
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("tachyon-probes".into())
            .spawn(move || run(arbiter, rx, events))?;
        Ok(Builtin {
            tx: Some(tx),
            smb,
            thread: Some(thread),
        })
    }

    /// The service's view of the probes' buffer (for their commits).
    pub(crate) fn service_view(&self) -> ServiceView<'_> {
        self.smb.service()
    }

    /// Starts `probe` as data source instance `instance`, writing to global buffer
    /// `target_buffer`.
    pub(crate) fn start_probe(&self, instance: u64, probe: Box<dyn Probe>, target_buffer: u16) {
        self.send(Command::Start {
            instance,
            probe,
            target_buffer,
        });
    }

    /// Flushes the given instances, then reports [`Event::BuiltinFlushed`].
    pub(crate) fn flush(&self, request_id: u64, instances: Vec<u64>) {
        self.send(Command::Flush {
            request_id,
            instances,
        });
    }

    /// Has the given instances clear their incremental state (no report: the service does not
    /// wait for a clear).
    pub(crate) fn clear(&self, instances: Vec<u64>) {
        self.send(Command::Clear { instances });
    }

    /// Flushes and stops an instance, then reports [`Event::BuiltinStopped`].
    pub(crate) fn stop(&self, instance: u64) {
        self.send(Command::Stop { instance });
    }

    fn send(&self, command: Command) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(command);
        }
    }
}

impl Drop for Builtin {
    fn drop(&mut self) {
        // Closing the channel ends the thread.
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Running {
    instance: u64,
    probe: Box<dyn Probe>,
    writer: TraceWriter,
    period: Option<Duration>,
    next_poll: Option<Instant>,
}

/// The running probes among `instances`.
fn of<'r>(
    running: &'r mut [Running],
    instances: &'r [u64],
) -> impl Iterator<Item = &'r mut Running> {
    running
        .iter_mut()
        .filter(|r| instances.contains(&r.instance))
}

fn run(arbiter: Arc<SmbArbiter>, commands: Receiver<Command>, events: Sender<Event>) {
    let mut running: Vec<Running> = Vec::new();
    loop {
        let next = running.iter().filter_map(|r| r.next_poll).min();
        let command = match next {
            Some(at) => match commands.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(c) => Some(c),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            },
            None => match commands.recv() {
                Ok(c) => Some(c),
                Err(_) => break,
            },
        };
        match command {
            Some(Command::Start {
                instance,
                mut probe,
                target_buffer,
            }) => match arbiter.create_trace_writer(target_buffer) {
                Ok(mut writer) => {
                    probe.start(&mut writer);
                    writer.flush();
                    let period = probe.poll_period().map(|p| p.max(MIN_POLL_PERIOD));
                    running.push(Running {
                        instance,
                        probe,
                        writer,
                        period,
                        next_poll: period.map(|p| Instant::now() + p),
                    });
                }
                Err(_) => {
                    let _ = events.send(Event::BuiltinStopped {
                        instance_id: instance,
                    });
                }
            },
            Some(Command::Flush {
                request_id,
                instances,
            }) => {
                for r in of(&mut running, &instances) {
                    r.probe.flush(&mut r.writer);
                    r.writer.flush();
                }
                let _ = events.send(Event::BuiltinFlushed { request_id });
            }
            Some(Command::Stop { instance }) => {
                if let Some(i) = running.iter().position(|r| r.instance == instance) {
                    let mut r = running.remove(i);
                    r.probe.flush(&mut r.writer);
                    r.writer.flush();
                }
                let _ = events.send(Event::BuiltinStopped {
                    instance_id: instance,
                });
            }
            Some(Command::Clear { instances }) => {
                for r in of(&mut running, &instances) {
                    r.probe.clear_incremental_state(&mut r.writer);
                    r.writer.flush();
                }
            }
            None => {}
        }
        let now = Instant::now();
        for r in &mut running {
            let (Some(at), Some(period)) = (r.next_poll, r.period) else {
                continue;
            };
            if at <= now {
                r.probe.poll(&mut r.writer);
                r.writer.flush();
                let mut next = at + period;
                if next <= now {
                    next = now + period;
                }
                r.next_poll = Some(next);
            }
        }
    }
}

//! CPU sampling of the traced process: `perf_event_open` software CPU-clock timers with the
//! kernel's user call chains (Tracy's sampling, Perfetto's `traced_perf`), written as Perfetto
//! `PerfSample` packets with interned call stacks.
//!
//! [`Config::sampling_hz`](crate::Config::sampling_hz) (`TACHYON_SAMPLING_HZ`) turns it on.
//! One event per CPU for each thread the process has when the session starts, with `inherit`,
//! so threads they create later are sampled too; each event has a 64 KiB ring buffer that a
//! `tachyon-sampler` thread empties every 10 ms and at the end of the session. The kernel
//! stamps samples with `CLOCK_BOOTTIME`, the packets say so (`timestamp_clock_id` 6).
//!
//! The stacks: with the feature `dwarf-unwind` (default, x86-64), the kernel copies the user
//! registers and the top 8 KiB of the stack with each sample, and the sampler thread unwinds
//! that copy with the binaries' `.eh_frame` (`callstack::dwarf`), as `perf --call-graph dwarf`
//! does; right without frame pointers, cut where the 8 KiB end. Without it, the kernel's own
//! call chains, which it walks by frame pointers: the first frame (where the thread was
//! running) is exact, the callers right only for code built with frame pointers
//! (`-C force-frame-pointers=yes`). All events of one CPU share one ring buffer
//! (`PERF_EVENT_IOC_SET_OUTPUT`): 256 KiB per CPU, within the unprivileged
//! `perf_event_mlock_kb` default on two CPUs.
//!
//! When the kernel refuses (`kernel.perf_event_paranoid` above 2, a seccomp filter, no
//! `perf_event_open` at all), [`start`] says why and tracing goes on without samples.

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::callstack::MAX_DEPTH;

/// Perfetto's `BUILTIN_CLOCK_BOOTTIME`.
pub(crate) const BOOTTIME_CLOCK_ID: u32 = 6;

/// One sample as the sampler hands it to a thread's writer.
#[derive(Debug)]
pub(crate) struct Sample<'a> {
    pub(crate) cpu: u32,
    pub(crate) pid: u32,
    pub(crate) tid: u32,
    /// `Profiling.CpuMode` (the same numbers as perf's `PERF_RECORD_MISC_*` cpu modes).
    pub(crate) cpu_mode: i32,
    pub(crate) period: u64,
    /// Innermost first.
    pub(crate) pcs: &'a [u64],
    /// Not a sample: records the kernel lost on this CPU.
    pub(crate) lost: u64,
    /// The id of the event the sample's event was inherited from (its own id when it was
    /// opened, not inherited): `PERF_SAMPLE_STREAM_ID`.
    pub(crate) stream: u64,
}

/// Why sampling did not start.
#[derive(Debug)]
pub struct SamplingError {
    /// What the kernel said.
    pub error: io::Error,
    /// `kernel.perf_event_paranoid`, if readable.
    pub paranoid: Option<i32>,
}

impl std::fmt::Display for SamplingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "perf_event_open refused CPU sampling: {}", self.error)?;
        match (self.error.raw_os_error(), self.paranoid) {
            (Some(1 | 13), Some(p)) if p > 2 => write!(
                f,
                " (kernel.perf_event_paranoid is {p}; 2 or less lets a process sample itself: \
                 sysctl kernel.perf_event_paranoid=2)"
            ),
            (Some(1 | 13), _) => write!(
                f,
                " (a seccomp filter or a container's policy may forbid perf_event_open)"
            ),
            (Some(38), _) => write!(f, " (this kernel has no perf events)"),
            _ => Ok(()),
        }
    }
}

impl std::error::Error for SamplingError {}

/// Samples taken and lost by the running sampler.
#[derive(Debug, Default)]
struct Counters {
    samples: AtomicU64,
    lost: AtomicU64,
}

/// A running sampler: its thread and the stop flag.
struct Running {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
    counters: Arc<Counters>,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

/// What a stopped sampler did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SamplingReport {
    /// Samples written.
    pub samples: u64,
    /// Samples the kernel dropped (its ring buffer was full).
    pub lost: u64,
}

/// Starts sampling this process at `hz` samples per second of CPU time per thread (clamped to
/// `kernel.perf_event_max_sample_rate`). The samples go to the session that is running.
pub(crate) fn start(hz: u32) -> Result<(), SamplingError> {
    let hz = u64::from(hz)
        .min(max_sample_rate().unwrap_or(u64::MAX))
        .max(1);
    let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    if running.is_some() {
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let (tx, rx) = std::sync::mpsc::channel::<Result<(), SamplingError>>();
    let (stop2, counters2) = (stop.clone(), counters.clone());
    let thread = std::thread::Builder::new()
        .name("tachyon-sampler".into())
        .spawn(move || {
            let me = sys::gettid();
            let events = match open_all(hz, me) {
                Ok(e) => {
                    let _ = tx.send(Ok(()));
                    e
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            run(events, &stop2, &counters2);
        })
        .map_err(|error| SamplingError {
            error,
            paranoid: None,
        })?;
    match rx.recv() {
        Ok(Ok(())) => {
            *running = Some(Running {
                stop,
                thread,
                counters,
            });
            Ok(())
        }
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => Err(SamplingError {
            error: io::Error::other("the sampler thread ended"),
            paranoid: None,
        }),
    }
}

/// Stops the sampler (its last samples are written first); `None` if none ran.
pub(crate) fn stop() -> Option<SamplingReport> {
    let running = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    running.stop.store(true, Ordering::Relaxed);
    running.thread.thread().unpark();
    let _ = running.thread.join();
    Some(SamplingReport {
        samples: running.counters.samples.load(Ordering::Relaxed),
        lost: running.counters.lost.load(Ordering::Relaxed),
    })
}

fn max_sample_rate() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn paranoid() -> Option<i32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// One event per CPU per thread of the process (but `skip_tid`, the sampler).
fn open_all(hz: u64, skip_tid: i32) -> Result<Vec<sys::Event>, SamplingError> {
    let err = |error| SamplingError {
        error,
        paranoid: paranoid(),
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpus = online_cpus().unwrap_or(cpus);
    let mut tids = thread_ids("/proc/self/task").map_err(err)?;
    tids.retain(|&t| t != skip_tid);
    let mut events: Vec<sys::Event> = Vec::new();
    // The first event of each CPU has the ring buffer; the others write into it.
    let mut leaders: Vec<Option<i32>> = vec![None; cpus];
    for &tid in &tids {
        for (cpu, leader) in leaders.iter_mut().enumerate() {
            match sys::Event::open(tid, cpu as i32, &sys::Attr::own(hz), *leader) {
                Ok(e) => {
                    leader.get_or_insert(e.fd());
                    events.push(e);
                }
                Err(e) if thread_or_cpu_gone(&e) => {}
                Err(e) => return Err(err(e)),
            }
        }
    }
    if events.is_empty() {
        return Err(err(io::Error::other("no thread could be sampled")));
    }
    Ok(events)
}

/// The thread ids listed in a `/proc/PID/task` directory, in order.
fn thread_ids(task_dir: &str) -> io::Result<Vec<i32>> {
    let mut tids: Vec<i32> = std::fs::read_dir(task_dir)?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// `perf_event_open` failed because the thread exited meanwhile (ESRCH) or the CPU is offline
/// (ENODEV): nothing to sample there, not an error.
fn thread_or_cpu_gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(3 | 19))
}

/// The number of CPUs the kernel may run threads on (`/sys/devices/system/cpu/possible`).
fn online_cpus() -> Option<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").ok()?;
    let last = s.trim().rsplit(['-', ',']).next()?.parse::<usize>().ok()?;
    Some(last + 1)
}

fn run(mut events: Vec<sys::Event>, stop: &AtomicBool, counters: &Counters) {
    let mut record = Vec::with_capacity(16 << 10);
    let mut pcs = [0u64; MAX_DEPTH];
    loop {
        let last = stop.load(Ordering::Relaxed);
        for e in &mut events {
            e.drain(&mut record, |rec| {
                if let Some((s, ts)) = parse(rec, &mut pcs, true) {
                    if s.lost != 0 {
                        counters.lost.fetch_add(s.lost, Ordering::Relaxed);
                    } else {
                        counters.samples.fetch_add(1, Ordering::Relaxed);
                    }
                    crate::track_event::state::with_state(|st| st.perf_sample(ts, &s));
                }
            });
        }
        if last {
            break;
        }
        // Often enough that a CPU's buffer (about 30 samples with their stacks) does not
        // overflow at 1 kHz per busy thread.
        std::thread::park_timeout(Duration::from_millis(5));
    }
}

/// How often an event is sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interval {
    /// Samples per second (of CPU time, for the CPU clock); the kernel adjusts the period.
    Frequency(u64),
    /// A sample every this many events (nanoseconds, for the CPU clock).
    Period(u64),
}

/// The event a [`ProcessSampler`] samples on: perf's `type` and `config`
/// (`perf_event_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerfEvent {
    /// `PERF_TYPE_*` (0 hardware, 1 software).
    pub kind: u32,
    /// `PERF_COUNT_HW_*` / `PERF_COUNT_SW_*`.
    pub config: u64,
}

impl PerfEvent {
    /// The software CPU clock (`PERF_COUNT_SW_CPU_CLOCK`), which every kernel with perf
    /// events offers, also in virtual machines.
    pub const CPU_CLOCK: PerfEvent = PerfEvent { kind: 1, config: 0 };
}

/// One record of a [`ProcessSampler`]: a sample, or a count of samples the kernel lost.
#[derive(Debug)]
pub struct PerfRecord<'a> {
    /// `CLOCK_BOOTTIME` nanoseconds (0 for a lost-records count).
    pub timestamp: u64,
    /// The CPU the sample was taken on.
    pub cpu: u32,
    /// Process and thread sampled.
    pub pid: u32,
    /// Thread.
    pub tid: u32,
    /// `Profiling.CpuMode`: 1 kernel, 2 user (perf's `PERF_RECORD_MISC_*` modes).
    pub cpu_mode: i32,
    /// Events since the previous sample (the timebase count).
    pub period: u64,
    /// The kernel's call chain, innermost first: the first frame is where the thread was, the
    /// others are return addresses minus one; walked by frame pointers, so callers are right
    /// only in code built with them. Kernel frames first when they were asked for.
    pub pcs: &'a [u64],
    /// Not 0: a count of records the kernel dropped (its ring buffer was full).
    pub lost: u64,
}

/// CPU sampling of other processes (the daemon's `linux.perf`): `perf_event_open` events on
/// every thread of the processes added (with `inherit`, so their new threads are sampled too),
/// or on every CPU for the whole system, with the kernel's frame-pointer call chains.
/// [`drain`](Self::drain) hands out what the kernel wrote since the last call.
///
/// One ring buffer per CPU (the other events of that CPU write into it), of `pages` pages.
///
/// A thread the process starts while its events are being opened may inherit none of them (or
/// only some CPUs'), so [`add_process`](Self::add_process) is meant to be called again: it opens
/// events for every thread that has none of its own yet, inherited or not. A thread then holds
/// several events that sample it (its own, and those inherited along one or more chains); each
/// sample says which chain it came from (its stream id), and `drain` keeps one chain per thread
/// and CPU: the thread's own event once it has one, else the first chain seen. A thread's
/// `PERF_RECORD_EXIT` closes its own events (not a CPU's ring buffer owner) and forgets its
/// chains, so a thread id the kernel reuses is sampled afresh.
pub struct ProcessSampler {
    attr: sys::Attr,
    /// Every open event by (thread, CPU); thread -1 for the whole-system events.
    events: HashMap<(i32, u32), sys::Event>,
    /// The event of each CPU that owns the ring buffer.
    leaders: Vec<Option<i32>>,
    /// The id of each thread's own event, by (thread, CPU).
    own: HashMap<(i32, u32), u64>,
    /// The chain kept for a thread without an event of its own on that CPU.
    chosen: HashMap<(i32, u32), u64>,
    /// Threads with events of their own (a rescan opens only the new ones).
    threads: HashSet<i32>,
    record: Vec<u8>,
    pcs: Box<[u64; MAX_DEPTH]>,
}

impl std::fmt::Debug for ProcessSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessSampler")
            .field("events", &self.events.len())
            .finish_non_exhaustive()
    }
}

impl ProcessSampler {
    /// A sampler with no events yet: `event` at `interval`, with kernel samples and frames when
    /// `kernel` is set (which `perf_event_paranoid` 2 refuses to anyone but root).
    pub fn new(event: PerfEvent, interval: Interval, kernel: bool) -> ProcessSampler {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpus = online_cpus().unwrap_or(cpus);
        let interval = match interval {
            Interval::Frequency(hz) => {
                Interval::Frequency(hz.min(max_sample_rate().unwrap_or(u64::MAX)).max(1))
            }
            Interval::Period(p) => Interval::Period(p.max(1)),
        };
        ProcessSampler {
            attr: sys::Attr {
                event: (event.kind, event.config),
                interval,
                user_stack: false,
                inherit: true,
                kernel,
                task: true,
            },
            events: HashMap::new(),
            leaders: vec![None; cpus],
            own: HashMap::new(),
            chosen: HashMap::new(),
            threads: HashSet::new(),
            record: Vec::with_capacity(16 << 10),
            pcs: Box::new([0; MAX_DEPTH]),
        }
    }

    /// Samples every thread of process `pid` that has no event of its own yet (call it again to
    /// pick up threads started since, or while, the process's events were opened). The number
    /// of threads added; an error when the kernel refuses (a process that exited meanwhile adds
    /// 0).
    pub fn add_process(&mut self, pid: i32) -> Result<usize, SamplingError> {
        let err = |error| SamplingError {
            error,
            paranoid: paranoid(),
        };
        let Ok(mut tids) = thread_ids(&format!("/proc/{pid}/task")) else {
            return Ok(0);
        };
        tids.retain(|t| !self.threads.contains(t));
        let mut added = 0;
        for tid in tids {
            let mut any = false;
            for cpu in 0..self.leaders.len() {
                match self.open(tid, cpu) {
                    Ok(()) => any = true,
                    Err(e) if thread_or_cpu_gone(&e) => {}
                    Err(e) => return Err(err(e)),
                }
            }
            if any {
                self.threads.insert(tid);
                added += 1;
            }
        }
        Ok(added)
    }

    /// Samples every process on every CPU (`perf_event_paranoid` ≤ 0, `CAP_PERFMON` or root).
    pub fn add_all_cpus(&mut self) -> Result<(), SamplingError> {
        if self.threads.contains(&-1) {
            return Ok(());
        }
        // A per-CPU event follows every task: there is nothing to inherit, and no thread's
        // exit to follow.
        self.attr.inherit = false;
        self.attr.task = false;
        for cpu in 0..self.leaders.len() {
            match self.open(-1, cpu) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(19) => {} // an offline CPU
                Err(error) => {
                    return Err(SamplingError {
                        error,
                        paranoid: paranoid(),
                    })
                }
            }
        }
        self.threads.insert(-1);
        Ok(())
    }

    fn open(&mut self, tid: i32, cpu: usize) -> io::Result<()> {
        let e = sys::Event::open(tid, cpu as i32, &self.attr, self.leaders[cpu])?;
        if tid > 0 {
            // Without its id the thread's samples are kept by the first-chain rule.
            if let Ok(id) = e.id() {
                self.own.insert((tid, cpu as u32), id);
            }
        }
        self.leaders[cpu].get_or_insert(e.fd());
        self.events.insert((tid, cpu as u32), e);
        Ok(())
    }

    /// Whether any event is open.
    pub fn is_sampling(&self) -> bool {
        !self.events.is_empty()
    }

    /// Calls `f` with every record the kernel wrote since the last call.
    pub fn drain(&mut self, mut f: impl FnMut(&PerfRecord<'_>)) {
        let whole = self.threads.contains(&-1);
        let mut exited = Vec::new();
        let (record, pcs) = (&mut self.record, &mut *self.pcs);
        let (own, chosen) = (&self.own, &mut self.chosen);
        for e in self.events.values_mut().filter(|e| e.has_ring()) {
            e.drain(record, |rec| {
                if let Some(tid) = exit_of(rec) {
                    exited.push(tid);
                    return;
                }
                let Some((s, ts)) = parse(rec, pcs, false) else {
                    return;
                };
                if s.lost == 0 && !whole && !keep(own, chosen, s.tid as i32, s.cpu, s.stream) {
                    return;
                }
                f(&PerfRecord {
                    timestamp: ts,
                    cpu: s.cpu,
                    pid: s.pid,
                    tid: s.tid,
                    cpu_mode: s.cpu_mode,
                    period: s.period,
                    pcs: s.pcs,
                    lost: s.lost,
                });
            });
        }
        for tid in exited {
            self.forget(tid);
        }
    }

    /// A thread exited: its own events are closed (except a CPU's ring buffer owner, which the
    /// other events write into) and its chains forgotten.
    fn forget(&mut self, tid: i32) {
        if tid <= 0 {
            return;
        }
        let had_own = self.threads.remove(&tid);
        for cpu in 0..self.leaders.len() as u32 {
            self.chosen.remove(&(tid, cpu));
            if !had_own {
                continue;
            }
            self.own.remove(&(tid, cpu));
            if let Some(e) = self.events.get(&(tid, cpu)) {
                if Some(e.fd()) != self.leaders[cpu as usize] {
                    self.events.remove(&(tid, cpu));
                }
            }
        }
    }
}

/// Whether a sample of `tid` on `cpu` from chain `stream` is kept: the thread's own event's
/// when it has one, else the first chain seen for it on that CPU (the others sample the same
/// thread again).
fn keep(
    own: &HashMap<(i32, u32), u64>,
    chosen: &mut HashMap<(i32, u32), u64>,
    tid: i32,
    cpu: u32,
    stream: u64,
) -> bool {
    if let Some(&id) = own.get(&(tid, cpu)) {
        return stream == id;
    }
    *chosen.entry((tid, cpu)).or_insert(stream) == stream
}

/// The thread of a `PERF_RECORD_EXIT` record (header, pid, ppid, tid, ...).
fn exit_of(rec: &[u8]) -> Option<i32> {
    let ty = u32::from_ne_bytes(rec.get(0..4)?.try_into().ok()?);
    if ty != PERF_RECORD_EXIT {
        return None;
    }
    Some(i32::from_ne_bytes(rec.get(16..20)?.try_into().ok()?))
}

const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_EXIT: u32 = 4;
const PERF_RECORD_SAMPLE: u32 = 9;
/// Where a sample's call chain starts (after its header, ip, pid/tid, time, stream id, cpu,
/// period and the chain's length).
const CHAIN: usize = 64;
const PERF_CONTEXT_MAX: u64 = -4095i64 as u64;

/// Decodes one ring-buffer record (header included) laid out as `sys::SAMPLE_TYPE` says:
/// ip, pid/tid, time, stream id, cpu, period, callchain. Garbage gives `None`, never a panic.
fn parse<'a>(rec: &[u8], pcs: &'a mut [u64; MAX_DEPTH], own: bool) -> Option<(Sample<'a>, u64)> {
    let u32_at = |o: usize| Some(u32::from_ne_bytes(rec.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_ne_bytes(rec.get(o..o + 8)?.try_into().ok()?));
    let ty = u32_at(0)?;
    let misc = u16::from_ne_bytes(rec.get(4..6)?.try_into().ok()?);
    match ty {
        PERF_RECORD_LOST => {
            let lost = u64_at(16)?;
            Some((
                Sample {
                    cpu: 0,
                    pid: 0,
                    tid: 0,
                    cpu_mode: 0,
                    period: 0,
                    pcs: &[],
                    lost,
                    stream: 0,
                },
                0,
            ))
        }
        PERF_RECORD_SAMPLE => {
            let ip = u64_at(8)?;
            let pid = u32_at(16)?;
            let tid = u32_at(20)?;
            let time = u64_at(24)?;
            let stream = u64_at(32)?;
            let cpu = u32_at(40)?;
            let period = u64_at(48)?;
            let nr = usize::try_from(u64_at(56)?).ok()?;
            // Without `.eh_frame` unwinding every stack is the kernel's chain, whoever's it is.
            #[cfg(not(all(
                feature = "dwarf-unwind",
                target_arch = "x86_64",
                target_os = "linux"
            )))]
            let _ = own;
            #[cfg(all(feature = "dwarf-unwind", target_arch = "x86_64", target_os = "linux"))]
            if !own {
                // Another process's stack: not unwindable with this process's binaries.
            } else if let Some(n) = unwind_copy(rec, CHAIN + 8 * nr.min(4096), ip, pcs) {
                return Some((
                    Sample {
                        cpu,
                        pid,
                        tid,
                        cpu_mode: i32::from(misc & 7),
                        period,
                        pcs: &pcs[..n],
                        lost: 0,
                        stream,
                    },
                    time,
                ));
            }
            let mut n = 0;
            let mut first = true;
            for i in 0..nr.min(4096) {
                let pc = u64_at(CHAIN + 8 * i)?;
                if pc >= PERF_CONTEXT_MAX {
                    continue; // a context marker (user, kernel)
                }
                if n == pcs.len() {
                    break;
                }
                // The first frame is where the thread was; the others are return addresses.
                pcs[n] = if first { pc } else { pc.wrapping_sub(1) };
                first = false;
                n += 1;
            }
            if n == 0 && ip != 0 {
                pcs[0] = ip;
                n = 1;
            }
            Some((
                Sample {
                    cpu,
                    pid,
                    tid,
                    cpu_mode: i32::from(misc & 7),
                    period,
                    pcs: &pcs[..n],
                    lost: 0,
                    stream,
                },
                time,
            ))
        }
        _ => None,
    }
}

/// The registers and stack copy after the call chain (at `off`), unwound: the frames, or None
/// without them (the kernel could not copy, or the unwinder found nothing).
#[cfg(all(feature = "dwarf-unwind", target_arch = "x86_64", target_os = "linux"))]
fn unwind_copy(rec: &[u8], off: usize, ip: u64, pcs: &mut [u64; MAX_DEPTH]) -> Option<usize> {
    let u64_at = |o: usize| Some(u64::from_ne_bytes(rec.get(o..o + 8)?.try_into().ok()?));
    let abi = u64_at(off)?;
    if abi == 0 {
        return None;
    }
    // Registers in bit order: bp (6), sp (7), ip (8).
    let (bp, sp, rip) = (u64_at(off + 8)?, u64_at(off + 16)?, u64_at(off + 24)?);
    let size = usize::try_from(u64_at(off + 32)?).ok()?;
    let data = off + 40;
    let stack = rec.get(data..data.checked_add(size)?)?;
    let dyn_size = usize::try_from(u64_at(data + size)?).ok()?;
    let stack = &stack[..dyn_size.min(size)];
    let ip = if rip != 0 { rip } else { ip };
    let n = crate::callstack::dwarf::walk_sample(ip, sp, bp, stack, pcs);
    (n > 0).then_some(n)
}

/// The system calls and the ring buffer (the only unsafe code of the sampler).
mod sys {
    use super::*;

    const PERF_TYPE_SOFTWARE: u32 = 1;
    const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
    /// IP | TID | TIME | CALLCHAIN | CPU | PERIOD | STREAM_ID: the layout `parse` reads.
    const SAMPLE_TYPE_CHAIN: u64 = 1 | 2 | 4 | 32 | 128 | 256 | 512;
    /// The same + REGS_USER | STACK_USER (the registers and stack copy `unwind_copy` reads).
    const SAMPLE_TYPE_STACK: u64 = SAMPLE_TYPE_CHAIN | (1 << 12) | (1 << 13);

    /// What an event samples and how.
    pub(crate) struct Attr {
        /// perf `type` and `config`.
        pub(crate) event: (u32, u64),
        pub(crate) interval: Interval,
        /// Registers and 8 KiB of user stack with each sample (for unwinding in this process).
        pub(crate) user_stack: bool,
        /// Threads the sampled thread creates are sampled too.
        pub(crate) inherit: bool,
        /// Kernel samples and kernel frames too.
        pub(crate) kernel: bool,
        /// `PERF_RECORD_EXIT` (and `FORK`) records of the sampled threads.
        pub(crate) task: bool,
    }

    impl Attr {
        /// This process's own sampling: CPU clock at `hz`, user stacks copied where they can be
        /// unwound here.
        pub(crate) fn own(hz: u64) -> Attr {
            Attr {
                event: (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK),
                interval: Interval::Frequency(hz),
                user_stack: cfg!(all(
                    feature = "dwarf-unwind",
                    target_arch = "x86_64",
                    target_os = "linux"
                )),
                inherit: true,
                kernel: false,
                task: false,
            }
        }
    }
    /// x86-64 perf registers: BP (6), SP (7), IP (8).
    const REGS_USER: u64 = (1 << 6) | (1 << 7) | (1 << 8);
    /// Bytes of user stack copied per sample.
    const STACK_USER: u32 = 8 << 10;
    const PERF_EVENT_IOC_SET_OUTPUT: u64 = 0x2405;
    const FLAG_INHERIT: u64 = 1 << 1;
    const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
    const FLAG_EXCLUDE_HV: u64 = 1 << 6;
    const FLAG_FREQ: u64 = 1 << 10;
    const FLAG_TASK: u64 = 1 << 13;
    /// `_IOR('$', 7, u64)`: the event's id, as samples' stream ids give it.
    const PERF_EVENT_IOC_ID: u64 = 0x8008_2407;
    const FLAG_EXCLUDE_CALLCHAIN_KERNEL: u64 = 1 << 21;
    const FLAG_USE_CLOCKID: u64 = 1 << 25;
    const CLOCK_BOOTTIME: i32 = 7;
    #[cfg(target_arch = "x86_64")]
    const SYS_PERF_EVENT_OPEN: i64 = 298;
    #[cfg(target_arch = "aarch64")]
    const SYS_PERF_EVENT_OPEN: i64 = 241;
    #[cfg(target_arch = "x86_64")]
    const SYS_GETTID: i64 = 186;
    #[cfg(target_arch = "aarch64")]
    const SYS_GETTID: i64 = 178;
    const PAGE: usize = 4096;
    /// Data pages per CPU: 256 KiB.
    const DATA_PAGES: usize = 64;

    extern "C" {
        fn syscall(n: i64, ...) -> i64;
        fn mmap(
            addr: *mut c_void,
            len: usize,
            prot: i32,
            flags: i32,
            fd: i32,
            off: i64,
        ) -> *mut c_void;
        fn munmap(addr: *mut c_void, len: usize) -> i32;
        fn close(fd: i32) -> i32;
        fn ioctl(fd: i32, req: u64, ...) -> i32;
    }

    pub(super) fn gettid() -> i32 {
        // SAFETY: gettid takes no arguments and cannot fail.
        unsafe { syscall(SYS_GETTID) as i32 }
    }

    /// An open perf event and its ring buffer mapping (none when it writes into another
    /// event's).
    pub(super) struct Event {
        fd: i32,
        base: *mut u8,
        len: usize,
    }

    // SAFETY: the mapping and the descriptor belong to the event alone; only the thread that
    // holds it reads them.
    unsafe impl Send for Event {}

    impl Event {
        pub(super) fn fd(&self) -> i32 {
            self.fd
        }

        /// The kernel's id of this event (the stream id of its samples and its inheritors').
        pub(super) fn id(&self) -> io::Result<u64> {
            let mut id = 0u64;
            // SAFETY: PERF_EVENT_IOC_ID writes one u64 through the pointer, which is valid and
            // writable for the call; `fd` is an open perf event.
            if unsafe { ioctl(self.fd, PERF_EVENT_IOC_ID, &mut id as *mut u64) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(id)
        }

        /// Whether this event owns a ring buffer (other events write into it).
        pub(super) fn has_ring(&self) -> bool {
            !self.base.is_null()
        }

        pub(super) fn open(tid: i32, cpu: i32, a: &Attr, output: Option<i32>) -> io::Result<Event> {
            // perf_event_attr, PERF_ATTR_SIZE_VER7 (128 bytes), zeroed then filled by offset.
            let mut attr = [0u8; 128];
            let put32 =
                |a: &mut [u8; 128], o: usize, v: u32| a[o..o + 4].copy_from_slice(&v.to_ne_bytes());
            let put64 =
                |a: &mut [u8; 128], o: usize, v: u64| a[o..o + 8].copy_from_slice(&v.to_ne_bytes());
            put32(&mut attr, 0, a.event.0);
            put32(&mut attr, 4, 128);
            put64(&mut attr, 8, a.event.1);
            let (interval, freq) = match a.interval {
                Interval::Frequency(hz) => (hz, FLAG_FREQ),
                Interval::Period(p) => (p, 0),
            };
            put64(&mut attr, 16, interval.max(1)); // sample_freq or sample_period
            let sample_type = if a.user_stack {
                SAMPLE_TYPE_STACK
            } else {
                SAMPLE_TYPE_CHAIN
            };
            put64(&mut attr, 24, sample_type);
            let mut flags = FLAG_EXCLUDE_HV | freq | FLAG_USE_CLOCKID;
            if a.inherit {
                flags |= FLAG_INHERIT;
            }
            if !a.kernel {
                flags |= FLAG_EXCLUDE_KERNEL | FLAG_EXCLUDE_CALLCHAIN_KERNEL;
            }
            if a.task {
                flags |= FLAG_TASK;
            }
            put64(&mut attr, 40, flags);
            put32(&mut attr, 92, CLOCK_BOOTTIME as u32);
            if a.user_stack {
                put64(&mut attr, 80, REGS_USER);
                put32(&mut attr, 88, STACK_USER);
            }
            // SAFETY: `attr` is a valid perf_event_attr of the size it declares and lives
            // across the call; the other arguments are plain integers.
            let fd = unsafe {
                syscall(
                    SYS_PERF_EVENT_OPEN,
                    attr.as_ptr(),
                    tid as i64,
                    cpu as i64,
                    -1i64,
                    8i64, /* PERF_FLAG_FD_CLOEXEC */
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let fd = fd as i32;
            if let Some(leader) = output {
                // SAFETY: both descriptors are perf events of this process on the same CPU.
                if unsafe { ioctl(fd, PERF_EVENT_IOC_SET_OUTPUT, leader) } != 0 {
                    let e = io::Error::last_os_error();
                    // SAFETY: `fd` is ours and closed once.
                    unsafe { close(fd) };
                    return Err(e);
                }
                return Ok(Event {
                    fd,
                    base: std::ptr::null_mut(),
                    len: 0,
                });
            }
            let len = PAGE * (1 + DATA_PAGES);
            // SAFETY: a fresh shared read-write mapping of the event's ring buffer; the kernel
            // checks `fd` and `len`.
            let base = unsafe { mmap(std::ptr::null_mut(), len, 3, 1, fd, 0) };
            if base as isize == -1 {
                let e = io::Error::last_os_error();
                // SAFETY: `fd` is ours and closed once.
                unsafe { close(fd) };
                return Err(e);
            }
            Ok(Event {
                fd,
                base: base.cast(),
                len,
            })
        }

        /// Calls `f` with every record the kernel has written since the last call (a record
        /// that wraps around the end of the ring is copied into `scratch` first).
        pub(super) fn drain(&mut self, scratch: &mut Vec<u8>, mut f: impl FnMut(&[u8])) {
            if self.base.is_null() {
                return;
            }
            // SAFETY: the first page of the mapping is the kernel's `perf_event_mmap_page`;
            // `data_head` (offset 1024) is written by the kernel, so it is read atomically,
            // with acquire order to see the records it covers; `data_tail` (1032) is ours.
            let (head, tail) = unsafe {
                let head = &*self.base.add(1024).cast::<AtomicU64>();
                let tail = &*self.base.add(1032).cast::<AtomicU64>();
                (head, tail)
            };
            let size = (PAGE * DATA_PAGES) as u64;
            let h = head.load(Ordering::Acquire);
            let mut t = tail.load(Ordering::Relaxed);
            // SAFETY: the data area is the `size` bytes after the metadata page, inside the
            // mapping; the kernel does not write the part between tail and head until the
            // tail moves past it.
            let data = unsafe { std::slice::from_raw_parts(self.base.add(PAGE), size as usize) };
            while h.wrapping_sub(t) >= 8 && h.wrapping_sub(t) <= size {
                let off = (t % size) as usize;
                scratch.clear();
                let take = |scratch: &mut Vec<u8>, from: usize, n: usize| {
                    let first = n.min(data.len() - from);
                    scratch.extend_from_slice(&data[from..from + first]);
                    scratch.extend_from_slice(&data[..n - first]);
                };
                take(scratch, off, 8);
                let len = u16::from_ne_bytes([scratch[6], scratch[7]]) as u64;
                if len < 8 || len > h.wrapping_sub(t) {
                    t = h; // a torn or corrupt header: skip what is there
                    break;
                }
                scratch.clear();
                take(scratch, off, len as usize);
                f(scratch);
                t = t.wrapping_add(len);
            }
            tail.store(t, Ordering::Release);
        }
    }

    impl Drop for Event {
        fn drop(&mut self) {
            // SAFETY: the mapping (if any) and descriptor were made in `open` and are
            // released once.
            unsafe {
                if !self.base.is_null() {
                    munmap(self.base.cast(), self.len);
                }
                close(self.fd);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_and_garbage_does_not_panic() {
        let mut rec = Vec::new();
        rec.extend_from_slice(&PERF_RECORD_SAMPLE.to_ne_bytes());
        rec.extend_from_slice(&2u16.to_ne_bytes()); // user mode
        rec.extend_from_slice(&0u16.to_ne_bytes());
        for v in [0x1000u64, (7u64 << 32) | 5, 123, 77, 1, 1_000_000, 3] {
            rec.extend_from_slice(&v.to_ne_bytes());
        }
        for v in [-512i64 as u64, 0x1000, 0x2001] {
            rec.extend_from_slice(&v.to_ne_bytes());
        }
        let mut pcs = [0u64; MAX_DEPTH];
        let (s, ts) = parse(&rec, &mut pcs, true).unwrap();
        assert_eq!((s.pid, s.tid, s.cpu, s.cpu_mode, ts), (5, 7, 1, 2, 123));
        assert_eq!(s.stream, 77);
        assert_eq!(s.pcs, &[0x1000, 0x2000]);
        for cut in 0..rec.len() {
            let mut pcs = [0u64; MAX_DEPTH];
            let _ = parse(&rec[..cut], &mut pcs, true);
        }
        let mut big = rec.clone();
        big[56..64].copy_from_slice(&u64::MAX.to_ne_bytes());
        let mut pcs = [0u64; MAX_DEPTH];
        assert!(parse(&big, &mut pcs, true).is_none());
    }

    #[test]
    fn one_chain_per_thread_and_cpu_is_kept() {
        let mut own = HashMap::new();
        let mut chosen = HashMap::new();
        // Thread 7 has no event of its own: the first chain seen on a CPU is kept there.
        assert!(keep(&own, &mut chosen, 7, 0, 100));
        assert!(!keep(&own, &mut chosen, 7, 0, 200));
        assert!(keep(&own, &mut chosen, 7, 1, 200));
        assert!(keep(&own, &mut chosen, 7, 0, 100));
        // Once it has its own event, only that one counts.
        own.insert((7, 0), 300);
        assert!(!keep(&own, &mut chosen, 7, 0, 100));
        assert!(keep(&own, &mut chosen, 7, 0, 300));
        assert!(keep(&own, &mut chosen, 7, 1, 200));
    }

    #[test]
    fn exit_records_name_their_thread() {
        let mut rec = Vec::new();
        rec.extend_from_slice(&PERF_RECORD_EXIT.to_ne_bytes());
        rec.extend_from_slice(&0u32.to_ne_bytes());
        for v in [10u32, 1, 12, 11] {
            rec.extend_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(exit_of(&rec), Some(12));
        assert_eq!(exit_of(&rec[..18]), None);
        rec[0] = PERF_RECORD_SAMPLE as u8;
        assert_eq!(exit_of(&rec), None);
    }

    #[test]
    fn refusals_explain_themselves() {
        let e = SamplingError {
            error: io::Error::from_raw_os_error(13),
            paranoid: Some(3),
        };
        assert!(e.to_string().contains("perf_event_paranoid is 3"), "{e}");
    }
}

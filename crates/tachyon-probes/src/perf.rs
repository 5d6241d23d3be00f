//! `linux.perf`: CPU sampling of the target processes with `perf_event_open`, written as
//! `PerfSample` packets with interned call stacks (`mappings`, `frames`, `callstacks`,
//! `mapping_paths`, `build_ids`), as Perfetto's `traced_perf` writes them.
//!
//! # What is sampled
//!
//! `perf_event_config.timebase` gives the event (`counter`, the software CPU clock when unset;
//! the other software and the hardware counters as Perfetto names them) and its `frequency`
//! or `period` (else the legacy `sampling_frequency`, else 100 Hz).
//! `callstack_sampling.scope` (or the legacy top-level fields) names the processes:
//! `target_pid`s and `target_cmdline`s (a process whose first argument, or that argument's
//! file name, is the string), minus `exclude_pid`s and `exclude_cmdline`s. The targets get one
//! event per thread and CPU with `inherit`, so threads they create later are sampled too;
//! processes that match a `target_cmdline` after the start are found at the next rescan of
//! `/proc` (every [`RESCAN`]), and threads a target started while its events were being
//! opened (which inherit none) get their own then. No target at all means the whole system: one event per CPU
//! (which the kernel grants only to root, `CAP_PERFMON` or `perf_event_paranoid` ≤ 0), its
//! samples of excluded processes dropped here. `kernel_frames` adds kernel samples and frames.
//!
//! # The stacks
//!
//! The kernel's call chains (`PERF_SAMPLE_CALLCHAIN`), which it walks by frame pointers: the
//! first frame, where the thread was, is exact; its callers are right only in code built with
//! frame pointers (C with `-fno-omit-frame-pointer`, Rust with `-C force-frame-pointers=yes`).
//! `callstack_sampling.user_frames` asks for more (`UNWIND_DWARF`) than this gives: the
//! daemon does not unwind other processes' stack copies (the SDK's own sampling does, see
//! `tachyon::sampling`). Addresses are attributed to the executable mappings of
//! `/proc/PID/maps`, read when the process is first sampled and again when an address falls
//! in none of them; each mapping's build id and load bias come from its ELF file, so `rel_pc`
//! is the address in the file, as a symbolizer wants it. Kernel addresses go to a
//! `[kernel.kallsyms]` mapping, addresses in no mapping to an empty one.
//!
//! # Encoding
//!
//! One packet per sample: its new interned entries (each emitted once per sequence and
//! incremental-state generation; the first packet of a generation says
//! `SEQ_INCREMENTAL_STATE_CLEARED`) and the `PerfSample` (`cpu`, `pid`, `tid`, `cpu_mode`,
//! `timebase_count`, `callstack_iid`), stamped with the kernel's `CLOCK_BOOTTIME` time, the
//! trace's default clock. Records the kernel lost (its ring buffer was full) become a
//! `PerfSample` with `kernel_records_lost`. The ring buffers are read every
//! `ring_buffer_read_period_ms` (100 ms when unset) and at every flush.
//!
//! When the kernel refuses, the probe says why on standard error and writes nothing; the rest
//! of the session records as asked.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tachyon::backend::TraceWriter;
use tachyon::sampling::{Interval, PerfEvent, PerfRecord, ProcessSampler};
use tachyon_protos::{perf_events::Counter, InternedData, PerfEventConfigView};

use crate::procfs;
use crate::Probe;

/// The name of the kernel's mapping, shared by every kernel frame (not allocated per frame).
static KERNEL_MAPPING: std::sync::LazyLock<Arc<str>> =
    std::sync::LazyLock::new(|| Arc::from("[kernel.kallsyms]"));
/// How often `/proc` is searched for new processes matching a `target_cmdline`.
pub(crate) const RESCAN: Duration = Duration::from_millis(250);
/// Ring-buffer read period when the config sets none.
const DEFAULT_READ_PERIOD: Duration = Duration::from_millis(100);
/// Sampling frequency when the config sets none (Hz).
const DEFAULT_HZ: u64 = 100;
/// `TracePacket.sequence_flags` bits.
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;
/// Kernel addresses on x86-64 and arm64 have the top bit set.
const KERNEL_START: u64 = 1 << 63;
/// Most mappings kept per process, and longest `/proc/PID/maps` read.
const MAX_MAPS_BYTES: usize = 4 << 20;

/// What the config asks for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PerfConfig {
    pub(crate) event: PerfEvent,
    pub(crate) interval: Interval,
    pub(crate) kernel: bool,
    pub(crate) target_pids: Vec<i32>,
    pub(crate) target_cmdlines: Vec<String>,
    pub(crate) exclude_pids: Vec<i32>,
    pub(crate) exclude_cmdlines: Vec<String>,
    pub(crate) read_period: Duration,
}

impl PerfConfig {
    pub(crate) fn new(cfg: Option<&PerfEventConfigView<'_>>) -> PerfConfig {
        let mut c = PerfConfig {
            event: PerfEvent::CPU_CLOCK,
            interval: Interval::Frequency(DEFAULT_HZ),
            kernel: false,
            target_pids: Vec::new(),
            target_cmdlines: Vec::new(),
            exclude_pids: Vec::new(),
            exclude_cmdlines: Vec::new(),
            read_period: DEFAULT_READ_PERIOD,
        };
        let Some(cfg) = cfg else {
            return c;
        };
        if cfg.sampling_frequency() != 0 {
            c.interval = Interval::Frequency(u64::from(cfg.sampling_frequency()));
        }
        if let Ok(tb) = cfg.timebase() {
            if tb.frequency() != 0 {
                c.interval = Interval::Frequency(tb.frequency());
            } else if tb.period() != 0 {
                c.interval = Interval::Period(tb.period());
            }
            if let Some(e) = tb.counter().and_then(perf_event) {
                c.event = e;
            }
        }
        if cfg.ring_buffer_read_period_ms() != 0 {
            c.read_period = Duration::from_millis(u64::from(cfg.ring_buffer_read_period_ms()));
        }
        c.kernel = cfg.kernel_frames();
        let strings = |it: &mut dyn Iterator<Item = Result<&str, _>>| -> Vec<String> {
            it.filter_map(Result::ok).map(str::to_owned).collect()
        };
        c.target_pids = cfg.target_pid().filter_map(Result::ok).collect();
        c.target_cmdlines = strings(&mut cfg.target_cmdline());
        c.exclude_pids = cfg.exclude_pid().filter_map(Result::ok).collect();
        c.exclude_cmdlines = strings(&mut cfg.exclude_cmdline());
        if let Ok(cs) = cfg.callstack_sampling() {
            c.kernel |= cs.kernel_frames();
            if let Ok(scope) = cs.scope() {
                c.target_pids
                    .extend(scope.target_pid().filter_map(Result::ok));
                c.target_cmdlines
                    .extend(strings(&mut scope.target_cmdline()));
                c.exclude_pids
                    .extend(scope.exclude_pid().filter_map(Result::ok));
                c.exclude_cmdlines
                    .extend(strings(&mut scope.exclude_cmdline()));
            }
        }
        c
    }

    /// Whether a process is named by the scope (no scope: the whole system).
    fn whole_system(&self) -> bool {
        self.target_pids.is_empty() && self.target_cmdlines.is_empty()
    }
}

/// perf's `type` and `config` of a Perfetto counter.
fn perf_event(c: Counter) -> Option<PerfEvent> {
    let sw = |config| Some(PerfEvent { kind: 1, config });
    let hw = |config| Some(PerfEvent { kind: 0, config });
    match c {
        Counter::UnknownCounter => None,
        Counter::SwCpuClock => sw(0),
        Counter::SwTaskClock => sw(1),
        Counter::SwPageFaults => sw(2),
        Counter::SwContextSwitches => sw(3),
        Counter::SwCpuMigrations => sw(4),
        Counter::SwPageFaultsMin => sw(5),
        Counter::SwPageFaultsMaj => sw(6),
        Counter::SwAlignmentFaults => sw(7),
        Counter::SwEmulationFaults => sw(8),
        Counter::SwDummy => sw(9),
        Counter::HwCpuCycles => hw(0),
        Counter::HwInstructions => hw(1),
        Counter::HwCacheReferences => hw(2),
        Counter::HwCacheMisses => hw(3),
        Counter::HwBranchInstructions => hw(4),
        Counter::HwBranchMisses => hw(5),
        Counter::HwBusCycles => hw(6),
        Counter::HwStalledCyclesFrontend => hw(7),
        Counter::HwStalledCyclesBackend => hw(8),
        Counter::HwRefCpuCycles => hw(9),
    }
}

/// Whether command line `argv0` matches a configured `pattern`: the whole first argument or
/// its file name.
pub(crate) fn cmdline_matches(argv0: &str, pattern: &str) -> bool {
    !pattern.is_empty()
        && (argv0 == pattern || argv0.rsplit('/').next().is_some_and(|b| b == pattern))
}

/// The `linux.perf` probe. See the module docs.
pub(crate) struct Perf {
    cfg: PerfConfig,
    sampler: Option<ProcessSampler>,
    /// Processes whose threads have events.
    sampled: HashSet<i32>,
    /// Processes the kernel refused, said once (tried again at every rescan: the refusal may
    /// be an `exec` in progress).
    refused: HashSet<i32>,
    last_rescan: Option<Instant>,
    interner: Interner,
    procs: HashMap<i32, ProcMaps>,
    elves: HashMap<Arc<str>, Option<Arc<ElfInfo>>>,
    /// The next packet starts a generation of interned data.
    cleared: bool,
    /// Why the kernel refused, once said.
    failed: bool,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Perf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Perf")
            .field("cfg", &self.cfg)
            .field("sampled", &self.sampled)
            .finish_non_exhaustive()
    }
}

impl Perf {
    pub(crate) fn new(cfg: Option<&PerfEventConfigView<'_>>) -> Perf {
        Perf::with_config(PerfConfig::new(cfg))
    }

    pub(crate) fn with_config(cfg: PerfConfig) -> Perf {
        Perf {
            cfg,
            sampler: None,
            sampled: HashSet::new(),
            refused: HashSet::new(),
            last_rescan: None,
            interner: Interner::default(),
            procs: HashMap::new(),
            elves: HashMap::new(),
            cleared: true,
            failed: false,
            buf: Vec::new(),
        }
    }

    /// Opens events for the targets' threads that have none of their own yet.
    fn rescan(&mut self) {
        if self.failed {
            return;
        }
        self.last_rescan = Some(Instant::now());
        let pids = if self.cfg.whole_system() {
            Vec::new()
        } else {
            self.target_pids()
        };
        let cfg = &self.cfg;
        let sampler = self
            .sampler
            .get_or_insert_with(|| ProcessSampler::new(cfg.event, cfg.interval, cfg.kernel));
        let result = if self.cfg.whole_system() {
            sampler.add_all_cpus()
        } else {
            // Every target, sampled already or not: threads a sampled process started while
            // its events were being opened inherited none (or not every CPU's), and each rescan
            // gives every thread without events of its own some (the sampler keeps one chain
            // per thread, so none is counted twice). A pid no longer a target (the process
            // exited, or its pid went to another program) gets nothing more.
            self.sampled.retain(|p| pids.contains(p));
            // A process the kernel refuses (it is being replaced by `exec` right now, or it is
            // not ours) is said once and tried again at the next rescan; the others are
            // sampled meanwhile.
            for pid in pids {
                match sampler.add_process(pid) {
                    Ok(n) if n > 0 => {
                        self.sampled.insert(pid);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if self.refused.insert(pid) {
                            eprintln!("tachyon traced: linux.perf: process {pid}: {e}");
                        }
                    }
                }
            }
            Ok(())
        };
        if let Err(e) = result {
            eprintln!("tachyon traced: linux.perf: {e}; no CPU samples in this session");
            if !sampler.is_sampling() {
                self.failed = true;
                self.sampler = None;
            }
        }
    }

    /// The processes the scope names, sampled already or not.
    fn target_pids(&mut self) -> Vec<i32> {
        let mut pids: Vec<i32> = self.cfg.target_pids.clone();
        if !self.cfg.target_cmdlines.is_empty() || !self.cfg.exclude_cmdlines.is_empty() {
            for pid in list_pids() {
                if pid == std::process::id() as i32 {
                    continue;
                }
                let argv0 = argv0(pid, &mut self.buf);
                if self.excluded_cmdline(&argv0) {
                    pids.retain(|&p| p != pid);
                } else if self
                    .cfg
                    .target_cmdlines
                    .iter()
                    .any(|p| cmdline_matches(&argv0, p))
                {
                    pids.push(pid);
                }
            }
        }
        pids.retain(|p| !self.cfg.exclude_pids.contains(p));
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    fn excluded_cmdline(&self, argv0: &str) -> bool {
        self.cfg
            .exclude_cmdlines
            .iter()
            .any(|p| cmdline_matches(argv0, p))
    }

    /// Writes every sample the kernel has.
    fn drain(&mut self, w: &mut TraceWriter) {
        let Some(mut sampler) = self.sampler.take() else {
            return;
        };
        let whole = self.cfg.whole_system();
        sampler.drain(|r| {
            if whole && r.lost == 0 && self.cfg.exclude_pids.contains(&(r.pid as i32)) {
                return;
            }
            self.write(w, r);
        });
        self.sampler = Some(sampler);
    }

    fn write(&mut self, w: &mut TraceWriter, r: &PerfRecord<'_>) {
        if self.cleared {
            self.interner.clear();
        }
        let iid = if r.lost == 0 {
            let frames: Vec<u64> = r
                .pcs
                .iter()
                .rev()
                .map(|&pc| self.frame(r.pid as i32, pc))
                .collect();
            self.interner.callstack(frames)
        } else {
            0
        };
        let flags = if self.cleared {
            SEQ_INCREMENTAL_STATE_CLEARED | SEQ_NEEDS_INCREMENTAL_STATE
        } else {
            SEQ_NEEDS_INCREMENTAL_STATE
        };
        let dropped = w.packets_dropped();
        let interner = &mut self.interner;
        w.write_packet(|p| {
            p.set_timestamp(if r.timestamp != 0 {
                r.timestamp
            } else {
                tachyon::clock::boottime_ns()
            });
            p.set_sequence_flags(flags);
            if interner.has_pending() {
                interner.write_pending(&mut p.set_interned_data());
            }
            let mut s = p.set_perf_sample();
            s.set_cpu(r.cpu);
            if r.lost != 0 {
                s.set_kernel_records_lost(r.lost);
                return;
            }
            s.set_pid(r.pid);
            s.set_tid(r.tid);
            s.set_cpu_mode_raw(r.cpu_mode);
            s.set_timebase_count(r.period);
            if iid != 0 {
                s.set_callstack_iid(iid);
            }
        });
        // A lost packet may have carried interned entries: start a new generation.
        self.cleared = w.packets_dropped() != dropped;
    }

    /// The frame iid of `pc` in process `pid`.
    fn frame(&mut self, pid: i32, pc: u64) -> u64 {
        let mapping = if pc >= KERNEL_START {
            Some(MapEntry {
                start: KERNEL_START,
                end: u64::MAX,
                pgoff: 0,
                path: KERNEL_MAPPING.clone(),
            })
        } else {
            self.mapping_of(pid, pc)
        };
        let Some(m) = mapping else {
            let mapping = self.interner.mapping(&MappingKey::unknown(), || None);
            return self.interner.frame(mapping, pc);
        };
        let elf = if m.path.starts_with('/') {
            let (elves, buf) = (&mut self.elves, &mut self.buf);
            elves
                .entry(m.path.clone())
                .or_insert_with(|| ElfInfo::read(&m.path, buf).map(Arc::new))
                .clone()
        } else {
            None
        };
        let load_bias = elf.as_ref().map_or(0, |e| e.load_bias(m.pgoff));
        let key = MappingKey {
            path: m.path.clone(),
            start: m.start,
            end: m.end,
            pgoff: m.pgoff,
        };
        let mapping = self.interner.mapping(&key, || {
            Some((
                elf.as_ref().map(|e| e.build_id.clone()).unwrap_or_default(),
                load_bias,
            ))
        });
        let rel_pc = pc
            .wrapping_sub(m.start)
            .wrapping_add(m.pgoff)
            .wrapping_add(load_bias);
        self.interner.frame(mapping, rel_pc)
    }

    fn mapping_of(&mut self, pid: i32, pc: u64) -> Option<MapEntry> {
        let now = Instant::now();
        let maps = self.procs.entry(pid).or_insert_with(|| ProcMaps {
            maps: read_maps(pid, &mut self.buf),
            read_at: now,
        });
        if let Some(m) = maps.find(pc) {
            return Some(m.clone());
        }
        // A library loaded since the last read? At most once per read period per process.
        if now.duration_since(maps.read_at) >= self.cfg.read_period {
            maps.maps = read_maps(pid, &mut self.buf);
            maps.read_at = now;
            return maps.find(pc).cloned();
        }
        None
    }
}

impl Probe for Perf {
    fn start(&mut self, w: &mut TraceWriter) {
        self.rescan();
        let _ = w;
    }

    fn poll_period(&self) -> Option<Duration> {
        Some(self.cfg.read_period)
    }

    fn poll(&mut self, w: &mut TraceWriter) {
        self.drain(w);
        let due = self.last_rescan.is_none_or(|t| t.elapsed() >= RESCAN);
        if due && !self.cfg.whole_system() {
            self.rescan();
        }
        // Processes that exited: forget their mappings (a reused pid reads its own).
        if self.procs.len() > 64 {
            self.procs
                .retain(|pid, _| std::path::Path::new(&format!("/proc/{pid}")).exists());
        }
    }

    fn flush(&mut self, w: &mut TraceWriter) {
        self.drain(w);
        w.flush();
    }

    fn clear_incremental_state(&mut self, w: &mut TraceWriter) {
        let _ = w;
        self.cleared = true;
    }
}

/// Every pid in `/proc`.
fn list_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| procfs::parse_id(&e.ok()?.file_name()))
                .collect()
        })
        .unwrap_or_default()
}

/// A process's first command-line argument ("" when unreadable or a kernel thread).
fn argv0(pid: i32, buf: &mut Vec<u8>) -> String {
    let path = std::path::PathBuf::from(format!("/proc/{pid}/cmdline"));
    if !procfs::read_file(&path, buf, 4096) {
        return String::new();
    }
    procfs::split_cmdline(buf)
        .into_iter()
        .next()
        .unwrap_or_default()
}

/// One executable mapping of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MapEntry {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) pgoff: u64,
    pub(crate) path: Arc<str>,
}

struct ProcMaps {
    /// Sorted by start.
    maps: Vec<MapEntry>,
    read_at: Instant,
}

impl ProcMaps {
    fn find(&self, pc: u64) -> Option<&MapEntry> {
        let i = self.maps.partition_point(|m| m.start <= pc);
        let m = self.maps.get(i.checked_sub(1)?)?;
        (pc < m.end).then_some(m)
    }
}

fn read_maps(pid: i32, buf: &mut Vec<u8>) -> Vec<MapEntry> {
    let path = std::path::PathBuf::from(format!("/proc/{pid}/maps"));
    if !procfs::read_file(&path, buf, MAX_MAPS_BYTES) {
        return Vec::new();
    }
    parse_maps(buf)
}

/// The executable mappings of a `/proc/PID/maps` text, sorted; malformed lines are skipped.
pub(crate) fn parse_maps(text: &[u8]) -> Vec<MapEntry> {
    let text = String::from_utf8_lossy(text);
    let mut out: Vec<MapEntry> = text
        .lines()
        .filter_map(|line| {
            let mut it = line.splitn(6, ' ');
            let (range, perms, off) = (it.next()?, it.next()?, it.next()?);
            let (_dev, _inode) = (it.next()?, it.next()?);
            let path = it.next().unwrap_or("").trim_start();
            if perms.as_bytes().get(2) != Some(&b'x') {
                return None;
            }
            let (s, e) = range.split_once('-')?;
            let start = u64::from_str_radix(s, 16).ok()?;
            let end = u64::from_str_radix(e, 16).ok()?;
            let pgoff = u64::from_str_radix(off, 16).ok()?;
            (start < end).then(|| MapEntry {
                start,
                end,
                pgoff,
                path: Arc::from(path.strip_suffix(" (deleted)").unwrap_or(path)),
            })
        })
        .collect();
    out.sort_by_key(|m| m.start);
    out
}

/// What the mappings need from an ELF file: its build id and loadable segments.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ElfInfo {
    pub(crate) build_id: Vec<u8>,
    /// (p_offset, p_vaddr, p_filesz) of each executable PT_LOAD.
    pub(crate) loads: Vec<(u64, u64, u64)>,
}

impl ElfInfo {
    /// Reads the program headers and the GNU build-id note of a 64-bit little-endian ELF file
    /// (the only kind the sampled architectures run); `None` for anything else or an
    /// unreadable file. Reads at most a few pages, wherever the headers say.
    pub(crate) fn read(path: &str, buf: &mut Vec<u8>) -> Option<ElfInfo> {
        let f = File::open(path).ok()?;
        let mut at = |off: u64, len: usize| -> Option<Vec<u8>> {
            buf.clear();
            buf.resize(len, 0);
            let n = f.read_at(buf, off).ok()?;
            buf.truncate(n);
            Some(buf.clone())
        };
        let h = at(0, 64)?;
        Self::parse(&h, &mut at)
    }

    /// [`read`](Self::read) over `at(offset, len)` (fewer bytes at the end of the file).
    pub(crate) fn parse(
        h: &[u8],
        at: &mut dyn FnMut(u64, usize) -> Option<Vec<u8>>,
    ) -> Option<ElfInfo> {
        let u16_at =
            |b: &[u8], o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
        let u32_at =
            |b: &[u8], o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
        let u64_at =
            |b: &[u8], o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
        if h.get(..6)? != b"\x7fELF\x02\x01" {
            return None;
        }
        let phoff = u64_at(h, 0x20)?;
        let phentsize = usize::from(u16_at(h, 0x36)?);
        let phnum = usize::from(u16_at(h, 0x38)?).min(256);
        if phentsize < 56 {
            return None;
        }
        let ph = at(phoff, phentsize * phnum)?;
        let mut info = ElfInfo::default();
        let mut notes = Vec::new();
        for i in 0..phnum {
            let p = ph.get(i * phentsize..(i + 1) * phentsize)?;
            let (ty, flags, off, vaddr, filesz) = (
                u32_at(p, 0)?,
                u32_at(p, 4)?,
                u64_at(p, 8)?,
                u64_at(p, 16)?,
                u64_at(p, 32)?,
            );
            match ty {
                // Only the executable ones: a read-only segment may end in the page where the
                // code begins, at another bias.
                1 if flags & 1 != 0 => info.loads.push((off, vaddr, filesz)),
                4 if filesz <= 64 << 10 => notes.push((off, filesz as usize)),
                _ => {}
            }
        }
        for (off, len) in notes {
            let Some(n) = at(off, len) else { continue };
            if let Some(id) = tachyon::callstack::gnu_build_id(&n) {
                info.build_id = id.to_vec();
                return Some(info);
            }
        }
        Some(info)
    }

    /// `p_vaddr - p_offset` of the executable segment mapped at file offset `pgoff` (0 if none
    /// is).
    pub(crate) fn load_bias(&self, pgoff: u64) -> u64 {
        self.loads
            .iter()
            .find(|&&(off, _, size)| {
                let page = off & !0xfff;
                pgoff >= page && pgoff < off.saturating_add(size.max(1))
            })
            .map_or(0, |&(off, vaddr, _)| vaddr.wrapping_sub(off))
    }
}

/// A mapping as interned: the same file mapped at the same place in two processes is one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct MappingKey {
    path: Arc<str>,
    start: u64,
    end: u64,
    pgoff: u64,
}

impl MappingKey {
    fn unknown() -> MappingKey {
        MappingKey {
            path: Arc::from(""),
            start: 0,
            end: 0,
            pgoff: 0,
        }
    }
}

/// The sequence's interned stacks and what is new since the last packet.
#[derive(Debug, Default)]
struct Interner {
    next_iid: u64,
    paths: HashMap<Arc<str>, u64>,
    build_ids: HashMap<Vec<u8>, u64>,
    mappings: HashMap<MappingKey, u64>,
    frames: HashMap<(u64, u64), u64>,
    callstacks: HashMap<Vec<u64>, u64>,
    pending_paths: Vec<(u64, Arc<str>)>,
    pending_build_ids: Vec<(u64, Vec<u8>)>,
    /// (iid, key, path iid, build id iid, load bias).
    pending_mappings: Vec<(u64, MappingKey, u64, u64, u64)>,
    pending_frames: Vec<(u64, u64, u64)>,
    pending_callstacks: Vec<(u64, Vec<u64>)>,
}

impl Interner {
    fn next(&mut self) -> u64 {
        self.next_iid += 1;
        self.next_iid
    }

    fn clear(&mut self) {
        *self = Interner::default();
    }

    fn has_pending(&self) -> bool {
        !(self.pending_paths.is_empty()
            && self.pending_build_ids.is_empty()
            && self.pending_mappings.is_empty()
            && self.pending_frames.is_empty()
            && self.pending_callstacks.is_empty())
    }

    /// The mapping's iid; `info` gives its build id and load bias the first time.
    fn mapping(&mut self, key: &MappingKey, info: impl FnOnce() -> Option<(Vec<u8>, u64)>) -> u64 {
        if let Some(&iid) = self.mappings.get(key) {
            return iid;
        }
        let (build_id, load_bias) = info().unwrap_or_default();
        let path_iid = match self.paths.get(&key.path) {
            Some(&i) => i,
            None => {
                let i = self.next();
                self.paths.insert(key.path.clone(), i);
                self.pending_paths.push((i, key.path.clone()));
                i
            }
        };
        let build_iid = if build_id.is_empty() {
            0
        } else if let Some(&i) = self.build_ids.get(&build_id) {
            i
        } else {
            let i = self.next();
            self.build_ids.insert(build_id.clone(), i);
            self.pending_build_ids.push((i, build_id));
            i
        };
        let iid = self.next();
        self.mappings.insert(key.clone(), iid);
        self.pending_mappings
            .push((iid, key.clone(), path_iid, build_iid, load_bias));
        iid
    }

    fn frame(&mut self, mapping: u64, rel_pc: u64) -> u64 {
        if let Some(&iid) = self.frames.get(&(mapping, rel_pc)) {
            return iid;
        }
        let iid = self.next();
        self.frames.insert((mapping, rel_pc), iid);
        self.pending_frames.push((iid, mapping, rel_pc));
        iid
    }

    /// The callstack of `frames` (outermost first); 0 for none.
    fn callstack(&mut self, frames: Vec<u64>) -> u64 {
        if frames.is_empty() {
            return 0;
        }
        if let Some(&iid) = self.callstacks.get(&frames) {
            return iid;
        }
        let iid = self.next();
        self.callstacks.insert(frames.clone(), iid);
        self.pending_callstacks.push((iid, frames));
        iid
    }

    fn write_pending(&mut self, d: &mut InternedData<'_>) {
        for (iid, path) in self.pending_paths.drain(..) {
            let mut s = d.add_mapping_paths();
            s.set_iid(iid);
            s.set_str(path.as_bytes());
        }
        for (iid, id) in self.pending_build_ids.drain(..) {
            let mut s = d.add_build_ids();
            s.set_iid(iid);
            s.set_str(&id);
        }
        for (iid, key, path_iid, build_iid, load_bias) in self.pending_mappings.drain(..) {
            let mut m = d.add_mappings();
            m.set_iid(iid);
            if build_iid != 0 {
                m.set_build_id(build_iid);
            }
            m.set_exact_offset(key.pgoff);
            m.set_start_offset(key.pgoff);
            m.set_start(key.start);
            m.set_end(key.end);
            m.set_load_bias(load_bias);
            if !key.path.is_empty() {
                m.add_path_string_ids(path_iid);
            }
        }
        for (iid, mapping, rel_pc) in self.pending_frames.drain(..) {
            let mut f = d.add_frames();
            f.set_iid(iid);
            f.set_mapping_id(mapping);
            f.set_rel_pc(rel_pc);
        }
        for (iid, frames) in self.pending_callstacks.drain(..) {
            let mut c = d.add_callstacks();
            c.set_iid(iid);
            for f in frames {
                c.add_frame_ids(f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_keep_executable_mappings_sorted_and_skip_garbage() {
        let text = b"7f0000001000-7f0000002000 r-xp 00001000 08:01 42   /usr/lib/libc.so.6\n\
                     55550000-55551000 r--p 00000000 08:01 7 /bin/x\n\
                     55551000-55552000 r-xp 00001000 08:01 7 /bin/x (deleted)\n\
                     zz-1 r-xp 0 0 0\n\
                     7ffd0000-7ffd1000 r-xp 00000000 00:00 0 [vdso]\n";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 3);
        assert_eq!(&*maps[0].path, "/bin/x");
        assert_eq!((maps[0].start, maps[0].pgoff), (0x5555_1000, 0x1000));
        assert_eq!(&*maps[1].path, "[vdso]");
        assert_eq!(&*maps[2].path, "/usr/lib/libc.so.6");
        let pm = ProcMaps {
            maps,
            read_at: Instant::now(),
        };
        assert_eq!(pm.find(0x5555_1800).map(|m| m.start), Some(0x5555_1000));
        assert!(pm.find(0x5555_2000).is_none());
        assert!(pm.find(0).is_none());
    }

    #[test]
    fn cmdlines_match_the_first_argument_or_its_file_name() {
        assert!(cmdline_matches("/usr/bin/busy", "busy"));
        assert!(cmdline_matches("/usr/bin/busy", "/usr/bin/busy"));
        assert!(!cmdline_matches("/usr/bin/busybox", "busy"));
        assert!(!cmdline_matches("busy", ""));
    }

    #[test]
    fn this_binary_has_a_build_id_and_garbage_gives_none() {
        let mut buf = Vec::new();
        let exe = std::env::current_exe().unwrap();
        let info = ElfInfo::read(exe.to_str().unwrap(), &mut buf).expect("an ELF file");
        assert!(!info.loads.is_empty());
        // Rust's linker invocation asks for a build id on Linux; not every toolchain does.
        assert!(info.build_id.is_empty() || info.build_id.len() >= 8);
        let mut no = |_: u64, _: usize| -> Option<Vec<u8>> { None };
        assert!(ElfInfo::parse(b"\x7fELF\x02\x01", &mut no).is_none());
        assert!(ElfInfo::parse(b"not an elf file at all", &mut no).is_none());
        // Truncated headers: every prefix gives an answer, never a panic.
        let mut head = [0u8; 64];
        head[..6].copy_from_slice(b"\x7fELF\x02\x01");
        head[0x36] = 56;
        head[0x38] = 3;
        for cut in 0..head.len() {
            let mut short = |_: u64, n: usize| Some(vec![1u8; n / 2]);
            let _ = ElfInfo::parse(&head[..cut], &mut short);
        }
    }

    #[test]
    fn config_reads_timebase_scope_and_legacy_fields() {
        use tachyon_protos::DataSourceConfigView;
        let mut buf = protozero::HeapBuffered::new();
        {
            let mut c: tachyon_protos::DataSourceConfig<'_> = buf.root();
            c.set_name("linux.perf");
            let mut p = c.set_perf_event_config();
            {
                let mut tb = p.set_timebase();
                tb.set_period(250_000);
                tb.set_counter(Counter::SwTaskClock);
            }
            {
                let mut cs = p.set_callstack_sampling();
                let mut s = cs.set_scope();
                s.add_target_cmdline("busy");
                s.add_exclude_pid(1);
            }
            p.add_target_pid(42);
            p.set_ring_buffer_read_period_ms(50);
        }
        let bytes = buf.serialize().unwrap();
        let v = DataSourceConfigView::decode(&bytes).unwrap();
        let cfg = PerfConfig::new(v.perf_event_config().ok().as_ref());
        assert_eq!(cfg.interval, Interval::Period(250_000));
        assert_eq!(cfg.event, PerfEvent { kind: 1, config: 1 });
        assert_eq!(cfg.target_pids, [42]);
        assert_eq!(cfg.target_cmdlines, ["busy"]);
        assert_eq!(cfg.exclude_pids, [1]);
        assert_eq!(cfg.read_period, Duration::from_millis(50));
        assert!(!cfg.whole_system());
        let none = PerfConfig::new(None);
        assert_eq!(none.interval, Interval::Frequency(DEFAULT_HZ));
        assert!(none.whole_system());
    }
}

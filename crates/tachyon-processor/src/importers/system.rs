//! The system probes' packets (`linux.process_stats`: ProcessTree and ProcessStats;
//! `linux.sys_stats`: SysStats), imported as Perfetto's
//! `SystemProbesParser` does (`src/trace_processor/importers/proto/system_probes_parser.cc`).
//!
//! # ProcessTree
//!
//! For each process that has a `cmdline` (others are skipped, as in Perfetto): the parent and
//! the process are found or created (a new one also gets its main thread, as Perfetto's
//! `GetOrCreateProcess` does), `parent_upid` is set, `name` is the first argument and `cmdline`
//! the arguments joined by spaces, both replacing whatever a descriptor said (Perfetto's
//! `SetProcessMetadata`: the system's view wins; a ProcessDescriptor only names a process that
//! has no name yet). Two special cases from Perfetto: a single argument is cut at its first
//! space for the name (processes that rewrite their title with spaces), and a kernel worker
//! (parent pid 2) named `kworker/N:M-queue` or `+queue` loses the transient queue suffix.
//! `uid` and `android_appid` (uid % 100000) come from `uid`.
//!
//! For each thread: the thread (`tid`) of process `tgid` is found or created, and named with
//! ProcessTree's priority, below a thread descriptor's (Perfetto's `ThreadNamePriority`:
//! an instrumented thread's own name is kept over its `comm`).
//!
//! # ProcessStats
//!
//! Per-process counters on process counter tracks (`process_counter_track`, dimensions `upid`
//! and the key), as Perfetto's `SystemProbesParser::ParseProcessStats` and
//! `ChromeSystemProbesParser` make them: `mem.{virt, rss, rss.anon, rss.file, rss.shmem,
//! swap, locked, rss.watermark, dmabuf_rss}` (type `process_memory`), `mem.smaps.*` (`smaps`),
//! both in bytes; `oom_score_adj`; `runtime.{user_ns, kernel_ns}` (`proc_stat_runtime`);
//! Chrome's `chrome.{private_footprint_kb, peak_resident_set_kb}` (`chrome_process_stats`,
//! bytes despite the names) and the process arg `is_peak_rss_resettable`. `threads` attach
//! threads to the process. Perfetto's track descriptions are not copied, nor are `fds`
//! (Perfetto's `filedescriptor` table).
//!
//! # SysStats
//!
//! Counters on tracks named and typed like Perfetto's blueprint tracks (`type` column), with
//! the same dimension args:
//!
//! | field | type | name | dimensions | value |
//! |---|---|---|---|---|
//! | `meminfo` | `meminfo` | the `/proc/meminfo` key (`MemTotal`, …) | `meminfo_key` | kB × 1024, unit `bytes` |
//! | `vmstat` | `vmstat` | the `/proc/vmstat` key (`nr_free_pages`, …) | `vmstat_key` | as is |
//! | `cpu_stat` | `cpustat` | `cpu.times.{user_ns, user_nice_ns, system_mode_ns, idle_ns, io_wait_ns, irq_ns, softirq_ns, steal_ns}` | `cpu`, `cpustat_key` | ns |
//! | `num_forks` | `num_forks` | `num_forks` | – | as is |
//! | `num_irq_total` | `num_irq_total` | `num_irq_total` | – | as is |
//! | `num_softirq_total` | `num_softirq_total` | `num_softirq_total` | – | as is |
//! | `num_irq` | `num_irq` | `num_irq (id: N)` | `irq` | as is |
//! | `num_softirq` | `num_softirq` | `num_softirq (id: N)` | `irq` | as is |
//! | `devfreq` | `clock_frequency` | `KEY Frequency` | `linux_device` | kHz |
//! | `cpufreq_khz` | `cpu_frequency` | `cpufreq` | `cpu` (the index) | kHz |
//! | `disk_stat` | `diskstat` | `diskstat.[DEV].{read,write,discard}_{amount,throughput}`, `…flush_amount`, `…flush_time` | `device_name`, `counter_name` | deltas: MB, MB/s, count, ms |
//! | `psi` | `psi` | `psi.{cpu,io,mem}.{some,full}` | `psi_resource` | stall ns |
//! | `thermal_zone` | `thermal_temperature_sys` | the zone's `type` | `thermal_zone` | unit `C` |
//! | `cpuidle_state` | `cpu_idle_state` | `cpuidleN.STATE` | `cpu`, `state` | unit `us` |
//! | `gpufreq_mhz` | `gpu_frequency` | `gpufreq` | `ugpu`, `gpu` (both 0) | unit `kHz` (as Perfetto labels it) |
//!
//! The CPU tracks are listed in `cpu_counter_track` (its `cpu` column is the `cpu` dimension).
//! Unknown meminfo/vmstat keys and CPU times without `cpu_id` are dropped and counted
//! (`meminfo_unknown_keys`, `vmstat_unknown_keys`, `invalid_cpu_times`), as are PSI samples of
//! an unknown resource (`psi_unknown_resource`; Perfetto also stops reading the rest of that
//! packet, we keep its other sections).
//!
//! A disk's counters are the differences between two consecutive `disk_stat` entries of the
//! device (/proc/diskstats is cumulative; sectors are 512 bytes, 2048 per MB; a throughput is
//! the amount over the time spent, 0 when no time passed), so its first entry only sets the
//! baseline, as in Perfetto. They are computed in file order, which is time order on the one
//! sequence a probe writes.
//!
//! Not imported: `buddy_info` and `slab_info`, whose values Perfetto scales by the page size of
//! a `SystemInfo` packet, which Tachyon does not import.

use tachyon_protos::TracePacketView;

use crate::importers::{Aux, Event, EventKind, Parser};
use crate::storage::stats::Stat;
use crate::storage::strings::{FxHashMap, StrId};
use crate::storage::{name_priority, ArgValue, CounterRow, EventType, TrackRow, NONE};

use tachyon_protos::sys_stats_keys::{MEMINFO_KEYS, VMSTAT_KEYS};

/// The `cpustat_key` dimension of the eight CPU time counters, in `CpuTimes` field order.
const CPU_TIMES: [&str; 8] = [
    "user_ns",
    "user_nice_ns",
    "system_mode_ns",
    "idle_ns",
    "io_wait_ns",
    "irq_ns",
    "softirq_ns",
    "steal_ns",
];

/// Perfetto's `kthreadd`: its children are kernel threads.
const KTHREADD_PID: i64 = 2;

/// The kinds of system tracks (Perfetto's blueprint names, the `type` column).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Meminfo,
    Vmstat,
    CpuStat,
    NumForks,
    NumIrqTotal,
    NumSoftirqTotal,
    NumIrq,
    NumSoftirq,
    Devfreq,
    CpuFreq,
    DiskStat,
    Psi,
    Thermal,
    CpuIdle,
    GpuFreq,
    ProcessMemory,
    OomScoreAdj,
    Smaps,
    ProcRuntime,
    ChromeProcessStats,
    /// Not a counter: `is_peak_rss_resettable`, a process arg (the value is 0 or 1).
    PeakRssResettable,
}

impl Kind {
    fn type_name(self) -> &'static str {
        match self {
            Kind::Meminfo => "meminfo",
            Kind::Vmstat => "vmstat",
            Kind::CpuStat => "cpustat",
            Kind::NumForks => "num_forks",
            Kind::NumIrqTotal => "num_irq_total",
            Kind::NumSoftirqTotal => "num_softirq_total",
            Kind::NumIrq => "num_irq",
            Kind::NumSoftirq => "num_softirq",
            Kind::Devfreq => "clock_frequency",
            Kind::CpuFreq => "cpu_frequency",
            Kind::DiskStat => "diskstat",
            Kind::Psi => "psi",
            Kind::Thermal => "thermal_temperature_sys",
            Kind::CpuIdle => "cpu_idle_state",
            Kind::GpuFreq => "gpu_frequency",
            Kind::ProcessMemory => "process_memory",
            Kind::OomScoreAdj => "oom_score_adj",
            Kind::Smaps => "smaps",
            Kind::ProcRuntime => "proc_stat_runtime",
            Kind::ChromeProcessStats => "chrome_process_stats",
            Kind::PeakRssResettable => "",
        }
    }
}

/// One system track, identified by its kind, static string dimension (the meminfo, vmstat or
/// cpustat key, a disk counter's name, a PSI resource), string dimension from the trace (a
/// device, thermal zone or idle state name) and numeric dimension (cpu or irq).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct TrackKey {
    kind: Kind,
    key: Option<&'static str>,
    name: StrId,
    num: Option<i64>,
}

impl TrackKey {
    fn new(kind: Kind) -> TrackKey {
        TrackKey {
            kind,
            key: None,
            name: NONE,
            num: None,
        }
    }
}

/// The cumulative /proc/diskstats counters of one device, in `DiskStat` field order after the
/// name: read sectors and ms, write sectors and ms, discard sectors and ms, flush count and ms.
type DiskCounters = [u64; 8];

/// `SysStats.DiskStat` sectors are 512 bytes.
const SECTORS_PER_MB: f64 = 2048.0;

/// Perfetto's names of the `PsiSample.PsiResource` values (`psi.` + name is the track name).
fn psi_resource_key(resource: i32) -> Option<&'static str> {
    Some(match resource {
        0 => "resource.unspecified",
        1 => "cpu.some",
        2 => "cpu.full",
        3 => "io.some",
        4 => "io.full",
        5 => "mem.some",
        6 => "mem.full",
        _ => return None,
    })
}

/// What a `ProcessStats.Process` field (by number) becomes: (kind, key dimension). `None`:
/// not a counter (pid, threads, fds, Chrome's fields) or unknown.
fn process_counter(field: u32) -> Option<(Kind, Option<&'static str>)> {
    Some(match field {
        2 => (Kind::ProcessMemory, Some("virt")),
        3 => (Kind::ProcessMemory, Some("rss")),
        4 => (Kind::ProcessMemory, Some("rss.anon")),
        5 => (Kind::ProcessMemory, Some("rss.file")),
        6 => (Kind::ProcessMemory, Some("rss.shmem")),
        7 => (Kind::ProcessMemory, Some("swap")),
        8 => (Kind::ProcessMemory, Some("locked")),
        9 => (Kind::ProcessMemory, Some("rss.watermark")),
        24 => (Kind::ProcessMemory, Some("dmabuf_rss")),
        10 => (Kind::OomScoreAdj, None),
        16 => (Kind::Smaps, Some("rss")),
        17 => (Kind::Smaps, Some("pss")),
        18 => (Kind::Smaps, Some("pss.anon")),
        19 => (Kind::Smaps, Some("pss.file")),
        20 => (Kind::Smaps, Some("pss.smem")),
        23 => (Kind::Smaps, Some("swap.pss")),
        21 => (Kind::ProcRuntime, Some("user_ns")),
        22 => (Kind::ProcRuntime, Some("kernel_ns")),
        _ => return None,
    })
}

/// `ProcessStats.Process` fields that are no counters of the system pass: `pid`, `threads`,
/// `fds`, and Chrome's `is_peak_rss_resettable` and `chrome_private_footprint_kb` (read by the
/// Chrome pass). Perfetto's system pass does not skip `chrome_peak_resident_set_kb` (14): it
/// counts it as unknown after the Chrome pass made it a counter; so does this one.
const PROCESS_STATS_PID: u32 = 1;
const PROCESS_STATS_THREADS: u32 = 11;
const PROCESS_STATS_FDS: u32 = 15;
const PROCESS_STATS_CHROME: [u32; 2] = [12, 13];

/// Chrome's `ProcessStats.Process` fields, read by Perfetto's `ChromeSystemProbesParser`
/// before the system pass: (field, kind, key).
const PROCESS_STATS_CHROME_FIELDS: [(u32, Kind, Option<&str>); 3] = [
    (12, Kind::PeakRssResettable, None),
    (13, Kind::ChromeProcessStats, Some("private_footprint_kb")),
    (14, Kind::ChromeProcessStats, Some("peak_resident_set_kb")),
];

/// The eight counters Perfetto derives from two consecutive readings of one disk: (counter
/// name, unit, value).
fn disk_deltas(prev: &DiskCounters, cur: &DiskCounters) -> [(&'static str, &'static str, f64); 8] {
    // Differences as Perfetto takes them (signed: a counter reset gives a negative delta),
    // wrapping where a hostile value would overflow.
    let d = |i: usize| (cur[i] as i64).wrapping_sub(prev[i] as i64);
    let mb = |i: usize| d(i) as f64 / SECTORS_PER_MB;
    let throughput = |amount: f64, ms: i64| {
        if ms == 0 {
            0.0
        } else {
            amount * 1000.0 / ms as f64
        }
    };
    [
        ("read_amount", "MB", mb(0)),
        ("read_throughput", "MB/s", throughput(mb(0), d(1))),
        ("write_amount", "MB", mb(2)),
        ("write_throughput", "MB/s", throughput(mb(2), d(3))),
        ("discard_amount", "MB", mb(4)),
        ("discard_throughput", "MB/s", throughput(mb(4), d(5))),
        ("flush_amount", "count", d(6) as f64),
        ("flush_time", "ms", d(7) as f64),
    ]
}

/// The unit of a disk counter track, by counter name.
fn disk_unit(counter: &str) -> &'static str {
    match counter {
        "flush_amount" => "count",
        "flush_time" => "ms",
        c if c.ends_with("_throughput") => "MB/s",
        _ => "MB",
    }
}

/// System tracks, described at tokenizing and created (in parse order, like every other track)
/// on their first counter value.
#[derive(Debug, Default)]
pub(crate) struct SystemState {
    keys: Vec<TrackKey>,
    ids: FxHashMap<TrackKey, u32>,
    /// Index into `keys` → track id (`NONE` until created).
    tracks: Vec<u32>,
    /// The last `disk_stat` reading of each device (by name).
    disks: FxHashMap<StrId, DiskCounters>,
}

impl SystemState {
    fn intern(&mut self, key: TrackKey) -> u64 {
        let next = self.keys.len() as u32;
        let id = *self.ids.entry(key).or_insert_with(|| {
            self.keys.push(key);
            self.tracks.push(NONE);
            next
        });
        id as u64
    }
}

/// Perfetto's `MaybeTruncateKworkerName`: `kworker/45:2-mm_percpu_wq` → `kworker/45:2`.
fn truncate_kworker(name: &str) -> &str {
    if let Some(rest) = name.strip_prefix("kworker/") {
        if let Some(i) = rest.find(['+', '-']) {
            return &name[..8 + i];
        }
    }
    name
}

impl Parser {
    // === Tokenizing ===

    /// Queues the processes and threads of a ProcessTree packet at `ts`.
    pub(crate) fn process_tree(
        &mut self,
        p: &TracePacketView<'_>,
        ts: i64,
        out: &mut Vec<Event>,
    ) -> Result<(), ()> {
        let tree = p.process_tree().map_err(drop)?;
        let mut kthreads = Vec::new();
        for proc in tree.processes() {
            let proc = proc.map_err(drop)?;
            let args: Vec<&str> = proc.cmdline().filter_map(Result::ok).collect();
            if args.is_empty() {
                continue;
            }
            let (pid, ppid) = (proc.pid() as i64, proc.ppid() as i64);
            let mut argv0 = args[0];
            let mut joined = None;
            if ppid == KTHREADD_PID {
                kthreads.push(pid);
                let t = truncate_kworker(argv0);
                if t.len() != argv0.len() {
                    argv0 = t;
                    joined = Some(t.to_owned());
                }
            }
            if args.len() == 1 {
                if let Some(i) = argv0.find(' ') {
                    argv0 = &argv0[..i];
                }
            }
            let joined = joined.unwrap_or_else(|| args.join(" "));
            let strings = &mut self.st.strings;
            let aux = Aux {
                pid: Some(pid),
                tid: 0,
                name: strings.intern(argv0),
                cmdline: strings.intern(&joined),
                ppid: Some(ppid),
                uid: proc.has_uid().then(|| proc.uid() as u32),
            };
            let extra = TreeProcessExtra {
                start_ts: proc
                    .has_process_start_from_boot()
                    .then(|| proc.process_start_from_boot().min(i64::MAX as u64) as i64),
                is_kthread: proc.has_is_kthread().then(|| proc.is_kthread()),
                cmdline_is_comm: proc.cmdline_is_comm(),
            };
            if extra != TreeProcessExtra::default() {
                self.tree_process_extra.insert(self.aux.len() as u64, extra);
            }
            out.push(self.aux_event(ts, EventKind::TreeProcess, aux));
        }
        for t in tree.threads() {
            let t = t.map_err(drop)?;
            let (tid, tgid) = (t.tid() as i64, t.tgid() as i64);
            let name = if t.has_name() {
                let raw = String::from_utf8_lossy(t.name_bytes());
                let name = if tid == tgid && kthreads.contains(&tid) {
                    truncate_kworker(&raw)
                } else {
                    &raw
                };
                self.st.strings.intern(name)
            } else {
                NONE
            };
            let aux = Aux {
                pid: Some(tgid),
                tid,
                name,
                cmdline: NONE,
                ppid: None,
                uid: None,
            };
            out.push(self.aux_event(ts, EventKind::TreeThread, aux));
        }
        Ok(())
    }

    /// Turns a SysStats packet into counter events (timestamps to be set by the caller), in
    /// Perfetto's order of sections (the order new tracks get their ids in).
    pub(crate) fn sys_stats(
        &mut self,
        p: &TracePacketView<'_>,
        out: &mut Vec<Event>,
    ) -> Result<(), ()> {
        let s = p.sys_stats().map_err(drop)?;
        let mut push = |sys: &mut SystemState, key: TrackKey, value: f64| {
            push_counter(sys, out, key, value);
        };
        for m in s.meminfo() {
            let m = m.map_err(drop)?;
            match MEMINFO_KEYS.get(m.key_raw() as usize) {
                Some(&name) if m.key_raw() > 0 => {
                    let key = TrackKey {
                        key: Some(name),
                        ..TrackKey::new(Kind::Meminfo)
                    };
                    // /proc/meminfo is in kB; the table is in bytes.
                    push(&mut self.system, key, m.value() as f64 * 1024.0);
                }
                _ => self.st.stats.inc(Stat::meminfo_unknown_keys),
            }
        }
        for d in s.devfreq() {
            let d = d.map_err(drop)?;
            let key = TrackKey {
                name: self.st.strings.intern_bytes(d.key_bytes()),
                ..TrackKey::new(Kind::Devfreq)
            };
            push(&mut self.system, key, d.value() as f64);
        }
        for (cpu, khz) in s.cpufreq_khz().enumerate() {
            let key = TrackKey {
                num: Some(cpu as i64),
                ..TrackKey::new(Kind::CpuFreq)
            };
            push(&mut self.system, key, khz.map_err(drop)? as f64);
        }
        for v in s.vmstat() {
            let v = v.map_err(drop)?;
            match VMSTAT_KEYS.get(v.key_raw() as usize) {
                Some(&name) if v.key_raw() > 0 => {
                    let key = TrackKey {
                        key: Some(name),
                        ..TrackKey::new(Kind::Vmstat)
                    };
                    push(&mut self.system, key, v.value() as f64);
                }
                _ => self.st.stats.inc(Stat::vmstat_unknown_keys),
            }
        }
        for c in s.cpu_stat() {
            let c = c.map_err(drop)?;
            if !c.has_cpu_id() {
                self.st.stats.inc(Stat::invalid_cpu_times);
                continue;
            }
            let values = [
                c.user_ns(),
                c.user_nice_ns(),
                c.system_mode_ns(),
                c.idle_ns(),
                c.io_wait_ns(),
                c.irq_ns(),
                c.softirq_ns(),
                c.steal_ns(),
            ];
            for (name, v) in CPU_TIMES.into_iter().zip(values) {
                let key = TrackKey {
                    key: Some(name),
                    num: Some(c.cpu_id() as i64),
                    ..TrackKey::new(Kind::CpuStat)
                };
                push(&mut self.system, key, v as f64);
            }
        }
        let irqs = s.num_irq().map(|i| (Kind::NumIrq, i));
        let softirqs = s.num_softirq().map(|i| (Kind::NumSoftirq, i));
        for (kind, i) in irqs.chain(softirqs) {
            let i = i.map_err(drop)?;
            let key = TrackKey {
                num: Some(i.irq() as i64),
                ..TrackKey::new(kind)
            };
            push(&mut self.system, key, i.count() as f64);
        }
        for (kind, has, value) in [
            (Kind::NumForks, s.has_num_forks(), s.num_forks()),
            (Kind::NumIrqTotal, s.has_num_irq_total(), s.num_irq_total()),
            (
                Kind::NumSoftirqTotal,
                s.has_num_softirq_total(),
                s.num_softirq_total(),
            ),
        ] {
            if has {
                push(&mut self.system, TrackKey::new(kind), value as f64);
            }
        }
        for d in s.disk_stat() {
            let d = d.map_err(drop)?;
            let device = self.st.strings.intern_bytes(d.device_name_bytes());
            let cur: DiskCounters = [
                d.read_sectors(),
                d.read_time_ms(),
                d.write_sectors(),
                d.write_time_ms(),
                d.discard_sectors(),
                d.discard_time_ms(),
                d.flush_count(),
                d.flush_time_ms(),
            ];
            if let Some(prev) = self.system.disks.insert(device, cur) {
                for (counter, _unit, value) in disk_deltas(&prev, &cur) {
                    let key = TrackKey {
                        key: Some(counter),
                        name: device,
                        ..TrackKey::new(Kind::DiskStat)
                    };
                    push(&mut self.system, key, value);
                }
            }
        }
        for psi in s.psi() {
            let psi = psi.map_err(drop)?;
            let Some(resource) = psi_resource_key(psi.resource_raw()) else {
                self.st.stats.inc(Stat::psi_unknown_resource);
                continue;
            };
            let key = TrackKey {
                key: Some(resource),
                ..TrackKey::new(Kind::Psi)
            };
            push(&mut self.system, key, psi.total_ns() as f64);
        }
        for t in s.thermal_zone() {
            let t = t.map_err(drop)?;
            let key = TrackKey {
                name: self.st.strings.intern_bytes(t.type_bytes()),
                ..TrackKey::new(Kind::Thermal)
            };
            push(&mut self.system, key, t.temp() as f64);
        }
        for c in s.cpuidle_state() {
            let c = c.map_err(drop)?;
            for e in c.cpuidle_state_entry() {
                let e = e.map_err(drop)?;
                let key = TrackKey {
                    name: self.st.strings.intern_bytes(e.state_bytes()),
                    num: Some(c.cpu_id() as i64),
                    ..TrackKey::new(Kind::CpuIdle)
                };
                push(&mut self.system, key, e.duration_us() as f64);
            }
        }
        for mhz in s.gpufreq_mhz() {
            push(
                &mut self.system,
                TrackKey::new(Kind::GpuFreq),
                mhz.map_err(drop)? as f64,
            );
        }
        Ok(())
    }

    /// Turns a ProcessStats packet into counter events (timestamps to be set by the caller), as
    /// Perfetto's `SystemProbesParser::ParseProcessStats` does: each field of a process, in
    /// wire order, is a counter on the process's track for it (memory in KiB becomes bytes;
    /// `oom_score_adj` and the runtimes are as is), `threads` attach threads to the process,
    /// and a field it does not know is counted (`proc_stat_unknown_counters`). Not imported:
    /// `fds` (Perfetto's `filedescriptor` table, which Tachyon does not have).
    pub(crate) fn process_stats(
        &mut self,
        p: &TracePacketView<'_>,
        out: &mut Vec<Event>,
    ) -> Result<(), ()> {
        let stats = p.process_stats().map_err(drop)?;
        // Chrome's pass first, over the whole packet, as Perfetto's modules run.
        for proc in stats.processes() {
            let proc = proc.map_err(drop)?;
            let pid = proc.pid() as i64;
            let mut fields = protozero::ProtoDecoder::new(proc.bytes());
            while let Some(f) = fields.read_field().map_err(drop)? {
                let Some(&(_, kind, key)) =
                    PROCESS_STATS_CHROME_FIELDS.iter().find(|c| c.0 == f.id())
                else {
                    continue;
                };
                let value = match kind {
                    Kind::PeakRssResettable => f.as_bool() as u8 as f64,
                    _ => f.as_i64().wrapping_mul(1024) as f64,
                };
                let key = TrackKey {
                    key,
                    num: Some(pid),
                    ..TrackKey::new(kind)
                };
                push_counter(&mut self.system, out, key, value);
            }
        }
        for proc in stats.processes() {
            let proc = proc.map_err(drop)?;
            let pid = proc.pid() as i64;
            let mut fields = protozero::ProtoDecoder::new(proc.bytes());
            while let Some(f) = fields.read_field().map_err(drop)? {
                let id = f.id();
                if id == PROCESS_STATS_PID
                    || id == PROCESS_STATS_FDS
                    || PROCESS_STATS_CHROME.contains(&id)
                {
                    continue;
                }
                if id == PROCESS_STATS_THREADS {
                    let t = tachyon_protos::process_stats::ThreadView::decode(f.as_bytes())
                        .map_err(drop)?;
                    let aux = Aux {
                        pid: Some(pid),
                        tid: t.tid() as i64,
                        name: NONE,
                        cmdline: NONE,
                        ppid: None,
                        uid: None,
                    };
                    out.push(self.aux_event(0, EventKind::TreeThread, aux));
                    continue;
                }
                let Some((kind, key)) = process_counter(id) else {
                    self.st.stats.inc(Stat::proc_stat_unknown_counters);
                    continue;
                };
                let value = match kind {
                    // KiB in /proc; bytes in the table.
                    Kind::ProcessMemory | Kind::Smaps => f.as_i64().wrapping_mul(1024) as f64,
                    _ => f.as_i64() as f64,
                };
                let key = TrackKey {
                    key,
                    num: Some(pid),
                    ..TrackKey::new(kind)
                };
                push_counter(&mut self.system, out, key, value);
            }
        }
        Ok(())
    }

    // === Parsing ===

    /// Perfetto's `ProcessTracker::GetOrCreateProcess`: a new process also gets its main thread.
    fn tree_process(&mut self, pid: i64) -> u32 {
        let new = !self.st.has_process(pid);
        let upid = self.st.process(pid);
        if new {
            self.st.thread(pid, Some(pid));
        }
        upid
    }

    /// A ProcessTree process: parent, name, command line and uid.
    pub(crate) fn apply_tree_process(&mut self, a: &Aux, extra: TreeProcessExtra) {
        let (Some(pid), Some(ppid)) = (a.pid, a.ppid) else {
            return;
        };
        let parent = self.tree_process(ppid);
        let upid = self.tree_process(pid);
        let p = &mut self.st.processes[upid as usize];
        if parent != upid {
            p.parent = parent;
        }
        p.name = a.name;
        p.cmdline = a.cmdline;
        if a.uid.is_some() {
            p.uid = a.uid;
        }
        if extra.start_ts.is_some() {
            p.start_ts = extra.start_ts;
        }
        if let Some(k) = extra.is_kthread {
            self.st
                .push_process_arg(upid, "is_kthread", ArgValue::Bool(k));
        }
        if extra.cmdline_is_comm {
            // The command line is the comm: it names the main thread too, as /proc would.
            let utid = self.st.thread(pid, Some(pid));
            self.st
                .set_thread_name(utid, a.name, name_priority::PROCESS_TREE);
        }
    }

    /// A ProcessTree thread: joins its process and is named, unless a descriptor named it.
    pub(crate) fn apply_tree_thread(&mut self, a: &Aux) {
        let Some(tgid) = a.pid else { return };
        let new_process = !self.st.has_process(tgid);
        let utid = self.st.thread(a.tid, Some(tgid));
        if new_process && a.tid != tgid {
            self.st.thread(tgid, Some(tgid));
        }
        self.st
            .set_thread_name(utid, a.name, name_priority::PROCESS_TREE);
    }

    /// A SysStats counter value, on its track (created on first use).
    pub(crate) fn apply_system_counter(&mut self, ev: &Event) {
        let idx = ev.track as usize;
        let Some(&key) = self.system.keys.get(idx) else {
            return;
        };
        if key.kind == Kind::PeakRssResettable {
            let upid = self.tree_process(key.num.unwrap_or(0));
            let value = ArgValue::Bool(f64::from_bits(ev.data) != 0.0);
            self.st
                .push_process_arg(upid, "is_peak_rss_resettable", value);
            return;
        }
        let mut track = self.system.tracks[idx];
        if track == NONE {
            track = self.create_system_track(key);
            self.system.tracks[idx] = track;
        }
        self.st.counters.push(CounterRow {
            ts: ev.ts,
            track,
            value: f64::from_bits(ev.data),
        });
    }

    fn create_system_track(&mut self, k: TrackKey) -> u32 {
        let process_kind = matches!(
            k.kind,
            Kind::ProcessMemory
                | Kind::OomScoreAdj
                | Kind::Smaps
                | Kind::ProcRuntime
                | Kind::ChromeProcessStats
        );
        // A process counter's track belongs to the process of its pid (created if new, as
        // Perfetto's `GetOrCreateProcess` does).
        let upid = if process_kind {
            self.tree_process(k.num.unwrap_or(0))
        } else {
            NONE
        };
        let strings = &mut self.st.strings;
        let dynamic = (k.name != NONE).then(|| strings.get(k.name).to_owned());
        let dynamic = dynamic.as_deref().unwrap_or("");
        let num = k.num.unwrap_or(0);
        let key = k.key.unwrap_or("");
        let name = match k.kind {
            Kind::CpuStat => strings.intern(&format!("cpu.times.{key}")),
            Kind::NumIrq => strings.intern(&format!("num_irq (id: {num})")),
            Kind::NumSoftirq => strings.intern(&format!("num_softirq (id: {num})")),
            Kind::Devfreq => strings.intern(&format!("{dynamic} Frequency")),
            Kind::CpuFreq => strings.intern("cpufreq"),
            Kind::DiskStat => strings.intern(&format!("diskstat.[{dynamic}].{key}")),
            Kind::Psi => strings.intern(&format!("psi.{key}")),
            Kind::Thermal => k.name,
            Kind::CpuIdle => strings.intern(&format!("cpuidle{num}.{dynamic}")),
            Kind::GpuFreq => strings.intern("gpufreq"),
            Kind::ProcessMemory => strings.intern(&format!("mem.{key}")),
            Kind::OomScoreAdj => strings.intern("oom_score_adj"),
            Kind::Smaps => strings.intern(&format!("mem.smaps.{key}")),
            Kind::ProcRuntime => strings.intern(&format!("runtime.{key}")),
            Kind::ChromeProcessStats => strings.intern(&format!("chrome.{key}")),
            Kind::PeakRssResettable => NONE,
            Kind::Meminfo | Kind::Vmstat => strings.intern(key),
            Kind::NumForks | Kind::NumIrqTotal | Kind::NumSoftirqTotal => {
                strings.intern(k.kind.type_name())
            }
        };
        let unit: StrId = match k.kind {
            Kind::Meminfo => strings.intern("bytes"),
            Kind::DiskStat => strings.intern(disk_unit(key)),
            Kind::Thermal => strings.intern("C"),
            Kind::CpuIdle => strings.intern("us"),
            Kind::GpuFreq => strings.intern("kHz"),
            _ => NONE,
        };
        let key_str =
            |strings: &mut crate::storage::strings::StringPool| ArgValue::Str(strings.intern(key));
        let dims: Vec<(&str, ArgValue)> = match k.kind {
            Kind::Meminfo => vec![("meminfo_key", key_str(strings))],
            Kind::Vmstat => vec![("vmstat_key", key_str(strings))],
            Kind::CpuStat => vec![
                ("cpu", ArgValue::Int(num)),
                ("cpustat_key", key_str(strings)),
            ],
            Kind::NumIrq | Kind::NumSoftirq => vec![("irq", ArgValue::Int(num))],
            Kind::Devfreq => vec![("linux_device", ArgValue::Str(k.name))],
            Kind::CpuFreq => vec![("cpu", ArgValue::Int(num))],
            Kind::DiskStat => vec![
                ("device_name", ArgValue::Str(k.name)),
                ("counter_name", key_str(strings)),
            ],
            Kind::Psi => vec![("psi_resource", key_str(strings))],
            Kind::Thermal => vec![("thermal_zone", ArgValue::Str(k.name))],
            Kind::CpuIdle => vec![
                ("cpu", ArgValue::Int(num)),
                ("state", ArgValue::Str(k.name)),
            ],
            // Perfetto's GPU 0 (`ugpu`, its row in the gpu table) and its id.
            Kind::GpuFreq => vec![("ugpu", ArgValue::Int(0)), ("gpu", ArgValue::Int(0))],
            Kind::OomScoreAdj => vec![("upid", ArgValue::Int(upid as i64))],
            Kind::ProcessMemory => vec![
                ("upid", ArgValue::Int(upid as i64)),
                ("process_memory_key", key_str(strings)),
            ],
            Kind::Smaps => vec![
                ("upid", ArgValue::Int(upid as i64)),
                ("smaps_key", key_str(strings)),
            ],
            Kind::ProcRuntime => vec![
                ("upid", ArgValue::Int(upid as i64)),
                ("proc_stat_runtime_key", key_str(strings)),
            ],
            Kind::ChromeProcessStats => vec![
                ("upid", ArgValue::Int(upid as i64)),
                ("key", key_str(strings)),
            ],
            Kind::NumForks
            | Kind::NumIrqTotal
            | Kind::NumSoftirqTotal
            | Kind::PeakRssResettable => Vec::new(),
        };
        let dimension_arg_set = if dims.is_empty() {
            NONE
        } else {
            let set = self.st.new_arg_set();
            for (key, value) in dims {
                self.st.push_arg_str_key(set, key, value);
            }
            set
        };
        let id = self.st.tracks.len() as u32;
        self.st.tracks.push(TrackRow {
            name,
            kind: k.kind.type_name(),
            event_type: EventType::Counter,
            dimension_arg_set,
            parent: NONE,
            source_arg_set: NONE,
            utid: NONE,
            upid,
            unit,
            description: NONE,
        });
        id
    }
}

/// What a ProcessTree process says besides its `Aux`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TreeProcessExtra {
    /// `process_start_from_boot` (BOOTTIME ns, the default trace clock).
    pub(crate) start_ts: Option<i64>,
    pub(crate) is_kthread: Option<bool>,
    pub(crate) cmdline_is_comm: bool,
}

/// A value of the system counter `key` (its track interned on first use), timestamp to be set
/// by the caller.
fn push_counter(sys: &mut SystemState, out: &mut Vec<Event>, key: TrackKey, value: f64) {
    let track = sys.intern(key);
    out.push(Event::bare(
        EventKind::SystemCounter,
        0,
        track,
        value.to_bits(),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TracePacket from protobuf text format, through tachyon-protos' schema.
    fn packet(text: &str) -> Vec<u8> {
        let protos =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tachyon-protos/protos");
        let fds = protox::compile([protos.join("perfetto/trace/trace.proto")], [&protos]).unwrap();
        let desc = prost_reflect::DescriptorPool::from_file_descriptor_set(fds)
            .unwrap()
            .get_message_by_name("perfetto.protos.TracePacket")
            .unwrap();
        let msg = prost_reflect::DynamicMessage::parse_text_format(desc, text).unwrap();
        prost::Message::encode_to_vec(&msg)
    }

    /// Tokenizes ProcessStats packets (at their timestamps) and applies the events in order.
    fn import_process_stats(packets: &[(i64, &str)]) -> Parser {
        let mut parser = Parser::default();
        for &(ts, text) in packets {
            let bytes = packet(text);
            let view = TracePacketView::decode(&bytes).unwrap();
            let mut out = Vec::new();
            parser.process_stats(&view, &mut out).unwrap();
            for ev in out {
                parser.apply(&Event { ts, ..ev });
            }
        }
        parser
    }

    /// The process counters as (track type, name, pid, ts, value), in track then time order.
    fn process_counters(p: &Parser) -> Vec<(&'static str, String, i64, i64, f64)> {
        let mut rows: Vec<_> =
            p.st.counters
                .iter()
                .map(|c| {
                    let t = &p.st.tracks[c.track as usize];
                    let pid = p.st.processes[t.upid as usize].pid;
                    (
                        c.track,
                        t.kind,
                        p.st.strings.get(t.name).to_owned(),
                        pid,
                        c.ts,
                        c.value,
                    )
                })
                .collect();
        rows.sort_by_key(|r| (r.0, r.4));
        rows.into_iter()
            .map(|r| (r.1, r.2, r.3, r.4, r.5))
            .collect()
    }

    // The expected values are trace_processor_shell's on the same packets.
    #[test]
    fn process_stats_become_process_counters() {
        let p = import_process_stats(&[
            (
                2000,
                "process_stats { processes { pid: 10 vm_size_kb: 1000 vm_rss_kb: 300 \
                 oom_score_adj: -100 threads { tid: 11 } fds { fd: 3 path: \"/dev/null\" } \
                 is_peak_rss_resettable: true chrome_private_footprint_kb: 7 \
                 chrome_peak_resident_set_kb: 8 smr_pss_shmem_kb: 10 runtime_user_mode: 5000000 \
                 runtime_kernel_mode: 700000 dmabuf_rss_kb: 64 } \
                 processes { pid: 20 oom_score_adj: 900 } }",
            ),
            (
                3000,
                "process_stats { processes { pid: 10 vm_rss_kb: 320 } }",
            ),
        ]);
        let rows = process_counters(&p);
        let expected: &[(&str, &str, i64, i64, f64)] = &[
            (
                "chrome_process_stats",
                "chrome.private_footprint_kb",
                10,
                2000,
                7168.0,
            ),
            (
                "chrome_process_stats",
                "chrome.peak_resident_set_kb",
                10,
                2000,
                8192.0,
            ),
            ("process_memory", "mem.virt", 10, 2000, 1_024_000.0),
            ("process_memory", "mem.rss", 10, 2000, 307_200.0),
            ("process_memory", "mem.rss", 10, 3000, 327_680.0),
            ("oom_score_adj", "oom_score_adj", 10, 2000, -100.0),
            ("smaps", "mem.smaps.pss.smem", 10, 2000, 10_240.0),
            (
                "proc_stat_runtime",
                "runtime.user_ns",
                10,
                2000,
                5_000_000.0,
            ),
            (
                "proc_stat_runtime",
                "runtime.kernel_ns",
                10,
                2000,
                700_000.0,
            ),
            ("process_memory", "mem.dmabuf_rss", 10, 2000, 65_536.0),
            ("oom_score_adj", "oom_score_adj", 20, 2000, 900.0),
        ];
        let rows: Vec<_> = rows
            .iter()
            .map(|(k, n, pid, ts, v)| (*k, n.as_str(), *pid, *ts, *v))
            .collect();
        assert_eq!(rows, expected);
        // Thread 11 joined process 10; chrome_peak_resident_set_kb is also counted unknown.
        let t = p.st.threads.iter().find(|t| t.tid == 11).unwrap();
        assert_eq!(p.st.processes[t.upid as usize].pid, 10);
        assert_eq!(p.st.stats.get(Stat::proc_stat_unknown_counters), 1);
        // The dimensions: upid and the key.
        let track =
            p.st.tracks
                .iter()
                .find(|t| t.kind == "process_memory")
                .unwrap();
        assert_ne!(track.dimension_arg_set, NONE);
        let upid10 = p.st.processes.iter().position(|r| r.pid == 10).unwrap();
        assert_eq!(track.upid as usize, upid10);
        assert_ne!(
            p.st.processes[upid10].arg_set, NONE,
            "is_peak_rss_resettable"
        );
    }

    #[test]
    fn disk_deltas_are_perfettos() {
        let prev = [1000, 10, 2000, 20, 0, 0, 1, 1];
        let cur = [5096, 30, 2000, 20, 2048, 4, 3, 5];
        let d = disk_deltas(&prev, &cur);
        assert_eq!(d[0], ("read_amount", "MB", 2.0));
        assert_eq!(d[1], ("read_throughput", "MB/s", 100.0));
        // No time spent writing: throughput 0, not a division by zero.
        assert_eq!(d[3], ("write_throughput", "MB/s", 0.0));
        assert_eq!(d[5], ("discard_throughput", "MB/s", 250.0));
        assert_eq!(d[6], ("flush_amount", "count", 2.0));
        assert_eq!(d[7], ("flush_time", "ms", 4.0));
        // A counter that went down (a device reset) gives a negative delta, as in Perfetto.
        assert_eq!(disk_deltas(&cur, &prev)[0].2, -2.0);
        // Extreme values from a hostile trace wrap instead of overflowing.
        let huge = disk_deltas(&[u64::MAX; 8], &[i64::MAX as u64; 8]);
        let huge2 = disk_deltas(&[i64::MAX as u64; 8], &[u64::MAX; 8]);
        assert!(huge2.iter().all(|(_, _, v)| v.is_finite()));
        assert!(huge.iter().all(|(_, _, v)| v.is_finite()));
        for (name, unit, _) in d {
            assert_eq!(disk_unit(name), unit);
        }
    }

    #[test]
    fn kworker_names_lose_their_queue() {
        assert_eq!(
            truncate_kworker("kworker/45:2-mm_percpu_wq"),
            "kworker/45:2"
        );
        assert_eq!(
            truncate_kworker("kworker/u16:0+events_unbound"),
            "kworker/u16:0"
        );
        assert_eq!(truncate_kworker("kworker/0:1H"), "kworker/0:1H");
        assert_eq!(truncate_kworker("kswapd0"), "kswapd0");
        assert_eq!(truncate_kworker("kworker/"), "kworker/");
    }
}

//! `linux.sys_stats`: system-wide counters from `/proc/meminfo`, `/proc/vmstat` and
//! `/proc/stat`, as `SysStats` packets, after Perfetto's `SysStatsDataSource`.
//!
//! # Config (`SysStatsConfig`)
//!
//! - `meminfo_period_ms` + `meminfo_counters`: `/proc/meminfo` values in kB, as the kernel
//!   prints them, keyed by `MeminfoCounters`.
//! - `vmstat_period_ms` + `vmstat_counters`: `/proc/vmstat` values, keyed by `VmstatCounters`.
//! - `stat_period_ms` + `stat_counters`: from `/proc/stat`, `STAT_CPU_TIMES` gives one
//!   `cpu_stat` (`CpuTimes`) per CPU, in nanoseconds (clock ticks × 10⁹ / `sysconf(_SC_CLK_TCK)`);
//!   `STAT_IRQ_COUNTS` gives `num_irq_total`, `STAT_SOFTIRQ_COUNTS` `num_softirq_total`,
//!   `STAT_FORK_COUNT` `num_forks`. The per-interrupt lists (`num_irq`, `num_softirq`) are not
//!   recorded.
//!
//! A period of 0 turns its group off; a period under 10 ms is raised to 10 ms (as Perfetto
//! does). An empty counter list means every counter this build knows. The other groups of the
//! config (devfreq, cpufreq, buddyinfo, diskstats, psi, thermal, cpuidle, gpufreq) are not
//! supported and ignored.
//!
//! # Timing
//!
//! [`poll_period`](Probe::poll_period) is the greatest common divisor of the enabled periods
//! (Perfetto requires them to be multiples of each other and uses the smallest; the gcd gives
//! the same answer for those configs and still works for the others); each poll emits the
//! groups whose period has come round. [`start`](Probe::start) emits a first sample of every
//! enabled group, so the counters have a value from the beginning of the trace. Each packet's
//! `timestamp` is when its reads began (BOOTTIME), `collection_end_timestamp` when they ended.

use std::path::PathBuf;
use std::time::Duration;

use tachyon::backend::TraceWriter;
use tachyon_protos::SysStatsConfigView;

use crate::counters::{self, MEMINFO_KEYS, VMSTAT_KEYS};
use crate::procfs;
use crate::Probe;

/// Shortest period of any group.
const MIN_PERIOD_MS: u32 = 10;
/// Largest file read (`/proc/stat` on a machine with many CPUs and interrupts is the biggest).
const MAX_FILE: usize = 1 << 20;

/// `SysStatsConfig.StatCounters` values.
const STAT_CPU_TIMES: u32 = 1;
const STAT_IRQ_COUNTS: u32 = 2;
const STAT_SOFTIRQ_COUNTS: u32 = 3;
const STAT_FORK_COUNT: u32 = 4;
const ALL_STAT: u8 = (1 << STAT_CPU_TIMES)
    | (1 << STAT_IRQ_COUNTS)
    | (1 << STAT_SOFTIRQ_COUNTS)
    | (1 << STAT_FORK_COUNT);

/// One group of counters: how often (in ticks; 0 = off) and which keys.
#[derive(Clone, Copy, Debug, Default)]
struct Group {
    period_ms: u32,
    every: u64,
}

/// The `linux.sys_stats` probe. See the module docs.
#[derive(Debug)]
pub(crate) struct SysStats {
    root: PathBuf,
    meminfo: Group,
    vmstat: Group,
    stat: Group,
    /// Bit `i`: `MeminfoCounters` value `i` is recorded.
    meminfo_keys: u64,
    /// Bit `i`: `VmstatCounters` value `i` is recorded.
    vmstat_keys: u128,
    /// Bit `i`: `StatCounters` value `i` is recorded.
    stat_fields: u8,
    tick: Option<Duration>,
    ns_per_clock_tick: u64,
    /// Polls so far (start is poll 0).
    ticks: u64,
    meminfo_buf: Vec<u8>,
    vmstat_buf: Vec<u8>,
    stat_buf: Vec<u8>,
}

fn clamp_period(ms: u32) -> u32 {
    if ms == 0 {
        0
    } else {
        ms.max(MIN_PERIOD_MS)
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A bit set of the enum values in `values` that index `table` (all of them if empty).
fn key_mask(values: Vec<i32>, table_len: usize) -> u128 {
    let all = if table_len >= 128 {
        u128::MAX
    } else {
        (1u128 << table_len) - 1
    } & !1;
    if values.is_empty() {
        return all;
    }
    values
        .into_iter()
        .filter(|&v| v > 0 && (v as usize) < table_len)
        .fold(0, |m, v| m | (1 << v))
}

impl SysStats {
    pub(crate) fn new(cfg: Option<&SysStatsConfigView<'_>>) -> Self {
        let (mut mi, mut vm, mut st) = (Group::default(), Group::default(), Group::default());
        let (mut mi_keys, mut vm_keys, mut st_fields) = (Vec::new(), Vec::new(), Vec::new());
        if let Some(c) = cfg {
            mi.period_ms = clamp_period(c.meminfo_period_ms());
            vm.period_ms = clamp_period(c.vmstat_period_ms());
            st.period_ms = clamp_period(c.stat_period_ms());
            mi_keys = c.meminfo_counters_raw().filter_map(Result::ok).collect();
            vm_keys = c.vmstat_counters_raw().filter_map(Result::ok).collect();
            st_fields = c.stat_counters_raw().filter_map(Result::ok).collect();
        }
        let stat_fields = if st_fields.is_empty() {
            ALL_STAT
        } else {
            st_fields
                .into_iter()
                .filter(|&v| (1..=4).contains(&v))
                .fold(0u8, |m, v| m | (1 << v))
        };
        let tick_ms = [mi.period_ms, vm.period_ms, st.period_ms]
            .into_iter()
            .filter(|&p| p != 0)
            .reduce(gcd);
        for g in [&mut mi, &mut vm, &mut st] {
            if let Some(t) = tick_ms {
                g.every = (g.period_ms / t) as u64;
            }
        }
        let hz = rustix::param::clock_ticks_per_second();
        SysStats {
            root: PathBuf::from("/proc"),
            meminfo: mi,
            vmstat: vm,
            stat: st,
            meminfo_keys: key_mask(mi_keys, MEMINFO_KEYS.len()) as u64,
            vmstat_keys: key_mask(vm_keys, VMSTAT_KEYS.len()),
            stat_fields,
            tick: tick_ms.map(|t| Duration::from_millis(t as u64)),
            ns_per_clock_tick: 1_000_000_000 / if hz == 0 { 100 } else { hz },
            ticks: 0,
            meminfo_buf: Vec::new(),
            vmstat_buf: Vec::new(),
            stat_buf: Vec::new(),
        }
    }

    #[cfg(test)]
    pub(crate) fn set_root(&mut self, root: impl Into<PathBuf>) {
        self.root = root.into();
    }

    /// Reads the groups due at this tick and writes one packet (none if nothing is due).
    fn sample(&mut self, w: &mut TraceWriter) {
        let tick = self.ticks;
        self.ticks += 1;
        let due = |g: &Group| g.every != 0 && tick % g.every == 0;
        let (mi, vm, st) = (due(&self.meminfo), due(&self.vmstat), due(&self.stat));
        if !(mi || vm || st) {
            return;
        }
        let start = tachyon::clock::boottime_ns();
        let mi =
            mi && procfs::read_file(&self.root.join("meminfo"), &mut self.meminfo_buf, MAX_FILE);
        let vm = vm && procfs::read_file(&self.root.join("vmstat"), &mut self.vmstat_buf, MAX_FILE);
        let st = st && procfs::read_file(&self.root.join("stat"), &mut self.stat_buf, MAX_FILE);
        let end = tachyon::clock::boottime_ns();
        if !(mi || vm || st) {
            return;
        }
        w.write_packet(|p| {
            p.set_timestamp(start);
            let mut s = p.set_sys_stats();
            if mi {
                let keys = self.meminfo_keys;
                procfs::parse_key_values(&self.meminfo_buf, |k, v| {
                    if let Some(id) = counters::lookup(&MEMINFO_KEYS, k) {
                        if keys & (1 << id) != 0 {
                            let mut m = s.add_meminfo();
                            m.set_key_raw(id as i32);
                            m.set_value(v);
                        }
                    }
                });
            }
            if vm {
                let keys = self.vmstat_keys;
                procfs::parse_key_values(&self.vmstat_buf, |k, v| {
                    if let Some(id) = counters::lookup(&VMSTAT_KEYS, k) {
                        if keys & (1 << id) != 0 {
                            let mut m = s.add_vmstat();
                            m.set_key_raw(id as i32);
                            m.set_value(v);
                        }
                    }
                });
            }
            if st {
                let stat = procfs::parse_stat(&self.stat_buf);
                let f = self.stat_fields;
                let ns = self.ns_per_clock_tick;
                if f & (1 << STAT_CPU_TIMES) != 0 {
                    for c in &stat.cpus {
                        let t = c.ticks.map(|v| v.saturating_mul(ns));
                        let mut ct = s.add_cpu_stat();
                        ct.set_cpu_id(c.cpu);
                        ct.set_user_ns(t[0]);
                        ct.set_user_nice_ns(t[1]);
                        ct.set_system_mode_ns(t[2]);
                        ct.set_idle_ns(t[3]);
                        ct.set_io_wait_ns(t[4]);
                        ct.set_irq_ns(t[5]);
                        ct.set_softirq_ns(t[6]);
                        ct.set_steal_ns(t[7]);
                    }
                }
                if f & (1 << STAT_FORK_COUNT) != 0 {
                    if let Some(v) = stat.processes {
                        s.set_num_forks(v);
                    }
                }
                if f & (1 << STAT_IRQ_COUNTS) != 0 {
                    if let Some(v) = stat.intr_total {
                        s.set_num_irq_total(v);
                    }
                }
                if f & (1 << STAT_SOFTIRQ_COUNTS) != 0 {
                    if let Some(v) = stat.softirq_total {
                        s.set_num_softirq_total(v);
                    }
                }
            }
            s.set_collection_end_timestamp(end);
        });
    }
}

impl Probe for SysStats {
    fn start(&mut self, w: &mut TraceWriter) {
        self.sample(w);
    }

    fn poll_period(&self) -> Option<Duration> {
        self.tick
    }

    fn poll(&mut self, w: &mut TraceWriter) {
        self.sample(w);
    }

    fn flush(&mut self, w: &mut TraceWriter) {
        w.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tachyon_protos::sys_stats_config::StatCounters;
    use tachyon_protos::{MeminfoCounters, SysStatsConfig, VmstatCounters};

    fn config(f: impl FnOnce(&mut SysStatsConfig<'_>)) -> Vec<u8> {
        let mut buf = protozero::HeapBuffered::new();
        {
            let mut c: SysStatsConfig<'_> = buf.root();
            f(&mut c);
        }
        buf.serialize().unwrap()
    }

    fn probe(bytes: &[u8]) -> SysStats {
        SysStats::new(Some(&SysStatsConfigView::decode(bytes).unwrap()))
    }

    #[test]
    fn periods_filters_and_ticks() {
        let p = SysStats::new(None);
        assert_eq!(p.tick, None);
        assert_eq!(p.stat_fields, ALL_STAT);

        let p = probe(&config(|c| {
            c.set_meminfo_period_ms(500);
            c.set_stat_period_ms(200);
            c.set_vmstat_period_ms(0);
            c.add_meminfo_counters(MeminfoCounters::MeminfoMemFree);
            c.add_meminfo_counters_raw(1000); // Unknown to this build: ignored.
            c.add_stat_counters(StatCounters::StatForkCount);
        }));
        assert_eq!(p.tick, Some(Duration::from_millis(100)));
        assert_eq!((p.meminfo.every, p.stat.every, p.vmstat.every), (5, 2, 0));
        assert_eq!(p.meminfo_keys, 1 << MeminfoCounters::MeminfoMemFree as u32);
        assert_eq!(p.stat_fields, 1 << STAT_FORK_COUNT);
        // Every known vmstat key by default, never the unspecified 0.
        assert_eq!(p.vmstat_keys.count_ones() as usize, VMSTAT_KEYS.len() - 1);
        assert_eq!(p.vmstat_keys & 1, 0);

        // Tiny periods are raised to 10 ms.
        let p = probe(&config(|c| c.set_meminfo_period_ms(1)));
        assert_eq!(p.tick, Some(Duration::from_millis(10)));
        assert_eq!(p.meminfo_keys.count_ones() as usize, MEMINFO_KEYS.len() - 1);
    }

    #[test]
    fn samples_fake_proc_files_into_packets() {
        let dir = std::env::temp_dir().join(format!("tachyon-probes-sys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("meminfo"),
            "MemTotal:  1000 kB\nMemFree: 200 kB\nNoSuchKey: 5 kB\nCached:\nBuffers: x kB\n",
        )
        .unwrap();
        std::fs::write(dir.join("vmstat"), "nr_free_pages 50\npgfault 7\nweird\n").unwrap();
        std::fs::write(
            dir.join("stat"),
            "cpu 9 9 9 9\ncpu0 1 2 3 4 5 6 7 8 9 10\ncpu1 10 0 0 20\nintr 99 1 2\nsoftirq 77 1\nprocesses 55\n",
        )
        .unwrap();
        let mut p = probe(&config(|c| {
            c.set_meminfo_period_ms(100);
            c.set_vmstat_period_ms(100);
            c.add_vmstat_counters(VmstatCounters::VmstatPgfault);
            c.set_stat_period_ms(100);
        }));
        p.set_root(&dir);
        p.ns_per_clock_tick = 10_000_000; // USER_HZ = 100
        let session =
            tachyon::backend::InProcessSession::start(tachyon::backend::SessionConfig::default())
                .unwrap();
        let mut w = session.arbiter().create_trace_writer(0).unwrap();
        p.start(&mut w);
        p.flush(&mut w);
        drop(w);
        let trace = session.stop().unwrap().trace;
        std::fs::remove_dir_all(&dir).unwrap();

        let trace = tachyon_protos::TraceView::decode(&trace).unwrap();
        let packets: Vec<_> = trace
            .packet()
            .map(Result::unwrap)
            .filter(|p| p.has_sys_stats())
            .collect();
        assert_eq!(packets.len(), 1);
        let s = packets[0].sys_stats().unwrap();
        let meminfo: Vec<(i32, u64)> = s
            .meminfo()
            .map(|m| m.map(|m| (m.key_raw(), m.value())).unwrap())
            .collect();
        assert_eq!(
            meminfo,
            [
                (MeminfoCounters::MeminfoMemTotal as i32, 1000),
                (MeminfoCounters::MeminfoMemFree as i32, 200)
            ]
        );
        let vmstat: Vec<(i32, u64)> = s
            .vmstat()
            .map(|m| m.map(|m| (m.key_raw(), m.value())).unwrap())
            .collect();
        assert_eq!(vmstat, [(VmstatCounters::VmstatPgfault as i32, 7)]);
        let cpus: Vec<_> = s.cpu_stat().map(Result::unwrap).collect();
        assert_eq!(cpus.len(), 2);
        let c0 = &cpus[0];
        assert_eq!(c0.cpu_id(), 0);
        assert_eq!(
            [
                c0.user_ns(),
                c0.user_nice_ns(),
                c0.system_mode_ns(),
                c0.idle_ns(),
                c0.io_wait_ns(),
                c0.irq_ns(),
                c0.softirq_ns(),
                c0.steal_ns()
            ],
            [1, 2, 3, 4, 5, 6, 7, 8].map(|t| t * 10_000_000)
        );
        assert_eq!((cpus[1].cpu_id(), cpus[1].idle_ns()), (1, 200_000_000));
        assert_eq!(s.num_forks(), 55);
        assert_eq!(s.num_irq_total(), 99);
        assert_eq!(s.num_softirq_total(), 77);
        assert_eq!(s.num_irq().count(), 0, "per-IRQ lists are not recorded");
    }

    #[test]
    fn missing_files_write_nothing() {
        let mut p = probe(&config(|c| c.set_meminfo_period_ms(100)));
        p.set_root("/nonexistent/proc");
        let session =
            tachyon::backend::InProcessSession::start(tachyon::backend::SessionConfig::default())
                .unwrap();
        let mut w = session.arbiter().create_trace_writer(0).unwrap();
        p.start(&mut w);
        p.poll(&mut w);
        drop(w);
        let trace = session.stop().unwrap().trace;
        let trace = tachyon_protos::TraceView::decode(&trace).unwrap();
        assert!(!trace.packet().any(|p| p.unwrap().has_sys_stats()));
    }

    #[test]
    fn gcd_of_periods() {
        assert_eq!(gcd(300, 200), 100);
        assert_eq!(gcd(7, 5), 1);
        assert_eq!(gcd(10, 0), 10);
        assert_eq!(key_mask(vec![], 4), 0b1110);
        assert_eq!(key_mask(vec![0, 2, 9, -1], 4), 0b0100);
    }
}

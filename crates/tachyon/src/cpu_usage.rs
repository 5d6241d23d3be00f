//! Tracy's CPU usage plot (with [`Config::cpu_usage`](crate::Config), off by default: the
//! sampler is a writer of its own in every session): every 100 ms while such a session runs, a
//! `tachyon-cpu` thread reads `/proc/stat` and `/proc/self/stat` and records two plots in
//! percent of the whole machine (all CPUs): `CPU usage (process)` and `CPU usage (system)`
//! (everything but idle and I/O wait). Category `tachyon.cpu` turns them off. The same thread
//! writes the program's information ([`app_info!`](crate::app_info)) into each session that
//! starts after it was given.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;
use std::time::Duration;

use crate::track_event::{global, message, state, Callsite, CallsiteKind, Plot, PlotKind};

/// How often the plots are sampled.
pub(crate) const PERIOD: Duration = Duration::from_millis(100);

static CPU: Callsite = Callsite::new(
    "",
    Some("tachyon.cpu"),
    file!(),
    line!(),
    module_path!(),
    &[],
    CallsiteKind::Event,
);

/// Jiffies: (the process's user + system, the machine's busy, the machine's total).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sample {
    pub(crate) process: u64,
    pub(crate) busy: u64,
    pub(crate) total: u64,
}

/// Parses the first (`cpu `) line of `/proc/stat` and `/proc/self/stat`; `None` if either
/// does not read as expected.
pub(crate) fn parse(proc_stat: &str, self_stat: &str) -> Option<Sample> {
    let line = proc_stat.lines().next()?;
    let mut it = line.split_ascii_whitespace();
    if it.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = it.map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let total: u64 = v.iter().take(8).sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    // The command name (field 2) may hold spaces and parentheses: fields restart after the
    // last ')'. utime and stime are fields 14 and 15, i.e. the 12th and 13th after it.
    let rest = &self_stat[self_stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(Sample {
        process: utime + stime,
        busy: total.saturating_sub(idle),
        total,
    })
}

/// Percentages between two samples: (process, system); `None` when no time passed.
pub(crate) fn usage(a: Sample, b: Sample) -> Option<(f64, f64)> {
    let dt = b.total.checked_sub(a.total)?;
    if dt == 0 {
        return None;
    }
    let p = b.process.saturating_sub(a.process) as f64 * 100.0 / dt as f64;
    let s = b.busy.saturating_sub(a.busy) as f64 * 100.0 / dt as f64;
    Some((p.min(100.0), s.min(100.0)))
}

fn read() -> Option<Sample> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let own = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse(&stat, &own)
}

/// Whether the running session wants the CPU plots.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// A session started: the program's information goes into it now (system mode's sessions,
/// started later by the daemon, get it from the sampler thread), and the sampler thread runs,
/// sampling if `cpu_usage`.
pub(crate) fn session_started(cpu_usage: bool) {
    ENABLED.store(cpu_usage, Ordering::Relaxed);
    message::write_app_info();
    start();
}

/// Starts the sampler thread once (it sleeps while no session runs).
fn start() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("tachyon-cpu".into())
            .spawn(run);
        // Without the thread: no CPU plots, and program info only from app_info! calls made
        // while a session runs.
        drop(spawned);
    });
}

fn run() {
    let process = Plot::new("CPU usage (process)", PlotKind::Percentage);
    let system = Plot::new("CPU usage (system)", PlotKind::Percentage);
    let mut last: Option<Sample> = None;
    loop {
        if global::EPOCH.load(Ordering::Relaxed) == 0 {
            // Let go of the writer of a session that ended (its stop would wait for it).
            state::release_thread_writer();
            last = None;
            std::thread::sleep(PERIOD);
            continue;
        }
        message::write_app_info();
        if !ENABLED.load(Ordering::Relaxed) || CPU.check().is_none() {
            last = None;
        } else {
            // The first reading of a session is the base of the next one's shares.
            let now = read();
            if let (Some(a), Some(b)) = (last, now) {
                if let Some((p, s)) = usage(a, b) {
                    process.set(p);
                    system.set(s);
                }
            }
            last = now;
        }
        std::thread::sleep(PERIOD);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files_and_computes_shares() {
        let stat = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n";
        let own = "1234 (a (weird) name) S 1 2 3 4 5 6 7 8 9 10 30 20 0 0";
        let a = parse(stat, own).unwrap();
        assert_eq!(
            a,
            Sample {
                process: 50,
                busy: 150,
                total: 1000
            }
        );
        let b = Sample {
            process: 100,
            busy: 350,
            total: 1400,
        };
        let (p, s) = usage(a, b).unwrap();
        assert!(
            (p - 12.5).abs() < 1e-9 && (s - 50.0).abs() < 1e-9,
            "{p} {s}"
        );
        assert_eq!(usage(a, a), None);
        assert_eq!(parse("intr 1 2", own), None);
        assert_eq!(parse(stat, "garbage"), None);
        assert_eq!(parse("cpu 1 x 3 4", own), None);
    }
}

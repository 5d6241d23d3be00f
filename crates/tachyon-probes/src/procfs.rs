//! Reading and parsing `/proc` files.
//!
//! Every parser takes the raw bytes of one file and is total: a malformed line (a missing
//! value, a number that does not parse, a key it does not know) is skipped, never an error and
//! never a panic, because `/proc` formats vary between kernels and a process may be changing
//! while we read it. The file reader turns every I/O error into "not there": processes and
//! threads vanish between listing `/proc` and opening their files (`ENOENT`, `ESRCH`), and some
//! files are not readable by every user (`EACCES`).

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Reads at most `limit` bytes of `path` into `buf` (cleared first). `false` if the file could
/// not be opened or read; `buf` then holds whatever was read before the error.
pub(crate) fn read_file(path: &Path, buf: &mut Vec<u8>, limit: usize) -> bool {
    buf.clear();
    match File::open(path) {
        Ok(f) => f.take(limit as u64).read_to_end(buf).is_ok(),
        Err(_) => false,
    }
}

/// Iterates over the whitespace-separated tokens of a line.
fn tokens(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|b| b.is_ascii_whitespace())
        .filter(|t| !t.is_empty())
}

fn parse_u64(t: &[u8]) -> Option<u64> {
    std::str::from_utf8(t).ok()?.parse().ok()
}

fn parse_i32(t: &[u8]) -> Option<i32> {
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// The `Key: value` / `key value` lines of `/proc/meminfo` and `/proc/vmstat`: calls `f` with
/// the key (without a trailing `:`) and the first number after it (`/proc/meminfo` values are
/// in kB; the unit is ignored).
pub(crate) fn parse_key_values(text: &[u8], mut f: impl FnMut(&[u8], u64)) {
    for line in text.split(|&b| b == b'\n') {
        let mut t = tokens(line);
        let (Some(key), Some(value)) = (t.next(), t.next()) else {
            continue;
        };
        let key = key.strip_suffix(b":").unwrap_or(key);
        if let Some(v) = parse_u64(value) {
            f(key, v);
        }
    }
}

/// One `cpuN` line of `/proc/stat`, in clock ticks (USER_HZ): user, nice, system, idle,
/// iowait, irq, softirq, steal. Fields an old kernel does not print are 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CpuTicks {
    pub(crate) cpu: u32,
    pub(crate) ticks: [u64; 8],
}

/// What `linux.sys_stats` takes from `/proc/stat`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// Per-CPU times (the aggregate `cpu` line is left out).
    pub(crate) cpus: Vec<CpuTicks>,
    /// `intr`: interrupts serviced since boot (the first number, the total).
    pub(crate) intr_total: Option<u64>,
    /// `softirq`: softirqs serviced since boot (the total).
    pub(crate) softirq_total: Option<u64>,
    /// `processes`: forks since boot.
    pub(crate) processes: Option<u64>,
}

/// Parses `/proc/stat`.
pub(crate) fn parse_stat(text: &[u8]) -> ProcStat {
    let mut out = ProcStat::default();
    for line in text.split(|&b| b == b'\n') {
        let mut t = tokens(line);
        let Some(key) = t.next() else { continue };
        match key {
            b"intr" => out.intr_total = t.next().and_then(parse_u64),
            b"softirq" => out.softirq_total = t.next().and_then(parse_u64),
            b"processes" => out.processes = t.next().and_then(parse_u64),
            _ => {
                let Some(n) = key.strip_prefix(b"cpu") else {
                    continue;
                };
                // `cpu` alone is the sum over all CPUs; `cpuN` must have a number.
                let Some(cpu) = std::str::from_utf8(n).ok().and_then(|s| s.parse().ok()) else {
                    continue;
                };
                let mut ticks = [0u64; 8];
                for slot in &mut ticks {
                    match t.next() {
                        Some(v) => *slot = parse_u64(v).unwrap_or(0),
                        None => break,
                    }
                }
                out.cpus.push(CpuTicks { cpu, ticks });
            }
        }
    }
    out
}

/// What `linux.process_stats` takes from `/proc/PID/status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Status {
    /// `Name:`, the command name (comm), as the kernel escapes it.
    pub(crate) name: Option<String>,
    /// `Tgid:`, the process id the task belongs to.
    pub(crate) tgid: Option<i32>,
    /// `PPid:`.
    pub(crate) ppid: Option<i32>,
    /// `Uid:`: the real uid (the first of four).
    pub(crate) uid: Option<i32>,
}

/// Parses `/proc/PID/status`.
pub(crate) fn parse_status(text: &[u8]) -> Status {
    let mut out = Status::default();
    for line in text.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (key, rest) = (&line[..colon], &line[colon + 1..]);
        match key {
            b"Name" => {
                let v = rest.strip_prefix(b"\t").unwrap_or(rest);
                out.name = Some(String::from_utf8_lossy(v).into_owned());
            }
            b"Tgid" => out.tgid = tokens(rest).next().and_then(parse_i32),
            b"PPid" => out.ppid = tokens(rest).next().and_then(parse_i32),
            b"Uid" => out.uid = tokens(rest).next().and_then(parse_i32),
            _ => {}
        }
    }
    out
}

/// Splits `/proc/PID/cmdline` (arguments each ended by a NUL) into arguments. Empty for kernel
/// threads and zombies. A process that rewrote its arguments (`setproctitle`) may leave one
/// argument with spaces, or trailing NULs: both are kept as they are, minus the trailing NULs.
/// Invalid UTF-8 is replaced (trace strings must be UTF-8).
pub(crate) fn split_cmdline(bytes: &[u8]) -> Vec<String> {
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    if end == 0 {
        return Vec::new();
    }
    bytes[..end]
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// `/proc/PID/task/TID/comm` without its newline.
pub(crate) fn parse_comm(bytes: &[u8]) -> String {
    let b = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    String::from_utf8_lossy(b).into_owned()
}

/// A `/proc` directory entry name that is a pid or tid.
pub(crate) fn parse_id(name: &std::ffi::OsStr) -> Option<i32> {
    let s = name.to_str()?;
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|&id: &i32| id > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &[u8] = b"cpu  10132153 290696 3084719 46828483 16683 0 25195 0 0 0
cpu0 1393280 32966 572056 13343292 6130 0 17875 0 0 0
cpu1 1335000 28000 500000 13000000 4000 7 100 3 0 0
cpu2 5 6
cpuX 1 2 3
cpu3 1 2 x 4
intr 199292 26 0 0 0 0
ctxt 2225524352
btime 1700000000
processes 78129
procs_running 2
procs_blocked 0
softirq 12345 1 2 3
garbage
";

    #[test]
    fn stat_keeps_per_cpu_lines_and_totals() {
        let s = parse_stat(STAT);
        assert_eq!(s.cpus.len(), 4, "{:?}", s.cpus);
        assert_eq!(
            s.cpus[0],
            CpuTicks {
                cpu: 0,
                ticks: [1393280, 32966, 572056, 13343292, 6130, 0, 17875, 0]
            }
        );
        assert_eq!(
            s.cpus[1].ticks,
            [1335000, 28000, 500000, 13000000, 4000, 7, 100, 3]
        );
        // Short lines: missing fields are zero.
        assert_eq!(s.cpus[2].ticks, [5, 6, 0, 0, 0, 0, 0, 0]);
        // A field that is not a number is zero; the line is kept.
        assert_eq!(
            s.cpus[3],
            CpuTicks {
                cpu: 3,
                ticks: [1, 2, 0, 4, 0, 0, 0, 0]
            }
        );
        assert_eq!(s.intr_total, Some(199292));
        assert_eq!(s.softirq_total, Some(12345));
        assert_eq!(s.processes, Some(78129));
        assert_eq!(parse_stat(b""), ProcStat::default());
        assert_eq!(parse_stat(b"processes\nintr x\n").processes, None);
    }

    #[test]
    fn key_values_of_meminfo_and_vmstat() {
        let text = b"MemTotal:       16314720 kB\nMemFree:  123 kB\nBogus:\nHugePages_Total:       0\nBroken: x kB\n\nnr_free_pages 4242\n";
        let mut seen = Vec::new();
        parse_key_values(text, |k, v| {
            seen.push((String::from_utf8_lossy(k).into_owned(), v))
        });
        assert_eq!(
            seen,
            [
                ("MemTotal".into(), 16314720),
                ("MemFree".into(), 123),
                ("HugePages_Total".into(), 0),
                ("nr_free_pages".into(), 4242)
            ]
        );
    }

    #[test]
    fn status_fields() {
        let text = b"Name:\tmy prog\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t1234\nNgid:\t0\nPid:\t1235\nPPid:\t1\nTracerPid:\t0\nUid:\t1000\t1001\t1002\t1003\nGid:\t100\t100\t100\t100\n";
        let s = parse_status(text);
        assert_eq!(
            s,
            Status {
                name: Some("my prog".into()),
                tgid: Some(1234),
                ppid: Some(1),
                uid: Some(1000),
            }
        );
        let s = parse_status(b"Name:\nPPid:\tnope\nUid:\n\xff\xfe:\x00\n");
        assert_eq!(s.name.as_deref(), Some(""));
        assert_eq!((s.ppid, s.uid, s.tgid), (None, None, None));
    }

    #[test]
    fn cmdline_split() {
        assert_eq!(
            split_cmdline(b"/bin/sh\0-c\0echo hi\0"),
            ["/bin/sh", "-c", "echo hi"]
        );
        assert_eq!(split_cmdline(b"a\0\0b\0"), ["a", "", "b"]);
        assert_eq!(
            split_cmdline(b"rewritten title with spaces\0\0\0\0"),
            ["rewritten title with spaces"]
        );
        assert_eq!(split_cmdline(b"no-terminator"), ["no-terminator"]);
        assert!(split_cmdline(b"").is_empty());
        assert!(split_cmdline(b"\0\0").is_empty());
        assert_eq!(split_cmdline(b"\xff\0"), ["\u{fffd}"]);
    }

    #[test]
    fn comm_and_ids() {
        assert_eq!(parse_comm(b"kworker/0:1\n"), "kworker/0:1");
        assert_eq!(parse_comm(b"x"), "x");
        assert_eq!(parse_id("123".as_ref()), Some(123));
        for bad in ["self", "0", "-1", "+5", "99999999999", "1a", ""] {
            assert_eq!(parse_id(bad.as_ref()), None, "{bad}");
        }
    }
}

//! Whether a trace can be imported in the memory this machine has: checked before the import
//! starts, so that a trace too large ends in a clear error instead of the out-of-memory killer.

/// Peak import memory per byte of (decompressed) trace, measured: 0.9 with the import bench
/// (`cargo bench -p tachyon-processor --bench import`, 1 M events, SDK-written: 55 bytes of
/// peak per slice) and 1.02 for `tachyon stats` on a 2.16 GB SDK-written trace (2.20 GB peak
/// RSS, the whole process, its zone statistics included; 2026-11-27). Rounded up, with room
/// for traces whose sequences go back in time often (more runs) and for traces with more
/// distinct strings and args; [`Guarded`] stops a file's import that outgrows the limit while
/// the file is read.
pub(crate) const PEAK_BYTES_PER_TRACE_BYTE: u64 = 2;

/// The memory an import of `trace_bytes` needs at its peak (beyond the trace itself).
pub(crate) fn estimate(trace_bytes: u64) -> u64 {
    trace_bytes.saturating_mul(PEAK_BYTES_PER_TRACE_BYTE)
}

/// The memory this process may still use: `MemAvailable` from `/proc/meminfo`, lowered to the
/// cgroup's `memory.max` headroom when one is set. `None` where neither can be read (then no
/// check is made).
pub(crate) fn available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let mem = meminfo
        .as_deref()
        .and_then(|m| meminfo_field(m, "MemAvailable:"));
    let cgroup = cgroup_headroom();
    match (mem, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A `/proc/meminfo` field, in bytes.
fn meminfo_field(meminfo: &str, name: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with(name))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb.saturating_mul(1024))
}

/// `memory.max - memory.current` of this process's cgroup (v2), if it has a limit.
fn cgroup_headroom() -> Option<u64> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cg.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let max: u64 = read("memory.max")?.trim().parse().ok()?; // "max" (no limit) fails here.
    let current: u64 = read("memory.current")?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// This process's resident memory, in bytes (`VmRSS`; `None` where it cannot be read).
pub(crate) fn resident() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    meminfo_field(&status, "VmRSS:")
}

/// The least growth [`Guarded`] stops at: it measures the whole process, whose other threads
/// may allocate too, so a small limit (tests, tiny traces) is left to the check before the
/// import.
const GUARD_FLOOR: u64 = 64 << 20;

/// A trace file's reader that watches the import's memory as it reads: once the process has
/// grown by more than `limit` since the reader was made, the next read fails, and
/// [`Guarded::tripped`] says how much it had grown. The check before the import estimates the
/// peak; this one stops an import whose trace needs more than the estimate before the
/// out-of-memory killer would, with the same error.
pub(crate) struct Guarded<R> {
    inner: R,
    limit: Option<u64>,
    /// The least growth it stops at ([`GUARD_FLOOR`]).
    floor: u64,
    base: u64,
    tripped: Option<u64>,
}

impl<R> Guarded<R> {
    pub(crate) fn new(inner: R, limit: Option<u64>) -> Self {
        Guarded {
            inner,
            limit,
            floor: GUARD_FLOOR,
            base: resident().unwrap_or(0),
            tripped: None,
        }
    }

    /// The memory growth that stopped the import, if it was stopped.
    pub(crate) fn tripped(&self) -> Option<u64> {
        self.tripped
    }
}

impl<R: std::io::Read> std::io::Read for Guarded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let (Some(limit), Some(now)) = (self.limit, resident()) {
            let grown = now.saturating_sub(self.base);
            if grown > limit.max(self.floor) {
                self.tripped = Some(grown);
                return Err(std::io::Error::other(
                    "the import's memory limit was reached",
                ));
            }
        }
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_are_read_in_bytes() {
        let m = "MemTotal:       16000000 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(meminfo_field(m, "MemAvailable:"), Some(8_192_000_000));
        assert_eq!(meminfo_field(m, "SwapFree:"), None);
        assert_eq!(estimate(1 << 30), 2 << 30);
        assert_eq!(estimate(u64::MAX), u64::MAX);
    }

    #[test]
    fn a_guarded_reader_stops_once_memory_grew_past_the_limit() {
        use std::io::Read;
        let data = [7u8; 64];
        let mut r = Guarded::new(&data[..], Some(1 << 40));
        let mut buf = [0u8; 16];
        assert_eq!(r.read(&mut buf).unwrap(), 16);
        assert_eq!(r.tripped(), None);
        if resident().is_some() {
            // A limit already exceeded: growth since `base`, forced by lowering it and the
            // floor (a test process is far smaller than the floor).
            let mut r = Guarded::new(&data[..], Some(0));
            r.base = 0;
            r.limit = Some(1);
            r.floor = 0;
            assert!(r.read(&mut buf).is_err());
            assert!(r.tripped().is_some_and(|g| g > 0));
        }
    }
}

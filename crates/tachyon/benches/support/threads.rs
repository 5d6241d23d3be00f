//! The benches' readings of their own threads' CPU time, from `/proc` (Linux).

use std::path::PathBuf;

/// CPU time (ns) of this process's thread named `name`: from `schedstat` (nanoseconds), or
/// where the kernel has none, `stat`'s utime + stime (clock ticks, assumed 100 Hz).
pub(crate) fn thread_cpu_ns(name: &str) -> Option<u64> {
    let dir = thread_dir(name)?;
    if let Some(ns) = std::fs::read_to_string(dir.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
    {
        return Some(ns);
    }
    // `stat`: fields after the parenthesised command; utime and stime are the 14th and 15th
    // fields of the line, the 12th and 13th after the `)`.
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let utime: u64 = rest.next()?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some((utime + stime) * 10_000_000)
}

/// The `/proc/self/task/<tid>` directory of this process's thread named `name`. A task that
/// exits while the directory is listed is skipped, not taken as "no such thread".
pub(crate) fn thread_dir(name: &str) -> Option<PathBuf> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .flatten()
        .map(|task| task.path())
        .find(|dir| std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.trim() == name))
}

/// CPU time (ns) of the calling thread, from `/proc/thread-self/schedstat`.
pub(crate) fn this_thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

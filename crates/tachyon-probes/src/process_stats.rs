//! `linux.process_stats`: process and thread names and parent pids, from `/proc`, as
//! `ProcessTree` packets.
//!
//! # What is emitted, and when
//!
//! The goal (issue 6) is that every pid and tid in a trace has a name, including the processes
//! that start after the session (the traced programs themselves). So, unlike Perfetto, which
//! dumps `/proc` at start only when `scan_all_processes_on_start` is set and otherwise scans on
//! demand when ftrace reports new pids, this probe:
//!
//! - scans all of `/proc` at [`start`](Probe::start) and emits every process and thread;
//! - rescans at every [`poll`](Probe::poll) and [`flush`](Probe::flush) and emits only what is
//!   new or changed since it was last emitted: a new pid or tid, a process whose command line
//!   changed (`exec`), a thread whose name changed (`prctl(PR_SET_NAME)`) or that moved to
//!   another process (tid reuse). Entries of processes and threads that are gone are forgotten,
//!   so a reused id is emitted again.
//! - emits everything again at every incremental-state clear (the session's
//!   `clear_period_ms`), so that a ring buffer that overwrote the first full scan still names
//!   every process.
//!
//! The poll period is `proc_stats_poll_ms` when set (at least 100 ms, Perfetto's minimum for
//! that option), else [`DEFAULT_POLL`]. Perfetto uses that option for its per-process memory
//! counters, which this probe does not record; here it paces the rescans.
//! `scan_all_processes_on_start` and `record_thread_names` are not needed (both behaviours are
//! always on); the other options (`quirks`, `resolve_process_fds`, `scan_smaps_rollup`,
//! `record_process_age`, `record_process_runtime`) are not supported and ignored.
//!
//! # Encoding (Perfetto's, as `traced_probes` writes it)
//!
//! `ProcessTree.processes`: `pid`, `ppid`, `uid` (the real uid, from `/proc/PID/status`) and
//! `cmdline` (`/proc/PID/cmdline` split at NULs; for a kernel thread or a zombie, which have
//! none, the single entry is the main thread's `comm`). `ProcessTree.threads`: `tid`, `tgid`
//! and `name` (`/proc/PID/task/TID/comm`), for every thread including the main one (as
//! Perfetto v58+ does). The packet `timestamp` is when the scan began (BOOTTIME, the default
//! trace clock, so no clock id), `collection_end_timestamp` when it ended. A scan's entries are
//! split into packets of at most about [`PACKET_BUDGET`] bytes, each process followed by its
//! threads, so that a process and its threads share a packet whenever they fit in one (the
//! trace processor, like Perfetto's, recognises kernel worker threads within one packet).
//!
//! # Bounds
//!
//! At most [`MAX_THREADS`] threads per scan (processes beyond are left for the next scan and
//! nothing is forgotten in a capped scan); command lines are read up to [`MAX_CMDLINE`] bytes.
//! Processes and threads that vanish while being read are skipped.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tachyon::backend::TraceWriter;
use tachyon_protos::ProcessStatsConfigView;

use crate::procfs;
use crate::Probe;

/// Rescan period when `proc_stats_poll_ms` is not set.
pub(crate) const DEFAULT_POLL: Duration = Duration::from_millis(1000);
/// Shortest rescan period (`proc_stats_poll_ms` below it is raised to it).
const MIN_POLL: Duration = Duration::from_millis(100);
/// Most threads looked at in one scan.
pub(crate) const MAX_THREADS: usize = 100_000;
/// Longest command line read, in bytes (the rest is cut).
pub(crate) const MAX_CMDLINE: usize = 8 * 1024;
/// Target size of one `ProcessTree` packet, in bytes (estimated before encoding; a packet may
/// exceed it by one entry).
pub(crate) const PACKET_BUDGET: usize = 60 * 1024;
/// Longest `status` or `comm` file read.
const MAX_SMALL_FILE: usize = 4 * 1024;

/// A process as last emitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProcEntry {
    pub(crate) pid: i32,
    pub(crate) ppid: i32,
    pub(crate) uid: Option<i32>,
    pub(crate) cmdline: Vec<String>,
}

/// A thread as last emitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ThreadEntry {
    pub(crate) tid: i32,
    pub(crate) tgid: i32,
    pub(crate) name: String,
}

/// What one scan found new or changed.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    pub(crate) processes: Vec<ProcEntry>,
    pub(crate) threads: Vec<ThreadEntry>,
    /// Whether the scan stopped at [`MAX_THREADS`].
    pub(crate) capped: bool,
}

/// The `linux.process_stats` probe. See the module docs.
#[derive(Debug)]
pub(crate) struct ProcessStats {
    root: PathBuf,
    poll: Duration,
    max_threads: usize,
    /// pid → what was last emitted for it.
    procs: HashMap<i32, ProcEntry>,
    /// tid → (tgid, name) last emitted.
    threads: HashMap<i32, (i32, String)>,
    buf: Vec<u8>,
}

impl ProcessStats {
    pub(crate) fn new(cfg: Option<&ProcessStatsConfigView<'_>>) -> Self {
        let ms = cfg.map_or(0, |c| c.proc_stats_poll_ms());
        let poll = if ms == 0 {
            DEFAULT_POLL
        } else {
            Duration::from_millis(ms as u64).max(MIN_POLL)
        };
        Self::with_root("/proc", poll)
    }

    /// A probe reading another directory laid out like `/proc` (tests).
    pub(crate) fn with_root(root: impl Into<PathBuf>, poll: Duration) -> Self {
        ProcessStats {
            root: root.into(),
            poll,
            max_threads: MAX_THREADS,
            procs: HashMap::new(),
            threads: HashMap::new(),
            buf: Vec::new(),
        }
    }

    #[cfg(test)]
    pub(crate) fn set_max_threads(&mut self, n: usize) {
        self.max_threads = n;
    }

    /// Scans the whole directory and returns what changed since the last scan (everything, the
    /// first time), remembering it as emitted.
    pub(crate) fn scan(&mut self) -> Changes {
        let mut out = Changes::default();
        let mut pids = list_ids(&self.root);
        pids.sort_unstable();
        let mut seen_procs = HashSet::with_capacity(pids.len());
        let mut seen_threads = HashSet::new();
        let mut budget = self.max_threads;
        for pid in pids {
            if budget == 0 {
                out.capped = true;
                break;
            }
            let dir = self.root.join(pid.to_string());
            let mut tids = list_ids(&dir.join("task"));
            if tids.is_empty() {
                continue; // Gone (or not a process directory).
            }
            tids.sort_unstable();
            if tids.len() > budget {
                tids.truncate(budget);
                out.capped = true;
            }
            budget -= tids.len();
            if !procfs::read_file(&dir.join("cmdline"), &mut self.buf, MAX_CMDLINE) {
                continue;
            }
            let mut cmdline = procfs::split_cmdline(&self.buf);
            let mut names = Vec::with_capacity(tids.len());
            for tid in tids {
                let path = dir.join("task").join(tid.to_string()).join("comm");
                if procfs::read_file(&path, &mut self.buf, MAX_SMALL_FILE) {
                    names.push((tid, procfs::parse_comm(&self.buf)));
                }
            }
            let main_comm = names.iter().find(|(t, _)| *t == pid).map(|(_, n)| n);
            // No command line: a kernel thread, or a process exiting (a zombie has none). A
            // process already emitted keeps what was emitted: its comm is not a new name.
            let no_cmdline = cmdline.is_empty();
            if cmdline.is_empty() {
                if let Some(comm) = main_comm {
                    cmdline.push(comm.clone());
                }
            }
            let known = self.procs.get(&pid);
            let changed = match known {
                None => true,
                Some(_) if no_cmdline => false,
                Some(e) => e.cmdline != cmdline || cmdline.is_empty(),
            };
            if changed {
                if !procfs::read_file(&dir.join("status"), &mut self.buf, MAX_SMALL_FILE) {
                    continue;
                }
                let status = procfs::parse_status(&self.buf);
                if cmdline.is_empty() {
                    // No main thread comm either (it exited): the status name is all there is.
                    cmdline.extend(status.name);
                }
                let entry = ProcEntry {
                    pid,
                    ppid: status.ppid.unwrap_or(0),
                    uid: status.uid,
                    cmdline,
                };
                if known != Some(&entry) {
                    out.processes.push(entry.clone());
                    self.procs.insert(pid, entry);
                }
            }
            seen_procs.insert(pid);
            for (tid, name) in names {
                seen_threads.insert(tid);
                let same = self
                    .threads
                    .get(&tid)
                    .is_some_and(|(tgid, n)| *tgid == pid && *n == name);
                if !same {
                    self.threads.insert(tid, (pid, name.clone()));
                    out.threads.push(ThreadEntry {
                        tid,
                        tgid: pid,
                        name,
                    });
                }
            }
        }
        if !out.capped {
            self.procs.retain(|pid, _| seen_procs.contains(pid));
            self.threads.retain(|tid, _| seen_threads.contains(tid));
        }
        out
    }

    /// Forgets what was emitted: the next scan has every process and thread again.
    pub(crate) fn forget(&mut self) {
        self.procs.clear();
        self.threads.clear();
    }

    /// Scans and writes what changed.
    fn scan_and_emit(&mut self, w: &mut TraceWriter) {
        let start = tachyon::clock::boottime_ns();
        let changes = self.scan();
        let end = tachyon::clock::boottime_ns();
        emit(w, &changes, start, end);
    }
}

impl Probe for ProcessStats {
    fn start(&mut self, w: &mut TraceWriter) {
        self.scan_and_emit(w);
    }

    fn poll_period(&self) -> Option<Duration> {
        Some(self.poll)
    }

    fn poll(&mut self, w: &mut TraceWriter) {
        self.scan_and_emit(w);
    }

    fn flush(&mut self, w: &mut TraceWriter) {
        self.scan_and_emit(w);
        w.flush();
    }

    fn clear_incremental_state(&mut self, w: &mut TraceWriter) {
        self.forget();
        self.scan_and_emit(w);
    }
}

/// The positive numeric entries of a directory (pids or tids); empty if it cannot be read.
fn list_ids(dir: &Path) -> Vec<i32> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .filter_map(|e| procfs::parse_id(&e.file_name()))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Estimated encoded size of one entry (tags, varints, string lengths: generous).
fn process_size(p: &ProcEntry) -> usize {
    24 + p.cmdline.iter().map(|a| a.len() + 3).sum::<usize>()
}

fn thread_size(t: &ThreadEntry) -> usize {
    20 + t.name.len()
}

/// Splits `sizes` into consecutive ranges of at most `budget` total (each at least one item).
pub(crate) fn batches(sizes: impl Iterator<Item = usize>, budget: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let (mut start, mut len, mut acc) = (0, 0, 0);
    for s in sizes {
        if len > 0 && acc + s > budget {
            out.push((start, start + len));
            start += len;
            len = 0;
            acc = 0;
        }
        len += 1;
        acc += s;
    }
    if len > 0 {
        out.push((start, start + len));
    }
    out
}

/// One entry of a `ProcessTree` packet.
#[derive(Clone, Copy, Debug)]
enum Item<'a> {
    Process(&'a ProcEntry),
    Thread(&'a ThreadEntry),
}

impl Item<'_> {
    fn size(&self) -> usize {
        match self {
            Item::Process(p) => process_size(p),
            Item::Thread(t) => thread_size(t),
        }
    }

    /// The process the entry belongs to.
    fn pid(&self) -> i32 {
        match self {
            Item::Process(p) => p.pid,
            Item::Thread(t) => t.tgid,
        }
    }
}

/// Splits `items` into packets of at most `budget` bytes without splitting a process's group
/// (the process and its threads) unless the group alone exceeds the budget.
fn packet_ranges(items: &[Item<'_>], budget: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut cur: Option<(usize, usize)> = None;
    let mut acc = 0;
    let mut a = 0;
    while a < items.len() {
        let pid = items[a].pid();
        let b = a + items[a..].iter().take_while(|i| i.pid() == pid).count();
        let size: usize = items[a..b].iter().map(Item::size).sum();
        if size > budget {
            out.extend(cur.take());
            let sizes = items[a..b].iter().map(Item::size);
            out.extend(
                batches(sizes, budget)
                    .into_iter()
                    .map(|(x, y)| (a + x, a + y)),
            );
        } else {
            match cur {
                Some((s, _)) if acc + size <= budget => {
                    cur = Some((s, b));
                    acc += size;
                }
                _ => {
                    out.extend(cur.replace((a, b)));
                    acc = size;
                }
            }
        }
        a = b;
    }
    out.extend(cur);
    out
}

/// The entries in packet order: by pid, each process before its threads. (Both lists come
/// out of [`ProcessStats::scan`] sorted by pid and tgid.)
fn items(changes: &Changes) -> Vec<Item<'_>> {
    let (procs, threads) = (&changes.processes, &changes.threads);
    let mut out = Vec::with_capacity(procs.len() + threads.len());
    let (mut i, mut j) = (0, 0);
    while i < procs.len() || j < threads.len() {
        if i < procs.len() && (j == threads.len() || procs[i].pid <= threads[j].tgid) {
            out.push(Item::Process(&procs[i]));
            i += 1;
        } else {
            out.push(Item::Thread(&threads[j]));
            j += 1;
        }
    }
    out
}

/// Writes `changes` as `ProcessTree` packets (none if nothing changed).
fn emit(w: &mut TraceWriter, changes: &Changes, start: u64, end: u64) {
    let items = items(changes);
    for (a, b) in packet_ranges(&items, PACKET_BUDGET) {
        w.write_packet(|p| {
            p.set_timestamp(start);
            let mut tree = p.set_process_tree();
            for item in &items[a..b] {
                match item {
                    Item::Process(e) => {
                        let mut proc = tree.add_processes();
                        proc.set_pid(e.pid);
                        proc.set_ppid(e.ppid);
                        for arg in &e.cmdline {
                            proc.add_cmdline(arg);
                        }
                        if let Some(uid) = e.uid {
                            proc.set_uid(uid);
                        }
                    }
                    Item::Thread(t) => {
                        let mut thread = tree.add_threads();
                        thread.set_tid(t.tid);
                        thread.set_tgid(t.tgid);
                        thread.set_name(&t.name);
                    }
                }
            }
            tree.set_collection_end_timestamp(end);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A fake `/proc` in a temporary directory.
    struct FakeProc(PathBuf);

    impl FakeProc {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "tachyon-probes-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            FakeProc(dir)
        }

        fn process(&self, pid: i32, ppid: i32, cmdline: &[u8], threads: &[(i32, &str)]) {
            let dir = self.0.join(pid.to_string());
            fs::create_dir_all(dir.join("task")).unwrap();
            fs::write(dir.join("cmdline"), cmdline).unwrap();
            let main = threads.iter().find(|t| t.0 == pid).map_or("?", |t| t.1);
            fs::write(
                dir.join("status"),
                format!(
                    "Name:\t{main}\nTgid:\t{pid}\nPPid:\t{ppid}\nUid:\t{}\t0\t0\t0\n",
                    1000 + pid
                ),
            )
            .unwrap();
            for (tid, name) in threads {
                let t = dir.join("task").join(tid.to_string());
                fs::create_dir_all(&t).unwrap();
                fs::write(t.join("comm"), format!("{name}\n")).unwrap();
            }
        }

        fn rename_thread(&self, pid: i32, tid: i32, name: &str) {
            let p = self.0.join(format!("{pid}/task/{tid}/comm"));
            fs::write(p, format!("{name}\n")).unwrap();
        }

        fn remove(&self, pid: i32) {
            fs::remove_dir_all(self.0.join(pid.to_string())).unwrap();
        }
    }

    impl Drop for FakeProc {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn pids(c: &Changes) -> Vec<i32> {
        c.processes.iter().map(|p| p.pid).collect()
    }

    fn tids(c: &Changes) -> Vec<(i32, i32, &str)> {
        c.threads
            .iter()
            .map(|t| (t.tid, t.tgid, t.name.as_str()))
            .collect()
    }

    #[test]
    fn first_scan_has_everything_then_only_changes() {
        let fake = FakeProc::new("diff");
        fake.process(1, 0, b"/sbin/init\0splash\0", &[(1, "systemd")]);
        fake.process(2, 0, b"", &[(2, "kthreadd")]);
        fake.process(
            40,
            1,
            b"/usr/bin/app\0--x\0",
            &[(40, "app"), (41, "worker")],
        );
        // Not processes: ignored.
        fs::create_dir_all(fake.0.join("self")).unwrap();
        fs::write(fake.0.join("meminfo"), "x").unwrap();
        let mut probe = ProcessStats::with_root(&fake.0, DEFAULT_POLL);

        let c = probe.scan();
        assert!(!c.capped);
        assert_eq!(pids(&c), [1, 2, 40]);
        let app = &c.processes[2];
        assert_eq!(app.ppid, 1);
        assert_eq!(app.uid, Some(1040));
        assert_eq!(app.cmdline, ["/usr/bin/app", "--x"]);
        // A kernel thread has no cmdline: its comm stands in.
        assert_eq!(c.processes[1].cmdline, ["kthreadd"]);
        assert_eq!(
            tids(&c),
            [
                (1, 1, "systemd"),
                (2, 2, "kthreadd"),
                (40, 40, "app"),
                (41, 40, "worker")
            ]
        );

        // Nothing changed: nothing to emit.
        let c = probe.scan();
        assert!(c.processes.is_empty() && c.threads.is_empty());
        // Until an incremental-state clear: then everything again.
        probe.forget();
        let c = probe.scan();
        assert_eq!(pids(&c), [1, 2, 40]);
        assert_eq!(tids(&c).len(), 4);

        // A new process, a renamed thread, a new thread, an exec.
        fake.process(50, 40, b"/bin/child\0", &[(50, "child")]);
        fake.rename_thread(40, 41, "renamed");
        fake.process(
            40,
            1,
            b"/usr/bin/app2\0",
            &[(40, "app2"), (41, "renamed"), (42, "new")],
        );
        let c = probe.scan();
        assert_eq!(pids(&c), [40, 50]);
        assert_eq!(c.processes[0].cmdline, ["/usr/bin/app2"]);
        assert_eq!(
            tids(&c),
            [
                (40, 40, "app2"),
                (41, 40, "renamed"),
                (42, 40, "new"),
                (50, 50, "child")
            ]
        );

        // A process exits and its pid comes back: emitted again.
        fake.remove(50);
        assert!(probe.scan().processes.is_empty());
        fake.process(50, 1, b"/bin/child\0", &[(50, "child")]);
        let c = probe.scan();
        assert_eq!(pids(&c), [50]);
        assert_eq!(tids(&c), [(50, 50, "child")]);

        // It exits: as a zombie it has no command line, and its comm is not a new name.
        fake.process(50, 1, b"", &[(50, "child")]);
        assert!(probe.scan().processes.is_empty());
    }

    #[test]
    fn vanished_and_odd_entries_are_skipped() {
        let fake = FakeProc::new("odd");
        fake.process(7, 1, b"/bin/ok\0", &[(7, "ok")]);
        // A process directory with no task/ (it exited between readdir and open).
        fs::create_dir_all(fake.0.join("8")).unwrap();
        // A process whose cmdline is gone but tasks remain.
        fake.process(9, 1, b"", &[(9, "z")]);
        fs::remove_file(fake.0.join("9/cmdline")).unwrap();
        // A thread without comm.
        fake.process(10, 1, b"/bin/t\0", &[(10, "t")]);
        fs::create_dir_all(fake.0.join("10/task/11")).unwrap();
        // Binary junk in names and status.
        fake.process(12, 1, b"\xff\xfe\0", &[(12, "j")]);
        fs::write(fake.0.join("12/status"), b"\xff\0garbage\nPPid:\tx\n").unwrap();
        let mut probe = ProcessStats::with_root(&fake.0, DEFAULT_POLL);
        let c = probe.scan();
        assert_eq!(pids(&c), [7, 10, 12]);
        assert_eq!(c.processes[2].ppid, 0);
        assert_eq!(c.processes[2].uid, None);
        assert_eq!(c.processes[2].cmdline, ["\u{fffd}\u{fffd}"]);
        assert_eq!(tids(&c), [(7, 7, "ok"), (10, 10, "t"), (12, 12, "j")]);
    }

    #[test]
    fn thread_cap_stops_the_scan_and_forgets_nothing() {
        let fake = FakeProc::new("cap");
        fake.process(1, 0, b"a\0", &[(1, "a"), (2, "b")]);
        fake.process(3, 0, b"c\0", &[(3, "c")]);
        let mut probe = ProcessStats::with_root(&fake.0, DEFAULT_POLL);
        probe.set_max_threads(2);
        let c = probe.scan();
        assert!(c.capped);
        assert_eq!(pids(&c), [1]);
        probe.set_max_threads(10);
        let c = probe.scan();
        assert!(!c.capped);
        assert_eq!(pids(&c), [3]);
    }

    #[test]
    fn large_scans_are_split_into_packets_under_64_kib() {
        let fake = FakeProc::new("big");
        let long_arg = "x".repeat(3000);
        for pid in 1..=100 {
            let cmdline = format!("/bin/p{pid}\0{long_arg}\0");
            fake.process(
                pid,
                1,
                cmdline.as_bytes(),
                &[(pid, "main"), (pid + 1000, "worker")],
            );
        }
        let mut probe = ProcessStats::with_root(&fake.0, DEFAULT_POLL);
        let session =
            tachyon::backend::InProcessSession::start(tachyon::backend::SessionConfig::default())
                .unwrap();
        let mut w = session.arbiter().create_trace_writer(0).unwrap();
        probe.start(&mut w);
        probe.flush(&mut w); // Nothing new: no packet.
        drop(w);
        let trace = session.stop().unwrap().trace;

        let trace = tachyon_protos::TraceView::decode(&trace).unwrap();
        let (mut packets, mut procs, mut threads) = (0, 0, 0);
        for p in trace.packet().map(Result::unwrap) {
            if !p.has_process_tree() {
                continue;
            }
            packets += 1;
            assert!(p.bytes().len() < 64 * 1024, "{}", p.bytes().len());
            let t = p.process_tree().unwrap();
            let pids: Vec<i32> = t.processes().map(|p| p.unwrap().pid()).collect();
            procs += pids.len();
            for th in t.threads().map(Result::unwrap) {
                threads += 1;
                assert!(
                    pids.contains(&th.tgid()),
                    "a process shares its threads' packet"
                );
            }
        }
        assert_eq!((procs, threads), (100, 200));
        assert!(
            packets >= 6,
            "300 KiB of command lines need several packets: {packets}"
        );
    }

    #[test]
    fn processes_come_with_their_threads() {
        let p = |pid| ProcEntry {
            pid,
            ppid: 1,
            uid: None,
            cmdline: vec![],
        };
        let t = |tid, tgid| ThreadEntry {
            tid,
            tgid,
            name: String::new(),
        };
        let changes = Changes {
            processes: vec![p(1), p(5)],
            threads: vec![t(1, 1), t(3, 2), t(5, 5), t(6, 5), t(9, 9)],
            capped: false,
        };
        let order: Vec<String> = items(&changes)
            .iter()
            .map(|i| match i {
                Item::Process(p) => format!("p{}", p.pid),
                Item::Thread(t) => format!("t{}", t.tid),
            })
            .collect();
        assert_eq!(order, ["p1", "t1", "t3", "p5", "t5", "t6", "t9"]);
    }

    #[test]
    fn packets_keep_groups_together() {
        let p = |pid, n| ProcEntry {
            pid,
            ppid: 1,
            uid: None,
            cmdline: vec!["x".repeat(n)],
        };
        let t = |tid, tgid| ThreadEntry {
            tid,
            tgid,
            name: "t".into(),
        };
        // Sizes: process = 27 + n, thread = 21.
        let (p1, p2, p3) = (p(1, 23), p(2, 23), p(3, 200));
        let (t1, t2, t3a, t3b) = (t(1, 1), t(2, 2), t(3, 3), t(4, 3));
        let items = [
            Item::Process(&p1),
            Item::Thread(&t1),
            Item::Process(&p2),
            Item::Thread(&t2),
            Item::Process(&p3),
            Item::Thread(&t3a),
            Item::Thread(&t3b),
        ];
        // Groups of 71, 71 and 269 bytes with a budget of 150: [1], [2] together, [3] split.
        assert_eq!(packet_ranges(&items, 150), [(0, 4), (4, 5), (5, 7)]);
        assert_eq!(packet_ranges(&items, 100), [(0, 2), (2, 4), (4, 5), (5, 7)]);
        assert_eq!(packet_ranges(&items, 10_000), [(0, 7)]);
        assert!(packet_ranges(&[], 100).is_empty());
    }

    #[test]
    fn batches_respect_the_budget() {
        assert_eq!(batches([10, 10, 10].into_iter(), 25), [(0, 2), (2, 3)]);
        assert_eq!(batches([30, 5].into_iter(), 25), [(0, 1), (1, 2)]);
        assert!(batches(std::iter::empty(), 25).is_empty());
        assert_eq!(batches([1; 5].into_iter(), 100), [(0, 5)]);
    }

    #[test]
    fn poll_period_from_config() {
        assert_eq!(ProcessStats::new(None).poll, DEFAULT_POLL);
        let mut buf = protozero::HeapBuffered::new();
        {
            let mut c: tachyon_protos::ProcessStatsConfig<'_> = buf.root();
            c.set_proc_stats_poll_ms(20);
        }
        let bytes = buf.serialize().unwrap();
        let view = ProcessStatsConfigView::decode(&bytes).unwrap();
        assert_eq!(ProcessStats::new(Some(&view)).poll, MIN_POLL);
    }
}

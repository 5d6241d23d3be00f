//! The probes against this machine's real `/proc`, writing through a real trace writer into an
//! in-process session; the trace is decoded with the generated views and imported with the
//! trace processor.

use std::sync::mpsc;
use std::time::Duration;

use protozero::HeapBuffered;
use tachyon::backend::{InProcessSession, SessionConfig, TraceWriter};
use tachyon_probes::{create_probe, PROCESS_STATS, SYS_STATS};
use tachyon_processor::{Options, TraceProcessor, Value};
use tachyon_protos::{DataSourceConfig, MeminfoCounters, SysStatsConfig, TraceView};

/// Runs `f` with a writer of a fresh session and returns the trace.
fn record(f: impl FnOnce(&mut TraceWriter)) -> Vec<u8> {
    let session = InProcessSession::start(SessionConfig::default()).unwrap();
    let mut w = session.arbiter().create_trace_writer(0).unwrap();
    f(&mut w);
    drop(w);
    let report = session.stop().unwrap();
    assert_eq!(report.arbiter.packets_dropped, 0);
    report.trace
}

fn config(name: &str, f: impl FnOnce(&mut DataSourceConfig<'_>)) -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    {
        let mut c: DataSourceConfig<'_> = buf.root();
        c.set_name(name);
        f(&mut c);
    }
    buf.serialize().unwrap()
}

struct Proc {
    pid: i32,
    ppid: i32,
    cmdline: Vec<String>,
}

struct Thread {
    tid: i32,
    tgid: i32,
    name: String,
}

/// Entries tagged with the index of their ProcessTree packet.
type Tagged<T> = Vec<(usize, T)>;

/// Every ProcessTree entry of the trace.
fn process_trees(trace: &[u8]) -> (Tagged<Proc>, Tagged<Thread>) {
    let (mut procs, mut threads) = (Vec::new(), Vec::new());
    let mut n = 0;
    for p in TraceView::decode(trace).unwrap().packet() {
        let p = p.unwrap();
        if !p.has_process_tree() {
            continue;
        }
        assert!(p.bytes().len() < 64 * 1024, "packets stay under 64 KiB");
        assert!(p.timestamp() > 0);
        let t = p.process_tree().unwrap();
        assert!(t.collection_end_timestamp() >= p.timestamp());
        for e in t.processes() {
            let e = e.unwrap();
            let cmdline = e.cmdline().map(|a| a.unwrap().to_owned()).collect();
            procs.push((
                n,
                Proc {
                    pid: e.pid(),
                    ppid: e.ppid(),
                    cmdline,
                },
            ));
        }
        for e in t.threads() {
            let e = e.unwrap();
            threads.push((
                n,
                Thread {
                    tid: e.tid(),
                    tgid: e.tgid(),
                    name: e.name().unwrap().to_owned(),
                },
            ));
        }
        n += 1;
    }
    (procs, threads)
}

fn my_tid() -> i32 {
    // /proc/thread-self names the calling thread's directory.
    let link = std::fs::read_link("/proc/thread-self").unwrap();
    link.file_name().unwrap().to_str().unwrap().parse().unwrap()
}

#[test]
fn process_stats_names_everything_and_then_only_news() {
    let me = std::process::id() as i32;
    let mut probe = create_probe(PROCESS_STATS, &config(PROCESS_STATS, |_| {})).unwrap();
    assert_eq!(probe.poll_period(), Some(Duration::from_secs(1)));
    let mut child_pid = 0;
    let mut thread_tid = 0;
    let trace = record(|w| {
        probe.start(w);
        // Started after the data source: a child process and a named thread.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        child_pid = child.id() as i32;
        let (tx, rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("probe-thread".into())
            .spawn(move || {
                tx.send(my_tid()).unwrap();
                let _ = stop_rx.recv();
            })
            .unwrap();
        thread_tid = rx.recv().unwrap();
        // The child may still be between fork and exec: wait for its new command line.
        for _ in 0..500 {
            let cmd = std::fs::read(format!("/proc/{child_pid}/cmdline")).unwrap_or_default();
            if cmd.starts_with(b"sleep\0") {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        probe.poll(w);
        probe.flush(w);
        child.kill().unwrap();
        child.wait().unwrap();
        stop_tx.send(()).unwrap();
        t.join().unwrap();
    });

    let (procs, threads) = process_trees(&trace);
    // The first scan holds init and this process.
    let first: Vec<&Proc> = procs
        .iter()
        .filter(|(n, _)| *n == 0)
        .map(|(_, p)| p)
        .collect();
    assert!(
        first.iter().any(|p| p.pid == 1),
        "init is in the first scan"
    );
    let mine: Vec<&Proc> = procs
        .iter()
        .map(|(_, p)| p)
        .filter(|p| p.pid == me)
        .collect();
    assert_eq!(mine.len(), 1, "an unchanged process is emitted once");
    let exe = std::env::args().next().unwrap();
    assert_eq!(mine[0].cmdline[0], exe);
    assert_eq!(mine[0].ppid, std::os::unix::process::parent_id() as i32);
    // The later scans hold what is new: the child (a process of ours) and the thread.
    let child: Vec<&Proc> = procs
        .iter()
        .map(|(_, p)| p)
        .filter(|p| p.pid == child_pid)
        .collect();
    assert!(!child.is_empty(), "the child is named");
    let last = child.last().unwrap();
    assert_eq!(last.cmdline, ["sleep", "30"]);
    assert_eq!(last.ppid, me);
    let t: Vec<&Thread> = threads
        .iter()
        .map(|(_, t)| t)
        .filter(|t| t.tid == thread_tid)
        .collect();
    assert!(!t.is_empty(), "the new thread is named");
    assert_eq!(t.last().unwrap().tgid, me);
    assert_eq!(t.last().unwrap().name, "probe-thread");
    // Every process's main thread is listed too.
    assert!(threads.iter().any(|(_, t)| t.tid == me && t.tgid == me));
    // Kernel threads (children of kthreadd) carry their comm as the command line.
    for (_, p) in procs.iter().filter(|(_, p)| p.ppid == 2) {
        assert_eq!(p.cmdline.len(), 1, "{:?}", p.cmdline);
    }

    // The trace processor names them.
    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
    let r = tp
        .query(&format!(
            "SELECT p.name, p.cmdline, pp.pid FROM process p LEFT JOIN process pp \
             ON p.parent_upid = pp.upid WHERE p.pid = {child_pid}"
        ))
        .unwrap();
    assert_eq!(
        r.rows,
        [[
            Value::Text("sleep".into()),
            Value::Text("sleep 30".into()),
            Value::Integer(me as i64)
        ]]
    );
    let r = tp
        .query(&format!(
            "SELECT thread.name, process.pid FROM thread JOIN process USING (upid) \
             WHERE tid = {thread_tid}"
        ))
        .unwrap();
    assert_eq!(
        r.rows,
        [[
            Value::Text("probe-thread".into()),
            Value::Integer(me as i64)
        ]]
    );
}

#[test]
fn sys_stats_samples_at_the_configured_periods() {
    let cfg = config(SYS_STATS, |c| {
        let mut s: SysStatsConfig<'_> = c.set_sys_stats_config();
        s.set_meminfo_period_ms(10);
        s.add_meminfo_counters(MeminfoCounters::MeminfoMemTotal);
        s.add_meminfo_counters(MeminfoCounters::MeminfoMemAvailable);
        s.set_stat_period_ms(20);
    });
    let mut probe = create_probe(SYS_STATS, &cfg).unwrap();
    assert_eq!(probe.poll_period(), Some(Duration::from_millis(10)));
    let trace = record(|w| {
        probe.start(w); // tick 0: meminfo and stat
        probe.poll(w); // tick 1: meminfo
        probe.poll(w); // tick 2: meminfo and stat
        probe.flush(w);
    });

    let mut packets = Vec::new();
    for p in TraceView::decode(&trace).unwrap().packet() {
        let p = p.unwrap();
        if p.has_sys_stats() {
            let s = p.sys_stats().unwrap();
            assert!(s.collection_end_timestamp() >= p.timestamp());
            let meminfo: Vec<(i32, u64)> = s
                .meminfo()
                .map(|m| {
                    let m = m.unwrap();
                    (m.key_raw(), m.value())
                })
                .collect();
            let cpus: Vec<(u32, u64, u64)> = s
                .cpu_stat()
                .map(|c| {
                    let c = c.unwrap();
                    (c.cpu_id(), c.user_ns(), c.idle_ns())
                })
                .collect();
            packets.push((
                p.timestamp(),
                meminfo,
                cpus,
                s.num_forks(),
                s.has_num_irq_total(),
            ));
        }
    }
    assert_eq!(packets.len(), 3);
    assert!(packets.windows(2).all(|w| w[0].0 <= w[1].0));
    for (_, meminfo, ..) in &packets {
        let keys: Vec<i32> = meminfo.iter().map(|m| m.0).collect();
        assert_eq!(keys, [1, 3], "MemTotal and MemAvailable only");
        assert!(meminfo[0].1 > 0);
    }
    for i in [0, 2] {
        let (_, _, cpus, forks, irq) = &packets[i];
        assert!(!cpus.is_empty() && cpus.len() <= 4096, "{cpus:?}");
        assert!(cpus.iter().any(|c| c.1 + c.2 > 0), "CPU times in ns");
        assert!(*forks > 0);
        assert!(*irq);
    }
    assert!(
        packets[1].2.is_empty() && packets[1].3 == 0,
        "no stat at tick 1"
    );
    // CPU times only grow.
    for (a, b) in packets[0].2.iter().zip(&packets[2].2) {
        assert_eq!(a.0, b.0);
        assert!(b.1 >= a.1 && b.2 >= a.2);
    }

    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
    let r = tp
        .query(
            "SELECT t.name, t.type, t.unit, count(*) FROM counter c \
             JOIN counter_track t ON c.track_id = t.id WHERE t.type = 'meminfo' \
             GROUP BY t.id ORDER BY t.name",
        )
        .unwrap();
    let rows: Vec<_> = r
        .rows
        .iter()
        .map(|r| (r[0].clone(), r[3].clone()))
        .collect();
    assert_eq!(
        rows,
        [
            (Value::Text("MemAvailable".into()), Value::Integer(3)),
            (Value::Text("MemTotal".into()), Value::Integer(3))
        ]
    );
    let r = tp
        .query(
            "SELECT count(DISTINCT cpu), count(*) FROM cpu_counter_track \
             WHERE name = 'cpu.times.user_ns'",
        )
        .unwrap();
    assert_eq!(r.rows[0][0], r.rows[0][1]);
    assert!(matches!(r.rows[0][0], Value::Integer(n) if n >= 1));
}

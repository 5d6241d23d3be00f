//! `DaemonConfig::prefault_buffers` (`tachyon traced --prefault-buffers`): a session's central
//! buffers are mapped when the session is created, so the service thread takes their page
//! faults in `EnableTracing`, not in the commits of the first pass; the session works as any.
//!
//! One test in this file: it counts the minor faults of the thread named `tachyon-traced`, and
//! only one daemon may run in the process while it does.

mod support;

use support::*;
use tachyon_traced::Consumer;

/// Minor page faults of this process's threads named `tachyon-traced` (the daemon's service
/// thread), from `/proc/self/task/*/stat` (field 10); None where that cannot be read.
fn service_thread_faults() -> Option<u64> {
    let mut total = None;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != "tachyon-traced" {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        let after_name = &stat[stat.rfind(')')? + 1..];
        // Field 3 (state) is the first after the name; minflt is field 10.
        let faults: u64 = after_name.split_whitespace().nth(10 - 3)?.parse().ok()?;
        *total.get_or_insert(0) += faults;
    }
    total
}

/// The service thread's faults while `EnableTracing` creates a session with one 16 MiB buffer
/// (4 096 pages), and the packets a producer then commits, read back.
fn enable_and_commit(prefault: bool) -> (Option<u64>, Vec<u64>) {
    let (_dir, daemon) = daemon_with("prefault", |c| c.prefault_buffers = prefault);
    let mut producer = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    let before = service_thread_faults();
    consumer
        .enable_tracing(&Config::simple(16 * 1024, "test.source").encode(), None)
        .unwrap();
    // `enable_tracing` waits for a reply the daemon sends after creating the session.
    let faults = before.zip(service_thread_faults()).map(|(b, a)| a - b);
    let (_, buffer) = producer.wait_start();
    let chunk = producer.write_chunk(1, &[packet(1, 0), packet(2, 10)], true);
    producer.commit(&[chunk], buffer);
    consumer.disable_tracing().unwrap();
    let end = consumer
        .wait_for_end(Some(TIMEOUT))
        .unwrap()
        .expect("the session ends");
    assert_eq!(end.error, None);
    let mut trace = Vec::new();
    consumer.read_buffers(&mut trace).unwrap();
    (faults, timestamps(&trace))
}

#[test]
#[cfg_attr(miri, ignore = "sockets and shared memory")]
fn a_prefaulting_daemon_maps_the_buffers_when_the_session_starts() {
    let (lazy, lazy_read) = enable_and_commit(false);
    let (prefaulted, prefaulted_read) = enable_and_commit(true);
    assert_eq!(lazy_read, [1, 2]);
    assert_eq!(prefaulted_read, [1, 2]);
    let (Some(lazy), Some(prefaulted)) = (lazy, prefaulted) else {
        eprintln!("no /proc/self/task/*/stat here: the fault counts were not checked");
        return;
    };
    eprintln!("EnableTracing of a 16 MiB buffer: {lazy} faults lazily, {prefaulted} prefaulted");
    // Lazily, creating the session touches none of the buffer's 4 096 pages (the bookkeeping's
    // own allocations take a few); prefaulted, it maps all of them: 4 096 faults in 4 KiB
    // pages, or, where the kernel gives the prefaulted ring the huge pages it asks for, one per
    // 2 MiB page inside it (at least 7 of its 16 MiB: the ring need not start 2 MiB-aligned)
    // and one per 4 KiB page at its unaligned ends.
    assert!(lazy < 1024, "{lazy}");
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|m| !m.contains("[never]"));
    if thp {
        assert!(prefaulted >= lazy + 7, "{prefaulted}");
    } else {
        assert!(prefaulted >= 4096, "{prefaulted}");
    }
}

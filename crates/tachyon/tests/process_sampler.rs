//! `tachyon::sampling::ProcessSampler` on this very process: a thread that holds both an event
//! it inherited (its parent was sampled when it started it) and one of its own (a later
//! `add_process` gave it one) is sampled once, not twice: one chain is kept per thread and CPU.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use tachyon::sampling::{Interval, PerfEvent, ProcessSampler};

fn perf_allowed() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .is_some_and(|p| p <= 2)
}

/// This thread's id.
fn gettid() -> u32 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok())
        .unwrap()
}

/// Nanoseconds thread `tid` of this process has run (`/proc/.../schedstat`).
fn cpu_ns(tid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap();
    s.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
#[cfg_attr(miri, ignore = "perf_event_open")]
fn a_thread_with_inherited_and_own_events_is_sampled_once() {
    if !perf_allowed() {
        eprintln!("skipped: perf_event_paranoid forbids sampling");
        return;
    }
    // One sample per millisecond of the thread's CPU time, on each event that samples it.
    let period = Duration::from_millis(1);
    let mut sampler = ProcessSampler::new(
        PerfEvent::CPU_CLOCK,
        Interval::Period(period.as_nanos() as u64),
        false,
    );
    let (to_parent, parent_rx) = mpsc::channel::<()>();
    let (child_tid_tx, child_tid_rx) = mpsc::channel::<u32>();
    let (to_child, child_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<(u32, u64)>();
    let parent = std::thread::spawn(move || {
        parent_rx.recv().unwrap();
        // Started by a sampled thread: the child inherits the parent's events.
        let child = std::thread::spawn(move || {
            let tid = gettid();
            child_tid_tx.send(tid).unwrap();
            child_rx.recv().unwrap();
            // 200 ms of CPU time, however loaded the machine (a minute at most).
            let before = cpu_ns(tid);
            let give_up = Instant::now() + Duration::from_secs(60);
            let mut x = 0u64;
            while cpu_ns(tid) - before < 200_000_000 && Instant::now() < give_up {
                for _ in 0..100_000 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            }
            done_tx.send((tid, cpu_ns(tid) - before)).unwrap();
        });
        child.join().unwrap();
    });
    assert!(sampler.add_process(std::process::id() as i32).unwrap() > 0);
    to_parent.send(()).unwrap();
    let child_tid = child_tid_rx.recv().unwrap();
    // The child gets events of its own too: it now has two chains on each CPU.
    assert!(sampler.add_process(std::process::id() as i32).unwrap() >= 1);
    to_child.send(()).unwrap();
    let (tid, ran) = done_rx.recv().unwrap();
    assert_eq!(tid, child_tid);
    parent.join().unwrap();
    let mut samples = 0u64;
    sampler.drain(|r| {
        if r.lost == 0 && r.tid == tid {
            samples += 1;
        }
    });
    let expected = ran / period.as_nanos() as u64;
    assert!(expected >= 100, "the child ran only {ran} ns");
    // Twice the expected count is what sampling it on both chains gives.
    assert!(
        samples * 10 >= expected * 6 && samples * 10 <= expected * 14,
        "{samples} samples for {expected} ms of CPU time"
    );
}

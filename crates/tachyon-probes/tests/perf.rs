//! `linux.perf` against a real process: this test binary, run again as a child that spins in a
//! known function, is sampled through a real trace writer; the samples are decoded with the
//! generated views and imported with the trace processor (`perf_sample`, `stack_profile_*`).

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use protozero::HeapBuffered;
use tachyon::backend::{InProcessSession, SessionConfig};
use tachyon_probes::{create_probe, PERF};
use tachyon_processor::{Options, TraceProcessor, Value};
use tachyon_protos::{DataSourceConfig, TraceView};

const CHILD: &str = "TACHYON_PERF_TEST_CHILD";

/// The known function: a busy loop that stays in its own frame (an assembly loop, so that
/// no helper function is the leaf even in a debug build), checking the time now and then.
#[inline(never)]
fn spin(until: Instant) -> u64 {
    let mut rounds = 0u64;
    while Instant::now() < until {
        #[allow(unused_mut)]
        let mut n = 1_000_000u64;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a register countdown; touches no memory and no stack.
        unsafe {
            std::arch::asm!("2:", "dec {n}", "jnz 2b", n = inout(reg) n, options(nomem, nostack));
        }
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above.
        unsafe {
            std::arch::asm!("2:", "subs {n}, {n}, #1", "b.ne 2b", n = inout(reg) n, options(nomem, nostack));
        }
        rounds += 1 + std::hint::black_box(n);
    }
    rounds
}

/// Not a test of its own: the child the sampling test runs (ignored, so a plain `cargo test`
/// does not count it as a passing test; the parent runs it with `--ignored`).
#[test]
#[ignore = "the child process of the sampling test, run by it"]
fn perf_child() {
    if let Some(secs) = std::env::var_os(CHILD) {
        let secs: f64 = secs.to_str().unwrap().parse().unwrap();
        std::hint::black_box(spin(Instant::now() + Duration::from_secs_f64(secs)));
    }
}

fn spawn_child(secs: f64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "perf_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, secs.to_string())
        .spawn()
        .unwrap()
}

fn perf_config(pid: i32) -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    {
        let mut c: DataSourceConfig<'_> = buf.root();
        c.set_name(PERF);
        let mut p = c.set_perf_event_config();
        p.set_timebase().set_frequency(1000);
        p.set_callstack_sampling().set_scope().add_target_pid(pid);
        p.set_ring_buffer_read_period_ms(20);
    }
    buf.serialize().unwrap()
}

fn perf_allowed() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .is_some_and(|p| p <= 2)
}

#[test]
fn samples_of_a_busy_child_land_in_its_loop() {
    if !perf_allowed() {
        eprintln!("skipped: perf_event_paranoid forbids sampling");
        return;
    }
    let mut child = spawn_child(3.0);
    let pid = child.id() as i32;
    // Let the child reach its loop (its startup is not what is measured).
    std::thread::sleep(Duration::from_millis(200));

    let session = InProcessSession::start(SessionConfig::default()).unwrap();
    let mut w = session.arbiter().create_trace_writer(0).unwrap();
    let mut probe = create_probe(PERF, &perf_config(pid)).unwrap();
    assert_eq!(probe.poll_period(), Some(Duration::from_millis(20)));
    probe.start(&mut w);
    let deadline = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        probe.poll(&mut w);
    }
    probe.flush(&mut w);
    drop(probe);
    drop(w);
    let _ = child.kill();
    let _ = child.wait();
    let report = session.stop().unwrap();
    let trace = report.trace;

    // Decoded: every sample is the child's, with a stack.
    let mut samples = 0;
    for p in TraceView::decode(&trace).unwrap().packet() {
        let p = p.unwrap();
        if !p.has_perf_sample() {
            continue;
        }
        let s = p.perf_sample().unwrap();
        if s.kernel_records_lost() != 0 {
            continue;
        }
        samples += 1;
        assert_eq!(s.pid(), pid as u32);
        assert_ne!(s.callstack_iid(), 0);
        assert!(p.timestamp() > 0);
    }
    assert!(samples >= 10, "only {samples} samples");

    // Imported: the leaf frames of most samples are in `spin`, in this binary's mapping.
    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
    let module = tachyon::callstack::module_of(spin as fn(Instant) -> u64 as usize as u64)
        .expect("this binary is a module");
    let start = module.rel_pc(spin as fn(Instant) -> u64 as usize as u64) as i64;
    let rows = tp
        .query(
            "SELECT f.rel_pc, m.name FROM perf_sample s \
             JOIN stack_profile_callsite c ON c.id = s.callsite_id \
             JOIN stack_profile_frame f ON f.id = c.frame_id \
             JOIN stack_profile_mapping m ON m.id = f.mapping",
        )
        .unwrap()
        .rows;
    assert_eq!(rows.len(), samples, "every sample imported with its leaf");
    let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
    let in_spin = rows
        .iter()
        .filter(|r| match (&r[0], &r[1]) {
            (Value::Integer(pc), Value::Text(name)) => {
                *pc >= start && *pc < start + 4096 && std::path::Path::new(name) == exe
            }
            _ => false,
        })
        .count();
    assert!(
        in_spin * 10 >= rows.len() * 8,
        "{in_spin} of {} samples in spin (at {start:#x}): {:?}",
        rows.len(),
        &rows[..rows.len().min(8)]
    );
}

#[test]
fn a_process_that_is_not_there_samples_nothing_and_does_not_fail() {
    let session = InProcessSession::start(SessionConfig::default()).unwrap();
    let mut w = session.arbiter().create_trace_writer(0).unwrap();
    // pid_max is at most 2^22: this pid cannot exist.
    let mut probe = create_probe(PERF, &perf_config(1 << 23)).unwrap();
    probe.start(&mut w);
    probe.poll(&mut w);
    probe.flush(&mut w);
    drop(w);
    let trace = session.stop().unwrap().trace;
    for p in TraceView::decode(&trace).unwrap().packet() {
        assert!(!p.unwrap().has_perf_sample());
    }
}

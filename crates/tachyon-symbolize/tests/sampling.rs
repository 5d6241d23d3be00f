//! CPU sampling: a busy loop in a known function gets most of the samples, once symbolized.
//! Skips (with a message) where the kernel refuses perf_event_open.

use tachyon_processor::profiles::cpu_profile;
use tachyon_processor::TraceProcessor;

/// Burns `iterations` rounds of arithmetic the optimizer cannot remove.
#[inline(never)]
fn busy_known_loop(iterations: u64) -> u64 {
    let mut x = 1u64;
    for i in 0..iterations {
        x = std::hint::black_box(x.wrapping_mul(0x5851_f42d_4c95_7f2d).rotate_left(7) ^ i);
    }
    x
}

#[test]
fn a_busy_loop_gets_most_samples() {
    if std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .is_none_or(|p| p > 2)
    {
        eprintln!("skipped: perf_event_paranoid does not let a process sample itself");
        return;
    }
    tachyon::start(tachyon::Config {
        sampling_hz: 2000,
        ..tachyon::Config::in_memory()
    })
    .unwrap();
    // About 0.2-0.5 s of CPU time in the loop, however loaded the machine is (the sampler
    // counts CPU time, not wall time).
    std::hint::black_box(busy_known_loop(50_000_000));
    let report = tachyon::shutdown().unwrap().unwrap();
    let tp = TraceProcessor::from_bytes(&report.trace, &Default::default()).unwrap();
    let p = cpu_profile(&tp).unwrap();
    if p.samples == 0 {
        eprintln!("skipped: no samples (perf_event_open refused: see stderr)");
        return;
    }
    // Samples whose innermost frame (after inlining) is in the loop: its own code or the
    // functions it calls from it (in debug builds the iterator's methods are calls).
    let in_loop: u64 = p
        .stacks
        .iter()
        .filter(|(stack, _)| stack.iter().any(|f| f.ends_with("busy_known_loop")))
        .map(|(_, n)| n)
        .sum();
    let leaf_in_loop: u64 = p
        .stacks
        .iter()
        .filter(|(stack, _)| stack.last().is_some_and(|f| f.ends_with("busy_known_loop")))
        .map(|(_, n)| n)
        .sum();
    assert!(
        in_loop * 2 > p.samples,
        "{in_loop} of {} samples in busy_known_loop: {:#?}",
        p.samples,
        p.bottom_up().iter().take(5).collect::<Vec<_>>()
    );
    assert!(leaf_in_loop > 0, "the loop's own code was sampled");
}

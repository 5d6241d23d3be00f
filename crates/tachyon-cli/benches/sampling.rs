//! The cost of CPU sampling on the demo workload (`tachyon demo`'s producer and worker pool,
//! fully instrumented): jobs per second with sampling off, at 1 kHz and at 10 kHz per thread,
//! in interleaved rounds so that load from elsewhere hits the three alike. Prints the median
//! jobs/s of each and the slowdown in % against "off" (the median of the per-round ratios).
//! Every run records into an in-memory session with the same settings otherwise.
//!
//! Run: `cargo bench -p tachyon-cli --bench sampling` (`SAMPLING_BENCH_ROUNDS`,
//! `SAMPLING_BENCH_SECONDS` to change the 5 rounds of 1 s per setting).

#[allow(dead_code, unreachable_pub, unused_imports)]
#[path = "../src/demo.rs"]
mod demo;

use std::time::Duration;

fn env_or(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Jobs per second of one demo run with sampling at `hz` (0: off), and the samples taken.
fn run(hz: u32, seconds: f64) -> (f64, u64) {
    tachyon::start(tachyon::Config {
        output: None,
        buffer_size: 64 << 20,
        sampling_hz: hz,
        symbolize: false,
        ..tachyon::Config::default()
    })
    .expect("start a session");
    let summary = demo::run(demo::Settings {
        threads: 2,
        duration: Duration::from_secs_f64(seconds),
    })
    .expect("the demo runs");
    let report = tachyon::shutdown().expect("stop").expect("a session");
    let tp = tachyon_processor::TraceProcessor::from_bytes(&report.trace, &Default::default())
        .expect("the trace loads");
    let samples = match tp
        .query("SELECT count(*) FROM perf_sample")
        .map(|r| r.rows[0][0].clone())
    {
        Ok(tachyon_processor::Value::Integer(n)) => n as u64,
        _ => 0,
    };
    (summary.jobs as f64 / summary.elapsed.as_secs_f64(), samples)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it once, briefly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let rounds = if quick {
        1
    } else {
        env_or("SAMPLING_BENCH_ROUNDS", 5.0) as usize
    };
    let seconds = if quick {
        0.2
    } else {
        env_or("SAMPLING_BENCH_SECONDS", 1.0)
    };
    let settings = [0u32, 1000, 10_000];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); settings.len()];
    let mut samples = vec![0u64; settings.len()];
    for _ in 0..rounds {
        for (i, &hz) in settings.iter().enumerate() {
            let (r, s) = run(hz, seconds);
            rates[i].push(r);
            samples[i] += s;
        }
    }
    let ratios = |i: usize| -> f64 {
        let mut v: Vec<f64> = rates[0]
            .iter()
            .zip(&rates[i])
            .map(|(off, on)| on / off)
            .collect();
        median(&mut v)
    };
    for (i, &hz) in settings.iter().enumerate() {
        let mut r = rates[i].clone();
        let label = if hz == 0 {
            "off".to_owned()
        } else {
            format!("{} kHz", hz / 1000)
        };
        println!(
            "sampling/{label}: {:.0} jobs/s (median of {rounds}), {} samples{}",
            median(&mut r),
            samples[i],
            if hz == 0 {
                String::new()
            } else {
                format!(", slowdown {:+.1}%", (1.0 - ratios(i)) * 100.0)
            }
        );
    }
}

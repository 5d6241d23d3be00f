//! Writes a large trace with the SDK, streamed into its file while it is recorded: the input for
//! loading multi-gigabyte traces with `tachyon stats` and `tachyon query` (see
//! `docs/processor-scale.md`).
//!
//! Run: `cargo run --release -p tachyon --example large_trace -- 2048 large.pftrace 2` (the size
//! in MiB, default 64; the path, default `large_trace.pftrace`; the rate in millions of events
//! per second, default 2).
//!
//! Four threads record zones nested three deep, each begin with an int and a string argument
//! (the shape of the processor's import benchmark), until the file reaches the size. The rate
//! is paced below what the streaming service sustains without loss (see `docs/data-path.md`):
//! unpaced, the threads outrun it and the central buffer overwrites what the file has not
//! taken yet (the trace says so). Writers wait for room instead of dropping
//! (`on_full: Stall`), and sequences clear their incremental state each second, so that a
//! loss, if one happens anyway, costs a second of a sequence at most; the report and
//! `tachyon stats` say if anything was lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const THREADS: u64 = 4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mib: u64 = match args.next() {
        Some(s) => s.parse().map_err(|e| format!("size in MiB {s:?}: {e}"))?,
        None => 64,
    };
    let path = args.next().unwrap_or_else(|| "large_trace.pftrace".into());
    let rate: f64 = match args.next() {
        Some(s) => s
            .parse()
            .map_err(|e| format!("rate in M events/s {s:?}: {e}"))?,
        None => 2.0,
    };
    let target = mib << 20;
    // Each round of a thread is 1000 × 3 zones: 6000 events.
    let round = Duration::from_secs_f64(6000.0 * THREADS as f64 / (rate * 1e6));

    tachyon::start(tachyon::Config {
        output: Some(path.clone().into()),
        stream: true,
        stream_period: Duration::from_millis(100),
        clear_period: Some(Duration::from_secs(1)),
        buffer_size: 64 << 20,
        on_full: tachyon::BufferExhaustedPolicy::Stall {
            timeout: Duration::from_secs(10),
        },
        ..tachyon::Config::from_env()?
    })?;
    tachyon::set_process_name("large_trace");

    let done = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let done = Arc::clone(&done);
            std::thread::Builder::new()
                .name(format!("writer-{t}"))
                .spawn(move || {
                    let mut i = 0u64;
                    let mut next = Instant::now();
                    while !done.load(Ordering::Relaxed) {
                        next += round;
                        if let Some(ahead) = next.checked_duration_since(Instant::now()) {
                            std::thread::sleep(ahead);
                        }
                        for _ in 0..1000 {
                            let _a = tachyon::zone!("large", "frame", n = i, kind = "frame");
                            let _b = tachyon::zone!("large", "layout", n = i + 1, kind = "layout");
                            let _c = tachyon::zone!("large", "paint", n = t, kind = "paint");
                            i += 3;
                        }
                    }
                })
        })
        .collect::<Result<_, _>>()?;

    let start = Instant::now();
    let mut last_report = start;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let len = std::fs::metadata(&path).map_or(0, |m| m.len());
        if len >= target {
            break;
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            last_report = Instant::now();
            eprintln!(
                "{:.0} s: {} of {} MiB",
                start.elapsed().as_secs_f64(),
                len >> 20,
                mib
            );
        }
    }
    done.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().map_err(|_| "a writer thread panicked")?;
    }
    let report = tachyon::shutdown()?.ok_or("tracing was started above")?;
    println!("{report} in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

//! Live capture: this program listens for `tachyon capture` (on `TACHYON_LISTEN`, by default
//! 127.0.0.1:8110) and records zones on a few threads for a few seconds.
//!
//! ```text
//! TACHYON_WAIT_FOR_CAPTURE=30 cargo run --release --example live_capture -- [SECONDS] [THREADS]
//! tachyon capture -o live.pftrace          # in another terminal
//! ```
//!
//! With `TACHYON_ON_DEMAND=1` it records only while a capture is attached; attach and detach
//! as often as you like, each capture is a complete trace.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(3.0);
    let threads: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2);
    let mut config = tachyon::Config::from_env()?;
    if config.listen.is_none() {
        config.listen = Some(([127, 0, 0, 1], 8110).into());
    }
    tachyon::set_process_name("live_capture");
    tachyon::start(config)?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let zones = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|i| {
            let zones = zones.clone();
            std::thread::Builder::new()
                .name(format!("worker-{i}"))
                .spawn(move || {
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        for _ in 0..1000 {
                            let _z = tachyon::zone!("work");
                            n += 1;
                        }
                    }
                    zones.fetch_add(n, Ordering::Relaxed);
                })
        })
        .collect::<Result<_, _>>()?;
    for w in workers {
        w.join().map_err(|_| "a worker panicked")?;
    }
    let report = tachyon::shutdown()?.ok_or("no session")?;
    println!("zones {}", zones.load(Ordering::Relaxed));
    println!("{report}");
    Ok(())
}

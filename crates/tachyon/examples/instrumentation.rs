//! Tracy's instrumentation breadth in one program: workers sharing a `tachyon::sync::Mutex`
//! (contention shows as "wait for jobs" slices with flows from the holder), an `RwLock` read
//! by several threads, frames marked by the main loop, log messages at several levels, plots,
//! zone text and values, and the program's information.
//! Writes `instrumentation.pftrace`:
//! `cargo run -p tachyon-cli -- stats instrumentation.pftrace`.
//!
//! Run: `cargo run -p tachyon --example instrumentation`

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tachyon::sync::{Mutex, RwLock};
use tachyon::{Level, Plot, PlotKind};

fn main() -> std::io::Result<()> {
    tachyon::app_info!("instrumentation example, {} workers", 3);
    tachyon::start(tachyon::Config {
        output: Some("instrumentation.pftrace".into()),
        ..tachyon::Config::from_env()?
    })?;
    let jobs = Arc::new(Mutex::new_named("jobs", Vec::<u64>::new()));
    let settings = Arc::new(RwLock::new_named("settings", 10u64));
    let done = Plot::incremental("jobs done", PlotKind::Number);
    let queued = Plot::new("queue length", PlotKind::Number);

    let workers: Vec<_> = (0..3)
        .map(|w| {
            let (jobs, settings, done) = (Arc::clone(&jobs), Arc::clone(&settings), done.clone());
            thread::Builder::new()
                .name(format!("worker {w}"))
                .spawn(move || {
                    tachyon::set_thread_name_with_hint(&format!("worker {w}"), 1);
                    let mut handled = 0;
                    while handled < 20 {
                        let job = jobs.lock().unwrap().pop();
                        let Some(job) = job else {
                            thread::sleep(Duration::from_micros(200));
                            continue;
                        };
                        let scale = *settings.read().unwrap();
                        let zone = tachyon::zone!("job");
                        zone.value(job);
                        zone.text(&format!("scale {scale}"));
                        thread::sleep(Duration::from_micros(100 * (job % 5)));
                        done.add(1);
                        handled += 1;
                    }
                    tachyon::debug!("worker {w} finished");
                })
                .expect("spawn a worker")
        })
        .collect();

    for frame in 0..30u64 {
        tachyon::frame_mark!();
        {
            let mut q = jobs.lock().unwrap();
            q.extend((0..2).map(|i| frame * 2 + i));
            queued.set(q.len() as u64);
            // Holding the lock a while: the workers wait for it.
            thread::sleep(Duration::from_micros(300));
        }
        if frame % 10 == 0 {
            *settings.write().unwrap() += 1;
            tachyon::message!(level: Level::Warn, "settings changed at frame {frame}");
        }
        thread::sleep(Duration::from_millis(2));
    }
    tachyon::frame_mark!();
    for w in workers {
        w.join().expect("a worker panicked");
    }
    tachyon::message!(color: 0x00a000, "all jobs done");
    if let Some(report) = tachyon::shutdown()? {
        println!("wrote {} bytes to {:?}", report.bytes, report.path);
    }
    Ok(())
}

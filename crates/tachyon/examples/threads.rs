//! Threads and tracks: std thread names show up on the trace, `set_thread_name` names a
//! thread that has none (or renames one), `set_process_name` names the process. Work that is
//! not tied to one thread goes on a `Track`: `Track::named` gives a process-wide track (here a
//! "scheduler" with instants from several threads), `Track::new_async` a track of its own per
//! operation, whose slice may end on another thread than the one that began it. (Slices on one
//! track must nest: give overlapping operations a `new_async` track each.)
//! Writes `threads.pftrace`:
//! `cargo run -p tachyon-cli -- query threads.pftrace "SELECT tid, name FROM thread"`.
//!
//! Run: `cargo run -p tachyon --example threads`

use std::thread;

use tachyon::Track;

fn busy(n: u64) -> u64 {
    (0..n).fold(0u64, |h, i| (h ^ i).wrapping_mul(0x0100_0000_01b3))
}

fn main() -> std::io::Result<()> {
    tachyon::start(tachyon::Config {
        output: Some("threads.pftrace".into()),
        ..tachyon::Config::from_env()?
    })?;
    tachyon::set_process_name("threads example");
    tachyon::set_thread_name("coordinator"); // renames the main thread on the trace

    let scheduler = Track::named("scheduler");
    let mut handles = Vec::new();
    let dispatching = tachyon::begin!(&scheduler, "dispatch all", workers = 3);
    for i in 0..3u64 {
        let scheduler = scheduler.clone();
        // An operation of its own: begun here, ended by the thread that finishes it.
        let request = Track::new_async(format!("request {i}"));
        let pending = tachyon::begin!(&request, "request", id = i);
        tachyon::instant_on!(&scheduler, "dispatch", worker = i);
        handles.push(
            thread::Builder::new()
                .name(format!("worker {i}")) // the std name is the trace's thread name
                .spawn(move || {
                    {
                        let _zone = tachyon::zone!("work", worker = i);
                        std::hint::black_box(busy(200_000 * (i + 1)));
                    }
                    tachyon::instant_on!(&scheduler, "finished", worker = i);
                    tachyon::instant_on!(&request, "done");
                    pending.end();
                })?,
        );
    }
    dispatching.end();
    // A thread without a std name names itself on the trace.
    handles.push(thread::spawn(|| {
        tachyon::set_thread_name("housekeeping");
        let _zone = tachyon::zone!("sweep");
        std::hint::black_box(busy(100_000));
    }));
    for h in handles {
        h.join().expect("a thread panicked");
    }

    // `wrote FILE (N bytes, D packets dropped)`, or, in system mode (TACHYON_PRODUCER_SOCK),
    // what went to the daemon, which has the trace.
    let report = tachyon::shutdown()?.expect("tracing was started above");
    println!("{report}");
    Ok(())
}

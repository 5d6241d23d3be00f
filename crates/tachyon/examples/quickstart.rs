//! The smallest complete use of Tachyon: start tracing, record zones, an instant and a
//! counter on two threads, and write `quickstart.pftrace` (open it in ui.perfetto.dev, or
//! `cargo run -p tachyon-cli -- stats quickstart.pftrace`).
//!
//! Run: `cargo run -p tachyon --example quickstart`, or under a daemon (system mode):
//! `tachyon record -o all.pftrace -- cargo run -p tachyon --example quickstart`

fn fib(n: u64) -> u64 {
    let _zone = tachyon::zone!("fib", n = n);
    if n < 2 {
        n
    } else {
        fib(n - 1) + fib(n - 2)
    }
}

fn main() -> std::io::Result<()> {
    tachyon::start(tachyon::Config {
        output: Some("quickstart.pftrace".into()),
        // The TACHYON_* environment variables still apply; with TACHYON_PRODUCER_SOCK set the
        // events go to that `tachyon traced` daemon instead of a file of our own.
        ..tachyon::Config::from_env()?
    })?;
    tachyon::set_process_name("quickstart");

    let worker = std::thread::Builder::new()
        .name("worker".into())
        .spawn(|| {
            for i in 0..100u32 {
                let _zone = tachyon::zone!("work", "step");
                tachyon::counter!("steps done", i);
                std::hint::black_box(fib(5));
            }
        })?;
    {
        let _zone = tachyon::zone!("main loop");
        tachyon::instant!("started");
        std::hint::black_box(fib(10));
    }
    worker.join().expect("worker panicked");

    // `wrote FILE (N bytes, D packets dropped)`, or, in system mode (TACHYON_PRODUCER_SOCK),
    // what went to the daemon, which has the trace.
    let report = tachyon::shutdown()?.expect("tracing was started above");
    println!("{report}");
    Ok(())
}

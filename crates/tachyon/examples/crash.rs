//! Crashes on purpose, to see the crash handler save the trace:
//!
//! ```text
//! cargo run -p tachyon --example crash -- segv|abort|panic|stack-overflow
//! cargo run -p tachyon-cli -- stats crash.pftrace
//! ```
//!
//! Two threads record zones, then the main thread crashes the way it was asked to. The trace
//! is written to `crash.pftrace` (or `TACHYON_OUT`) before the process dies, and it dies as it
//! would have without Tachyon: `SIGSEGV` for `segv`, `SIGABRT` for `abort` and for
//! `stack-overflow` (std prints "has overflowed its stack" and aborts), exit status 101 for
//! `panic` (or `SIGABRT` when built with `panic = "abort"`). `TACHYON_NO_CRASH_HANDLER=1` shows
//! the same death without a trace.

use std::path::PathBuf;
use std::sync::{Arc, Barrier};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mode = std::env::args().nth(1).unwrap_or_default();
    if !matches!(mode.as_str(), "segv" | "abort" | "panic" | "stack-overflow") {
        eprintln!("usage: crash segv|abort|panic|stack-overflow");
        std::process::exit(2);
    }
    let mut config = tachyon::Config::from_env()?;
    if std::env::var_os("TACHYON_OUT").is_none() {
        config.output = Some(PathBuf::from("crash.pftrace"));
    }
    tachyon::start(config)?;
    tachyon::set_thread_name("main");

    // A worker that has recorded its zones before the crash, and then waits.
    let recorded = Arc::new(Barrier::new(2));
    let worker = {
        let recorded = Arc::clone(&recorded);
        std::thread::Builder::new()
            .name("worker".into())
            .spawn(move || {
                for i in 0..100u64 {
                    let _zone = tachyon::zone!("example", "work", item = i);
                    std::hint::black_box(i * i);
                }
                recorded.wait();
                std::thread::park();
            })?
    };
    recorded.wait();
    {
        let _setup = tachyon::zone!("setup");
        tachyon::instant!("about to crash");
    }
    let _outer = tachyon::zone!("crashing");
    match mode.as_str() {
        "segv" => {
            let p: *const u64 = std::hint::black_box(std::ptr::null());
            // SAFETY: none: this reads address 0 on purpose, to crash with SIGSEGV.
            let v = unsafe { p.read_volatile() };
            println!("unreachable: {v}");
        }
        "abort" => std::process::abort(),
        "panic" => panic!("the example panics on purpose"),
        _ => println!("unreachable: {}", recurse(std::hint::black_box(1))),
    }
    drop(worker);
    Ok(())
}

/// Recursion with a frame too large for the optimizer to remove: overflows the stack.
#[allow(unconditional_recursion)]
fn recurse(n: u64) -> u64 {
    let frame = std::hint::black_box([n; 512]);
    frame[(n % 512) as usize] + recurse(n + 1)
}

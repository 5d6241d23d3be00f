//! Memory profiling: the tracking allocator records every allocation and free while the
//! session runs; the trace gets a live-heap counter track (`Heap`, and `Heap: arena` for the
//! pool below) and heap profiles that ui.perfetto.dev shows as "unreleased" and "total
//! allocated" flame graphs, here one frame per zone. `tachyon stats memory.pftrace` lists the
//! peak and the leaks by site.
//!
//! Run: `cargo run -p tachyon --example memory` (`TACHYON_MEMORY=sampled:4096` samples instead).

use std::alloc::System;

use tachyon::alloc::Tracked;

#[global_allocator]
static ALLOC: Tracked<System> = Tracked::new(System);

fn main() -> std::io::Result<()> {
    tachyon::start(tachyon::Config {
        output: Some("memory.pftrace".into()),
        // The TACHYON_* environment variables still apply (TACHYON_MEMORY, ...).
        ..tachyon::Config::from_env()?
    })?;
    tachyon::set_process_name("memory example");

    let mut cache: Vec<Vec<u8>> = Vec::new();
    for step in 0..200usize {
        let _zone = tachyon::zone!("step");
        {
            let _z = tachyon::zone!("parse");
            let tokens: Vec<u64> = (0..(step % 50) as u64 * 100).collect();
            std::hint::black_box(&tokens);
        }
        {
            let _z = tachyon::zone!("cache");
            cache.push(vec![step as u8; 4096]);
            if cache.len() > 16 {
                cache.remove(0);
            }
        }
        if step % 50 == 0 {
            let _z = tachyon::zone!("leak");
            // A deliberate leak: it shows as unreleased at the end.
            std::mem::forget(vec![0u8; 10_000]);
        }
    }

    // A custom allocator's blocks, as a named pool.
    let arena = tachyon::alloc::pool("arena");
    for i in 0..100usize {
        arena.alloc(0x1000 + i * 64, 64);
    }
    arena.discard();

    let report = tachyon::shutdown()?.expect("a session was running");
    println!("{report}");
    if let Some(m) = &report.memory {
        println!("{m}");
    }
    Ok(())
}

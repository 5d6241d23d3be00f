//! Counters: `counter!` for counters with a static name (integer or float samples, with a
//! unit), and `CounterTrack` for counters whose name is only known at run time. A small
//! simulated allocator and a few cache shards feed them; every counter becomes its own track
//! in `counters.pftrace` (open it in ui.perfetto.dev, or
//! `cargo run -p tachyon-cli -- query counters.pftrace "SELECT name, unit, count(*) FROM counters GROUP BY name"`).
//!
//! Run: `cargo run -p tachyon --example counters`

use tachyon::{CounterTrack, Unit};

fn main() -> std::io::Result<()> {
    tachyon::start(tachyon::Config {
        output: Some("counters.pftrace".into()),
        // The TACHYON_* environment variables still apply (buffer size, categories, ...).
        ..tachyon::Config::from_env()?
    })?;
    tachyon::set_process_name("counters example");

    // Counters named at run time: one track per shard.
    let shards: Vec<CounterTrack> = (0..3)
        .map(|i| CounterTrack::new(format!("shard {i} items"), Unit::Count))
        .collect();
    let mut items = [0u64; 3];
    let mut heap: Vec<Vec<u8>> = Vec::new();
    let mut heap_bytes = 0usize;

    for step in 0..200u64 {
        let _zone = tachyon::zone!("step", n = step);
        // Allocate a little, free the oldest now and then.
        let size = 1024 * (1 + (step * 7919 % 64) as usize);
        heap.push(vec![step as u8; size]);
        heap_bytes += size;
        if heap.len() > 32 {
            heap_bytes -= heap.remove(0).len();
        }
        tachyon::counter!("heap", heap_bytes, Unit::Bytes); // an integer sample, in bytes
        tachyon::counter!("live blocks", heap.len(), Unit::Count);
        // A float sample, with a unit of our own.
        let fill = 100.0 * heap_bytes as f64 / (32.0 * 64.0 * 1024.0);
        tachyon::counter!("heap fill", fill, Unit::Named("%"));

        let shard = (step % 3) as usize;
        items[shard] += step % 5;
        shards[shard].set(items[shard]);
    }

    // `wrote FILE (N bytes, D packets dropped)`, or, in system mode (TACHYON_PRODUCER_SOCK),
    // what went to the daemon, which has the trace.
    let report = tachyon::shutdown()?.expect("tracing was started above");
    println!("{report}");
    Ok(())
}

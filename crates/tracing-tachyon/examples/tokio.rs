//! Tokio tasks instrumented with `tracing`, recorded by Tachyon through the Layer: each task's
//! span is entered at every poll, on whichever worker thread polls it.
//!
//! ```text
//! cargo run -p tracing-tachyon --example tokio                 # a slice per poll, per thread
//! cargo run -p tracing-tachyon --example tokio -- --async-track # one slice per task
//! tachyon query tokio.pftrace "SELECT name, count(*) FROM slice GROUP BY name"
//! ```
//!
//! With the default [`SpanMode::PerEntry`] a `fetch` task that awaits three times leaves (at
//! least) four `fetch` slices, each on the track of the worker thread that ran that poll, with
//! the task's fields as arguments; with `--async-track` ([`SpanMode::AsyncTrack`]) each task is
//! one slice on an async track of its own, from the span's creation to its close.

use std::time::Duration;

use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;
use tracing_tachyon::{SpanMode, TachyonLayer};

/// A task that awaits a timer a few times (so it is polled, and may move, that often).
#[tracing::instrument]
async fn fetch(id: u32, parts: u32) -> u64 {
    let mut total = 0;
    for part in 0..parts {
        tokio::time::sleep(Duration::from_millis(1 + u64::from(id % 3))).await;
        total += checksum(id, part);
    }
    tracing::info!(total, "fetched");
    total
}

/// Synchronous work inside a poll: a span nested in the task's entry.
#[tracing::instrument(level = "debug")]
fn checksum(id: u32, part: u32) -> u64 {
    (0..10_000u64).fold(u64::from(id) << 32 | u64::from(part), |h, x| {
        h.rotate_left(5) ^ x
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mode = if std::env::args().any(|a| a == "--async-track") {
        SpanMode::AsyncTrack
    } else {
        SpanMode::PerEntry
    };
    // `init()` reads the TACHYON_* environment (TACHYON_OUT, categories, system mode); here the
    // file name is fixed unless TACHYON_OUT says otherwise.
    let out = std::env::var("TACHYON_OUT").unwrap_or_else(|_| "tokio.pftrace".into());
    tachyon::start(tachyon::Config {
        output: Some(out.clone().into()),
        ..tachyon::Config::from_env()?
    })?;
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(TachyonLayer::new().with_span_mode(mode)),
    )?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_name("tokio-worker")
        .enable_time()
        .build()?;
    let total = rt.block_on(
        async {
            let tasks: Vec<_> = (0..16).map(|id| tokio::spawn(fetch(id, 3))).collect();
            let mut total = 0u64;
            for t in tasks {
                total = total.wrapping_add(t.await?);
            }
            Ok::<_, tokio::task::JoinError>(total)
        }
        .instrument(tracing::info_span!("main task")),
    )?;
    // The workers exit (and flush their writers) before the session stops.
    drop(rt);

    let report = tachyon::shutdown()?.ok_or("no session ran")?;
    println!(
        "checksum {total:x}; wrote {out} ({} bytes, {} packets dropped); `tachyon stats {out}` lists the zones",
        report.bytes, report.writers.packets_dropped
    );
    Ok(())
}

//! The `profiling` crate's `profile-with-tracing` backend, recorded by Tachyon through the
//! `tracing` Layer: `profiling::scope!` and `#[profiling::function]` become `tracing` spans, so
//! zones on the thread's track. `log` records arrive through `tracing-log`.
//!
//! ```text
//! cargo run -p tracing-tachyon --example profiling
//! tachyon stats profiling.pftrace
//! ```

use tracing_subscriber::layer::SubscriberExt;

#[profiling::function]
fn checksum(data: &[u8]) -> u64 {
    profiling::scope!("fold");
    data.iter()
        .fold(0u64, |h, &b| h.rotate_left(5) ^ u64::from(b))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `init()` reads the TACHYON_* environment (TACHYON_OUT, categories, system mode); here the
    // file name is fixed unless TACHYON_OUT says otherwise.
    let out = std::env::var("TACHYON_OUT").unwrap_or_else(|_| "profiling.pftrace".into());
    tachyon::start(tachyon::Config {
        output: Some(out.clone().into()),
        ..tachyon::Config::from_env()?
    })?;
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(tracing_tachyon::TachyonLayer::new()),
    )?;
    tracing_log::LogTracer::init()?;

    let data: Vec<u8> = (0..1 << 16).map(|i| (i * 31) as u8).collect();
    for frame in 0..10 {
        profiling::scope!("frame", format!("frame {frame}").as_str());
        let sum = checksum(&data);
        log::info!("frame {frame}: checksum {sum:x}");
        profiling::finish_frame!();
    }

    let report = tachyon::shutdown()?.ok_or("no session ran")?;
    println!(
        "wrote {out} ({} bytes); `tachyon stats {out}` lists the zones",
        report.bytes
    );
    Ok(())
}

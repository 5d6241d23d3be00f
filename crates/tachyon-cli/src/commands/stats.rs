//! `tachyon stats TRACE`: Tracy's statistics view, then the data-loss report.

use std::path::PathBuf;

use tachyon_processor::{QueryResult, Value, ZoneStats};

use crate::load::{load, Sort};

/// Locks, frames, messages, program info (`stats/tracy.rs`).
mod tracy;
use crate::output::{render, Format};

/// The crashes the trace records first (thread, signal or panic message, call stack); then per
/// zone name: count, total, self, mean, min, median, p99 and max time, sorted by total;
/// then, when the trace has them, the program's information, locks (acquisitions, contention,
/// waits, holds, the threads that waited most), frames (count, frame times, FPS) and messages
/// (per level, the warnings and errors); then every data_loss or error in the `stats` table,
/// or "no data lost".
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The trace file (Perfetto protobuf, optionally gzip-compressed).
    trace: PathBuf,
    /// How events are sorted before import.
    #[arg(long, value_enum, default_value_t = Sort::Full)]
    sort: Sort,
    /// Also print the CPU profile of the trace's samples, top-down and bottom-up.
    #[arg(long)]
    samples: bool,
    /// Also print zones grouped by the call stack they began in.
    #[arg(long)]
    callstacks: bool,
}

pub(crate) fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let tp = load(&args.trace, args.sort)?;
    print_crashes(&tp.crashes()?);
    let zones = tp.zone_stats()?;
    println!("Zones ({} names, sorted by total time)", zones.len());
    print!("{}", render(&zone_table(&zones), Format::Table));
    println!();
    super::memory_stats::print(&tp)?;
    if args.callstacks {
        crate::commands::profile::print_callstacks(&tp)?;
        println!();
    }
    if args.samples {
        crate::commands::profile::print_samples(&tp)?;
        println!();
    }
    tracy::print(&tp)?;
    let loss = tp.data_loss()?;
    if loss.is_empty() {
        println!("Data loss: no data lost");
    } else {
        println!(
            "Data loss: {} stat(s) report lost data or errors",
            loss.len()
        );
        for s in loss {
            let idx = s.idx.map(|i| format!("[{i}]")).unwrap_or_default();
            println!(
                "  {}{idx} = {} ({}, {})",
                s.name, s.value, s.severity, s.source
            );
            println!("      {}", s.description);
        }
    }
    Ok(())
}

/// The crash handler's events, at the top: what crashed, then its call stack.
fn print_crashes(crashes: &[tachyon_processor::Crash]) {
    for c in crashes {
        println!("{}", c.summary());
        match (&c.pc, &c.pc_module) {
            (Some(pc), Some(m)) => println!("  pc: {pc} ({m})"),
            (Some(pc), None) => println!("  pc: {pc}"),
            _ => {}
        }
        if c.stack.is_empty() {
            println!("  call stack: not recorded");
        } else {
            println!("  call stack:");
            for f in &c.stack {
                println!("    {f}");
            }
        }
    }
    if !crashes.is_empty() {
        println!();
    }
}

fn zone_table(zones: &[ZoneStats]) -> QueryResult {
    let t = |ns: i64| Value::Text(duration(ns as f64));
    QueryResult {
        columns: [
            "zone", "count", "total", "self", "mean", "min", "median", "p99", "max",
        ]
        .map(String::from)
        .to_vec(),
        rows: zones
            .iter()
            .map(|z| {
                vec![
                    Value::Text(z.name.clone()),
                    Value::Integer(z.count as i64),
                    t(z.total_ns),
                    t(z.self_ns),
                    Value::Text(duration(z.mean_ns)),
                    t(z.min_ns),
                    t(z.median_ns),
                    t(z.p99_ns),
                    t(z.max_ns),
                ]
            })
            .collect(),
    }
}

/// Human-readable duration, as Tracy prints them (3 significant digits).
pub(crate) fn duration(ns: f64) -> String {
    let (v, unit) = if ns < 1e3 {
        (ns, "ns")
    } else if ns < 1e6 {
        (ns / 1e3, "us")
    } else if ns < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, "s")
    };
    if unit == "ns" && v.fract() == 0.0 {
        format!("{v} ns")
    } else if v >= 100.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.2} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::duration;

    #[test]
    fn durations_pick_a_unit() {
        assert_eq!(duration(999.0), "999 ns");
        assert_eq!(duration(1500.0), "1.50 us");
        assert_eq!(duration(250_000_000.0), "250.0 ms");
        assert_eq!(duration(3e9), "3.00 s");
    }
}

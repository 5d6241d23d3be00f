//! The call-stack views of `tachyon stats`: `--samples` (the CPU profile, top-down and
//! bottom-up) and `--callstacks` (zones grouped by the stack they began in).

use tachyon_processor::profiles::{cpu_profile, zone_callstacks};
use tachyon_processor::TraceProcessor;

use crate::commands::stats::duration;

/// Lines of each view at most.
const MAX_LINES: usize = 60;

pub(crate) fn print_samples(tp: &TraceProcessor) -> Result<(), Box<dyn std::error::Error>> {
    let p = cpu_profile(tp)?;
    println!(
        "CPU samples: {} ({} without a call stack)",
        p.samples, p.without_stack
    );
    if p.samples == 0 {
        println!("  (record with TACHYON_SAMPLING_HZ=1000, or Config::sampling_hz)");
        return Ok(());
    }
    let pct = |n: u64| 100.0 * n as f64 / p.samples as f64;
    println!();
    println!("Top-down (total%  self%  function; nodes under 1% left out)");
    let min = (p.samples / 100).max(1);
    for l in p.top_down(min).iter().take(MAX_LINES) {
        println!(
            "{:6.1}% {:6.1}%  {}{}",
            pct(l.total_samples),
            pct(l.self_samples),
            "  ".repeat(l.depth.min(40)),
            l.name
        );
    }
    println!();
    println!("Bottom-up (self%  total%  function, then its most frequent callers)");
    for f in p.bottom_up().iter().filter(|f| f.self_samples > 0).take(20) {
        println!(
            "{:6.1}% {:6.1}%  {}",
            pct(f.self_samples),
            pct(f.total_samples),
            f.name
        );
        for (callers, n) in f.callers.iter().take(3) {
            if callers.is_empty() {
                continue;
            }
            println!("{:16}<- {:.1}%  {}", "", pct(*n), callers.join(" <- "));
        }
    }
    Ok(())
}

pub(crate) fn print_callstacks(tp: &TraceProcessor) -> Result<(), Box<dyn std::error::Error>> {
    let zones = zone_callstacks(tp)?;
    println!("Zones by call stack ({} zone/stack pairs)", zones.len());
    if zones.is_empty() {
        println!("  (record with TACHYON_CALLSTACK=N, or zone!(..., callstack))");
    }
    for z in zones.iter().take(MAX_LINES / 3) {
        println!(
            "{}  x{}  total {}",
            z.zone,
            z.count,
            duration(z.total_ns as f64)
        );
        // The innermost frames say where; the outermost few are the same everywhere.
        for f in z.stack.iter().rev().take(6) {
            println!("    {f}");
        }
        if z.stack.len() > 6 {
            println!("    ... {} more", z.stack.len() - 6);
        }
    }
    Ok(())
}

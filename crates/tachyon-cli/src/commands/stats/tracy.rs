//! The sections of `tachyon stats` for Tracy's other views: locks, frames, messages and the
//! program's information (each printed only when the trace has some).

use tachyon_processor::{FrameStats, LockStats, MessageStats, QueryResult, TraceProcessor, Value};

use super::duration;
use crate::output::{render, Format};

/// Prints the sections; nothing for a trace without locks, frames, messages or program info.
pub(crate) fn print(tp: &TraceProcessor) -> Result<(), Box<dyn std::error::Error>> {
    let msgs = tp.message_stats()?;
    if !msgs.app_info.is_empty() {
        println!("App info");
        for info in &msgs.app_info {
            for line in info.lines() {
                println!("  {line}");
            }
        }
        println!();
    }
    let locks = tp.lock_stats()?;
    if !locks.is_empty() {
        println!("Locks ({}, sorted by total wait)", locks.len());
        print!("{}", render(&lock_table(&locks), Format::Table));
        println!();
    }
    let frames = tp.frame_stats()?;
    if !frames.is_empty() {
        println!("Frames ({} set(s))", frames.len());
        print!("{}", render(&frame_table(&frames), Format::Table));
        println!();
    }
    if msgs.total > 0 {
        print_messages(&msgs);
        println!();
    }
    Ok(())
}

fn lock_table(locks: &[LockStats]) -> QueryResult {
    let t = |ns: i64| Value::Text(duration(ns as f64));
    QueryResult {
        columns: [
            "lock",
            "acquisitions",
            "shared",
            "contended",
            "total wait",
            "max wait",
            "total hold",
            "max hold",
            "waited most",
        ]
        .map(String::from)
        .to_vec(),
        rows: locks
            .iter()
            .map(|l| {
                let waiters = l
                    .top_waiters
                    .iter()
                    .map(|(name, n, ns)| format!("{name}: {n}x {}", duration(*ns as f64)))
                    .collect::<Vec<_>>()
                    .join(", ");
                vec![
                    Value::Text(l.name.clone()),
                    Value::Integer(l.acquisitions as i64),
                    Value::Integer(l.shared as i64),
                    Value::Text(format!("{} ({:.1}%)", l.contended, 100.0 * l.contention())),
                    t(l.total_wait_ns),
                    t(l.max_wait_ns),
                    t(l.total_hold_ns),
                    t(l.max_hold_ns),
                    Value::Text(waiters),
                ]
            })
            .collect(),
    }
}

fn frame_table(frames: &[FrameStats]) -> QueryResult {
    let t = |ns: i64| Value::Text(duration(ns as f64));
    QueryResult {
        columns: [
            "frame set",
            "frames",
            "mean",
            "median",
            "p90",
            "p99",
            "max",
            "> 2x median",
            "FPS",
        ]
        .map(String::from)
        .to_vec(),
        rows: frames
            .iter()
            .map(|f| {
                vec![
                    Value::Text(f.name.clone()),
                    Value::Integer(f.count as i64),
                    Value::Text(duration(f.mean_ns)),
                    t(f.median_ns),
                    t(f.p90_ns),
                    t(f.p99_ns),
                    t(f.max_ns),
                    Value::Integer(f.over_2x_median as i64),
                    Value::Text(format!("{:.1}", f.fps)),
                ]
            })
            .collect(),
    }
}

fn print_messages(m: &MessageStats) {
    let levels = m
        .by_priority
        .iter()
        .map(|(_, name, n)| format!("{name} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    println!("Messages ({}: {levels})", m.total);
    for (ts, level, tag, msg) in &m.notable {
        let tag = tag.as_deref().unwrap_or("-");
        let first = msg.lines().next().unwrap_or("");
        println!("  {ts} {level:<5} {tag}: {first}");
    }
}

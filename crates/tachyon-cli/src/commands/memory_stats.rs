//! The memory section of `tachyon stats`: per process and heap with heap profiles, the peak
//! live bytes and when, the totals, and the top sites by bytes still live at the end (leaks)
//! and by bytes allocated, with their stacks (zones, or functions).

use tachyon_processor::{HeapReport, HeapSite, QueryResult, TraceProcessor, Value};

use crate::output::{render, Format};

/// Sites listed per table.
const TOP: usize = 10;

/// Prints the section; nothing when the trace has no heap profile.
pub(crate) fn print(tp: &TraceProcessor) -> Result<(), Box<dyn std::error::Error>> {
    let heaps = tp.memory(TOP)?;
    if heaps.is_empty() {
        return Ok(());
    }
    println!("Memory ({} heap(s) with heap profiles)", heaps.len());
    for h in &heaps {
        println!("{}", summary_line(h));
        if !h.top_live.is_empty() {
            println!("  Still live at the end (leaks), by bytes:");
            print!(
                "{}",
                indent(&render(&site_table(&h.top_live, true), Format::Table))
            );
        }
        if !h.top_allocated.is_empty() {
            println!("  Allocated, by bytes:");
            print!(
                "{}",
                indent(&render(&site_table(&h.top_allocated, false), Format::Table))
            );
        }
    }
    println!();
    Ok(())
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("    {l}\n")).collect()
}

/// `pid 12 heap rust.global: peak 1.2 MiB at +0.153 s, 8.0 MiB allocated in 1234
/// allocations, 12.0 KiB live at the end in 3 blocks`.
pub(crate) fn summary_line(h: &HeapReport) -> String {
    format!(
        "  pid {} heap {}: peak {} at +{:.3} s, {} allocated in {} allocations, {} live at the end in {} blocks",
        h.pid,
        h.heap_name,
        bytes(h.peak_bytes),
        (h.peak_ts - h.start_ts).max(0) as f64 / 1e9,
        bytes(h.allocated_bytes),
        h.alloc_count,
        bytes(h.live_bytes),
        h.live_count,
    )
}

fn site_table(sites: &[HeapSite], live: bool) -> QueryResult {
    QueryResult {
        columns: if live {
            ["bytes", "blocks", "stack"]
        } else {
            ["bytes", "allocations", "stack"]
        }
        .map(String::from)
        .to_vec(),
        rows: sites
            .iter()
            .map(|s| {
                let (b, n) = if live {
                    (s.live_bytes, s.live_count)
                } else {
                    (s.allocated_bytes, s.alloc_count)
                };
                vec![
                    Value::Text(bytes(b)),
                    Value::Integer(n),
                    Value::Text(stack_text(&s.stack)),
                ]
            })
            .collect(),
    }
}

/// Frames shown per site: a native stack's innermost ones (the code that allocated and its
/// callers); zone paths are rarely deeper.
const SHOWN_FRAMES: usize = 5;

/// A site's stack, outermost first, cut to its [`SHOWN_FRAMES`] innermost frames.
fn stack_text(stack: &[String]) -> String {
    match stack.len().checked_sub(SHOWN_FRAMES) {
        Some(cut) if cut > 0 => format!("… > {}", stack[cut..].join(" > ")),
        _ => stack.join(" > "),
    }
}

/// Bytes in binary units (3 significant digits).
pub(crate) fn bytes(b: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v.abs() >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::{bytes, stack_text};

    #[test]
    fn deep_stacks_show_their_innermost_frames() {
        let s: Vec<String> = (0..8).map(|i| format!("f{i}")).collect();
        assert_eq!(stack_text(&s), "… > f3 > f4 > f5 > f6 > f7");
        assert_eq!(stack_text(&s[..2]), "f0 > f1");
        assert_eq!(stack_text(&[]), "");
    }

    #[test]
    fn bytes_pick_a_unit() {
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }
}

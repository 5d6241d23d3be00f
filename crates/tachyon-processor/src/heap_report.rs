//! The memory summary (`tachyon stats`): heap profiles and live-heap counters per process
//! and heap, read back through SQL.

/// One allocation site of a [`HeapReport`].
#[derive(Clone, Debug, PartialEq)]
pub struct HeapSite {
    /// Frame names, outermost first (zones, or functions).
    pub stack: Vec<String>,
    /// Bytes allocated at the site and not freed by the last dump.
    pub live_bytes: i64,
    /// Blocks still live.
    pub live_count: i64,
    /// Bytes allocated.
    pub allocated_bytes: i64,
    /// Allocations.
    pub alloc_count: i64,
}

/// What one heap of one process did, from its heap profiles and (for Tachyon's tracking
/// allocator) its live-heap counter track.
#[derive(Clone, Debug, PartialEq)]
pub struct HeapReport {
    /// The process's pid.
    pub pid: i64,
    /// The heap (`rust.global`, a pool's name, `libc.malloc`, ...).
    pub heap_name: String,
    /// Highest live bytes: from the heap's counter track when there is one (every change),
    /// else the highest total over the dumps.
    pub peak_bytes: i64,
    /// When (trace ns).
    pub peak_ts: i64,
    /// Start of the first heap profile window (trace ns): when tracking began.
    pub start_ts: i64,
    /// Bytes allocated in total.
    pub allocated_bytes: i64,
    /// Allocations in total.
    pub alloc_count: i64,
    /// Bytes live at the last dump.
    pub live_bytes: i64,
    /// Blocks live at the last dump.
    pub live_count: i64,
    /// Sites by bytes still live at the last dump (leaks), most first.
    pub top_live: Vec<HeapSite>,
    /// Sites by bytes allocated, most first.
    pub top_allocated: Vec<HeapSite>,
}

/// Functions of the allocator itself at the top of a native allocation stack (the tracking
/// hook, the `GlobalAlloc` shims, `alloc::alloc`): left out of a site's stack, so it ends at
/// the code that asked for memory (a flame graph still shows them).
const ALLOCATOR_FRAMES: &[&str] = &[
    "tachyon::alloc::",
    "<tachyon::alloc::",
    "tachyon::callstack::",
    "std::thread::local::LocalKey<",
    "__rust_alloc",
    "__rust_realloc",
    "__rust_dealloc",
    "__rg_",
    "__rdl_",
    "alloc::alloc::",
    "<alloc::alloc::Global",
    "<std::alloc::System",
    "std::alloc::",
];

/// The names of callsite `callsite`'s frames, outermost first: a frame's symbols (inlined
/// functions expanded) when it was symbolized, else its name, else `binary+0xPC`; the
/// allocator's own frames at the top of a native stack are dropped.
fn stack_of(conn: &rusqlite::Connection, callsite: i64) -> rusqlite::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut q = conn.prepare_cached(
        "SELECT c.parent_id, f.name, f.rel_pc, m.name, f.symbol_set_id FROM stack_profile_callsite c \
         JOIN stack_profile_frame f ON c.frame_id = f.id \
         LEFT JOIN stack_profile_mapping m ON f.mapping = m.id WHERE c.id = ?1",
    )?;
    let mut symbols = conn.prepare_cached(
        "SELECT name FROM stack_profile_symbol WHERE symbol_set_id = ?1 AND name IS NOT NULL \
         ORDER BY id",
    )?;
    let mut cur = Some(callsite);
    let mut guard = 0;
    let mut native = false;
    while let Some(id) = cur {
        guard += 1;
        if guard > 1024 {
            break;
        }
        type Row = (
            Option<i64>,
            Option<String>,
            i64,
            Option<String>,
            Option<i64>,
        );
        let row: Option<Row> = q
            .query_row([id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })?;
        let Some((parent, name, rel_pc, mapping, symbol_set)) = row else {
            break;
        };
        let symbolized: Vec<String> = match symbol_set {
            // Innermost first in a set; this list is built innermost first too.
            Some(set) => symbols
                .query_map([set], |r| r.get(0))?
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        match name.filter(|n| !n.is_empty()) {
            _ if !symbolized.is_empty() => {
                native = true;
                out.extend(symbolized);
            }
            Some(n) => out.push(n),
            None => {
                native = true;
                let m = mapping.unwrap_or_default();
                let binary = m.rsplit('/').next().unwrap_or(&m).to_owned();
                out.push(format!("{binary}+{rel_pc:#x}"));
            }
        }
        cur = parent;
    }
    if native {
        let own = out
            .iter()
            .take_while(|n| ALLOCATOR_FRAMES.iter().any(|p| n.starts_with(p)))
            .count();
        if own < out.len() {
            out.drain(..own);
        }
    }
    out.reverse();
    Ok(out)
}

/// The memory summary of the trace: one report per (process, heap) with heap profiles, the
/// top `top` sites each.
pub(crate) fn memory_report(
    conn: &rusqlite::Connection,
    top: usize,
) -> rusqlite::Result<Vec<HeapReport>> {
    let mut heaps = conn.prepare(
        "SELECT a.upid, p.pid, a.heap_name, \
           sum(CASE WHEN a.size > 0 THEN a.size ELSE 0 END), \
           sum(CASE WHEN a.count > 0 THEN a.count ELSE 0 END), sum(a.size), sum(a.count) \
         FROM heap_profile_allocation a JOIN process p ON a.upid = p.upid \
         GROUP BY a.upid, a.heap_name ORDER BY p.pid, a.heap_name",
    )?;
    let rows: Vec<(i64, i64, String, i64, i64, i64, i64)> = heaps
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get::<_, Option<String>>(2)?.unwrap_or_default(),
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
            ))
        })?
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for (upid, pid, heap, allocated, allocs, live, live_count) in rows {
        // Peak: the heap's counter track (Tachyon's tracking allocator names it), else the
        // running total over the dumps.
        let track = if heap == "rust.global" {
            "Heap".to_owned()
        } else {
            format!("Heap: {heap}")
        };
        let from_counter: Option<(i64, i64)> = conn
            .query_row(
                "SELECT CAST(c.value AS INT), c.ts FROM counter c \
                 JOIN process_counter_track t ON c.track_id = t.id \
                 WHERE t.name = ?1 AND t.upid = ?2 ORDER BY c.value DESC, c.ts LIMIT 1",
                rusqlite::params![track, upid],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })?;
        let (peak_bytes, peak_ts) = match from_counter {
            Some(p) => p,
            None => conn.query_row(
                "SELECT coalesce(max(total), 0), coalesce(ts, 0) FROM (SELECT ts, sum(sum(size)) \
                 OVER (ORDER BY ts) AS total FROM heap_profile_allocation \
                 WHERE upid = ?1 AND heap_name = ?2 GROUP BY ts)",
                rusqlite::params![upid, heap],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?,
        };
        let sites = |order: &str| -> rusqlite::Result<Vec<HeapSite>> {
            let sql = format!(
                "SELECT callsite_id, sum(size), sum(count), \
                   sum(CASE WHEN size > 0 THEN size ELSE 0 END), \
                   sum(CASE WHEN count > 0 THEN count ELSE 0 END) AS allocs \
                 FROM heap_profile_allocation WHERE upid = ?1 AND heap_name = ?2 \
                 GROUP BY callsite_id HAVING {order} > 0 ORDER BY {order} DESC, callsite_id LIMIT ?3"
            );
            let mut q = conn.prepare(&sql)?;
            let raw: Vec<(i64, i64, i64, i64, i64)> = q
                .query_map(rusqlite::params![upid, heap, top as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                })?
                .collect::<Result<_, _>>()?;
            raw.into_iter()
                .map(|(cs, live, live_count, allocated, allocs)| {
                    Ok(HeapSite {
                        stack: stack_of(conn, cs)?,
                        live_bytes: live,
                        live_count,
                        allocated_bytes: allocated,
                        alloc_count: allocs,
                    })
                })
                .collect()
        };
        let start_ts: i64 = conn.query_row(
            "SELECT coalesce(min(ts), 0) FROM heap_profile WHERE upid = ?1",
            [upid],
            |r| r.get(0),
        )?;
        let top_live = sites("sum(size)")?;
        let top_allocated = sites("sum(CASE WHEN size > 0 THEN size ELSE 0 END)")?;
        out.push(HeapReport {
            pid,
            heap_name: heap,
            peak_bytes,
            peak_ts,
            start_ts,
            allocated_bytes: allocated,
            alloc_count: allocs,
            live_bytes: live,
            live_count,
            top_live,
            top_allocated,
        });
    }
    Ok(out)
}

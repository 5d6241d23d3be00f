//! Heap profiles: `ProfilePacket`s (heapprofd's format, which Tachyon's tracking allocator
//! writes) into Perfetto's `heap_profile_allocation` and `heap_profile` tables, the call stacks
//! into the `stack_profile_*` tables (`profile.rs`); and the memory summary `tachyon stats`
//! prints.
//!
//! Semantics, as Perfetto's `ProfilePacketSequenceState`:
//!
//! - Per sequence, a dump's strings, mappings, frames and callstacks hold until its last packet
//!   (one without `continued`); then its samples become rows and the interned data is dropped.
//!   `index` must count up from 0 by one (else `heapprofd_missing_packet`).
//! - Samples are cumulative per call stack; rows are deltas from the previous dump of the same
//!   (process, callsite) on the sequence: one row with the allocations (`count`, `size` ≥ 0) and
//!   one with the frees (negated, ≤ 0), each only when non-zero. A total that shrinks is
//!   `heapprofd_malformed_packet` (the sample is dropped). A source callstack that maps to a
//!   new callsite (interning changed between dumps) starts from the totals seen before.
//! - `ts` is the dump's `timestamp` on `CLOCK_MONOTONIC_COARSE` converted to trace time (a dump
//!   whose time cannot be converted is skipped); `heap_profile` has one row per (process, dump
//!   time, heap) with the window `start_timestamp`..`timestamp`.
//!
//! Every index and id comes from the trace and is checked: unknown ids are counted
//! (`stackprofile_*`) and the entry skipped, never a panic.
//!
//! Known differences from Perfetto's trace processor: dumps are imported while tokenizing (in
//! file order), so the process of a dump gets its upid then, before processes that a
//! `ProcessTree` later in the file but earlier in time describes (Perfetto creates it in
//! timestamp order); callstacks interned in `InternedData` rather than in the ProfilePacket are
//! not resolved (above); Perfetto forgets the implicit string iid 0 after a dump, Tachyon keeps
//! it.

use tachyon_protos::{ProfilePacketView, TracePacketView};

use crate::profile::MappingParams;
use crate::stats::Stat;
use crate::storage::{Storage, NONE};
use crate::strings::{FxHashMap, StrId};

/// One `heap_profile_allocation` row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AllocRow {
    pub(crate) ts: i64,
    pub(crate) upid: u32,
    pub(crate) heap_name: StrId,
    pub(crate) callsite: u32,
    pub(crate) count: i64,
    pub(crate) size: i64,
}

/// One `heap_profile` row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProfileRow {
    pub(crate) ts: i64,
    pub(crate) ts_end: i64,
    pub(crate) upid: u32,
    pub(crate) heap_name: StrId,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    pid: u64,
    heap_name: StrId,
    ts: i64,
    callstack: u64,
    allocated: u64,
    freed: u64,
    allocs: u64,
    frees: u64,
}

/// A sequence's heap profile state.
#[derive(Debug, Default)]
struct Seq {
    prev_index: Option<u64>,
    strings: FxHashMap<u64, StrId>,
    /// The same strings' bytes where they are not UTF-8 (build ids are raw bytes).
    raw_strings: FxHashMap<u64, Box<[u8]>>,
    mappings: FxHashMap<u64, u32>,
    frames: FxHashMap<u64, u32>,
    callstacks: FxHashMap<u64, u32>,
    pending: Vec<Pending>,
    /// Last totals per (upid, callsite): (alloc row, free row).
    prev: FxHashMap<(u32, u32), (AllocRow, AllocRow)>,
    /// Callsites each (upid, source callstack, heap) resolved to.
    seen: FxHashMap<(u32, u64, StrId), Vec<u32>>,
    /// Totals carried into a source callstack that resolved to a new callsite.
    correction: FxHashMap<u64, (AllocRow, AllocRow)>,
}

/// The heap tables and the per-sequence state that builds them.
#[derive(Debug, Default)]
pub(crate) struct HeapStore {
    pub(crate) allocations: Vec<AllocRow>,
    pub(crate) profiles: Vec<ProfileRow>,
    seen_profiles: FxHashMap<(u32, i64, StrId), ()>,
    seqs: FxHashMap<u32, Seq>,
}

const ART_HEAP: &str = "com.android.art";

/// A `ProfilePacket` on sequence `seq_id` at packet time `packet_ts`; `to_trace` converts a
/// `CLOCK_MONOTONIC_COARSE` reading to trace time.
pub(crate) fn profile_packet(
    st: &mut Storage,
    seq_id: u32,
    packet_ts: i64,
    p: &TracePacketView<'_>,
    to_trace: &mut dyn FnMut(u64) -> Option<i64>,
) -> Result<(), ()> {
    let pp = p.profile_packet().map_err(drop)?;
    let mut seq = st.heap.seqs.remove(&seq_id).unwrap_or_default();
    let r = packet(st, &mut seq, packet_ts, &pp, to_trace);
    st.heap.seqs.insert(seq_id, seq);
    r
}

fn packet(
    st: &mut Storage,
    seq: &mut Seq,
    packet_ts: i64,
    pp: &ProfilePacketView<'_>,
    to_trace: &mut dyn FnMut(u64) -> Option<i64>,
) -> Result<(), ()> {
    let index = pp.index();
    let gap = match seq.prev_index {
        None => index != 0,
        Some(prev) => prev.wrapping_add(1) != index,
    };
    if gap {
        st.stats.inc(Stat::heapprofd_missing_packet);
    }
    seq.prev_index = Some(index);

    if seq.strings.is_empty() {
        let empty = st.strings.intern("");
        seq.strings.insert(0, empty);
    }
    for s in pp.strings() {
        let s = s.map_err(drop)?;
        let id = st.strings.intern_bytes(s.str());
        seq.strings.insert(s.iid(), id);
        if std::str::from_utf8(s.str()).is_err() {
            seq.raw_strings.insert(s.iid(), s.str().into());
        }
    }
    for m in pp.mappings() {
        let m = m.map_err(drop)?;
        let Some(&build_id) = seq.strings.get(&m.build_id()) else {
            st.stats.inc(Stat::stackprofile_invalid_string_id);
            continue;
        };
        let mut name = String::new();
        for c in m.path_string_ids() {
            let c = c.map_err(drop)?;
            match seq.strings.get(&c) {
                Some(&s) => {
                    name.push('/');
                    name.push_str(st.strings.get(s));
                }
                None => {
                    // As Perfetto: the name stops at the first unknown component.
                    st.stats.inc(Stat::stackprofile_invalid_string_id);
                    break;
                }
            }
        }
        let name = st.strings.intern(&name);
        let build_id = match seq.raw_strings.get(&m.build_id()) {
            Some(raw) => raw.to_vec(),
            None => st.strings.get(build_id).as_bytes().to_vec(),
        };
        let params = MappingParams {
            name,
            build_id: &build_id,
            exact_offset: m.exact_offset(),
            start_offset: m.start_offset(),
            start: m.start(),
            end: m.end(),
            load_bias: m.load_bias(),
        };
        let row = st.profile.mapping(&mut st.strings, &params, true);
        seq.mappings.insert(m.iid(), row);
    }
    for f in pp.frames() {
        let f = f.map_err(drop)?;
        let Some(&mapping) = seq.mappings.get(&f.mapping_id()) else {
            st.stats.inc(Stat::stackprofile_invalid_mapping_id);
            continue;
        };
        let Some(&name) = seq.strings.get(&f.function_name_id()) else {
            st.stats.inc(Stat::stackprofile_invalid_string_id);
            continue;
        };
        let name = if st.strings.get(name).is_empty() {
            NONE
        } else {
            name
        };
        let row = st.profile.frame(mapping, f.rel_pc(), name);
        seq.frames.insert(f.iid(), row);
    }
    'stacks: for c in pp.callstacks() {
        let c = c.map_err(drop)?;
        let mut frames = Vec::new();
        for f in c.frame_ids() {
            let f = f.map_err(drop)?;
            match seq.frames.get(&f) {
                Some(&row) => frames.push(row),
                None => {
                    st.stats.inc(Stat::stackprofile_invalid_frame_id);
                    continue 'stacks;
                }
            }
        }
        if frames.is_empty() {
            st.stats.inc(Stat::stackprofile_empty_callstack);
            continue;
        }
        let callsite = st.profile.callsite(&frames);
        seq.callstacks.insert(c.iid(), callsite);
    }

    for d in pp.process_dumps() {
        let d = d.map_err(drop)?;
        let Some(end) = to_trace(d.timestamp()) else {
            st.stats.inc(Stat::clock_sync_failure);
            continue;
        };
        let start = if d.has_start_timestamp() {
            to_trace(d.start_timestamp()).unwrap_or(end)
        } else {
            end
        };
        let pid = d.pid();
        let upid = st.process(pid as i64);
        st.stats.set_indexed(
            Stat::heapprofd_last_profile_timestamp,
            pid as i64,
            packet_ts,
        );
        let heap_name =
            (!d.heap_name_bytes().is_empty()).then(|| st.strings.intern_bytes(d.heap_name_bytes()));
        let heap_name_or_none = heap_name.unwrap_or(NONE);
        if st
            .heap
            .seen_profiles
            .insert((upid, end, heap_name_or_none), ())
            .is_none()
        {
            st.heap.profiles.push(ProfileRow {
                ts: start,
                ts_end: end,
                upid,
                heap_name: heap_name_or_none,
            });
        }
        let flags = [
            (d.disconnected(), Stat::heapprofd_client_disconnected),
            (d.buffer_corrupted(), Stat::heapprofd_buffer_corrupted),
            (d.buffer_overran(), Stat::heapprofd_buffer_overran),
            (d.rejected_concurrent(), Stat::heapprofd_rejected_concurrent),
            (d.hit_guardrail(), Stat::heapprofd_hit_guardrail),
        ];
        for (on, stat) in flags {
            if on {
                st.stats.add_indexed(stat, pid as i64, 1);
            }
        }
        let trustworthy_max_count = d.orig_sampling_interval_bytes() > 0;
        let alloc_heap = heap_name.unwrap_or_else(|| st.strings.intern("unknown"));
        for s in d.samples() {
            let s = s.map_err(drop)?;
            let mut a = Pending {
                pid,
                heap_name: alloc_heap,
                ts: end,
                callstack: s.callstack_id(),
                allocated: 0,
                freed: 0,
                allocs: 0,
                frees: 0,
            };
            if s.has_self_max() {
                a.allocated = s.self_max();
                if trustworthy_max_count {
                    a.allocs = s.self_max_count();
                }
            } else {
                a.allocated = s.self_allocated();
                a.freed = s.self_freed();
                a.allocs = s.alloc_count();
                a.frees = s.free_count();
            }
            seq.pending.push(a);
        }
    }
    if !pp.continued() {
        let pending = std::mem::take(&mut seq.pending);
        for a in &pending {
            add_allocation(st, seq, a);
        }
        seq.strings.clear();
        seq.raw_strings.clear();
        seq.mappings.clear();
        seq.frames.clear();
        seq.callstacks.clear();
    }
    Ok(())
}

fn add_allocation(st: &mut Storage, seq: &mut Seq, a: &Pending) {
    let upid = st.process(a.pid as i64);
    // Perfetto falls back to the callstacks the sequence interned in `InternedData` (its
    // `StackProfileSequenceState`); this importer only knows the ProfilePacket's own, so such
    // samples are counted here and dropped.
    let Some(&callsite) = seq.callstacks.get(&a.callstack) else {
        st.stats.inc(Stat::stackprofile_invalid_callstack_id);
        return;
    };
    let clamp = |v: u64| v.min(i64::MAX as u64) as i64;
    let mut alloc_row = AllocRow {
        ts: a.ts,
        upid,
        heap_name: a.heap_name,
        callsite,
        count: clamp(a.allocs),
        size: clamp(a.allocated),
    };
    let mut free_row = AllocRow {
        count: -clamp(a.frees),
        size: -clamp(a.freed),
        ..alloc_row
    };
    let prev = *seq
        .prev
        .entry((upid, callsite))
        .or_insert((AllocRow::default(), AllocRow::default()));
    let seen = seq
        .seen
        .entry((upid, a.callstack, a.heap_name))
        .or_default();
    if !seen.contains(&callsite) {
        seen.push(callsite);
        seq.correction.insert(a.callstack, prev);
    }
    if let Some(&(ca, cf)) = seq.correction.get(&a.callstack) {
        alloc_row.count = alloc_row.count.saturating_add(ca.count);
        alloc_row.size = alloc_row.size.saturating_add(ca.size);
        free_row.count = free_row.count.saturating_add(cf.count);
        free_row.size = free_row.size.saturating_add(cf.size);
    }
    let alloc_delta = AllocRow {
        count: alloc_row.count.saturating_sub(prev.0.count),
        size: alloc_row.size.saturating_sub(prev.0.size),
        ..alloc_row
    };
    let free_delta = AllocRow {
        count: free_row.count.saturating_sub(prev.1.count),
        size: free_row.size.saturating_sub(prev.1.size),
        ..free_row
    };
    if alloc_delta.count < 0 || alloc_delta.size < 0 || free_delta.count > 0 || free_delta.size > 0
    {
        st.stats
            .add_indexed(Stat::heapprofd_malformed_packet, upid as i64, 1);
        return;
    }
    if alloc_delta.count != 0 || alloc_delta.size != 0 {
        st.heap.allocations.push(alloc_delta);
    }
    if st.strings.get(a.heap_name) != ART_HEAP && (free_delta.count != 0 || free_delta.size != 0) {
        st.heap.allocations.push(free_delta);
    }
    seq.prev.insert((upid, callsite), (alloc_row, free_row));
}

/// End of the file: dumps whose last packet never came are counted.
pub(crate) fn finish(st: &mut Storage) {
    let unfinished = st
        .heap
        .seqs
        .values()
        .filter(|s| !s.pending.is_empty())
        .count();
    if unfinished > 0 {
        st.stats
            .add(Stat::heapprofd_non_finalized_profile, unfinished as i64);
    }
}

/// The tables, with Perfetto's names and columns.
pub(crate) const SCHEMA: &str = "
CREATE TABLE __intrinsic_heap_profile_allocation(
    id INTEGER PRIMARY KEY, ts INTEGER, upid INTEGER, heap_name TEXT, callsite_id INTEGER,
    count INTEGER, size INTEGER);
CREATE VIEW heap_profile_allocation AS SELECT * FROM __intrinsic_heap_profile_allocation;
CREATE TABLE __intrinsic_heap_profile(
    id INTEGER PRIMARY KEY, ts INTEGER, ts_end INTEGER, dur INTEGER, upid INTEGER,
    heap_name TEXT);
CREATE VIEW heap_profile AS SELECT * FROM __intrinsic_heap_profile;
";

/// Copies the rows into the tables of [`SCHEMA`].
pub(crate) fn load(tx: &rusqlite::Connection, st: &Storage) -> rusqlite::Result<()> {
    use rusqlite::params;
    let s = &st.strings;
    let text = |id: u32| (id != NONE).then(|| s.get(id));
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_heap_profile_allocation(id, ts, upid, heap_name, callsite_id, \
         count, size) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    for (i, r) in st.heap.allocations.iter().enumerate() {
        ins.execute(params![
            i as i64,
            r.ts,
            r.upid,
            text(r.heap_name),
            r.callsite,
            r.count,
            r.size
        ])?;
    }
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_heap_profile(id, ts, ts_end, dur, upid, heap_name) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for (i, r) in st.heap.profiles.iter().enumerate() {
        ins.execute(params![
            i as i64,
            r.ts,
            r.ts_end,
            r.ts_end - r.ts,
            r.upid,
            text(r.heap_name)
        ])?;
    }
    Ok(())
}

// === The memory summary (`tachyon stats`) ===

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

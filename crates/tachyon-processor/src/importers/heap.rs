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
//! file order; Perfetto parses them in timestamp order). So that a dump's process is the one
//! the rest of the trace describes (a `ProcessTree` or descriptor usually comes first), rows
//! hold a per-pid slot until the end of the import, when each pid becomes its upid: a process
//! only the dumps name is then created after every other, where Perfetto creates it at the
//! dump's time (only the upid numbering can differ). Callstacks interned in `InternedData` rather than in the ProfilePacket are
//! not resolved (above); Perfetto forgets the implicit string iid 0 after a dump, Tachyon keeps
//! it.

use tachyon_protos::{ProfilePacketView, TracePacketView};

use crate::importers::profile::MappingParams;
use crate::storage::heap::{AllocRow, Pending, ProfileRow, Seq};
use crate::storage::stats::Stat;
use crate::storage::{Storage, NONE};

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
        let upid = st.heap.pid_slot(pid as i64);
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
    let upid = st.heap.pid_slot(a.pid as i64);
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
        *st.heap.malformed.entry(upid).or_default() += 1;
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

/// End of the file (after every sorted event was parsed): the pid slots become upids (a
/// process is created if nothing else described it), and dumps whose last packet never came
/// are counted.
pub(crate) fn finish(st: &mut Storage) {
    let pids = std::mem::take(&mut st.heap.pids);
    st.heap.pid_slots = Default::default();
    let upids: Vec<u32> = pids.iter().map(|&pid| st.process(pid)).collect();
    let upid = |slot: u32| upids.get(slot as usize).copied().unwrap_or(NONE);
    for r in &mut st.heap.allocations {
        r.upid = upid(r.upid);
    }
    for r in &mut st.heap.profiles {
        r.upid = upid(r.upid);
    }
    let mut malformed: Vec<(u32, i64)> = st.heap.malformed.drain().collect();
    malformed.sort_unstable();
    for (slot, n) in malformed {
        st.stats
            .add_indexed(Stat::heapprofd_malformed_packet, upid(slot) as i64, n);
    }

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

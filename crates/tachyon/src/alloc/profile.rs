//! Heap profile dumps as Perfetto `ProfilePacket`s (heapprofd's format).
//!
//! A dump is self-contained: its first packet interns every string, the one mapping, the
//! frames and the callstacks it uses, then the samples follow (several packets with
//! `continued` when there are many); a reader forgets the interned data after the last packet.
//! Samples are cumulative since the session started, per call stack (a reader subtracts
//! consecutive dumps). Dump timestamps are on `CLOCK_MONOTONIC_COARSE`, as Perfetto expects;
//! each dump is preceded by a `ClockSnapshot` tying that clock to the trace clock and BOOTTIME.
//!
//! The coarse clock ticks once per jiffy (4 ms), so two dumps could read the same value and a
//! reader that converts through the latest snapshot at or before it would move the earlier
//! dump to the later one's time. So the coarse clock is read once ([`CoarseBase`], at the
//! first dump) and later values are that reading plus the trace time since: every snapshot
//! states the same linear relation, and each dump converts through its own.

use std::collections::HashMap;

use tachyon_protos::BuiltinClock;

use crate::clock::TRACE_CLOCK_ID;
use crate::writer::TraceWriter;

/// Samples per packet (a dump with more continues in further packets).
const SAMPLES_PER_PACKET: usize = 8192;

/// The frame of allocations made outside every zone.
pub(crate) const NO_ZONE: &str = "(no zone)";

/// Cumulative totals of one call stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub(crate) allocated: u64,
    pub(crate) freed: u64,
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
}

/// One heap's part of a dump.
pub(crate) struct HeapDump<'a> {
    pub(crate) name: &'a str,
    /// 1 in exact mode.
    pub(crate) sampling_interval: u64,
    pub(crate) buffer_overran: bool,
    /// (site, totals), sites with any allocation.
    pub(crate) samples: Vec<(u32, Totals)>,
}

/// `CLOCK_MONOTONIC_COARSE` and the trace clock read together.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CoarseBase {
    trace_ns: u64,
    coarse_ns: u64,
}

impl CoarseBase {
    pub(crate) fn read() -> CoarseBase {
        CoarseBase {
            trace_ns: crate::clock::now(),
            coarse_ns: crate::clock::monotonic_coarse_ns(),
        }
    }

    /// Trace time `t` on the coarse clock.
    fn coarse_of(&self, t: u64) -> u64 {
        (self.coarse_ns as i64 + (t as i64 - self.trace_ns as i64)).max(0) as u64
    }
}

/// Samples of heap `.0` going into one packet.
type Part<'a> = (usize, &'a [(u32, Totals)]);

/// Writes the packets of one dump; `index` counts the sequence's profile packets.
pub(crate) fn write_dump(
    w: &mut TraceWriter,
    index: &mut u64,
    base: CoarseBase,
    start_ns: u64,
    heaps: &[HeapDump<'_>],
    stack_of: &dyn Fn(u32) -> Vec<String>,
) {
    let pid = std::process::id() as u64;
    // The clocks, read together: the dump's time on the trace clock and on the coarse clock.
    let snap = crate::clock::Snapshot::take();
    let (trace_ns, boot_ns) = (snap.trace_ns, snap.boottime_ns);
    let coarse_of = |t: u64| base.coarse_of(t);
    let coarse_ns = coarse_of(trace_ns);
    w.write_packet(|p| {
        p.set_timestamp(trace_ns);
        p.set_timestamp_clock_id(TRACE_CLOCK_ID);
        let mut cs = p.set_clock_snapshot();
        {
            let mut c = cs.add_clocks();
            c.set_clock_id(TRACE_CLOCK_ID);
            c.set_timestamp(trace_ns);
        }
        {
            let mut c = cs.add_clocks();
            c.set_clock_id(BuiltinClock::Boottime as u32);
            c.set_timestamp(boot_ns);
        }
        let mut c = cs.add_clocks();
        c.set_clock_id(BuiltinClock::MonotonicCoarse as u32);
        c.set_timestamp(coarse_ns);
    });

    // Interning: strings (1 = the mapping's name, 2 = its build id, empty: readers forget
    // the implicit iid 0 after a dump), frames by name, callstacks by site.
    let mut strings: Vec<String> = vec!["tachyon zones".to_owned(), String::new()];
    let mut frame_of: HashMap<String, u64> = HashMap::new();
    let mut callstacks: Vec<(u64, Vec<u64>)> = Vec::new();
    let mut seen_sites: HashMap<u32, ()> = HashMap::new();
    for h in heaps {
        for &(site, _) in &h.samples {
            if seen_sites.insert(site, ()).is_some() {
                continue;
            }
            let mut names = stack_of(site);
            if names.is_empty() {
                names.push(NO_ZONE.to_owned());
            }
            let frames = names
                .into_iter()
                .map(|n| {
                    *frame_of.entry(n.clone()).or_insert_with(|| {
                        strings.push(n);
                        strings.len() as u64 // frame iid = its name's string iid
                    })
                })
                .collect();
            callstacks.push((site as u64 + 1, frames));
        }
    }
    let mut frames: Vec<(String, u64)> = frame_of.into_iter().collect();
    frames.sort_by_key(|f| f.1);

    // Samples in packets of at most SAMPLES_PER_PACKET; the interned data in the first.
    let mut chunks: Vec<Vec<Part<'_>>> = vec![Vec::new()];
    let mut room = SAMPLES_PER_PACKET;
    for (hi, h) in heaps.iter().enumerate() {
        let mut rest = &h.samples[..];
        loop {
            let n = rest.len().min(room);
            chunks.last_mut().expect("one").push((hi, &rest[..n]));
            rest = &rest[n..];
            room -= n;
            if room == 0 {
                chunks.push(Vec::new());
                room = SAMPLES_PER_PACKET;
            }
            if rest.is_empty() {
                break;
            }
        }
    }
    if chunks.len() > 1 && chunks.last().is_some_and(Vec::is_empty) {
        chunks.pop();
    }
    let last = chunks.len() - 1;
    for (ci, chunk) in chunks.iter().enumerate() {
        w.write_packet(|p| {
            p.set_timestamp(trace_ns);
            p.set_timestamp_clock_id(TRACE_CLOCK_ID);
            let mut pp = p.set_profile_packet();
            if ci == 0 {
                for (i, s) in strings.iter().enumerate() {
                    let mut e = pp.add_strings();
                    e.set_iid(i as u64 + 1);
                    e.set_str(s.as_bytes());
                }
                {
                    let mut m = pp.add_mappings();
                    m.set_iid(1);
                    m.set_build_id(2);
                    m.set_start(0);
                    m.set_end(0);
                    m.add_path_string_ids(1);
                }
                for &(_, iid) in &frames {
                    let mut f = pp.add_frames();
                    f.set_iid(iid);
                    f.set_function_name_id(iid);
                    f.set_mapping_id(1);
                    // Distinct per frame, so readers that key frames by (mapping, pc) keep
                    // them apart.
                    f.set_rel_pc(iid);
                }
                for (iid, fr) in &callstacks {
                    let mut c = pp.add_callstacks();
                    c.set_iid(*iid);
                    for f in fr {
                        c.add_frame_ids(*f);
                    }
                }
            }
            // Every heap appears in every dump's first packet (even with no samples), so a
            // reader sees the dump of each heap.
            let mut parts: Vec<Part<'_>> = chunk.clone();
            if ci == 0 {
                for hi in 0..heaps.len() {
                    if !parts.iter().any(|(h, _)| *h == hi) {
                        parts.push((hi, &[]));
                    }
                }
            }
            for (hi, samples) in parts {
                let h = &heaps[hi];
                let mut d = pp.add_process_dumps();
                d.set_pid(pid);
                d.set_heap_name(h.name);
                d.set_sampling_interval_bytes(h.sampling_interval);
                d.set_timestamp(coarse_of(trace_ns));
                d.set_start_timestamp(coarse_of(start_ns));
                if h.buffer_overran {
                    d.set_buffer_overran(true);
                }
                for (site, t) in samples {
                    let mut s = d.add_samples();
                    s.set_callstack_id(*site as u64 + 1);
                    s.set_self_allocated(t.allocated);
                    s.set_self_freed(t.freed);
                    s.set_alloc_count(t.allocs);
                    s.set_free_count(t.frees);
                }
            }
            if ci != last {
                pp.set_continued(true);
            }
            pp.set_index(*index);
        });
        *index += 1;
    }
}

//! Heap profile dumps as Perfetto `ProfilePacket`s (heapprofd's format).
//!
//! A dump is self-contained: its first packet interns every string, the mappings, the
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

/// String iids every dump has: the zones' mapping name, and "" (the build id of that mapping
/// and the name of native frames, which a symbolizer names later; written out rather than
/// left to the implicit iid 0, which Perfetto forgets after the first dump).
const ZONES_NAME: u64 = 1;
const EMPTY: u64 = 2;
/// The zones' mapping.
const ZONES_MAPPING: u64 = 1;

struct MappingOut {
    iid: u64,
    build_id: u64,
    exact_offset: u64,
    start_offset: u64,
    start: u64,
    end: u64,
    load_bias: u64,
    /// Path components (string iids), as heapprofd splits a path at '/'.
    path: Vec<u64>,
}

struct FrameOut {
    iid: u64,
    name: u64,
    mapping: u64,
    rel_pc: u64,
}

/// A dump's interning: strings (raw bytes: build ids are binary), mappings, frames and
/// callstacks, each numbered from 1 in its own space.
struct Interned {
    strings: Vec<Vec<u8>>,
    string_iid: HashMap<Vec<u8>, u64>,
    mappings: Vec<MappingOut>,
    /// Module start (or `u64::MAX` for addresses in no module) → mapping iid.
    mapping_iid: HashMap<u64, u64>,
    frames: Vec<FrameOut>,
    zone_frame: HashMap<String, u64>,
    pc_frame: HashMap<u64, u64>,
    /// (iid = site + 1, frame iids outermost first).
    callstacks: Vec<(u64, Vec<u64>)>,
}

impl Default for Interned {
    fn default() -> Self {
        let mut i = Interned {
            strings: Vec::new(),
            string_iid: HashMap::new(),
            mappings: Vec::new(),
            mapping_iid: HashMap::new(),
            frames: Vec::new(),
            zone_frame: HashMap::new(),
            pc_frame: HashMap::new(),
            callstacks: Vec::new(),
        };
        let zones = i.string(b"tachyon zones");
        let empty = i.string(b"");
        debug_assert_eq!((zones, empty), (ZONES_NAME, EMPTY));
        i.mappings.push(MappingOut {
            iid: ZONES_MAPPING,
            build_id: EMPTY,
            exact_offset: 0,
            start_offset: 0,
            start: 0,
            end: 0,
            load_bias: 0,
            path: vec![ZONES_NAME],
        });
        i
    }
}

impl Interned {
    fn string(&mut self, s: &[u8]) -> u64 {
        if let Some(&iid) = self.string_iid.get(s) {
            return iid;
        }
        self.strings.push(s.to_vec());
        let iid = self.strings.len() as u64;
        self.string_iid.insert(s.to_vec(), iid);
        iid
    }

    /// The callstack of `site`: its native frames when it has a stack, else one frame per
    /// zone (or [`NO_ZONE`]).
    fn callstack(&mut self, site: u32, (zones, pcs): (Vec<String>, Vec<u64>)) {
        let frames: Vec<u64> = if pcs.is_empty() {
            let mut names = zones;
            if names.is_empty() {
                names.push(NO_ZONE.to_owned());
            }
            names.into_iter().map(|n| self.zone_frame(n)).collect()
        } else {
            pcs.iter().rev().map(|&pc| self.native_frame(pc)).collect()
        };
        self.callstacks.push((site as u64 + 1, frames));
    }

    fn zone_frame(&mut self, name: String) -> u64 {
        if let Some(&iid) = self.zone_frame.get(&name) {
            return iid;
        }
        let name_iid = self.string(name.as_bytes());
        let iid = self.frames.len() as u64 + 1;
        self.frames.push(FrameOut {
            iid,
            name: name_iid,
            mapping: ZONES_MAPPING,
            // Distinct per frame, so readers that key frames by (mapping, pc) keep them apart.
            rel_pc: iid,
        });
        self.zone_frame.insert(name, iid);
        iid
    }

    /// A frame of a native stack: in the mapping of the binary it is in, at its address
    /// relative to that binary (what a symbolizer looks up), with no name yet.
    fn native_frame(&mut self, pc: u64) -> u64 {
        if let Some(&iid) = self.pc_frame.get(&pc) {
            return iid;
        }
        // There is something for the symbolizer at the end of the session.
        crate::callstack::note_recorded();
        let module = crate::callstack::module_of(pc);
        let (mapping, rel_pc) = match &module {
            Some(m) => (self.mapping(m.start, Some(m)), m.rel_pc(pc)),
            None => (self.mapping(u64::MAX, None), pc),
        };
        let iid = self.frames.len() as u64 + 1;
        self.frames.push(FrameOut {
            iid,
            name: EMPTY,
            mapping,
            rel_pc,
        });
        self.pc_frame.insert(pc, iid);
        iid
    }

    fn mapping(&mut self, key: u64, m: Option<&crate::callstack::Module>) -> u64 {
        if let Some(&iid) = self.mapping_iid.get(&key) {
            return iid;
        }
        let path: &str = m.map_or("[unknown]", |m| &m.path);
        let components: Vec<u64> = path
            .split('/')
            .filter(|c| !c.is_empty())
            .map(|c| self.string(c.as_bytes()))
            .collect();
        let build_id = match m {
            Some(m) if !m.build_id.is_empty() => self.string(&m.build_id),
            _ => EMPTY,
        };
        let iid = self.mappings.len() as u64 + 1;
        self.mappings.push(MappingOut {
            iid,
            build_id,
            exact_offset: m.map_or(0, |m| m.exact_offset),
            start_offset: m.map_or(0, |m| m.start_offset),
            start: m.map_or(0, |m| m.start),
            end: m.map_or(0, |m| m.end),
            load_bias: m.map_or(0, |m| m.load_bias),
            path: components,
        });
        self.mapping_iid.insert(key, iid);
        iid
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
    stack_of: &dyn Fn(u32) -> (Vec<String>, Vec<u64>),
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

    let mut interned = Interned::default();
    let mut seen_sites: HashMap<u32, ()> = HashMap::new();
    for h in heaps {
        for &(site, _) in &h.samples {
            if seen_sites.insert(site, ()).is_none() {
                interned.callstack(site, stack_of(site));
            }
        }
    }
    let Interned {
        strings,
        mappings,
        frames,
        callstacks,
        ..
    } = interned;

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
                    e.set_str(s);
                }
                for m in &mappings {
                    let mut w = pp.add_mappings();
                    w.set_iid(m.iid);
                    w.set_build_id(m.build_id);
                    w.set_exact_offset(m.exact_offset);
                    w.set_start_offset(m.start_offset);
                    w.set_start(m.start);
                    w.set_end(m.end);
                    w.set_load_bias(m.load_bias);
                    for &c in &m.path {
                        w.add_path_string_ids(c);
                    }
                }
                for f in &frames {
                    let mut w = pp.add_frames();
                    w.set_iid(f.iid);
                    w.set_function_name_id(f.name);
                    w.set_mapping_id(f.mapping);
                    w.set_rel_pc(f.rel_pc);
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

//! Interning of captured stacks into a packet sequence's `InternedData`: `mapping_paths`,
//! `build_ids`, `mappings`, `frames` and `callstacks`, each emitted once per sequence and
//! generation, so a repeated stack costs its callstack iid and nothing else.

use std::collections::HashMap;
use std::sync::Arc;

use tachyon_protos::InternedData;

use super::modules::{self, Module, ModuleMap};

/// Key of the mapping for addresses in no loaded binary (JIT code, a bad frame).
const UNKNOWN_MAPPING: u64 = u64::MAX;

/// A sequence's interning table for call stacks, keyed by the frame array.
///
/// [`intern`](Self::intern) gives a stack's `Callstack` iid (allocating only for what it has not
/// seen: a repeated stack is one hash lookup of its addresses); what is new since the last
/// [`write_pending`](Self::write_pending) is kept until that call writes it into the packet's
/// `InternedData`. [`clear`](Self::clear) starts over (an incremental-state clear on the
/// sequence). Used by the SDK's track events and CPU samples, and meant for any other writer
/// of stacks (allocations, crash reports).
#[derive(Debug, Default)]
pub struct CallstackInterner {
    stacks: HashMap<Box<[u64]>, u64, BuildWordHasher>,
    frames: HashMap<u64, u64, BuildWordHasher>,
    mappings: HashMap<u64, u64>,
    paths: HashMap<Arc<str>, u64>,
    build_ids: HashMap<Arc<[u8]>, u64>,
    next_iid: u64,
    modules: Option<Arc<ModuleMap>>,
    pending: Pending,
    scratch: Vec<u64>,
}

/// A multiply-rotate hasher for addresses (FxHash's scheme): the stacks are this process's own
/// return addresses, not attacker-chosen keys, and SipHash over a 10-frame stack was most of a
/// repeated stack's interning cost.
#[derive(Clone, Copy, Debug, Default)]
struct BuildWordHasher;

#[derive(Clone, Copy, Debug, Default)]
struct WordHasher(u64);

impl std::hash::BuildHasher for BuildWordHasher {
    type Hasher = WordHasher;
    fn build_hasher(&self) -> WordHasher {
        WordHasher(0)
    }
}

impl std::hash::Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

#[derive(Debug, Default)]
struct Pending {
    paths: Vec<(u64, Arc<str>)>,
    build_ids: Vec<(u64, Arc<[u8]>)>,
    mappings: Vec<(u64, Module, u64, u64)>,
    /// (iid, mapping iid, rel_pc).
    frames: Vec<(u64, u64, u64)>,
    /// (iid, range in `callstack_frames`).
    callstacks: Vec<(u64, usize, usize)>,
    /// Frame iids of the new callstacks, outermost first.
    callstack_frames: Vec<u64>,
}

impl CallstackInterner {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The iid of the callstack whose frames are `pcs` (innermost first, as
    /// [`capture`](super::capture) writes them); 0 for an empty stack.
    pub fn intern(&mut self, pcs: &[u64]) -> u64 {
        if pcs.is_empty() {
            return 0;
        }
        if let Some(&iid) = self.stacks.get(pcs) {
            return iid;
        }
        let mut frame_iids = std::mem::take(&mut self.scratch);
        frame_iids.clear();
        for &pc in pcs.iter().rev() {
            let f = self.frame(pc);
            frame_iids.push(f);
        }
        super::note_recorded();
        let iid = self.next();
        let start = self.pending.callstack_frames.len();
        self.pending.callstack_frames.extend_from_slice(&frame_iids);
        self.pending
            .callstacks
            .push((iid, start, self.pending.callstack_frames.len()));
        self.stacks.insert(pcs.into(), iid);
        self.scratch = frame_iids;
        iid
    }

    /// Whether [`write_pending`](Self::write_pending) has something to write.
    pub fn has_pending(&self) -> bool {
        !self.pending.callstacks.is_empty()
    }

    /// Writes what was interned since the last call into `d`, and forgets it.
    pub fn write_pending(&mut self, d: &mut InternedData<'_>) {
        let p = &mut self.pending;
        for (iid, path) in p.paths.drain(..) {
            let mut s = d.add_mapping_paths();
            s.set_iid(iid);
            s.set_str(path.as_bytes());
        }
        for (iid, id) in p.build_ids.drain(..) {
            let mut s = d.add_build_ids();
            s.set_iid(iid);
            s.set_str(&id);
        }
        for (iid, m, path_iid, build_iid) in p.mappings.drain(..) {
            let mut w = d.add_mappings();
            w.set_iid(iid);
            if build_iid != 0 {
                w.set_build_id(build_iid);
            }
            w.set_exact_offset(m.exact_offset);
            w.set_start_offset(m.start_offset);
            w.set_start(m.start);
            w.set_end(m.end);
            w.set_load_bias(m.load_bias);
            w.add_path_string_ids(path_iid);
        }
        for (iid, mapping, rel_pc) in p.frames.drain(..) {
            let mut f = d.add_frames();
            f.set_iid(iid);
            f.set_mapping_id(mapping);
            f.set_rel_pc(rel_pc);
        }
        for (iid, start, end) in p.callstacks.drain(..) {
            let mut c = d.add_callstacks();
            c.set_iid(iid);
            for &f in &p.callstack_frames[start..end] {
                c.add_frame_ids(f);
            }
        }
        p.callstack_frames.clear();
    }

    /// Forgets everything (the sequence's interned state was cleared); keeps the capacity.
    pub fn clear(&mut self) {
        self.stacks.clear();
        self.frames.clear();
        self.mappings.clear();
        self.paths.clear();
        self.build_ids.clear();
        self.next_iid = 0;
        let p = &mut self.pending;
        p.paths.clear();
        p.build_ids.clear();
        p.mappings.clear();
        p.frames.clear();
        p.callstacks.clear();
        p.callstack_frames.clear();
    }

    fn next(&mut self) -> u64 {
        self.next_iid += 1;
        self.next_iid
    }

    fn frame(&mut self, pc: u64) -> u64 {
        if let Some(&iid) = self.frames.get(&pc) {
            return iid;
        }
        let module = self.module_of(pc);
        let (mapping, rel_pc) = match module {
            Some(m) => (self.mapping(&m), m.rel_pc(pc)),
            None => (self.unknown_mapping(), pc),
        };
        let iid = self.next();
        self.pending.frames.push((iid, mapping, rel_pc));
        self.frames.insert(pc, iid);
        iid
    }

    fn module_of(&mut self, pc: u64) -> Option<Module> {
        let map = self.modules.get_or_insert_with(modules::current).clone();
        if let Some((_, m)) = map.find(pc) {
            return Some(m.clone());
        }
        let map = modules::rescan(&map);
        self.modules = Some(map.clone());
        map.find(pc).map(|(_, m)| m.clone())
    }

    fn mapping(&mut self, m: &Module) -> u64 {
        if let Some(&iid) = self.mappings.get(&m.start) {
            return iid;
        }
        let path_iid = self.path(&m.path);
        let build_iid = if m.build_id.is_empty() {
            0
        } else if let Some(&iid) = self.build_ids.get(&m.build_id) {
            iid
        } else {
            let iid = self.next();
            self.build_ids.insert(m.build_id.clone(), iid);
            self.pending.build_ids.push((iid, m.build_id.clone()));
            iid
        };
        let iid = self.next();
        self.pending
            .mappings
            .push((iid, m.clone(), path_iid, build_iid));
        self.mappings.insert(m.start, iid);
        iid
    }

    fn unknown_mapping(&mut self) -> u64 {
        if let Some(&iid) = self.mappings.get(&UNKNOWN_MAPPING) {
            return iid;
        }
        let m = Module {
            path: "[unknown]".into(),
            build_id: Arc::from(&[][..]),
            start: 0,
            end: 0,
            exact_offset: 0,
            start_offset: 0,
            load_bias: 0,
            base: 0,
            text_svma: (0, 0),
            eh_frame_hdr: None,
            loads: Arc::from(&[][..]),
        };
        let path_iid = self.path(&m.path);
        let iid = self.next();
        self.pending.mappings.push((iid, m, path_iid, 0));
        self.mappings.insert(UNKNOWN_MAPPING, iid);
        iid
    }

    fn path(&mut self, path: &Arc<str>) -> u64 {
        if let Some(&iid) = self.paths.get(path) {
            return iid;
        }
        let iid = self.next();
        self.paths.insert(path.clone(), iid);
        self.pending.paths.push((iid, path.clone()));
        iid
    }
}

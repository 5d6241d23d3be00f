//! The heap profile tables (`heap_profile_allocation`, `heap_profile`) and the per-sequence
//! state that builds them; `importers::heap` fills them.

use crate::storage::strings::{FxHashMap, StrId};

/// One `heap_profile_allocation` row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AllocRow {
    pub(crate) ts: i64,
    /// During the import, the process's slot in [`HeapStore::pids`]; its upid once
    /// `importers::heap::finish` resolved it.
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
    /// A slot, then a upid, as [`AllocRow::upid`].
    pub(crate) upid: u32,
    pub(crate) heap_name: StrId,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    pub(crate) pid: u64,
    pub(crate) heap_name: StrId,
    pub(crate) ts: i64,
    pub(crate) callstack: u64,
    pub(crate) allocated: u64,
    pub(crate) freed: u64,
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
}

/// A sequence's heap profile state.
#[derive(Debug, Default)]
pub(crate) struct Seq {
    pub(crate) prev_index: Option<u64>,
    pub(crate) strings: FxHashMap<u64, StrId>,
    /// The same strings' bytes where they are not UTF-8 (build ids are raw bytes).
    pub(crate) raw_strings: FxHashMap<u64, Box<[u8]>>,
    pub(crate) mappings: FxHashMap<u64, u32>,
    pub(crate) frames: FxHashMap<u64, u32>,
    pub(crate) callstacks: FxHashMap<u64, u32>,
    pub(crate) pending: Vec<Pending>,
    /// Last totals per (upid, callsite): (alloc row, free row).
    pub(crate) prev: FxHashMap<(u32, u32), (AllocRow, AllocRow)>,
    /// Callsites each (upid, source callstack, heap) resolved to.
    pub(crate) seen: FxHashMap<(u32, u64, StrId), Vec<u32>>,
    /// Totals carried into a source callstack that resolved to a new callsite.
    pub(crate) correction: FxHashMap<u64, (AllocRow, AllocRow)>,
}

/// The heap tables and the per-sequence state that builds them.
#[derive(Debug, Default)]
pub(crate) struct HeapStore {
    pub(crate) allocations: Vec<AllocRow>,
    pub(crate) profiles: Vec<ProfileRow>,
    pub(crate) seen_profiles: FxHashMap<(u32, i64, StrId), ()>,
    pub(crate) seqs: FxHashMap<u32, Seq>,
    /// The pids of the dumps, in order of first appearance (a row's slot indexes this).
    pub(crate) pids: Vec<i64>,
    pub(crate) pid_slots: FxHashMap<i64, u32>,
    /// `heapprofd_malformed_packet` counts by slot, until the slots become upids.
    pub(crate) malformed: FxHashMap<u32, i64>,
}

impl HeapStore {
    /// The slot of `pid`, added if new.
    pub(crate) fn pid_slot(&mut self, pid: i64) -> u32 {
        *self.pid_slots.entry(pid).or_insert_with(|| {
            self.pids.push(pid);
            (self.pids.len() - 1) as u32
        })
    }
}

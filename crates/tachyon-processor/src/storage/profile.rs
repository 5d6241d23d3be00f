//! The call-stack and CPU-sample tables (`stack_profile_*`, `perf_sample`, `cpu_profile_stack_sample`,
//! `__intrinsic_track_event_callstacks`) and their interning indexes; `importers::profile` fills them.

use crate::storage::strings::{FxHashMap, StrId};

#[derive(Clone, Debug)]
pub(crate) struct MappingRow {
    /// Hex of the raw build id ("" when the binary has none, as Perfetto).
    pub(crate) build_id: StrId,
    /// The raw build id, for matching `ModuleSymbols`.
    pub(crate) build_id_raw: Box<[u8]>,
    pub(crate) exact_offset: u64,
    pub(crate) start_offset: u64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) load_bias: u64,
    pub(crate) name: StrId,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct FrameRow {
    pub(crate) name: StrId,
    pub(crate) mapping: u32,
    pub(crate) rel_pc: u64,
    pub(crate) symbol_set: u32,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct CallsiteRow {
    pub(crate) depth: u32,
    pub(crate) parent: u32,
    pub(crate) frame: u32,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct SymbolRow {
    pub(crate) set: u32,
    pub(crate) name: StrId,
    pub(crate) file: StrId,
    pub(crate) line: Option<u32>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct PerfSampleRow {
    pub(crate) ts: i64,
    pub(crate) utid: u32,
    pub(crate) cpu: Option<u32>,
    pub(crate) cpu_mode: StrId,
    pub(crate) callsite: u32,
    pub(crate) unwind_error: StrId,
    pub(crate) session: u32,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct TrackEventCallstackRow {
    pub(crate) slice: u32,
    pub(crate) track: u32,
    pub(crate) callsite: u32,
    pub(crate) end_callsite: u32,
    /// The event's `callstack_weight`.
    pub(crate) weight: Option<f64>,
}

/// A sample between tokenizing and parsing (its thread is resolved once sorted).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PendingSample {
    pub(crate) pid: u32,
    pub(crate) tid: u32,
    pub(crate) cpu: Option<u32>,
    pub(crate) cpu_mode: StrId,
    pub(crate) callsite: u32,
    pub(crate) unwind_error: StrId,
    pub(crate) session: u32,
}

/// A StreamingProfilePacket sample before sorting: the sequence's thread, its stack.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PendingCpuSample {
    pub(crate) pid: i64,
    pub(crate) tid: i64,
    pub(crate) callsite: u32,
    pub(crate) priority: i32,
}

/// A `cpu_profile_stack_sample` row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuSampleRow {
    pub(crate) ts: i64,
    pub(crate) utid: u32,
    pub(crate) callsite: u32,
    pub(crate) priority: i32,
}

/// One source line of a symbolized address: function, file (NONE: unknown), line.
pub(crate) type SymbolLine = (StrId, StrId, Option<u32>);

/// A `ModuleSymbols` packet, kept until the end of the file.
#[derive(Debug)]
pub(crate) struct ModuleSymbols {
    pub(crate) path: StrId,
    pub(crate) build_id: Box<[u8]>,
    /// (address, lines) with lines as (function, file, line).
    pub(crate) addresses: Vec<(u64, Vec<SymbolLine>)>,
}

/// Identity of a shared mapping.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MappingKey {
    pub(crate) name: StrId,
    pub(crate) build_id: Box<[u8]>,
    pub(crate) exact_offset: u64,
    pub(crate) start_offset: u64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) load_bias: u64,
}

/// The trace's call-stack tables and their interning (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct StackProfile {
    pub(crate) mappings: Vec<MappingRow>,
    pub(crate) frames: Vec<FrameRow>,
    pub(crate) callsites: Vec<CallsiteRow>,
    pub(crate) symbols: Vec<SymbolRow>,
    pub(crate) perf_samples: Vec<PerfSampleRow>,
    pub(crate) track_event_callstacks: Vec<TrackEventCallstackRow>,
    /// `callstack_weight`s of track events, referenced from the upper half of their event's
    /// `data` (index + 1; the lower half is the callsite + 1).
    pub(crate) callstack_weights: Vec<f64>,
    pub(crate) pending_samples: Vec<PendingSample>,
    /// StreamingProfilePacket samples (`import/streaming.rs`): tokenized, then as sorted.
    pub(crate) pending_cpu_samples: Vec<PendingCpuSample>,
    pub(crate) cpu_samples: Vec<CpuSampleRow>,
    pub(crate) module_symbols: Vec<ModuleSymbols>,
    pub(crate) shared_mappings: FxHashMap<MappingKey, u32>,
    pub(crate) frame_index: FxHashMap<(u32, u64, StrId), u32>,
    pub(crate) dummy_frames: FxHashMap<(bool, SymbolLine), u32>,
    /// The dummy mappings of interned frames without a mapping (false) and of inline track
    /// event stacks (true).
    pub(crate) dummy_mappings: [Option<u32>; 2],
    pub(crate) callsite_index: FxHashMap<(u32, u32), u32>,
    pub(crate) next_perf_session: u32,
}

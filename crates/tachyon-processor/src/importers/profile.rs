//! Call stacks and CPU samples: Perfetto's `stack_profile_mapping`, `stack_profile_frame`,
//! `stack_profile_callsite`, `stack_profile_symbol`, `perf_sample` and
//! `__intrinsic_track_event_callstacks` tables.
//!
//! Two halves, as in Perfetto (`StackProfileSequenceState` + `MappingTracker`):
//!
//! - [`SeqProfile`], per packet sequence and generation: the interned `build_ids`,
//!   `mapping_paths`, `source_paths`, `function_names`, `mappings`, `frames` and `callstacks`
//!   as the producer wrote them (raw), and which table rows each iid already became.
//! - [`StackProfile`], for the whole trace: the rows and their interning. A mapping of an event
//!   with no process (track events), or with an empty address range, is shared by every
//!   sequence that describes it identically; a mapping of a process's sample is that process's
//!   own row, as Perfetto's `CreateUserMemoryMapping`. Frames are unique per mapping and
//!   (relative pc, name); callsites per (parent, frame). Anything that records stacks (track
//!   events, CPU samples, heap profiles) resolves them through [`resolve_callstack`] into the same
//!   rows.
//!
//! Stacks are resolved while tokenizing (interned data is only valid in file order on its
//! sequence); the events carry the callsite id through the sorter. Symbols (`ModuleSymbols`
//! packets, which the symbolizer appends) are applied at the end of the file, to every frame of
//! the matching mappings (same path, and the same build id if the packet names one).
//!
//! Nothing here reads a file: mapping paths are only names.

use tachyon_protos::{InternedDataView, ModuleSymbolsView, PerfSampleView, TrackEventView};

use crate::storage::profile::{
    CallsiteRow, CpuSampleRow, FrameRow, MappingKey, MappingRow, ModuleSymbols, PendingSample,
    PerfSampleRow, StackProfile, SymbolLine, SymbolRow,
};
use crate::storage::stats::Stat;
use crate::storage::strings::{FxHashMap, StrId, StringPool};
use crate::storage::{Storage, NONE};

/// Frames beyond this depth of one stack are dropped (a hostile trace cannot make a callsite
/// chain as long as the file).
const MAX_STACK_DEPTH: usize = 1024;

/// A mapping as a producer describes it, resolved to strings.
#[derive(Debug)]
pub(crate) struct MappingParams<'a> {
    pub(crate) name: StrId,
    pub(crate) build_id: &'a [u8],
    pub(crate) exact_offset: u64,
    pub(crate) start_offset: u64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) load_bias: u64,
}

impl StackProfile {
    /// A mapping row: shared (one row per identical description) or, for a process's own
    /// address space, a new row each time (the caller caches it per sequence and iid).
    pub(crate) fn mapping(
        &mut self,
        strings: &mut StringPool,
        p: &MappingParams<'_>,
        shared: bool,
    ) -> u32 {
        let key = MappingKey {
            name: p.name,
            build_id: p.build_id.into(),
            exact_offset: p.exact_offset,
            start_offset: p.start_offset,
            start: p.start,
            end: p.end,
            load_bias: p.load_bias,
        };
        if shared {
            if let Some(&id) = self.shared_mappings.get(&key) {
                return id;
            }
        }
        let id = self.mappings.len() as u32;
        let hex: String = p.build_id.iter().map(|b| format!("{b:02x}")).collect();
        let build_id = strings.intern(&hex);
        self.mappings.push(MappingRow {
            build_id,
            build_id_raw: p.build_id.into(),
            exact_offset: p.exact_offset,
            start_offset: p.start_offset,
            start: p.start,
            end: p.end,
            load_bias: p.load_bias,
            name: p.name,
        });
        if shared {
            self.shared_mappings.insert(key, id);
        }
        id
    }

    /// The frame at `rel_pc` of `mapping` named `name` (NONE: not symbolized).
    pub(crate) fn frame(&mut self, mapping: u32, rel_pc: u64, name: StrId) -> u32 {
        *self
            .frame_index
            .entry((mapping, rel_pc, name))
            .or_insert_with(|| {
                let id = self.frames.len() as u32;
                self.frames.push(FrameRow {
                    name,
                    mapping,
                    rel_pc,
                    symbol_set: NONE,
                });
                id
            })
    }

    /// A frame known only by its function (and source line): Perfetto's dummy frames, in a
    /// mapping of their own (named `track_event_inline` for inline track event stacks, "" for
    /// interned frames without a mapping), with a symbol row of their name and line.
    pub(crate) fn dummy_frame(
        &mut self,
        strings: &mut StringPool,
        inline: bool,
        name: StrId,
        file: StrId,
        line: Option<u32>,
    ) -> u32 {
        if let Some(&id) = self.dummy_frames.get(&(inline, (name, file, line))) {
            return id;
        }
        let mapping = match self.dummy_mappings[usize::from(inline)] {
            Some(m) => m,
            None => {
                let (label, end) = if inline {
                    ("track_event_inline", u64::MAX)
                } else {
                    ("", 0)
                };
                let label = strings.intern(label);
                let m = self.mapping(
                    strings,
                    &MappingParams {
                        name: label,
                        build_id: &[],
                        exact_offset: 0,
                        start_offset: 0,
                        start: 0,
                        end,
                        load_bias: 0,
                    },
                    false,
                );
                self.dummy_mappings[usize::from(inline)] = Some(m);
                m
            }
        };
        let id = self.frames.len() as u32;
        self.frames.push(FrameRow {
            name,
            mapping,
            rel_pc: 0,
            symbol_set: NONE,
        });
        let set = self.symbol_set(&[(name, file, line)]);
        self.frames[id as usize].symbol_set = set;
        self.dummy_frames.insert((inline, (name, file, line)), id);
        id
    }

    /// The callsite of `frames` (outermost first): the chain of callsites from the root, each
    /// unique per (parent, frame). NONE for an empty stack.
    pub(crate) fn callsite(&mut self, frames: &[u32]) -> u32 {
        let mut parent = NONE;
        for (depth, &frame) in frames.iter().take(MAX_STACK_DEPTH).enumerate() {
            parent = *self
                .callsite_index
                .entry((parent, frame))
                .or_insert_with(|| {
                    let id = self.callsites.len() as u32;
                    self.callsites.push(CallsiteRow {
                        depth: depth as u32,
                        parent,
                        frame,
                    });
                    id
                });
        }
        parent
    }

    /// A new symbol set of `lines` (function, file, line); its id is its first row's.
    pub(crate) fn symbol_set(&mut self, lines: &[SymbolLine]) -> u32 {
        let set = self.symbols.len() as u32;
        for &(name, file, line) in lines {
            self.symbols.push(SymbolRow {
                set,
                name,
                file,
                // As Perfetto: a line number without a file is dropped.
                line: if file == NONE { None } else { line },
            });
        }
        set
    }

    /// Applies the `ModuleSymbols` packets of the trace to the frames of their mappings.
    fn apply_symbols(&mut self, stats: &mut crate::storage::stats::Stats) {
        let mut by_mapping_pc: FxHashMap<(u32, u64), Vec<u32>> = FxHashMap::default();
        for (i, f) in self.frames.iter().enumerate() {
            by_mapping_pc
                .entry((f.mapping, f.rel_pc))
                .or_default()
                .push(i as u32);
        }
        for m in std::mem::take(&mut self.module_symbols) {
            let mappings: Vec<u32> = self
                .mappings
                .iter()
                .enumerate()
                .filter(|(_, r)| {
                    r.name == m.path && (m.build_id.is_empty() || *r.build_id_raw == *m.build_id)
                })
                .map(|(i, _)| i as u32)
                .collect();
            if mappings.is_empty() {
                stats.inc(Stat::stackprofile_invalid_mapping_id);
                continue;
            }
            for (address, lines) in &m.addresses {
                if lines.is_empty() {
                    continue;
                }
                let set = self.symbol_set(lines);
                let mut found = false;
                for &mapping in &mappings {
                    if let Some(frames) = by_mapping_pc.get(&(mapping, *address)) {
                        for &f in frames {
                            self.frames[f as usize].symbol_set = set;
                            found = true;
                        }
                    }
                }
                if !found {
                    stats.inc(Stat::stackprofile_invalid_frame_id);
                }
            }
        }
    }
}

/// A sequence's interned call-stack data (raw) and what it resolved to.
#[derive(Debug, Default)]
pub(crate) struct SeqProfile {
    build_ids: FxHashMap<u64, Box<[u8]>>,
    mapping_paths: FxHashMap<u64, StrId>,
    source_paths: FxHashMap<u64, StrId>,
    function_names: FxHashMap<u64, StrId>,
    mappings: FxHashMap<u64, RawMapping>,
    frames: FxHashMap<u64, RawFrame>,
    callstacks: FxHashMap<u64, Box<[u64]>>,
    /// (pid or -1, iid) → row.
    mapping_rows: FxHashMap<(i64, u64), u32>,
    frame_rows: FxHashMap<(i64, u64), u32>,
    callsite_rows: FxHashMap<(i64, u64), u32>,
    perf_session: Option<u32>,
}

#[derive(Debug)]
struct RawMapping {
    build_id: u64,
    exact_offset: u64,
    start_offset: u64,
    start: u64,
    end: u64,
    load_bias: u64,
    paths: Box<[u64]>,
}

#[derive(Debug, Clone, Copy)]
struct RawFrame {
    function_name: u64,
    mapping: u64,
    rel_pc: u64,
    source_path: Option<u64>,
    line: Option<u32>,
}

impl SeqProfile {
    /// An incremental-state clear: everything interned is forgotten (rows stay).
    pub(crate) fn clear(&mut self) {
        let session = self.perf_session;
        *self = SeqProfile::default();
        self.perf_session = session;
    }
}

/// Takes the call-stack part of a packet's `InternedData`.
pub(crate) fn ingest_interned(
    seq: &mut SeqProfile,
    d: &InternedDataView<'_>,
    strings: &mut StringPool,
) -> Result<(), ()> {
    for s in d.build_ids() {
        let s = s.map_err(drop)?;
        seq.build_ids.insert(s.iid(), s.str().into());
    }
    for s in d.mapping_paths() {
        let s = s.map_err(drop)?;
        seq.mapping_paths
            .insert(s.iid(), strings.intern_bytes(s.str()));
    }
    for s in d.source_paths() {
        let s = s.map_err(drop)?;
        seq.source_paths
            .insert(s.iid(), strings.intern_bytes(s.str()));
    }
    for s in d.function_names() {
        let s = s.map_err(drop)?;
        seq.function_names
            .insert(s.iid(), strings.intern_bytes(s.str()));
    }
    for m in d.mappings() {
        let m = m.map_err(drop)?;
        seq.mappings.insert(
            m.iid(),
            RawMapping {
                build_id: m.build_id(),
                exact_offset: m.exact_offset(),
                start_offset: m.start_offset(),
                start: m.start(),
                end: m.end(),
                load_bias: m.load_bias(),
                paths: m.path_string_ids().filter_map(Result::ok).collect(),
            },
        );
    }
    for f in d.frames() {
        let f = f.map_err(drop)?;
        seq.frames.insert(
            f.iid(),
            RawFrame {
                function_name: f.function_name_id(),
                mapping: f.mapping_id(),
                rel_pc: f.rel_pc(),
                source_path: f.has_source_path_iid().then(|| f.source_path_iid()),
                line: f.has_line_number().then(|| f.line_number()),
            },
        );
    }
    for c in d.callstacks() {
        let c = c.map_err(drop)?;
        seq.callstacks
            .insert(c.iid(), c.frame_ids().filter_map(Result::ok).collect());
    }
    Ok(())
}

/// The callsite (leaf) of the sequence's callstack `iid`, for process `pid` (None: an event of
/// no particular process, whose mappings are shared). Counts and returns None when something
/// it refers to is missing, as Perfetto does.
pub(crate) fn resolve_callstack(
    seq: &mut SeqProfile,
    st: &mut Storage,
    pid: Option<i64>,
    iid: u64,
) -> Option<u32> {
    let scope = pid.unwrap_or(-1);
    if let Some(&c) = seq.callsite_rows.get(&(scope, iid)) {
        return Some(c);
    }
    let Some(frame_iids) = seq.callstacks.get(&iid).cloned() else {
        // Counted for samples; a track event's unknown stack is silently absent (Perfetto).
        if pid.is_some() {
            st.stats.inc(Stat::stackprofile_invalid_callstack_id);
        }
        return None;
    };
    let mut frames = Vec::with_capacity(frame_iids.len().min(MAX_STACK_DEPTH));
    for &f in frame_iids.iter().take(MAX_STACK_DEPTH) {
        frames.push(resolve_frame(seq, st, scope, f)?);
    }
    if frames.is_empty() {
        return None;
    }
    let c = st.profile.callsite(&frames);
    seq.callsite_rows.insert((scope, iid), c);
    Some(c)
}

fn resolve_frame(seq: &mut SeqProfile, st: &mut Storage, scope: i64, iid: u64) -> Option<u32> {
    if let Some(&f) = seq.frame_rows.get(&(scope, iid)) {
        return Some(f);
    }
    let Some(raw) = seq.frames.get(&iid).copied() else {
        st.stats.inc(Stat::stackprofile_invalid_frame_id);
        return None;
    };
    let name = if raw.function_name == 0 {
        NONE
    } else {
        match seq.function_names.get(&raw.function_name) {
            Some(&n) => n,
            None => {
                st.stats.inc(Stat::stackprofile_invalid_string_id);
                return None;
            }
        }
    };
    let file = match raw.source_path {
        None => NONE,
        Some(p) => match seq.source_paths.get(&p) {
            Some(&f) => f,
            None => {
                st.stats.inc(Stat::stackprofile_invalid_string_id);
                return None;
            }
        },
    };
    let f = if raw.mapping == 0 {
        st.profile
            .dummy_frame(&mut st.strings, false, name, file, raw.line)
    } else {
        let mapping = resolve_mapping(seq, st, scope, raw.mapping)?;
        let f = st.profile.frame(mapping, raw.rel_pc, name);
        if (file != NONE || raw.line.is_some()) && st.profile.frames[f as usize].symbol_set == NONE
        {
            let set = st.profile.symbol_set(&[(name, file, raw.line)]);
            st.profile.frames[f as usize].symbol_set = set;
        }
        f
    };
    seq.frame_rows.insert((scope, iid), f);
    Some(f)
}

fn resolve_mapping(seq: &mut SeqProfile, st: &mut Storage, scope: i64, iid: u64) -> Option<u32> {
    if let Some(&m) = seq.mapping_rows.get(&(scope, iid)) {
        return Some(m);
    }
    let Some(raw) = seq.mappings.get(&iid) else {
        st.stats.inc(Stat::stackprofile_invalid_mapping_id);
        return None;
    };
    // The name is the path components joined with '/', a component that is a whole path
    // keeping its single leading '/' (Perfetto's `MakeMappingName`); a missing component ends
    // the name.
    let mut name = String::new();
    for p in raw.paths.iter() {
        match seq.mapping_paths.get(p) {
            Some(&s) => {
                name.push('/');
                name.push_str(st.strings.get(s));
            }
            None => break,
        }
    }
    if name.starts_with("//") {
        name.remove(0);
    }
    let build_id: Box<[u8]> = if raw.build_id == 0 {
        Box::default()
    } else {
        match seq.build_ids.get(&raw.build_id) {
            Some(b) => b.clone(),
            None => {
                st.stats.inc(Stat::stackprofile_invalid_string_id);
                return None;
            }
        }
    };
    let name = st.strings.intern(&name);
    let params = MappingParams {
        name,
        build_id: &build_id,
        exact_offset: raw.exact_offset,
        start_offset: raw.start_offset,
        start: raw.start,
        end: raw.end,
        load_bias: raw.load_bias,
    };
    let shared = scope < 0 || raw.start >= raw.end;
    let m = st.profile.mapping(&mut st.strings, &params, shared);
    seq.mapping_rows.insert((scope, iid), m);
    Some(m)
}

/// The callsite of a track event's stack (interned `callstack_iid`, or an inline `callstack`
/// of function names), if it has one.
/// The `callstack_weight` of a track event whose `data` holds its callsite (see
/// [`StackProfile::callstack_weights`]).
pub(crate) fn event_callstack_weight(p: &StackProfile, data: u64) -> Option<f64> {
    let index = (data >> 32) as usize;
    index
        .checked_sub(1)
        .and_then(|i| p.callstack_weights.get(i).copied())
}

pub(crate) fn track_event_callsite(
    seq: &mut SeqProfile,
    st: &mut Storage,
    pid: Option<i64>,
    ev: &TrackEventView<'_>,
) -> Option<u32> {
    if ev.has_callstack_iid() {
        let iid = ev.callstack_iid();
        let Some(pid) = pid else {
            return resolve_callstack(seq, st, None, iid);
        };
        // Unknown stacks of track events are not counted (Perfetto counts only samples').
        if !seq.callstacks.contains_key(&iid) {
            return None;
        }
        return resolve_callstack(seq, st, Some(pid), iid);
    }
    if !ev.has_callstack() {
        return None;
    }
    let cs = ev.callstack().ok()?;
    let mut frames = Vec::new();
    for f in cs.frames().take(MAX_STACK_DEPTH) {
        let Ok(f) = f else {
            st.stats.inc(Stat::track_event_tokenizer_errors);
            return None;
        };
        let name = st.strings.intern_bytes(f.function_name_bytes());
        let file = if f.has_source_file() {
            st.strings.intern_bytes(f.source_file_bytes())
        } else {
            NONE
        };
        let line = f.has_line_number().then(|| f.line_number());
        frames.push(
            st.profile
                .dummy_frame(&mut st.strings, true, name, file, line),
        );
    }
    (!frames.is_empty()).then(|| st.profile.callsite(&frames))
}

/// A `PerfSample`: its stack resolved now; the index of the pending sample to give the
/// `PerfSample` event, or None when the packet is not a sample (lost records, skips) or is
/// malformed.
pub(crate) fn tokenize_perf_sample(
    seq: &mut SeqProfile,
    st: &mut Storage,
    s: &PerfSampleView<'_>,
) -> Option<u64> {
    if s.kernel_records_lost() > 0 {
        st.stats.add_indexed(
            Stat::perf_cpu_lost_records,
            i64::from(s.cpu()),
            s.kernel_records_lost().min(i64::MAX as u64) as i64,
        );
        return None;
    }
    if s.has_sample_skipped_reason() && matches!(s.sample_skipped_reason_raw(), 1..=3) {
        st.stats.inc(Stat::perf_samples_skipped);
    }
    let session = *seq.perf_session.get_or_insert_with(|| {
        let id = st.profile.next_perf_session;
        st.profile.next_perf_session += 1;
        id
    });
    let callsite = if s.has_callstack_iid() {
        resolve_callstack(seq, st, Some(i64::from(s.pid())), s.callstack_iid()).unwrap_or(NONE)
    } else {
        NONE
    };
    let cpu_mode = match s.cpu_mode_raw() {
        1 => st.strings.intern("kernel"),
        2 => st.strings.intern("user"),
        3 => st.strings.intern("hypervisor"),
        4 => st.strings.intern("guest_kernel"),
        5 => st.strings.intern("guest_user"),
        _ => NONE,
    };
    let unwind_error = if s.has_unwind_error() {
        let name = match s.unwind_error_raw() {
            1 => "none",
            2 => "memory_invalid",
            3 => "unwind_info",
            4 => "unsupported",
            5 => "invalid_map",
            6 => "max_frames_exceeded",
            7 => "repeated_frame",
            8 => "invalid_elf",
            9 => "system_call",
            10 => "thread_timeout",
            11 => "thread_does_not_exist",
            12 => "bad_arch",
            13 => "maps_parse",
            14 => "invalid_parameter",
            15 => "ptrace_call",
            _ => "unknown",
        };
        st.strings.intern(name)
    } else {
        NONE
    };
    let idx = st.profile.pending_samples.len() as u64;
    st.profile.pending_samples.push(PendingSample {
        pid: s.pid(),
        tid: s.tid(),
        cpu: s.has_cpu().then(|| s.cpu()),
        cpu_mode,
        callsite,
        unwind_error,
        session,
    });
    Some(idx)
}

/// A sorted `PerfSample` event: the row, with its thread.
pub(crate) fn apply_perf_sample(st: &mut Storage, ts: i64, idx: u64) {
    let Some(&s) = st.profile.pending_samples.get(idx as usize) else {
        return;
    };
    let utid = st.thread(i64::from(s.tid), Some(i64::from(s.pid)));
    st.profile.perf_samples.push(PerfSampleRow {
        ts,
        utid,
        cpu: s.cpu,
        cpu_mode: s.cpu_mode,
        callsite: s.callsite,
        unwind_error: s.unwind_error,
        session: s.session,
    });
}

/// A sorted StreamingProfilePacket sample (`CpuProfileSample` event): the row, with its thread.
pub(crate) fn apply_cpu_profile_sample(st: &mut Storage, ts: i64, idx: u64) {
    let Some(&s) = st.profile.pending_cpu_samples.get(idx as usize) else {
        return;
    };
    let utid = st.thread(s.tid, Some(s.pid));
    st.profile.cpu_samples.push(CpuSampleRow {
        ts,
        utid,
        callsite: s.callsite,
        priority: s.priority,
    });
}

/// Keeps a `ModuleSymbols` packet for the end of the file.
pub(crate) fn queue_module_symbols(st: &mut Storage, m: &ModuleSymbolsView<'_>) -> Result<(), ()> {
    let path = st.strings.intern_bytes(m.path_bytes());
    let mut addresses = Vec::new();
    for a in m.address_symbols() {
        let a = a.map_err(drop)?;
        let mut lines = Vec::new();
        for l in a.lines() {
            let l = l.map_err(drop)?;
            let name = st.strings.intern_bytes(l.function_name_bytes());
            let file = if l.source_file_name_bytes().is_empty() {
                NONE
            } else {
                st.strings.intern_bytes(l.source_file_name_bytes())
            };
            lines.push((name, file, l.has_line_number().then(|| l.line_number())));
        }
        addresses.push((a.address(), lines));
    }
    st.profile.module_symbols.push(ModuleSymbols {
        path,
        build_id: m.build_id().into(),
        addresses,
    });
    Ok(())
}

/// End of the file: symbols applied.
pub(crate) fn finish(st: &mut Storage) {
    let Storage { profile, stats, .. } = st;
    profile.apply_symbols(stats);
}

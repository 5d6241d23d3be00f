//! Parsing: sorted events become rows of the slice, counter, flow, track, thread, process and
//! args tables.
//!
//! Slices are matched per track with a stack: a begin pushes (depth = stack height, parent =
//! top), an end pops and sets `dur`, an instant is a zero-length slice at the current depth.
//! Slices still open at the end keep `dur = -1` ("did not end"). Args of a begin and its end
//! are merged into one arg set.
//!
//! Tracks are created the first time an event uses them, following Perfetto's
//! `TrackEventTracker`: a descriptor with a thread is that thread's track (type
//! `thread_execution`), one with a process is a `process_track_event` track of that process,
//! and a descriptor with neither inherits its parent's thread or process, or is global if no
//! ancestor has one. Such a child track is merged with its siblings of the same name (or
//! `sibling_merge_key`), as Perfetto's track compressor merges them ([`Merged`]:
//! `*_merged_track_event` tracks, shared by uuids whose slices do not overlap), unless it is a
//! counter (`*_counter_track_event`), a state track, or its `sibling_merge_behavior` is `NONE`
//! (`thread_track_event`, `process_track_event`, `global_track_event`: one track per uuid). As
//! in Perfetto, `track.parent_id` is set only when the parent is itself a child track or a
//! global track; children of a thread's or process's own track are tied to it through
//! `utid`/`upid`.

use crate::importers::compressor::{Step, TrackGroup};
use crate::importers::{
    Event, EventKind, Parser, Reservation, LEGACY_SCOPE_GLOBAL, LEGACY_SCOPE_PROCESS,
};
use crate::storage::profile::TrackEventCallstackRow;
use crate::storage::stats::Stat;
use crate::storage::strings::{FxHashMap, StrId};
use crate::storage::{name_priority, ArgValue, EventType, SliceRow, TrackRow, NONE};

/// Deeper stacks are refused (Perfetto has the same kind of limit); a runaway producer that
/// never ends its slices would otherwise make every later begin slower.
const MAX_DEPTH: usize = 1024;
// A slice's depth is stored in 16 bits (`SliceRow::depth`).
const _: () = assert!(MAX_DEPTH <= u16::MAX as usize);
/// Longest parent_uuid chain considered, as in Perfetto.
const MAX_ANCESTORS: usize = 100;

/// Where a track's events belong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Scope {
    Thread(u32),
    Process(u32),
    Global,
}

/// An open slice on its track's stack, and where its arg set's late args start
/// (`Storage::arg_mark` when it began): a slice end that carries args merges them into the set
/// from there (`end_args.rs`). Kept here rather than in a map by arg set, so a slice costs no
/// hash insert and remove.
#[derive(Clone, Copy, Debug)]
struct Open {
    slice: u32,
    mark: usize,
}

/// The open slices of each track, by track id. Track ids are dense (positions in the track
/// table), so this is a vector rather than a map: every slice begin and end looks its track's
/// stack up twice.
#[derive(Debug, Default)]
struct Stacks(Vec<Vec<Open>>);

impl Stacks {
    /// Track `track`'s stack, created empty if new.
    fn entry(&mut self, track: u32) -> &mut Vec<Open> {
        let i = track as usize;
        if i >= self.0.len() {
            self.0.resize_with(i + 1, Vec::new);
        }
        &mut self.0[i]
    }

    fn get(&self, track: &u32) -> Option<&Vec<Open>> {
        self.0.get(*track as usize)
    }

    fn get_mut(&mut self, track: &u32) -> Option<&mut Vec<Open>> {
        self.0.get_mut(*track as usize)
    }
}

#[derive(Debug, Default)]
pub(crate) struct ParseState {
    /// uuid → track id.
    tracks: FxHashMap<u64, u32>,
    /// upid (`NONE`: global) → its legacy instant track.
    legacy_tracks: FxHashMap<u32, u32>,
    /// The descriptor track uuid of each thread and process that has one: a second uuid for
    /// the same thread (process) means its tid (pid) was reused, as Perfetto reads it.
    uuid_by_utid: FxHashMap<u32, u64>,
    uuid_by_upid: FxHashMap<u32, u64>,
    /// uuid → (scope, is root), once resolved.
    scopes: FxHashMap<u64, (Scope, bool)>,
    /// utid → its `thread` track.
    thread_tracks: FxHashMap<u32, u32>,
    /// Open slices per track.
    stacks: Stacks,
    /// Flow id → the slice that last carried it.
    flows: FxHashMap<u64, u32>,
    /// Track → flows arriving at the next slice that begins on it (legacy phase `f` without
    /// `bind_to_enclosing`).
    flows_to_next: FxHashMap<u32, Vec<u64>>,
    /// (utid, track type) → the thread's `thread_time` / `thread_instructions` track.
    thread_counter_tracks: FxHashMap<(u32, &'static str), u32>,
    /// Descriptor tracks merged with their siblings ([`Merged`]): uuid → how.
    merged: FxHashMap<u64, Merged>,
    /// (scope, parent uuid, merge key type, merge key) → index in `merge_sets`.
    merge_index: FxHashMap<(Scope, u64, u32, StrId), u32>,
    /// Each merge group's tracks (the uuids are the cookies).
    merge_sets: Vec<TrackGroup>,
}

/// A child track that Perfetto's track compressor merges with its siblings of the same name
/// (or `sibling_merge_key`): every non-root track but counters, state tracks and those whose
/// `sibling_merge_behavior` is `NONE`. The siblings share a [`TrackGroup`], the uuid its
/// cookie: uuids whose slices do not overlap in time share one track.
#[derive(Clone, Copy, Debug)]
struct Merged {
    set: u32,
    scope: Scope,
    /// The name its tracks get: the descriptor's, else its first event's.
    name: StrId,
    merge_type: u32,
    key: StrId,
    parent_uuid: u64,
    /// The parent's track, when the merged tracks link to it (`parent_id`).
    parent_track: u32,
}

impl Parser {
    pub(crate) fn apply_batch(&mut self, batch: &mut Vec<Event>) {
        for ev in batch.drain(..) {
            self.apply(&ev);
        }
    }

    pub(crate) fn apply(&mut self, ev: &Event) {
        self.apply_event(ev);
        self.arena_args.release(ev.args, ev.nargs);
    }

    fn apply_event(&mut self, ev: &Event) {
        match ev.kind {
            EventKind::Thread => {
                let a = self.aux[ev.data as usize];
                // A descriptor's thread is its track's (which tells reused tids apart).
                let scope = match self.aux_uuid.get(&ev.data) {
                    Some(&uuid) => self.resolve(uuid),
                    None => None,
                };
                let utid = match scope {
                    Some((Scope::Thread(utid), _)) => utid,
                    _ => self.st.thread(a.tid, a.pid),
                };
                self.st
                    .set_thread_name(utid, a.name, name_priority::TRACK_DESCRIPTOR);
            }
            EventKind::Process => {
                // As Perfetto's `SetProcessNameIfUnset`: a descriptor does not override a name
                // the system (ProcessTree) or an earlier descriptor gave.
                let a = self.aux[ev.data as usize];
                let scope = match self.aux_uuid.get(&ev.data) {
                    Some(&uuid) => self.resolve(uuid),
                    None => None,
                };
                let upid = match scope {
                    Some((Scope::Process(upid), _)) => upid,
                    _ => self.st.process(a.pid.unwrap_or(0)),
                };
                if let Some(app) = self
                    .aux_uuid
                    .get(&ev.data)
                    .and_then(|u| self.reservations.get(u)?.host_app)
                {
                    self.st.push_process_arg(
                        upid,
                        "chrome.host_app_package_name",
                        ArgValue::Str(app),
                    );
                }
                let p = &mut self.st.processes[upid as usize];
                if p.name == NONE {
                    p.name = a.name;
                }
                if p.cmdline == NONE {
                    p.cmdline = a.cmdline;
                }
            }
            EventKind::TreeProcess => {
                let a = self.aux[ev.data as usize];
                let extra = self
                    .tree_process_extra
                    .get(&ev.data)
                    .copied()
                    .unwrap_or_default();
                self.apply_tree_process(&a, extra);
            }
            EventKind::TreeThread => {
                let a = self.aux[ev.data as usize];
                self.apply_tree_thread(&a);
            }
            EventKind::SystemCounter => self.apply_system_counter(ev),
            EventKind::PerfSample => {
                crate::importers::profile::apply_perf_sample(&mut self.st, ev.ts, ev.data)
            }
            EventKind::CpuProfileSample => {
                crate::importers::profile::apply_cpu_profile_sample(&mut self.st, ev.ts, ev.data)
            }
            EventKind::Log => {
                let track = self.event_track(ev, NONE);
                self.apply_log(ev, track);
            }
            EventKind::Counter => {
                if let Some(track) = self.event_track(ev, NONE) {
                    self.st.counters.push(crate::storage::CounterRow {
                        ts: ev.ts,
                        track,
                        value: f64::from_bits(ev.data),
                    });
                }
            }
            EventKind::SliceBegin | EventKind::Instant | EventKind::Complete => {
                let step = if ev.kind == EventKind::SliceBegin {
                    Step::Begin
                } else {
                    Step::Instant
                };
                let Some(track) = self.event_track_at(ev, ev.name, step) else {
                    return;
                };
                self.close_completed(track, ev.ts);
                // Where this slice's late args will start (nothing below adds any before
                // `args_for`).
                let mark = self.st.arg_mark();
                let stack = self.parse.stacks.entry(track);
                if stack.len() >= MAX_DEPTH {
                    self.st.stats.inc(Stat::slice_max_depth_exceeded);
                    return;
                }
                let id = self.st.slices.len() as u32;
                let parent = stack.last().map_or(NONE, |o| o.slice);
                let depth = stack.len() as u16; // Below MAX_DEPTH.
                let open = Open { slice: id, mark };
                let dur = match ev.kind {
                    EventKind::SliceBegin => {
                        stack.push(open);
                        -1
                    }
                    EventKind::Complete => {
                        // On the stack until a later event on the track starts at or after
                        // its end, so that what it encloses nests under it.
                        stack.push(open);
                        ev.data.min(i64::MAX as u64) as i64
                    }
                    _ => 0,
                };
                if ev.kind == EventKind::Complete && dur == 0 {
                    self.st.zero_length_zones.push(id);
                }
                let arg_set = self.args_for(NONE, ev);
                self.st.slices.push(SliceRow {
                    ts: ev.ts,
                    dur,
                    track,
                    name_id: self.st.slice_names.intern(ev.category, ev.name),
                    depth,
                    parent,
                    arg_set,
                });
                if ev.kind != EventKind::Complete && ev.data != 0 {
                    self.st
                        .profile
                        .track_event_callstacks
                        .push(TrackEventCallstackRow {
                            slice: id,
                            track,
                            callsite: (ev.data as u32).wrapping_sub(1),
                            end_callsite: NONE,
                            weight: crate::importers::profile::event_callstack_weight(
                                &self.st.profile,
                                ev.data,
                            ),
                        });
                }
                self.flows_for(id, ev);
                // Legacy flows waiting for the next slice are rare: most traces never hash
                // the track here.
                if !self.parse.flows_to_next.is_empty() {
                    if let Some(ids) = self.parse.flows_to_next.remove(&track) {
                        for flow in ids {
                            self.flow_arrives(flow, id, true);
                        }
                    }
                }
            }
            EventKind::State => {
                if let Some(track) = self.event_track(ev, NONE) {
                    self.apply_state(ev, track);
                }
            }
            EventKind::SliceEnd => {
                let Some(track) = self.event_track_at(ev, NONE, Step::End) else {
                    return;
                };
                self.close_completed(track, ev.ts);
                // The innermost slice still open (completed slices above it end with it).
                let slices = &self.st.slices;
                let open = self.parse.stacks.get_mut(&track).and_then(|stack| {
                    let at = stack
                        .iter()
                        .rposition(|o| slices[o.slice as usize].dur == -1)?;
                    let open = stack[at];
                    stack.truncate(at);
                    Some(open)
                });
                let Some(Open { slice: id, mark }) = open else {
                    self.st.stats.inc(Stat::misplaced_end_event);
                    return;
                };
                let existing = self.st.slices[id as usize].arg_set;
                let arg_set = if existing == NONE {
                    self.args_for(NONE, ev)
                } else {
                    if ev.nargs != 0 {
                        self.merge_end_args(existing, mark, ev);
                    }
                    existing
                };
                let row = &mut self.st.slices[id as usize];
                row.dur = ev.ts.saturating_sub(row.ts);
                row.arg_set = arg_set;
                if row.dur == 0 {
                    self.st.zero_length_zones.push(id);
                }
                if ev.data != 0 {
                    self.st
                        .profile
                        .track_event_callstacks
                        .push(TrackEventCallstackRow {
                            slice: id,
                            track,
                            callsite: NONE,
                            end_callsite: (ev.data as u32).wrapping_sub(1),
                            weight: crate::importers::profile::event_callstack_weight(
                                &self.st.profile,
                                ev.data,
                            ),
                        });
                }
                self.flows_for(id, ev);
            }
            EventKind::TrackRename => {
                // Before the track exists, a rename is just the newest name. Once it exists,
                // a name its descriptor gave is its merge key and stays, unless the track is
                // never merged; a name taken from its first event gives way to the
                // descriptor's, as in Perfetto.
                let Some(r) = self.reservations.get_mut(&ev.track) else {
                    return;
                };
                let had_name = r.name.is_some();
                let fixed = had_name && !r.never_merged;
                let name = ev.data as StrId;
                if let Some(m) = self.parse.merged.get_mut(&ev.track) {
                    // A merged uuid's tracks keep a name its descriptor gave; one taken from
                    // its first event gives way, on the track the uuid holds.
                    if !fixed {
                        r.name = Some(name);
                        m.name = name;
                        if let Some(track) = self.parse.merge_sets[m.set as usize].held_by(ev.track)
                        {
                            self.st.tracks[track as usize].name = name;
                        }
                    }
                    return;
                }
                match self.parse.tracks.get(&ev.track) {
                    None => r.name = Some(name),
                    Some(_) if fixed => {}
                    Some(&track) => {
                        r.name = Some(name);
                        self.st.tracks[track as usize].name = name;
                    }
                }
            }
            EventKind::ThreadTime | EventKind::ThreadInstructions => {
                let Some(track) = self.event_track(ev, NONE) else {
                    return;
                };
                let utid = self.st.tracks[track as usize].utid;
                if utid == NONE {
                    // Thread time on a process or global track: no thread to charge it to.
                    self.st
                        .stats
                        .inc(Stat::track_event_thread_counter_without_thread);
                    return;
                }
                let (name, kind) = if ev.kind == EventKind::ThreadTime {
                    ("thread_time", "thread_time")
                } else {
                    ("thread_instruction_count", "thread_instructions")
                };
                let track = match self.parse.thread_counter_tracks.get(&(utid, kind)) {
                    Some(&t) => t,
                    None => {
                        let dims = self.st.new_arg_set();
                        self.st
                            .push_arg_str_key(dims, "utid", ArgValue::Int(utid as i64));
                        let id = self.st.tracks.len() as u32;
                        self.st.tracks.push(TrackRow {
                            name: self.st.strings.intern(name),
                            kind,
                            event_type: EventType::Counter,
                            dimension_arg_set: dims,
                            parent: NONE,
                            source_arg_set: NONE,
                            utid,
                            upid: NONE,
                            unit: NONE,
                            description: NONE,
                        });
                        self.parse.thread_counter_tracks.insert((utid, kind), id);
                        id
                    }
                };
                self.st.counters.push(crate::storage::CounterRow {
                    ts: ev.ts,
                    track,
                    value: f64::from_bits(ev.data),
                });
            }
            EventKind::FlowOut
            | EventKind::FlowStep
            | EventKind::FlowIn
            | EventKind::FlowEnd
            | EventKind::FlowEndNext => {
                let Some(track) = self.event_track(ev, NONE) else {
                    return;
                };
                if ev.kind == EventKind::FlowEndNext {
                    self.parse
                        .flows_to_next
                        .entry(track)
                        .or_default()
                        .push(ev.data);
                    return;
                }
                self.close_completed(track, ev.ts);
                let Some(slice) = self
                    .parse
                    .stacks
                    .get(&track)
                    .and_then(|s| Some(s.last()?.slice))
                else {
                    self.st.stats.inc(Stat::flow_without_enclosing_slice);
                    return;
                };
                match ev.kind {
                    EventKind::FlowOut => {
                        self.parse.flows.insert(ev.data, slice);
                    }
                    EventKind::FlowStep => {
                        if let Some(prev) = self.parse.flows.insert(ev.data, slice) {
                            self.push_flow(prev, slice, ev.data);
                        } else {
                            self.st.stats.inc(Stat::flow_step_without_start);
                        }
                    }
                    EventKind::FlowIn => self.flow_arrives(ev.data, slice, false),
                    _ => self.flow_arrives(ev.data, slice, true),
                }
            }
        }
    }

    /// Pops the completed (`X`) slices on top of `track`'s stack that end at or before `ts`.
    fn close_completed(&mut self, track: u32, ts: i64) {
        let Some(stack) = self.parse.stacks.get_mut(&track) else {
            return;
        };
        while let Some(top) = stack.last() {
            let row = &self.st.slices[top.slice as usize];
            if row.dur < 0 || row.ts.saturating_add(row.dur) > ts {
                break;
            }
            stack.pop();
        }
    }

    /// A flow arrives at `slice`: linked from the slice that carried it last; `close` ends it.
    fn flow_arrives(&mut self, flow: u64, slice: u32, close: bool) {
        let prev = if close {
            self.parse.flows.remove(&flow)
        } else {
            self.parse.flows.get(&flow).copied()
        };
        match prev {
            Some(prev) => self.push_flow(prev, slice, flow),
            None => self.st.stats.inc(Stat::flow_end_without_start),
        }
    }

    /// Records a flow between the slice that carried `trace_id` last and the one it arrives
    /// at, oriented as [`flow_direction`] says.
    fn push_flow(&mut self, carrier: u32, slice: u32, trace_id: u64) {
        let (slice_out, slice_in) = flow_direction(&self.st.slices, carrier, slice);
        self.st.flows.push(crate::storage::FlowRow {
            slice_out,
            slice_in,
            trace_id,
        });
    }

    /// Moves an event's args into arg set `set` (a new one if `NONE`); returns the set.
    pub(crate) fn args_for(&mut self, set: u32, ev: &Event) -> u32 {
        if ev.nargs == 0 {
            return set;
        }
        // The common case: no placeholders, every id in one page.
        if !self.arena_args.has_placeholders() {
            if let Some(ids) = self.arena_args.ids(ev.args, ev.nargs) {
                let set = if set == NONE {
                    self.st.new_arg_set()
                } else {
                    set
                };
                self.st.args.push_ids(set, ids);
                return set;
            }
        }
        let (merging, mut set) = (set != NONE, set);
        let range = ev.args as usize..(ev.args + ev.nargs) as usize;
        for i in range {
            let Some(id) = self.arena_args.id(i) else {
                continue;
            };
            if self.arena_args.is_placeholder(id) {
                let a = self.st.args.entry(id);
                // An arg decided at parse time (`legacy.rs`: the emitting thread).
                let Some(v) = self.passthrough_utid(i, ev, merging) else {
                    continue;
                };
                if set == NONE {
                    set = self.st.new_arg_set();
                }
                self.st.push_arg(set, a.flat_key, a.flat_key, v);
                continue;
            }
            if set == NONE {
                set = self.st.new_arg_set();
            }
            // Already deduplicated when it was tokenized (`arg_arena.rs`).
            self.st.args.push_id(set, id);
        }
        set
    }

    /// Flow v2 semantics: each of `flow_ids` links the slice that last carried the id to this
    /// one (and this one becomes the carrier); each of `terminating_flow_ids` links and ends.
    #[inline]
    fn flows_for(&mut self, slice: u32, ev: &Event) {
        if ev.nflows == 0 && ev.nterm == 0 {
            return;
        }
        let start = ev.flows as usize;
        let ids = start..start + ev.nflows as usize;
        let terms = ids.end..ids.end + ev.nterm as usize;
        for i in ids {
            let id = self.arena_flows[i];
            if let Some(prev) = self.parse.flows.insert(id, slice) {
                self.push_flow(prev, slice, id);
            }
        }
        for i in terms {
            let id = self.arena_flows[i];
            match self.parse.flows.remove(&id) {
                Some(prev) => self.push_flow(prev, slice, id),
                None => self.st.stats.inc(Stat::flow_end_without_start),
            }
        }
    }

    pub(crate) fn finish_parse(&mut self) {
        // The arenas were only needed until every event was parsed.
        self.arena_args = Default::default();
        self.arena_flows = Vec::new();
        self.arena_logs = Vec::new();
    }

    // === Tracks ===

    /// The track id of an event: its legacy thread's track or its uuid's (a merged uuid's
    /// group's first track).
    #[inline]
    fn event_track(&mut self, ev: &Event, event_name: StrId) -> Option<u32> {
        self.event_track_at(ev, event_name, Step::Default)
    }

    /// As [`Parser::event_track`], for a slice's begin, end or instant (which pick a merged
    /// uuid's track, [`Merged`]).
    #[inline]
    fn event_track_at(&mut self, ev: &Event, event_name: StrId, step: Step) -> Option<u32> {
        if !ev.legacy_thread {
            return self.intern_track_at(ev.track, event_name, step);
        }
        self.legacy_event_track(ev)
    }

    /// [`Parser::event_track`] of an event on a legacy thread or async track.
    fn legacy_event_track(&mut self, ev: &Event) -> Option<u32> {
        if ev.track & crate::importers::legacy::ASYNC_TRACK != 0 {
            return self.async_track(ev.track, ev.name);
        }
        // Resolved anew each time: the pid or tid may have been reused since.
        let (pid, tid, scope) = self.legacy_threads[ev.track as usize];
        let utid = self.st.thread(tid, pid);
        Some(match scope {
            LEGACY_SCOPE_PROCESS => {
                let upid = self.st.threads[utid as usize].upid;
                self.legacy_instant_track(upid)
            }
            LEGACY_SCOPE_GLOBAL => self.legacy_instant_track(NONE),
            _ => self.thread_track(utid),
        })
    }

    /// The track of legacy instants with process scope (of process `upid`) or global scope
    /// (`upid` = `NONE`).
    fn legacy_instant_track(&mut self, upid: u32) -> u32 {
        if let Some(&t) = self.parse.legacy_tracks.get(&upid) {
            return t;
        }
        let dims = self.st.new_arg_set();
        if upid != NONE {
            self.st
                .push_arg_str_key(dims, "upid", ArgValue::Int(upid as i64));
        }
        let src = self.st.new_arg_set();
        let chrome = self.st.strings.intern("chrome");
        self.st
            .push_arg_str_key(src, "source", ArgValue::Str(chrome));
        let (kind, name) = if upid == NONE {
            (
                "chrome_global_instant",
                self.st.strings.intern("Global Legacy Events"),
            )
        } else {
            ("chrome_process_instant", NONE)
        };
        let id = self.st.tracks.len() as u32;
        self.st.tracks.push(TrackRow {
            name,
            kind,
            event_type: EventType::Slice,
            dimension_arg_set: dims,
            parent: NONE,
            source_arg_set: src,
            utid: NONE,
            upid,
            unit: NONE,
            description: NONE,
        });
        self.parse.legacy_tracks.insert(upid, id);
        id
    }

    /// The track id for `uuid`, created on first use. `event_name` names global child tracks
    /// that have no name of their own, as in Perfetto. Inline: a track seen before (every
    /// event's but the first on it) is one map lookup, without a call.
    #[inline]
    fn intern_track(&mut self, uuid: u64, event_name: StrId) -> Option<u32> {
        self.intern_track_at(uuid, event_name, Step::Default)
    }

    /// [`Parser::intern_track`] for an event that does `step`.
    #[inline]
    fn intern_track_at(&mut self, uuid: u64, event_name: StrId, step: Step) -> Option<u32> {
        if let Some(&t) = self.parse.tracks.get(&uuid) {
            return Some(t);
        }
        match self.parse.merged.get(&uuid) {
            Some(&m) => Some(self.merged_track(uuid, m, step)),
            None => self.create_track(uuid, event_name, step),
        }
    }

    /// The track of merged uuid `uuid` (its group `m`) for an event that does `step`
    /// ([`TrackGroup::pick`], with the uuid as the cookie), made if new.
    fn merged_track(&mut self, uuid: u64, m: Merged, step: Step) -> u32 {
        let group = &mut self.parse.merge_sets[m.set as usize];
        let at = group.pick(uuid, step);
        let track = group.track(at);
        if track != NONE {
            return track;
        }
        let id = self.new_merged_track(uuid, m, at as u32);
        self.parse.merge_sets[m.set as usize].set_track(at, id);
        id
    }

    /// Track `index` of merged uuid `uuid`'s group, made for that uuid (as Perfetto's track
    /// factory makes it: the group's dimensions and the index; the uuid's source args).
    #[cold]
    fn new_merged_track(&mut self, uuid: u64, m: Merged, index: u32) -> u32 {
        let r = self.reservations.get(&uuid).cloned().unwrap_or_default();
        let kind = match m.scope {
            Scope::Thread(_) => "thread_merged_track_event",
            Scope::Process(_) => "process_merged_track_event",
            Scope::Global => "global_merged_track_event",
        };
        let (dims, utid, upid) = self.scope_dimensions(m.scope);
        self.st.push_arg_str_key(
            dims,
            "parent_track_uuid",
            ArgValue::Int(m.parent_uuid as i64),
        );
        self.st
            .push_arg_str_key(dims, "merge_key_type", ArgValue::Int(m.merge_type as i64));
        if m.key != NONE {
            self.st
                .push_arg_str_key(dims, "merge_key_value", ArgValue::Str(m.key));
        }
        self.st
            .push_arg_str_key(dims, "track_compressor_idx", ArgValue::Int(index as i64));
        let src = self.descriptor_source_args(uuid, &r, false);
        let id = self.st.tracks.len() as u32;
        self.st.tracks.push(TrackRow {
            name: m.name,
            kind,
            event_type: EventType::Slice,
            dimension_arg_set: dims,
            parent: m.parent_track,
            source_arg_set: src,
            utid,
            upid,
            unit: NONE,
            description: r.description.unwrap_or(NONE),
        });
        id
    }

    /// [`Parser::intern_track_at`] of a track not seen yet (a merged uuid is registered in its
    /// group, [`Merged`], and the event's track picked there).
    #[cold]
    #[inline(never)]
    fn create_track(&mut self, uuid: u64, event_name: StrId, step: Step) -> Option<u32> {
        let (scope, is_root) = self.resolve(uuid)?;
        let r = self.reservations.get(&uuid).cloned().unwrap_or_default();
        let parent_uuid = r.parent;
        let mut parent_track = NONE;
        let mut parent_is_root = false;
        if parent_uuid != 0 {
            parent_track = self.intern_track(parent_uuid, NONE).unwrap_or(NONE);
            parent_is_root = self.parse.scopes.get(&parent_uuid).is_some_and(|s| s.1);
        }
        let is_counter = r.counter.is_some();
        if !is_root && !is_counter && !r.state && !r.never_merged {
            let name = match r.name {
                Some(n) => n,
                None if uuid == 0 && !self.reservations.contains_key(&0) => {
                    self.st.strings.intern("Default Track")
                }
                None => event_name,
            };
            let (merge_type, key) = match r.merge_key {
                Some(k) => (2, k),
                None => (0, name),
            };
            let sets = &mut self.parse.merge_sets;
            let set = *self
                .parse
                .merge_index
                .entry((scope, parent_uuid, merge_type, key))
                .or_insert_with(|| {
                    sets.push(TrackGroup::default());
                    sets.len() as u32 - 1
                });
            let parent_track = if parent_uuid != 0 && !parent_is_root {
                parent_track
            } else {
                NONE
            };
            let m = Merged {
                set,
                scope,
                name,
                merge_type,
                key,
                parent_uuid,
                parent_track,
            };
            self.parse.merged.insert(uuid, m);
            return Some(self.merged_track(uuid, m, step));
        }
        let id = if is_root
            && !is_counter
            && !r.state
            && !r.disallow_merging
            && matches!(scope, Scope::Thread(_))
        {
            let Scope::Thread(utid) = scope else {
                unreachable!()
            };
            self.thread_track(utid)
        } else {
            let kind = match (scope, is_counter) {
                (Scope::Thread(_), _) if r.state => "thread_state_track_event",
                (Scope::Process(_), _) if r.state => "process_state_track_event",
                (Scope::Global, _) if r.state => "global_state_track_event",
                (Scope::Thread(_), false) => "thread_track_event",
                (Scope::Thread(_), true) => "thread_counter_track_event",
                (Scope::Process(_), false) => "process_track_event",
                (Scope::Process(_), true) => "process_counter_track_event",
                (Scope::Global, false) => "global_track_event",
                (Scope::Global, true) => "global_counter_track_event",
            };
            let name = match (r.name, &r.counter) {
                (Some(n), _) => n,
                (None, Some(c)) if c.builtin_type == 1 => self.st.strings.intern("thread_time"),
                (None, Some(c)) if c.builtin_type == 2 => {
                    self.st.strings.intern("thread_instruction_count")
                }
                (None, None) if uuid == 0 => self.st.strings.intern("Default Track"),
                (None, None) if !is_root => event_name,
                _ => NONE,
            };
            // Children of a thread's or process's own track hang off it through utid/upid,
            // not parent_id (Perfetto keeps that for back-compat); other children link up.
            let parent = if parent_uuid != 0 && !parent_is_root {
                parent_track
            } else {
                NONE
            };
            let (dims, utid, upid) = self.scope_dimensions(scope);
            self.st
                .push_arg_str_key(dims, "track_uuid", ArgValue::Int(uuid as i64));
            let src = self.descriptor_source_args(uuid, &r, is_root);
            let id = self.st.tracks.len() as u32;
            self.st.tracks.push(TrackRow {
                name,
                kind,
                event_type: if is_counter {
                    EventType::Counter
                } else if r.state {
                    EventType::State
                } else {
                    EventType::Slice
                },
                dimension_arg_set: dims,
                parent,
                source_arg_set: src,
                utid,
                upid,
                unit: r.counter.as_ref().and_then(|c| c.unit).unwrap_or(NONE),
                description: r.description.unwrap_or(NONE),
            });
            id
        };
        self.parse.tracks.insert(uuid, id);
        Some(id)
    }

    /// A new dimension arg set holding a track's thread (`utid`) or process (`upid`), and those
    /// ids (`NONE` where the scope has none).
    fn scope_dimensions(&mut self, scope: Scope) -> (u32, u32, u32) {
        let (utid, upid) = match scope {
            Scope::Thread(u) => (u, NONE),
            Scope::Process(p) => (NONE, p),
            Scope::Global => (NONE, NONE),
        };
        let dims = self.st.new_arg_set();
        if utid != NONE {
            self.st
                .push_arg_str_key(dims, "utid", ArgValue::Int(utid as i64));
        }
        if upid != NONE {
            self.st
                .push_arg_str_key(dims, "upid", ArgValue::Int(upid as i64));
        }
        (dims, utid, upid)
    }

    /// A descriptor track's source args (as Perfetto's `AddTrackArgs`).
    fn descriptor_source_args(&mut self, uuid: u64, r: &Reservation, is_root: bool) -> u32 {
        let src = self.st.new_arg_set();
        let descriptor = self.st.strings.intern("descriptor");
        self.st
            .push_arg_str_key(src, "source", ArgValue::Str(descriptor));
        self.st
            .push_arg_str_key(src, "trace_id", ArgValue::Int(uuid as i64));
        self.st.push_arg_str_key(
            src,
            "is_root_in_scope",
            ArgValue::Bool(uuid == 0 || is_root),
        );
        if uuid != 0 && self.first_packet_seqs.contains_key(&r.seq_id) {
            self.st
                .push_arg_str_key(src, "has_first_packet_on_sequence", ArgValue::Bool(true));
        }
        if let Some(c) = &r.counter {
            if let Some(cat) = c.category {
                self.st
                    .push_arg_str_key(src, "category", ArgValue::Str(cat));
            }
            if let Some(k) = c.y_axis_share_key {
                self.st
                    .push_arg_str_key(src, "y_axis_share_key", ArgValue::Str(k));
            }
        }
        let ordering = match r.child_ordering {
            1 => Some("lexicographic"),
            2 => Some("chronological"),
            3 => Some("explicit"),
            _ => None,
        };
        if let Some(o) = ordering {
            let o = self.st.strings.intern(o);
            self.st
                .push_arg_str_key(src, "child_ordering", ArgValue::Str(o));
        }
        if let Some(rank) = r.sibling_order_rank {
            self.st
                .push_arg_str_key(src, "sibling_order_rank", ArgValue::Int(rank as i64));
        }
        if let Some(d) = r.description {
            self.st
                .push_arg_str_key(src, "description", ArgValue::Str(d));
        }
        src
    }

    /// The track of a thread's own slices (one per utid; Perfetto's type for it is
    /// `thread_execution`, the track its thread-scoped root descriptor resolves to).
    fn thread_track(&mut self, utid: u32) -> u32 {
        if let Some(&t) = self.parse.thread_tracks.get(&utid) {
            return t;
        }
        let dims = self.st.new_arg_set();
        self.st
            .push_arg_str_key(dims, "utid", ArgValue::Int(utid as i64));
        let id = self.st.tracks.len() as u32;
        self.st.tracks.push(TrackRow {
            name: NONE,
            kind: "thread_execution",
            event_type: EventType::Slice,
            dimension_arg_set: dims,
            parent: NONE,
            source_arg_set: NONE,
            utid,
            upid: NONE,
            unit: NONE,
            description: NONE,
        });
        self.parse.thread_tracks.insert(utid, id);
        id
    }

    /// Whether the root track asked for explicit (process, thread) ordering.
    fn explicit_order(&self) -> (bool, bool) {
        self.reservations.get(&0).map_or((false, false), |r| {
            (r.explicit_process_order, r.explicit_thread_order)
        })
    }

    /// Scope of a track uuid and whether it is the root of that scope; `None` (with a stat)
    /// if its ancestry is broken.
    pub(crate) fn resolve(&mut self, uuid: u64) -> Option<(Scope, bool)> {
        if let Some(&s) = self.parse.scopes.get(&uuid) {
            return Some(s);
        }
        // Validate the whole chain first: a loop or a missing ancestor drops the event.
        let mut seen = Vec::new();
        let mut cur = uuid;
        loop {
            if cur == 0 && !seen.is_empty() {
                break;
            }
            if seen.contains(&cur) || seen.len() >= MAX_ANCESTORS {
                self.st.stats.inc(Stat::track_event_track_hierarchy_loop);
                return None;
            }
            seen.push(cur);
            match self.reservations.get(&cur) {
                Some(r) => {
                    if r.parent == 0 {
                        break;
                    }
                    cur = r.parent;
                }
                // The track itself may be undescribed (events on a bare uuid are global);
                // an ancestor may not.
                None if cur == uuid => break,
                None => {
                    self.st.stats.inc(Stat::track_hierarchy_missing_uuid);
                    return None;
                }
            }
        }
        let r = self.reservations.get(&uuid).cloned().unwrap_or_default();
        let result = if let Some(tid) = r.tid {
            let mut utid = self.st.thread(tid, r.pid);
            match self.parse.uuid_by_utid.insert(utid, uuid) {
                Some(old) if old != uuid => {
                    utid = self.st.start_new_thread(tid, r.pid);
                    self.parse.uuid_by_utid.insert(utid, uuid);
                }
                _ => {}
            }
            if let (Some(rank), true) = (r.sibling_order_rank, self.explicit_order().1) {
                self.st
                    .push_thread_arg(utid, "thread_sort_index_hint", ArgValue::Int(rank as i64));
            }
            (Scope::Thread(utid), true)
        } else if let Some(pid) = r.pid {
            let mut upid = self.st.process(pid);
            match self.parse.uuid_by_upid.insert(upid, uuid) {
                Some(old) if old != uuid => {
                    upid = self.st.start_new_process(pid);
                    self.parse.uuid_by_upid.insert(upid, uuid);
                }
                _ => {}
            }
            if let (Some(rank), true) = (r.sibling_order_rank, self.explicit_order().0) {
                self.st.push_process_arg(
                    upid,
                    "process_sort_index_hint",
                    ArgValue::Int(rank as i64),
                );
            }
            (Scope::Process(upid), true)
        } else if r.parent != 0 {
            match self.resolve(r.parent)? {
                (Scope::Global, _) => (Scope::Global, false),
                (s, _) => (s, false),
            }
        } else {
            (Scope::Global, false)
        };
        self.parse.scopes.insert(uuid, result);
        Some(result)
    }
}

/// A flow goes from the earlier slice to the later one, whichever carried its id first, as
/// Perfetto's `FlowTracker` orders them (equal timestamps keep the carrying order): a flow
/// step or end can land on a slice that began before the slice that started it.
fn flow_direction(slices: &[SliceRow], from: u32, to: u32) -> (u32, u32) {
    let ts = |id: u32| slices.get(id as usize).map(|s| s.ts);
    match (ts(from), ts(to)) {
        (Some(a), Some(b)) if a > b => (to, from),
        _ => (from, to),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_go_from_the_earlier_slice() {
        let slices = [SliceRow::at(100), SliceRow::at(50), SliceRow::at(100)];
        // Slice 0 carried the flow first, slice 1 began earlier: Perfetto links 1 -> 0.
        assert_eq!(flow_direction(&slices, 0, 1), (1, 0));
        assert_eq!(flow_direction(&slices, 1, 0), (1, 0));
        // Equal timestamps keep the carrying order; unknown ids are left alone.
        assert_eq!(flow_direction(&slices, 2, 0), (2, 0));
        assert_eq!(flow_direction(&slices, 0, 9), (0, 9));
    }
}

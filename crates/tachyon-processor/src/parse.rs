//! Parsing: sorted events become rows of the slice, counter, flow, track, thread, process and
//! args tables.
//!
//! Slices are matched per track with a stack: a begin pushes (depth = stack height, parent =
//! top), an end pops and sets `dur`, an instant is a zero-length slice at the current depth.
//! Slices still open at the end keep `dur = -1` ("did not end"). Args of a begin and its end
//! are merged into one arg set.
//!
//! Tracks are created the first time an event uses them, following Perfetto's
//! `TrackEventTracker`: a descriptor with a thread is that thread's track (type `thread`), one
//! with a process is a `process_track_event` track of that process, and a descriptor with
//! neither inherits its parent's thread or process (`thread_track_event`,
//! `process_track_event`), or is global (`global_track_event`) if no ancestor has one.
//! Counter descriptors give the `*_counter_track_event` equivalents. As in Perfetto,
//! `track.parent_id` is set only when the parent is itself a child track or a global track;
//! children of a thread's or process's own track are tied to it through `utid`/`upid`.
//! Perfetto also merges sibling tracks with equal names into one UI track; we keep one track
//! per uuid.

use crate::import::{Event, EventKind, Importer};
use crate::stats::Stat;
use crate::storage::{name_priority, ArgValue, EventType, SliceRow, TrackRow, NONE};
use crate::strings::{FxHashMap, StrId};

/// Deeper stacks are refused (Perfetto has the same kind of limit); a runaway producer that
/// never ends its slices would otherwise make every later begin slower.
const MAX_DEPTH: usize = 1024;
/// Longest parent_uuid chain considered, as in Perfetto.
const MAX_ANCESTORS: usize = 100;

/// Where a track's events belong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    Thread(u32),
    Process(u32),
    Global,
}

#[derive(Debug, Default)]
pub(crate) struct ParseState {
    /// uuid → track id.
    tracks: FxHashMap<u64, u32>,
    /// Index into `Importer::legacy_threads` → track id.
    legacy_tracks: FxHashMap<u64, u32>,
    /// uuid → (scope, is root), once resolved.
    scopes: FxHashMap<u64, (Scope, bool)>,
    /// utid → its `thread` track.
    thread_tracks: FxHashMap<u32, u32>,
    /// Open slices per track.
    stacks: FxHashMap<u32, Vec<u32>>,
    /// Flow id → the slice that last carried it.
    flows: FxHashMap<u64, u32>,
}

impl Importer {
    pub(crate) fn apply_batch(&mut self, batch: &mut Vec<Event>) {
        for ev in batch.drain(..) {
            self.apply(&ev);
        }
    }

    fn apply(&mut self, ev: &Event) {
        match ev.kind {
            EventKind::Thread => {
                let a = self.aux[ev.data as usize];
                let utid = self.st.thread(a.tid, a.pid);
                self.st
                    .set_thread_name(utid, a.name, name_priority::TRACK_DESCRIPTOR);
            }
            EventKind::Process => {
                // As Perfetto's `SetProcessNameIfUnset`: a descriptor does not override a name
                // the system (ProcessTree) or an earlier descriptor gave.
                let a = self.aux[ev.data as usize];
                let upid = self.st.process(a.pid.unwrap_or(0));
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
                self.apply_tree_process(&a);
            }
            EventKind::TreeThread => {
                let a = self.aux[ev.data as usize];
                self.apply_tree_thread(&a);
            }
            EventKind::SystemCounter => self.apply_system_counter(ev),
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
                let Some(track) = self.event_track(ev, ev.name) else {
                    return;
                };
                let stack = self.parse.stacks.entry(track).or_default();
                if stack.len() >= MAX_DEPTH {
                    self.st.stats.inc(Stat::slice_max_depth_exceeded);
                    return;
                }
                let id = self.st.slices.len() as u32;
                let parent = stack.last().copied().unwrap_or(NONE);
                let depth = stack.len() as u32;
                let dur = match ev.kind {
                    EventKind::SliceBegin => {
                        stack.push(id);
                        -1
                    }
                    EventKind::Complete => ev.data as i64,
                    _ => 0,
                };
                let arg_set = self.args_for(NONE, ev);
                self.st.slices.push(SliceRow {
                    ts: ev.ts,
                    dur,
                    track,
                    category: ev.category,
                    name: ev.name,
                    depth,
                    parent,
                    arg_set,
                });
                self.flows_for(id, ev);
            }
            EventKind::SliceEnd => {
                let Some(track) = self.event_track(ev, NONE) else {
                    return;
                };
                let Some(id) = self.parse.stacks.get_mut(&track).and_then(Vec::pop) else {
                    self.st.stats.inc(Stat::misplaced_end_event);
                    return;
                };
                let existing = self.st.slices[id as usize].arg_set;
                let arg_set = self.args_for(existing, ev);
                let row = &mut self.st.slices[id as usize];
                row.dur = ev.ts - row.ts;
                row.arg_set = arg_set;
                self.flows_for(id, ev);
            }
        }
    }

    /// Moves an event's args into arg set `set` (a new one if `NONE`); returns the set.
    fn args_for(&mut self, set: u32, ev: &Event) -> u32 {
        if ev.nargs == 0 {
            return set;
        }
        let set = if set == NONE {
            self.st.new_arg_set()
        } else {
            set
        };
        let range = ev.args as usize..(ev.args + ev.nargs) as usize;
        for i in range {
            let a = self.arena_args[i];
            self.st.push_arg(set, a.flat_key, a.key, a.value);
        }
        set
    }

    /// Flow v2 semantics: each of `flow_ids` links the slice that last carried the id to this
    /// one (and this one becomes the carrier); each of `terminating_flow_ids` links and ends.
    fn flows_for(&mut self, slice: u32, ev: &Event) {
        let start = ev.flows as usize;
        let ids = start..start + ev.nflows as usize;
        let terms = ids.end..ids.end + ev.nterm as usize;
        for i in ids {
            let id = self.arena_flows[i];
            if let Some(prev) = self.parse.flows.insert(id, slice) {
                self.st.flows.push(crate::storage::FlowRow {
                    slice_out: prev,
                    slice_in: slice,
                    trace_id: id,
                });
            }
        }
        for i in terms {
            let id = self.arena_flows[i];
            match self.parse.flows.remove(&id) {
                Some(prev) => self.st.flows.push(crate::storage::FlowRow {
                    slice_out: prev,
                    slice_in: slice,
                    trace_id: id,
                }),
                None => self.st.stats.inc(Stat::flow_end_without_start),
            }
        }
    }

    pub(crate) fn finish_parse(&mut self) {
        self.st.stats.add(
            Stat::sorter_push_event_out_of_order,
            self.sorter.out_of_order,
        );
        self.sorter.out_of_order = 0;
        // The arenas were only needed until every event was parsed.
        self.arena_args = Vec::new();
        self.arena_flows = Vec::new();
        self.arena_logs = Vec::new();
    }

    // === Tracks ===

    /// The track id of an event: its legacy thread's track or its uuid's.
    fn event_track(&mut self, ev: &Event, event_name: StrId) -> Option<u32> {
        if !ev.legacy_thread {
            return self.intern_track(ev.track, event_name);
        }
        if let Some(&t) = self.parse.legacy_tracks.get(&ev.track) {
            return Some(t);
        }
        let (pid, tid) = self.legacy_threads[ev.track as usize];
        let utid = self.st.thread(tid, Some(pid));
        let t = self.thread_track(utid);
        self.parse.legacy_tracks.insert(ev.track, t);
        Some(t)
    }

    /// The track id for `uuid`, created on first use. `event_name` names global child tracks
    /// that have no name of their own, as in Perfetto.
    fn intern_track(&mut self, uuid: u64, event_name: StrId) -> Option<u32> {
        if let Some(&t) = self.parse.tracks.get(&uuid) {
            return Some(t);
        }
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
        let id = if is_root && !is_counter && matches!(scope, Scope::Thread(_)) {
            let Scope::Thread(utid) = scope else {
                unreachable!()
            };
            self.thread_track(utid)
        } else {
            let kind = match (scope, is_counter) {
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
            self.st
                .push_arg_str_key(dims, "track_uuid", ArgValue::Int(uuid as i64));
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
            let id = self.st.tracks.len() as u32;
            self.st.tracks.push(TrackRow {
                name,
                kind,
                event_type: if is_counter {
                    EventType::Counter
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

    /// The `thread` track of a thread (one per utid).
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
            kind: "thread",
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

    /// Scope of a track uuid and whether it is the root of that scope; `None` (with a stat)
    /// if its ancestry is broken.
    fn resolve(&mut self, uuid: u64) -> Option<(Scope, bool)> {
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
            (Scope::Thread(self.st.thread(tid, r.pid)), true)
        } else if let Some(pid) = r.pid {
            (Scope::Process(self.st.process(pid)), true)
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

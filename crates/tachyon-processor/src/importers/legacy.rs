//! Legacy async events: TrackEvents whose `legacy_event.phase` is one of Chrome's async phases
//! (`b`/`e`/`n`, the nestable ones; `S`/`T`/`p`/`F`, the older ones), imported onto async
//! tracks as Perfetto's `TrackEventEventImporter` and `TrackCompressor` do, so that both
//! processors give the same tracks, slices and args.
//!
//! - The event's id says which async operation it belongs to: `unscoped_id` or `global_id`
//!   (global), or `local_id` (scoped to the event's process, which it must have).
//! - Its *scope* keeps unrelated operations with equal ids apart: the category for nestable
//!   events, the name for the older ones, or `category:id_scope` when the event gives an
//!   `id_scope`.
//! - Tracks are grouped by (process if the id is local, scope, root name), the root name being
//!   the name of the first event seen with that id. Within a group, each operation (id) gets a
//!   track of its own while it is open: a begin takes the track already holding the id, else
//!   the first idle one (nothing open on it), else a new one; an end leaves its track; an
//!   instant does both ([`TrackGroup`], the id as the cookie). The track's index in its group is its `track_compressor_idx`
//!   dimension, so two overlapping operations never share a track and later ones reuse idle
//!   tracks.
//! - `b`/`S` begin a slice, `e`/`F` end the innermost one on the track, and `n`/`T`/`p` are
//!   instants (steps are instants, as in Perfetto). For the track compressor, though, Perfetto
//!   counts `T` as an end and `F` as an instant; we do the same.
//! - Args: `legacy_trace_source_id` (the id), the debug annotations, then
//!   `legacy_event.passthrough_utid` (the thread that emitted the event) and, for `S`/`T`/`p`,
//!   `legacy_event.phase`. An end adds its debug annotations to its slice's args and nothing
//!   else (Perfetto's update of the same id and skip of an existing passthrough_utid leave
//!   them as the begin set them).
//!
//! The tokenizer records each async event's target in [`LegacyState`] (an index carried in the
//! event's track, tagged with [`ASYNC_TRACK`]); the track is chosen when the sorted events are
//! parsed, in timestamp order, since the compressor's state depends on that order.

use crate::importers::compressor::{Step, TrackGroup};
use crate::importers::track_event::Scope;
use crate::importers::{Event, Parser, PendingArg};
use crate::storage::stats::Stat;
use crate::storage::strings::{FxHashMap, StrId};
use crate::storage::{ArgValue, EventType, TrackRow, NONE};

/// The tag, in an event's `track` (with `legacy_thread` set), of an index into
/// [`LegacyState::events`].
pub(crate) const ASYNC_TRACK: u64 = 1 << 63;

/// Who emitted an async event: which thread or track the event would have gone to.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Emitter {
    /// An index into `Parser::legacy_threads`.
    LegacyThread(u64),
    /// A track uuid.
    Track(u64),
}

/// One async event, as tokenized.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AsyncEvent {
    emitter: Emitter,
    id: i64,
    process_scoped: bool,
    scope: StrId,
    /// What the event does to its track group (Perfetto's track compressor).
    step: Step,
    /// The arena index of its `legacy_event.passthrough_utid` arg (key `NONE` until the thread
    /// is known at parse time), or `u32::MAX`.
    passthrough_arg: u32,
    /// The track, once chosen (a bound flow event shares its slice's choice).
    track: Option<u32>,
}

#[derive(Debug, Default)]
pub(crate) struct LegacyState {
    events: Vec<AsyncEvent>,
    /// (upid of a process-scoped id or `NONE`, id) → the name of its first event.
    root_names: FxHashMap<(u32, i64), StrId>,
    /// (upid or `NONE`, scope, root name) → the group's tracks (the ids are the cookies).
    groups: FxHashMap<(u32, StrId, StrId), TrackGroup>,
    /// Arena index of a `legacy_event.passthrough_utid` placeholder of an event on a
    /// described track → the (pid, tid) of its sequence's thread.
    passthrough: FxHashMap<u32, (Option<i64>, i64)>,
}

/// Whether a legacy phase is an async one.
pub(crate) fn is_async_phase(phase: u8) -> bool {
    matches!(phase, b'b' | b'e' | b'n' | b'S' | b'T' | b'p' | b'F')
}

/// The slice an async phase makes: `b`/`S` begin one, `e`/`F` end one, the others are instants.
pub(crate) fn slice_kind(phase: u8) -> crate::importers::EventKind {
    use crate::importers::EventKind;
    match phase {
        b'b' | b'S' => EventKind::SliceBegin,
        b'e' | b'F' => EventKind::SliceEnd,
        _ => EventKind::Instant,
    }
}

impl Parser {
    /// After the debug annotations of an event on track `uuid`, from a sequence whose thread is
    /// `thread` (a ThreadDescriptor or a thread's TrackDescriptor): Perfetto gives events on a
    /// process's track (from a thread of that process) or a global track the emitting thread
    /// as `legacy_event.passthrough_utid`, resolved at parse time (`passthrough_utid`).
    pub(crate) fn passthrough_placeholder(&mut self, uuid: u64, thread: (Option<i64>, i64)) {
        // A thread's own track (the usual case) never gets one: skip it cheaply.
        if self
            .reservations
            .get(&uuid)
            .is_some_and(|r| r.tid.is_some())
        {
            return;
        }
        let key = self.st.strings.intern("legacy_event.passthrough_utid");
        self.legacy
            .passthrough
            .insert(self.arena_args.len() as u32, thread);
        self.pend_arg(key, NONE, ArgValue::UInt(0));
    }

    /// The value of the passthrough placeholder at arena index `arg` of `ev`: none when its
    /// args are `merging` into an existing set (Perfetto skips the key if present: an end or a
    /// repeated state keeps what its begin set), when the track is a thread's, or when the
    /// thread belongs to another process than the track.
    pub(crate) fn passthrough_utid(
        &mut self,
        arg: usize,
        ev: &Event,
        merging: bool,
    ) -> Option<ArgValue> {
        let (pid, tid) = *self.legacy.passthrough.get(&(arg as u32))?;
        if merging {
            return None;
        }
        if ev.legacy_thread {
            // A legacy instant on its process's or the global legacy instant track.
            return Some(ArgValue::UInt(self.st.thread(tid, pid) as u64));
        }
        let track_upid = match self.resolve(ev.track)? {
            (Scope::Thread(_), _) => return None,
            (Scope::Process(upid), _) => Some(upid),
            (Scope::Global, _) => None,
        };
        let utid = self.st.thread(tid, pid);
        if track_upid.is_some_and(|u| self.st.threads[utid as usize].upid != u) {
            return None;
        }
        Some(ArgValue::UInt(utid as u64))
    }

    /// Records an async event (phase `phase`) and returns the track value its events carry,
    /// or `None` (counted as a parser error) if it has no id.
    pub(crate) fn tokenize_async(
        &mut self,
        phase: u8,
        l: &tachyon_protos::track_event::LegacyEventView<'_>,
        emitter: Emitter,
        name: StrId,
        category: StrId,
    ) -> Option<u64> {
        let (id, process_scoped) = if l.has_unscoped_id() {
            (l.unscoped_id() as i64, false)
        } else if l.has_global_id() {
            (l.global_id() as i64, false)
        } else if l.has_local_id() {
            (l.local_id() as i64, true)
        } else {
            self.st.stats.inc(Stat::track_event_parser_errors);
            return None;
        };
        let scope = if l.has_id_scope() {
            let joined = format!(
                "{}:{}",
                self.st.strings.get(category),
                String::from_utf8_lossy(l.id_scope_bytes())
            );
            self.st.strings.intern(&joined)
        } else if matches!(phase, b'S' | b'T' | b'p' | b'F') {
            name
        } else {
            category
        };
        let step = match phase {
            b'b' | b'S' => Step::Begin,
            b'e' | b'T' => Step::End,
            _ => Step::Instant,
        };
        let index = self.legacy.events.len() as u64;
        self.legacy.events.push(AsyncEvent {
            emitter,
            id,
            process_scoped,
            scope,
            step,
            passthrough_arg: u32::MAX,
            track: None,
        });
        Some(ASYNC_TRACK | index)
    }

    /// The args an async event puts before its debug annotations.
    pub(crate) fn async_args_before(&mut self, track: u64, phase: u8) {
        if matches!(phase, b'e' | b'F') {
            return;
        }
        let e = self.legacy.events[(track & !ASYNC_TRACK) as usize];
        let key = self.st.strings.intern("legacy_trace_source_id");
        self.pend_arg(key, key, ArgValue::Int(e.id));
    }

    /// The args an async event puts after its debug annotations.
    pub(crate) fn async_args_after(&mut self, track: u64, phase: u8) {
        if matches!(phase, b'e' | b'F') {
            return;
        }
        let index = (track & !ASYNC_TRACK) as usize;
        let key = self.st.strings.intern("legacy_event.passthrough_utid");
        self.legacy.events[index].passthrough_arg = self.arena_args.len() as u32;
        self.pend_arg(key, NONE, ArgValue::UInt(0));
        if matches!(phase, b'S' | b'T' | b'p') {
            let key = self.st.strings.intern("legacy_event.phase");
            let value = self.st.strings.intern(&(phase as char).to_string());
            self.pend_arg(key, key, ArgValue::Str(value));
        }
    }

    /// The track of async event `track & !ASYNC_TRACK` (chosen on the first call); `None`,
    /// counted, if its id is process-scoped and it has no process.
    pub(crate) fn async_track(&mut self, track: u64, name: StrId) -> Option<u32> {
        let index = (track & !ASYNC_TRACK) as usize;
        let e = *self.legacy.events.get(index)?;
        if let Some(t) = e.track {
            return Some(t);
        }
        let (utid, upid) = match e.emitter {
            Emitter::LegacyThread(i) => {
                let (pid, tid, _) = self.legacy_threads[i as usize];
                let utid = self.st.thread(tid, pid);
                (Some(utid), self.st.threads[utid as usize].upid)
            }
            Emitter::Track(uuid) => match self.resolve(uuid) {
                Some((Scope::Thread(utid), _)) => (Some(utid), self.st.threads[utid as usize].upid),
                Some((Scope::Process(upid), _)) => (None, upid),
                _ => (None, NONE),
            },
        };
        if e.process_scoped && upid == NONE {
            self.st.stats.inc(Stat::track_event_parser_errors);
            return None;
        }
        let at = e.passthrough_arg as usize;
        if let (Some(utid), Some(old)) = (utid, self.arena_args.get(&self.st.args, at)) {
            let key = old.flat_key;
            let arg = PendingArg {
                flat_key: key,
                key,
                value: ArgValue::UInt(utid as u64),
            };
            self.arena_args.set(&mut self.st.args, at, arg);
        }
        let group_upid = if e.process_scoped { upid } else { NONE };
        let root = *self
            .legacy
            .root_names
            .entry((group_upid, e.id))
            .or_insert(name);
        let group = self
            .legacy
            .groups
            .entry((group_upid, e.scope, root))
            .or_default();
        // The track holding this id, else the first idle one (adopted for the id), else new.
        let at = group.pick(e.id as u64, e.step);
        let id = match group.track(at) {
            NONE => {
                let id = self.new_async_track(name, group_upid, upid, &e, root, at as u32);
                self.legacy
                    .groups
                    .get_mut(&(group_upid, e.scope, root))
                    .expect("group")
                    .set_track(at, id);
                id
            }
            id => id,
        };
        self.legacy.events[index].track = Some(id);
        Some(id)
    }

    /// A new async track: `legacy_async_process_slice` (a process-scoped id) or
    /// `legacy_async_global_slice`, named after the event that made it.
    fn new_async_track(
        &mut self,
        name: StrId,
        group_upid: u32,
        upid: u32,
        e: &AsyncEvent,
        root: StrId,
        index: u32,
    ) -> u32 {
        let dims = self.st.new_arg_set();
        if group_upid != NONE {
            self.st
                .push_arg_str_key(dims, "upid", ArgValue::Int(group_upid as i64));
        }
        self.st
            .push_arg_str_key(dims, "scope", ArgValue::Str(e.scope));
        self.st.push_arg_str_key(dims, "name", ArgValue::Str(root));
        self.st
            .push_arg_str_key(dims, "track_compressor_idx", ArgValue::Int(index as i64));
        let src = self.st.new_arg_set();
        let chrome = self.st.strings.intern("chrome");
        self.st
            .push_arg_str_key(src, "source", ArgValue::Str(chrome));
        self.st.push_arg_str_key(
            src,
            "trace_id_is_process_scoped",
            ArgValue::Bool(e.process_scoped),
        );
        // Perfetto records upid 0 for an event without a process.
        let upid_arg = if upid == NONE { 0 } else { upid as u64 };
        self.st
            .push_arg_str_key(src, "upid", ArgValue::UInt(upid_arg));
        self.st
            .push_arg_str_key(src, "source_scope", ArgValue::Str(e.scope));
        let (kind, track_upid) = if e.process_scoped {
            ("legacy_async_process_slice", group_upid)
        } else {
            ("legacy_async_global_slice", NONE)
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
            upid: track_upid,
            unit: NONE,
            description: NONE,
        });
        id
    }
}

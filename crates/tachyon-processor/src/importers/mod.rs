//! The importers: sorted events become rows of the storage's tables, one module per kind of
//! packet. [`Parser`] holds what they share (the storage, the tracks the descriptors
//! reserved, the arenas the tokenizer filled); each module adds its `impl Parser` block.
//!
//! * `track_event`: slices, instants, counters, flows and tracks of TrackEvents (and what
//!   every other importer needs: track resolution, arg sets);
//! * `end_args`: a slice end's args merged into its begin's set;
//! * `legacy`: Chrome's legacy async events;
//! * `system`: ProcessTree and SysStats;
//! * `logs`, `state`: log messages and state tracks;
//! * `profile`, `heap`: CPU samples, call stacks and heap profiles;
//! * `arg_arena`: arguments waiting, as entry ids, for their event to be parsed.

pub(crate) mod arg_arena;
pub(crate) mod compressor;
pub(crate) mod end_args;
pub(crate) mod heap;
pub(crate) mod legacy;
pub(crate) mod logs;
pub(crate) mod profile;
pub(crate) mod state;
pub(crate) mod system;
pub(crate) mod track_event;

use crate::storage::strings::{FxHashMap, StrId};
use crate::storage::{ArgValue, Storage, NONE};

/// Where a legacy event goes (`Parser::legacy_threads`): its thread's track, or, for instants
/// with `instant_event_scope`, the global (1) or its process's (2) legacy instant track.
pub(crate) const LEGACY_SCOPE_GLOBAL: u8 = 1;
pub(crate) const LEGACY_SCOPE_PROCESS: u8 = 2;
pub(crate) const LEGACY_SCOPE_THREAD: u8 = 3;

/// What a tokenized event does once sorted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventKind {
    SliceBegin,
    SliceEnd,
    Instant,
    /// A legacy complete event (phase `X`); `data` is its duration.
    Complete,
    /// A counter value; `data` is the `f64` bits.
    Counter,
    /// Names a thread; `data` indexes `Parser::aux`.
    Thread,
    /// Names a process; `data` indexes `Parser::aux`.
    Process,
    /// A `ProcessTree` process (pid, ppid, uid, name, cmdline); `data` indexes
    /// `Parser::aux`.
    TreeProcess,
    /// A `ProcessTree` thread (tid, tgid as `pid`, name); `data` indexes `Parser::aux`.
    TreeThread,
    /// A `SysStats` counter value: `track` indexes the system tracks of
    /// [`crate::importers::system::SystemState`], `data` is the `f64` bits.
    SystemCounter,
    /// A CPU sample; `data` indexes the pending samples of `crate::importers::profile`.
    PerfSample,
    /// A StreamingProfilePacket sample; `data` indexes `StackProfile::pending_cpu_samples`.
    CpuProfileSample,
    /// A log message (`android_logs`, `logs.rs`); `data` indexes `Parser::arena_logs`.
    Log,
    /// Flow events (`data` is the flow id), each bound to the slice open on its track: a flow
    /// starts there (`FlowOut`: legacy phase `s`, `bind_id` with `FLOW_OUT`), passes through
    /// (`FlowStep`: phase `t`, `FLOW_INOUT`), arrives and stays open (`FlowIn`: `FLOW_IN`),
    /// or arrives and ends (`FlowEnd`: phase `f` with `bind_to_enclosing`). `FlowEndNext`
    /// (phase `f` without it) arrives at the next slice that begins on the track.
    FlowOut,
    FlowStep,
    FlowIn,
    FlowEnd,
    FlowEndNext,
    /// The CPU time of the event's thread (`thread_time_*_us`, in ns) and its instruction
    /// count (`thread_instruction_count_*`); `data` is the `f64` bits. They go to the thread's
    /// `thread_time` and `thread_instruction_count` counter tracks.
    ThreadTime,
    ThreadInstructions,
    /// A later descriptor's name for track uuid `track` (`data`: the name's `StrId`).
    TrackRename,
    /// A `TYPE_STATE` event on state track `track` (`state.rs`); its name is the state.
    State,
}

impl EventKind {
    /// Every kind, in declaration order (`ALL[k as usize] == k`): how the sorter reads a kind
    /// back from its byte.
    pub(crate) const ALL: [EventKind; 22] = [
        EventKind::SliceBegin,
        EventKind::SliceEnd,
        EventKind::Instant,
        EventKind::Complete,
        EventKind::Counter,
        EventKind::Thread,
        EventKind::Process,
        EventKind::TreeProcess,
        EventKind::TreeThread,
        EventKind::SystemCounter,
        EventKind::PerfSample,
        EventKind::CpuProfileSample,
        EventKind::Log,
        EventKind::FlowOut,
        EventKind::FlowStep,
        EventKind::FlowIn,
        EventKind::FlowEnd,
        EventKind::FlowEndNext,
        EventKind::ThreadTime,
        EventKind::ThreadInstructions,
        EventKind::TrackRename,
        EventKind::State,
    ];
}

/// One timestamped event. Variable-length parts (args, flow ids) live in the importer's arenas
/// and are referenced by range, so an event is a fixed 56 bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Event {
    pub(crate) ts: i64,
    /// A track uuid or, if `legacy_thread`, an index into `Parser::legacy_threads` (events
    /// on a sequence with a ThreadDescriptor and no track uuid). Kept apart by the flag
    /// because track uuids use all 64 bits.
    pub(crate) track: u64,
    pub(crate) data: u64,
    pub(crate) name: StrId,
    pub(crate) category: StrId,
    pub(crate) args: u32,
    pub(crate) nargs: u32,
    pub(crate) flows: u32,
    pub(crate) nflows: u16,
    pub(crate) nterm: u16,
    pub(crate) kind: EventKind,
    pub(crate) legacy_thread: bool,
    /// Arrival number (modulo 2^32), set by the sorter: the tie-break between events with equal
    /// timestamps. It fills what was padding.
    pub(crate) order: u32,
}

/// An argument before it gets its arg set id.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PendingArg {
    pub(crate) flat_key: StrId,
    pub(crate) key: StrId,
    pub(crate) value: ArgValue,
}

/// Thread or process naming, from descriptors and ProcessTree.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Aux {
    pub(crate) pid: Option<i64>,
    pub(crate) tid: i64,
    pub(crate) name: StrId,
    pub(crate) cmdline: StrId,
    /// ProcessTree processes only.
    pub(crate) ppid: Option<i64>,
    /// ProcessTree processes only.
    pub(crate) uid: Option<u32>,
}

/// What a TrackDescriptor said about a track (Perfetto's "reservation").
#[derive(Clone, Debug, Default)]
pub(crate) struct Reservation {
    pub(crate) parent: u64,
    pub(crate) name: Option<StrId>,
    pub(crate) pid: Option<i64>,
    pub(crate) tid: Option<i64>,
    pub(crate) counter: Option<CounterDetails>,
    pub(crate) description: Option<StrId>,
    pub(crate) child_ordering: i32,
    pub(crate) sibling_order_rank: Option<i32>,
    /// A thread's descriptor track stays apart from the thread's own track.
    pub(crate) disallow_merging: bool,
    /// A state track (`state`: a `StateDescriptor`), for `TYPE_STATE` events (`state.rs`).
    pub(crate) state: bool,
    /// `SIBLING_MERGE_BEHAVIOR_NONE`: the name is no merge key, later descriptors may change it.
    pub(crate) never_merged: bool,
    /// `SIBLING_MERGE_BEHAVIOR_BY_SIBLING_MERGE_KEY`: the key siblings merge by (`NONE` when the
    /// descriptor gives none) instead of their name.
    pub(crate) merge_key: Option<StrId>,
    /// On the root track: processes (threads) are ordered by their tracks'
    /// `sibling_order_rank` (the `*_sort_index_hint` args).
    pub(crate) explicit_process_order: bool,
    pub(crate) explicit_thread_order: bool,
    /// Chrome's `host_app_package_name` of a process track.
    pub(crate) host_app: Option<StrId>,
    /// The sequence that described the track first.
    pub(crate) seq_id: u32,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct CounterDetails {
    pub(crate) unit: Option<StrId>,
    pub(crate) multiplier: i64,
    pub(crate) incremental: bool,
    pub(crate) builtin_type: i32,
    pub(crate) category: Option<StrId>,
    pub(crate) y_axis_share_key: Option<StrId>,
}

impl Event {
    /// An event with no name, category, args or flows, on track uuid `track`.
    pub(crate) fn bare(kind: EventKind, ts: i64, track: u64, data: u64) -> Event {
        Event {
            ts,
            track,
            data,
            name: NONE,
            category: NONE,
            args: 0,
            nargs: 0,
            flows: 0,
            nflows: 0,
            nterm: 0,
            kind,
            legacy_thread: false,
            order: 0,
        }
    }

    pub(crate) fn counter(ts: i64, track: u64, value: f64) -> Event {
        Event::bare(EventKind::Counter, ts, track, value.to_bits())
    }
}

/// The importers' shared state: what the tokenizer hands them beside the sorted events, and
/// the storage they write.
#[derive(Debug, Default)]
pub(crate) struct Parser {
    pub(crate) st: Storage,
    pub(crate) reservations: FxHashMap<u64, Reservation>,
    pub(crate) arena_args: arg_arena::ArgArena,
    pub(crate) arena_flows: Vec<u64>,
    pub(crate) arena_logs: Vec<logs::PendingLog>,
    pub(crate) aux: Vec<Aux>,
    /// Targets of legacy events: (pid, tid, scope), scope one of `LEGACY_SCOPE_*`.
    pub(crate) legacy_threads: Vec<(Option<i64>, i64, u8)>,
    /// Sequences that said `first_packet_on_sequence` (their tracks are complete from the
    /// start).
    pub(crate) first_packet_seqs: FxHashMap<u32, ()>,
    /// What a ProcessTree process says besides its `Aux` (by `aux` index).
    pub(crate) tree_process_extra: FxHashMap<u64, system::TreeProcessExtra>,
    /// The track uuid of a descriptor's thread or process naming event (by `aux` index).
    pub(crate) aux_uuid: FxHashMap<u64, u64>,
    pub(crate) parse: track_event::ParseState,
    /// Legacy async events (`legacy.rs`).
    pub(crate) legacy: legacy::LegacyState,
    /// ProcessTree and SysStats (the system probes' packets).
    pub(crate) system: system::SystemState,
}

impl Parser {
    /// Appends an argument of the event being tokenized (its entry id, in `arena_args`).
    #[inline]
    pub(crate) fn pend_arg(&mut self, flat_key: StrId, key: StrId, value: ArgValue) {
        self.arena_args.push(
            &mut self.st.args,
            PendingArg {
                flat_key,
                key,
                value,
            },
        );
    }

    /// Keeps a thread's or process's naming `aux` and returns the event that applies it at
    /// `ts`.
    pub(crate) fn aux_event(&mut self, ts: i64, kind: EventKind, aux: Aux) -> Event {
        let idx = self.aux.len() as u64;
        self.aux.push(aux);
        Event::bare(kind, ts, 0, idx)
    }
}

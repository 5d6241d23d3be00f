//! The imported trace, as plain Rust tables, before it is copied into SQLite.
//!
//! Rows are appended during the import and patched in place (a slice's `dur` when its end
//! arrives), which is why they live in `Vec`s first and are written to SQLite once, at the end.
//! Optional ids use [`NONE`] instead of `Option<u32>` to keep rows small: a slice row is 34
//! bytes.

pub(crate) mod heap;
pub(crate) mod logs;
pub(crate) mod profile;
pub(crate) mod state;
pub(crate) mod stats;
pub(crate) mod strings;
pub(crate) mod tables;

use stats::Stats;
use strings::{FxHashMap, StrId, StringPool};

/// "No value" for the `u32` id columns.
pub(crate) const NONE: u32 = u32::MAX;

/// Appends `v` as a LEB128 varint (the sorter's runs and the packed arg sets store numbers so).
#[inline]
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A typed argument value (`args.value_type` is derived from the variant).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum ArgValue {
    Int(i64),
    UInt(u64),
    Real(f64),
    Str(StrId),
    Bool(bool),
    Pointer(u64),
    Json(StrId),
}

impl ArgValue {
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            ArgValue::Int(_) => "int",
            ArgValue::UInt(_) => "uint",
            ArgValue::Real(_) => "real",
            ArgValue::Str(_) => "string",
            ArgValue::Bool(_) => "bool",
            ArgValue::Pointer(_) => "pointer",
            ArgValue::Json(_) => "json",
        }
    }
}

/// One argument: `flat_key` omits array indexes, `key` keeps them (`debug.a[1].b` has the flat
/// key `debug.a.b`). The import stores args deduplicated ([`crate::storage::tables::ArgBuilder`]);
/// this row form is for tests.
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ArgRow {
    pub(crate) set: u32,
    pub(crate) flat_key: StrId,
    pub(crate) key: StrId,
    pub(crate) value: ArgValue,
}

/// One slice. `#[repr(packed(2))]`: the `i64`s need no 8-byte alignment here, so the row is 34
/// bytes instead of 40 (its fields are read by value; the compiler refuses references to them).
#[repr(C, packed(2))]
#[derive(Clone, Copy, Debug)]
pub(crate) struct SliceRow {
    pub(crate) ts: i64,
    pub(crate) dur: i64,
    pub(crate) track: u32,
    /// The slice's (category, name), an id in [`SliceNames`].
    pub(crate) name_id: u32,
    pub(crate) parent: u32,
    pub(crate) arg_set: u32,
    /// At most `parse.rs`'s `MAX_DEPTH` (1024).
    pub(crate) depth: u16,
}

#[cfg(test)]
impl SliceRow {
    /// A root instant at `ts` on track 0 with no name or args: for tests that only need times.
    pub(crate) fn at(ts: i64) -> SliceRow {
        SliceRow {
            ts,
            dur: 0,
            track: 0,
            name_id: 0,
            parent: NONE,
            arg_set: NONE,
            depth: 0,
        }
    }
}

/// The distinct (category, name) pairs of slices: a program has few, so a slice stores one
/// 4-byte id for both strings.
#[derive(Debug, Default)]
pub(crate) struct SliceNames {
    pub(crate) pairs: Vec<(StrId, StrId)>,
    ids: FxHashMap<(StrId, StrId), u32>,
}

impl SliceNames {
    /// The id of (`category`, `name`), added if new.
    pub(crate) fn intern(&mut self, category: StrId, name: StrId) -> u32 {
        *self.ids.entry((category, name)).or_insert_with(|| {
            self.pairs.push((category, name));
            (self.pairs.len() - 1) as u32
        })
    }

    /// The pairs by id (the lookup map is dropped).
    pub(crate) fn into_pairs(mut self) -> Vec<(StrId, StrId)> {
        self.pairs.shrink_to_fit();
        self.pairs
    }
}

/// Whether a track holds slices or counter values (Perfetto's `event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Slice,
    Counter,
    /// A TrackEvent state track (`state.rs`).
    State,
}

#[derive(Clone, Debug)]
pub(crate) struct TrackRow {
    pub(crate) name: StrId,
    pub(crate) kind: &'static str,
    pub(crate) event_type: EventType,
    pub(crate) dimension_arg_set: u32,
    pub(crate) parent: u32,
    pub(crate) source_arg_set: u32,
    pub(crate) utid: u32,
    pub(crate) upid: u32,
    pub(crate) unit: StrId,
    pub(crate) description: StrId,
}

/// Where a thread's name came from, as Perfetto's `ThreadNamePriority`: a name replaces the
/// current one only if its source ranks at least as high, so an instrumented thread's own
/// name (a descriptor) wins over its `comm` from `/proc` (ProcessTree), whatever the order.
pub(crate) mod name_priority {
    /// No name yet.
    pub(crate) const NONE: u8 = 0;
    /// `ProcessTree` (the `linux.process_stats` data source).
    pub(crate) const PROCESS_TREE: u8 = 2;
    /// A thread descriptor (TrackDescriptor.thread or the legacy ThreadDescriptor).
    pub(crate) const TRACK_DESCRIPTOR: u8 = 4;
}

#[derive(Clone, Debug)]
pub(crate) struct ThreadRow {
    pub(crate) tid: i64,
    pub(crate) name: StrId,
    pub(crate) upid: u32,
    /// The [`name_priority`] of `name`'s source.
    pub(crate) name_priority: u8,
    /// The thread's args (e.g. `thread_sort_index_hint`), `NONE` if none.
    pub(crate) arg_set: u32,
}

#[derive(Clone, Debug)]
pub(crate) struct ProcessRow {
    pub(crate) pid: i64,
    pub(crate) name: StrId,
    pub(crate) cmdline: StrId,
    /// The parent's upid (`NONE` if unknown).
    pub(crate) parent: u32,
    pub(crate) uid: Option<u32>,
    /// The process's args (e.g. `process_sort_index_hint`), `NONE` if none.
    pub(crate) arg_set: u32,
    /// When it started (ProcessTree's `process_start_from_boot`).
    pub(crate) start_ts: Option<i64>,
}

impl ProcessRow {
    fn new(pid: i64) -> Self {
        ProcessRow {
            pid,
            name: NONE,
            cmdline: NONE,
            parent: NONE,
            uid: None,
            arg_set: NONE,
            start_ts: None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct CounterRow {
    pub(crate) ts: i64,
    pub(crate) track: u32,
    pub(crate) value: f64,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct FlowRow {
    pub(crate) slice_out: u32,
    pub(crate) slice_in: u32,
    pub(crate) trace_id: u64,
}

/// All tables of one import.
#[derive(Debug)]
pub(crate) struct Storage {
    pub(crate) strings: StringPool,
    pub(crate) stats: Stats,
    pub(crate) slices: Vec<SliceRow>,
    pub(crate) slice_names: SliceNames,
    pub(crate) tracks: Vec<TrackRow>,
    pub(crate) threads: Vec<ThreadRow>,
    pub(crate) processes: Vec<ProcessRow>,
    pub(crate) counters: Vec<CounterRow>,
    pub(crate) flows: Vec<FlowRow>,
    /// Arguments, deduplicated as they arrive (`tables.rs`).
    pub(crate) args: crate::storage::tables::ArgBuilder,
    /// Call stacks and CPU samples (`profile.rs`).
    pub(crate) profile: profile::StackProfile,
    /// Heap profiles (`heap.rs`).
    pub(crate) heap: heap::HeapStore,
    /// TrackEvent states (`state.rs`).
    pub(crate) states: state::StateStore,
    /// `android_logs` (`logs.rs`).
    pub(crate) android_logs: Vec<logs::LogRow>,
    /// Slices that began and ended on the same nanosecond (`dur = 0` like an instant, but a
    /// zone: `tachyon stats` counts them).
    pub(crate) zero_length_zones: Vec<u32>,
    next_arg_set: u32,
    tid_to_utid: FxHashMap<i64, u32>,
    /// (tid, upid) → utid: the same tid may live in several processes at once (pid
    /// namespaces, or traces merged from several machines' views).
    tid_upid_to_utid: FxHashMap<(i64, u32), u32>,
    pid_to_upid: FxHashMap<i64, u32>,
}

impl Default for Storage {
    fn default() -> Self {
        let mut s = Storage {
            strings: StringPool::default(),
            stats: Stats::default(),
            slices: Vec::new(),
            slice_names: SliceNames::default(),
            tracks: Vec::new(),
            threads: Vec::new(),
            processes: Vec::new(),
            counters: Vec::new(),
            flows: Vec::new(),
            args: Default::default(),
            profile: Default::default(),
            heap: Default::default(),
            states: Default::default(),
            android_logs: Vec::new(),
            zero_length_zones: Vec::new(),
            next_arg_set: 0,
            tid_to_utid: FxHashMap::default(),
            tid_upid_to_utid: FxHashMap::default(),
            pid_to_upid: FxHashMap::default(),
        };
        // As in Perfetto, utid 0 and upid 0 exist from the start and stand for tid/pid 0 (the
        // idle "swapper"), so that 0 never names a real thread or process.
        s.processes.push(ProcessRow::new(0));
        // Named like the kernel's idle task, as Perfetto names it.
        let swapper = s.strings.intern("swapper");
        s.threads.push(ThreadRow {
            tid: 0,
            name: swapper,
            upid: 0,
            name_priority: name_priority::NONE,
            arg_set: NONE,
        });
        s.pid_to_upid.insert(0, 0);
        s.tid_to_utid.insert(0, 0);
        s.tid_upid_to_utid.insert((0, 0), 0);
        s
    }
}

impl Storage {
    /// Starts a new argument set and returns its id.
    pub(crate) fn new_arg_set(&mut self) -> u32 {
        let id = self.next_arg_set;
        self.next_arg_set += 1;
        id
    }

    pub(crate) fn push_arg(&mut self, set: u32, flat_key: StrId, key: StrId, value: ArgValue) {
        self.args.push(set, flat_key, key, value);
    }

    /// A position in the args before those of a set about to be filled: a hint for
    /// [`Storage::arg_set_keys`] (merging an end's args, `end_args.rs`).
    pub(crate) fn arg_mark(&self) -> usize {
        self.args.late_len()
    }

    /// The args of set `set` (its late ones from `mark` on, [`Storage::arg_mark`]):
    /// (position, key), in order.
    pub(crate) fn arg_set_keys(&self, set: u32, mark: usize) -> Vec<(usize, StrId)> {
        self.args.set_keys(set, mark)
    }

    /// Gives the arg at `pos` (from [`Storage::arg_set_keys`]) a new flat key and value.
    pub(crate) fn update_arg(&mut self, pos: usize, flat_key: StrId, value: ArgValue) {
        self.args.update(pos, flat_key, value);
    }

    /// Convenience: an arg whose flat key and key are the same literal.
    pub(crate) fn push_arg_str_key(&mut self, set: u32, key: &str, value: ArgValue) {
        let k = self.strings.intern(key);
        self.push_arg(set, k, k, value);
    }

    /// The process with this pid, created if new, with its main thread (tid = pid) as
    /// Perfetto creates it for every process it learns of.
    pub(crate) fn process(&mut self, pid: i64) -> u32 {
        if let Some(&upid) = self.pid_to_upid.get(&pid) {
            return upid;
        }
        let upid = self.processes.len() as u32;
        self.processes.push(ProcessRow::new(pid));
        self.pid_to_upid.insert(pid, upid);
        match self.tid_to_utid.get(&pid) {
            // A thread seen before its process was known becomes the main thread.
            Some(&utid) if self.threads[utid as usize].upid == NONE => {
                self.threads[utid as usize].upid = upid;
                self.tid_upid_to_utid.insert((pid, upid), utid);
            }
            _ => {
                self.new_thread(pid, upid);
            }
        }
        upid
    }

    /// A new process for `pid` even if one exists (the pid was reused): later lookups of the
    /// pid find the new one.
    pub(crate) fn start_new_process(&mut self, pid: i64) -> u32 {
        let upid = self.processes.len() as u32;
        self.processes.push(ProcessRow::new(pid));
        self.pid_to_upid.insert(pid, upid);
        self.new_thread(pid, upid);
        upid
    }

    /// A new thread for `tid` in process `pid` even if one exists (the tid was reused): later
    /// lookups of the tid (in that process) find the new one.
    pub(crate) fn start_new_thread(&mut self, tid: i64, pid: Option<i64>) -> u32 {
        let upid = pid.map_or(NONE, |p| self.process(p));
        self.new_thread(tid, upid)
    }

    fn new_thread(&mut self, tid: i64, upid: u32) -> u32 {
        let utid = self.threads.len() as u32;
        self.threads.push(ThreadRow {
            tid,
            name: NONE,
            upid,
            name_priority: name_priority::NONE,
            arg_set: NONE,
        });
        self.tid_to_utid.insert(tid, utid);
        if upid != NONE {
            self.tid_upid_to_utid.insert((tid, upid), utid);
        }
        utid
    }

    /// The thread with this tid in process `pid` (if known), created if new. Without a pid,
    /// the latest thread with this tid; a thread without a process joins the first one named
    /// for it; a tid seen only in other processes starts a new thread.
    pub(crate) fn thread(&mut self, tid: i64, pid: Option<i64>) -> u32 {
        let upid = pid.map(|p| self.process(p));
        if let Some(u) = upid {
            if let Some(&utid) = self.tid_upid_to_utid.get(&(tid, u)) {
                return utid;
            }
        }
        if let Some(&utid) = self.tid_to_utid.get(&tid) {
            let t = &mut self.threads[utid as usize];
            match upid {
                None => return utid,
                Some(u) if t.upid == NONE => {
                    t.upid = u;
                    self.tid_upid_to_utid.insert((tid, u), utid);
                    return utid;
                }
                Some(_) => {}
            }
        }
        self.new_thread(tid, upid.unwrap_or(NONE))
    }

    /// Adds an arg to process `upid`'s arg set (created on first use).
    pub(crate) fn push_process_arg(&mut self, upid: u32, key: &str, value: ArgValue) {
        let set = match self.processes[upid as usize].arg_set {
            NONE => {
                let set = self.new_arg_set();
                self.processes[upid as usize].arg_set = set;
                set
            }
            set => set,
        };
        self.push_arg_str_key(set, key, value);
    }

    /// Adds an arg to thread `utid`'s arg set (created on first use).
    pub(crate) fn push_thread_arg(&mut self, utid: u32, key: &str, value: ArgValue) {
        let set = match self.threads[utid as usize].arg_set {
            NONE => {
                let set = self.new_arg_set();
                self.threads[utid as usize].arg_set = set;
                set
            }
            set => set,
        };
        self.push_arg_str_key(set, key, value);
    }

    /// Whether a process with this pid exists already.
    pub(crate) fn has_process(&self, pid: i64) -> bool {
        self.pid_to_upid.contains_key(&pid)
    }

    /// Names a thread unless its current name comes from a higher-ranked source (see
    /// [`name_priority`]); a `NONE` name changes nothing.
    pub(crate) fn set_thread_name(&mut self, utid: u32, name: StrId, priority: u8) {
        let t = &mut self.threads[utid as usize];
        if name != NONE && priority >= t.name_priority {
            t.name = name;
            t.name_priority = priority;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_rows_are_small_and_names_are_shared() {
        assert_eq!(std::mem::size_of::<SliceRow>(), 34);
        let mut n = SliceNames::default();
        let a = n.intern(1, 2);
        assert_eq!(n.intern(3, 2), a + 1);
        assert_eq!(n.intern(1, 2), a);
        assert_eq!(n.into_pairs(), vec![(1, 2), (3, 2)]);
    }

    #[test]
    fn threads_join_processes_and_tid_reuse_starts_a_new_thread() {
        let mut s = Storage::default();
        let a = s.thread(10, None);
        assert_eq!(s.threads[a as usize].upid, NONE);
        assert_eq!(s.thread(10, Some(1)), a);
        let p1 = s.process(1);
        assert_eq!(s.threads[a as usize].upid, p1);
        let b = s.thread(10, Some(2));
        assert_ne!(a, b);
        assert_eq!(s.thread(0, None), 0);
        assert_eq!(s.process(0), 0);
    }

    #[test]
    fn thread_names_follow_their_source_priority() {
        let mut s = Storage::default();
        let t = s.thread(5, Some(5));
        let (comm, own, other) = (
            s.strings.intern("comm"),
            s.strings.intern("own"),
            s.strings.intern("other"),
        );
        s.set_thread_name(t, comm, name_priority::PROCESS_TREE);
        assert_eq!(s.threads[t as usize].name, comm);
        s.set_thread_name(t, own, name_priority::TRACK_DESCRIPTOR);
        s.set_thread_name(t, comm, name_priority::PROCESS_TREE);
        assert_eq!(s.threads[t as usize].name, own, "a descriptor name wins");
        s.set_thread_name(t, other, name_priority::TRACK_DESCRIPTOR);
        assert_eq!(s.threads[t as usize].name, other, "the same source renames");
        s.set_thread_name(t, NONE, name_priority::TRACK_DESCRIPTOR);
        assert_eq!(s.threads[t as usize].name, other);
    }
}

//! A small, independent model of how Perfetto's trace processor reads the packets of a trace,
//! written from Perfetto's documented rules rather than from the SDK's code, so the tests check
//! the SDK against the reader and not against itself:
//!
//! * State is per `trusted_packet_sequence_id`.
//! * `SEQ_INCREMENTAL_STATE_CLEARED` (1) resets the sequence's interned data, its
//!   `TracePacketDefaults` and its incremental clock, and makes its incremental state valid.
//! * A packet with `SEQ_NEEDS_INCREMENTAL_STATE` (2) is skipped while the state is invalid:
//!   before the sequence's first clear and after a packet marked `previous_packet_dropped`
//!   (which counts as loss except on the sequence's first packet: the service marks every
//!   sequence's first packet, not knowing what came before).
//! * Interned data (`event_names`, `event_categories`, `debug_annotation_names`,
//!   `source_locations`) lives until the next clear.
//! * A timestamp is on `timestamp_clock_id` if the packet sets it, else on the defaults'
//!   `timestamp_clock_id`, else BOOTTIME. Clock 64 (sequence-scoped) is incremental when a
//!   `ClockSnapshot` on the sequence says so: each timestamp on it is a delta added to its
//!   value, and a snapshot entry for it resets the value; the snapshot's other clock maps it onto
//!   a global clock.
//! * A track event's track is its `track_uuid`, else the defaults' `track_uuid`.
//! * ClockSnapshots are grouped by their set of clocks (sequence-scoped ids count as distinct
//!   per sequence). Within one set, in file order, every non-incremental clock must move
//!   strictly forward: Perfetto rejects a snapshot whose trace-time clock (BOOTTIME) does not
//!   (`invalid_clock_snapshots`), and marks any other clock that does not as non-monotonic,
//!   which stops it from being converted at all. Both are errors here.
//!
//! Everything the model cannot resolve (an interning id that is not in the tables, a delta on a
//! clock nobody defined) is recorded, never papered over. Set `MODEL_DUMP=1` to print a line per
//! packet read.

// Shared by several test binaries, each using a part.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;

use tachyon_protos::{track_event, TracePacketView, TraceView};

pub const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
pub const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;
/// The first sequence-scoped clock id (64..=127 are sequence-scoped).
pub const INCREMENTAL_CLOCK: u32 = 64;
/// `BUILTIN_CLOCK_BOOTTIME`, Perfetto's default trace clock.
pub const BOOTTIME: u32 = 6;

/// A debug annotation's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    Int(i64),
    Uint(u64),
    Double(f64),
    Bool(bool),
    Str(String),
    /// A type the tests do not use.
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CounterValue {
    Int(i64),
    Double(f64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Begin,
    End,
    Instant,
    Counter,
    Other(i32),
}

/// A track event as the reader sees it: names, categories, argument names and source locations
/// resolved through the sequence's interning tables, its timestamp resolved onto a global clock.
#[derive(Clone, Debug)]
pub struct Event {
    /// Position of the packet in the trace.
    pub index: usize,
    pub seq: u32,
    /// The timestamp, on `clock`.
    pub ts: u64,
    pub clock: u32,
    pub kind: Kind,
    pub track: u64,
    pub name: Option<String>,
    pub categories: Vec<String>,
    pub args: Vec<(String, Arg)>,
    pub flow_ids: Vec<u64>,
    pub terminating_flow_ids: Vec<u64>,
    pub counter: Option<CounterValue>,
    /// (file, function, line).
    pub location: Option<(String, String, u32)>,
    /// A `log_message`: (body, priority, (file, function, line) of its source location).
    pub log: Option<LogMessage>,
    /// What could not be resolved (interning ids missing from the tables, an undefined clock).
    pub unresolved: Vec<String>,
}

/// A log message's body, priority and source location (file, function, line).
pub type LogMessage = (String, i32, Option<(String, String, u32)>);

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Descriptor {
    pub seq: u32,
    pub index: usize,
    pub uuid: u64,
    pub parent: Option<u64>,
    pub name: Option<String>,
    /// (pid, process name).
    pub process: Option<(i32, Option<String>)>,
    /// (pid, tid, thread name).
    pub thread: Option<(i32, i64, Option<String>)>,
    /// (unit, unit name) of a counter track.
    pub counter: Option<(Option<i32>, Option<String>)>,
    /// A counter track's `is_incremental`.
    pub incremental: bool,
    /// `sibling_order_rank`.
    pub rank: Option<i32>,
}

/// What the trace's `TraceStats` packet says about buffer 0 (the last such packet).
#[derive(Clone, Copy, Debug, Default)]
pub struct BufferStats {
    pub chunks_written: u64,
    pub chunks_overwritten: u64,
    pub chunks_discarded: u64,
    pub write_wrap_count: u64,
    pub trace_writer_packet_loss: u64,
}

#[derive(Debug, Default)]
pub struct Model {
    pub events: Vec<Event>,
    /// Every track descriptor read (not skipped), in trace order.
    pub descriptors: Vec<Descriptor>,
    /// Packets skipped because their sequence's incremental state was invalid.
    pub skipped: u64,
    /// Per sequence: (packets, skipped, clears, loss marks).
    pub per_sequence: HashMap<u32, [u64; 4]>,
    /// Packets that said `previous_packet_dropped`, other than the first of their sequence.
    pub loss_marks: u64,
    /// Sequences seen (with at least one packet).
    pub sequences: usize,
    /// The global clocks of every clock snapshot: (clock id, value) lists.
    pub snapshots: Vec<Vec<(u32, u64)>>,
    /// The sequence of each of `snapshots`.
    pub snapshot_sequences: Vec<u32>,
    pub buffer_stats: Option<BufferStats>,
    /// Problems that are not tied to one event (malformed packets).
    pub errors: Vec<String>,
    /// Every timestamped packet, in file order: (sequence, resolved timestamp, its clock).
    pub packet_times: Vec<(u32, u64, u32)>,
    /// `MODEL_DUMP` set: print a line per packet (to debug a failing test).
    dump: bool,
}

#[derive(Clone, Copy, Debug)]
struct ScopedClock {
    /// Timestamps on it are deltas.
    incremental: bool,
    /// Accumulated value of an incremental clock.
    value: u64,
    /// The snapshot that defined it: the clock's value then, and a global clock's value then.
    snap_value: u64,
    ref_clock: u32,
    ref_value: u64,
}

/// A clock in a snapshot: (sequence for sequence-scoped ids, else 0; clock id).
type ClockKey = (u32, u32);

#[derive(Default)]
struct Sequence {
    valid: bool,
    names: HashMap<u64, String>,
    categories: HashMap<u64, String>,
    arg_names: HashMap<u64, String>,
    locations: HashMap<u64, (String, String, u32)>,
    log_bodies: HashMap<u64, String>,
    default_clock: Option<u32>,
    default_track: Option<u64>,
    clocks: HashMap<u32, ScopedClock>,
}

impl Sequence {
    fn clear(&mut self) {
        *self = Sequence {
            valid: true,
            ..Sequence::default()
        };
    }
}

fn s(r: Result<&str, protozero::DecodeError>) -> String {
    r.expect("malformed string").to_owned()
}

impl Model {
    /// Reads a whole trace (panics if it is not well-formed protobuf: the SDK must never write
    /// that).
    pub fn read(trace: &[u8]) -> Model {
        let mut m = Model {
            dump: std::env::var_os("MODEL_DUMP").is_some(),
            ..Model::default()
        };
        let mut seqs: HashMap<u32, Sequence> = HashMap::new();
        let mut clock_sets: HashMap<(Vec<ClockKey>, ClockKey), u64> = HashMap::new();
        let view = TraceView::decode(trace).expect("the trace decodes");
        for (index, p) in view.packet().enumerate() {
            let p = p.expect("a packet decodes");
            m.check_snapshot(index, &p, &mut clock_sets);
            m.packet(index, &p, &mut seqs);
        }
        m.sequences = seqs.len();
        m
    }

    /// Perfetto's monotonicity rule for snapshots of one clock set (module docs).
    fn check_snapshot(
        &mut self,
        index: usize,
        p: &TracePacketView<'_>,
        sets: &mut HashMap<(Vec<ClockKey>, ClockKey), u64>,
    ) {
        if !p.has_clock_snapshot() {
            return;
        }
        let seq = p.trusted_packet_sequence_id();
        let key = |id: u32| (if (64..=127).contains(&id) { seq } else { 0 }, id);
        let clocks: Vec<(ClockKey, u64, bool)> = p
            .clock_snapshot()
            .unwrap()
            .clocks()
            .map(|c| {
                let c = c.unwrap();
                (key(c.clock_id()), c.timestamp(), c.is_incremental())
            })
            .collect();
        let mut set: Vec<ClockKey> = clocks.iter().map(|c| c.0).collect();
        set.sort_unstable();
        for &(clock, value, incremental) in &clocks {
            let last = sets.insert((set.clone(), clock), value);
            if let (Some(last), false) = (last, incremental) {
                if value <= last {
                    self.errors.push(format!(
                        "packet {index} (seq {seq}): clock {clock:?} of snapshot set {set:?} \
                         went from {last} to {value}"
                    ));
                }
            }
        }
    }

    fn packet(&mut self, index: usize, p: &TracePacketView<'_>, seqs: &mut HashMap<u32, Sequence>) {
        if p.has_trace_stats() {
            let ts = p.trace_stats().unwrap();
            if let Some(b) = ts.buffer_stats().next() {
                let b = b.unwrap();
                self.buffer_stats = Some(BufferStats {
                    chunks_written: b.chunks_written(),
                    chunks_overwritten: b.chunks_overwritten(),
                    chunks_discarded: b.chunks_discarded(),
                    write_wrap_count: b.write_wrap_count(),
                    trace_writer_packet_loss: b.trace_writer_packet_loss(),
                });
            }
        }
        let seq_id = p.trusted_packet_sequence_id();
        if self.dump {
            eprintln!(
                "#{index} seq {seq_id} flags {} dropped {} first {} ts {:?} clock {:?} \
                 event {} desc {} snap {} interned {} defaults {} stats {}",
                p.sequence_flags(),
                p.previous_packet_dropped(),
                p.first_packet_on_sequence(),
                p.has_timestamp().then(|| p.timestamp()),
                p.has_timestamp_clock_id().then(|| p.timestamp_clock_id()),
                p.has_track_event(),
                p.has_track_descriptor(),
                p.has_clock_snapshot(),
                p.has_interned_data(),
                p.has_trace_packet_defaults(),
                p.has_trace_stats(),
            );
        }
        let first = !seqs.contains_key(&seq_id);
        let seq = seqs.entry(seq_id).or_default();
        let counts = self.per_sequence.entry(seq_id).or_default();
        counts[0] += 1;
        if p.previous_packet_dropped() != 0 {
            counts[3] += 1;
            // The service marks the first packet it reads of every sequence (it cannot know
            // what came before); like Perfetto, count only the later marks as loss. The state
            // is invalid either way.
            if !first {
                self.loss_marks += 1;
            }
            seq.valid = false;
        }
        let flags = p.sequence_flags();
        if flags & SEQ_INCREMENTAL_STATE_CLEARED != 0 || p.incremental_state_cleared() {
            seq.clear();
            counts[2] += 1;
        } else if flags & SEQ_NEEDS_INCREMENTAL_STATE != 0 && !seq.valid {
            self.skipped += 1;
            counts[1] += 1;
            return;
        }
        if p.has_trace_packet_defaults() {
            let d = p.trace_packet_defaults().unwrap();
            seq.default_clock = d.has_timestamp_clock_id().then(|| d.timestamp_clock_id());
            seq.default_track = d
                .track_event_defaults()
                .ok()
                .filter(|t| t.has_track_uuid())
                .map(|t| t.track_uuid());
        }
        // Interned data is taken only while the state is valid (it would otherwise land in the
        // wrong generation).
        if p.has_interned_data() && seq.valid {
            let i = p.interned_data().unwrap();
            for n in i.event_names() {
                let n = n.unwrap();
                seq.names.insert(n.iid(), s(n.name()));
            }
            for n in i.event_categories() {
                let n = n.unwrap();
                seq.categories.insert(n.iid(), s(n.name()));
            }
            for n in i.debug_annotation_names() {
                let n = n.unwrap();
                seq.arg_names.insert(n.iid(), s(n.name()));
            }
            for b in i.log_message_body() {
                let b = b.unwrap();
                seq.log_bodies.insert(b.iid(), s(b.body()));
            }
            for l in i.source_locations() {
                let l = l.unwrap();
                seq.locations.insert(
                    l.iid(),
                    (s(l.file_name()), s(l.function_name()), l.line_number()),
                );
            }
        }
        if p.has_clock_snapshot() {
            let cs = p.clock_snapshot().unwrap();
            let clocks: Vec<(u32, u64, bool)> = cs
                .clocks()
                .map(|c| {
                    let c = c.unwrap();
                    (c.clock_id(), c.timestamp(), c.is_incremental())
                })
                .collect();
            let global: Vec<(u32, u64)> = clocks
                .iter()
                .filter(|c| !(64..=127).contains(&c.0))
                .map(|c| (c.0, c.1))
                .collect();
            let scoped: Vec<_> = clocks
                .iter()
                .filter(|c| (64..=127).contains(&c.0))
                .collect();
            if global.len() > 1 {
                self.snapshots.push(global.clone());
                self.snapshot_sequences.push(seq_id);
            }
            for &&(id, value, incremental) in &scoped {
                match global.first() {
                    Some(&(ref_clock, ref_value)) => {
                        seq.clocks.insert(
                            id,
                            ScopedClock {
                                incremental,
                                value,
                                snap_value: value,
                                ref_clock,
                                ref_value,
                            },
                        );
                    }
                    None => self.errors.push(format!(
                        "packet {index}: sequence-scoped clock {id} tied to no global clock"
                    )),
                }
            }
        }
        let mut unresolved = Vec::new();
        let (ts, clock) = if p.has_timestamp() {
            let clock = if p.has_timestamp_clock_id() {
                p.timestamp_clock_id()
            } else {
                seq.default_clock.unwrap_or(BOOTTIME)
            };
            if (64..=127).contains(&clock) {
                match seq.clocks.get_mut(&clock) {
                    Some(c) => {
                        c.value = if c.incremental {
                            c.value.wrapping_add(p.timestamp())
                        } else {
                            p.timestamp()
                        };
                        (
                            c.ref_value.wrapping_add(c.value.wrapping_sub(c.snap_value)),
                            c.ref_clock,
                        )
                    }
                    None => {
                        unresolved.push(format!("timestamp on undefined clock {clock}"));
                        (p.timestamp(), clock)
                    }
                }
            } else {
                (p.timestamp(), clock)
            }
        } else {
            (0, 0)
        };
        if p.has_timestamp() {
            self.packet_times.push((seq_id, ts, clock));
        }
        if p.has_track_descriptor() {
            let d = p.track_descriptor().unwrap();
            let process = d.process().ok().map(|pd| {
                (
                    pd.pid(),
                    pd.has_process_name().then(|| s(pd.process_name())),
                )
            });
            let thread = d.thread().ok().map(|td| {
                (
                    td.pid(),
                    td.tid(),
                    td.has_thread_name().then(|| s(td.thread_name())),
                )
            });
            let counter = d.counter().ok().map(|c| {
                (
                    c.has_unit().then(|| c.unit_raw()),
                    c.has_unit_name().then(|| s(c.unit_name())),
                )
            });
            self.descriptors.push(Descriptor {
                seq: seq_id,
                index,
                uuid: d.uuid(),
                parent: d.has_parent_uuid().then(|| d.parent_uuid()),
                name: d.has_name().then(|| s(d.name())),
                process: d.has_process().then_some(process).flatten(),
                thread: d.has_thread().then_some(thread).flatten(),
                counter: d.has_counter().then_some(counter).flatten(),
                incremental: d.counter().ok().is_some_and(|c| c.is_incremental()),
                rank: d.has_sibling_order_rank().then(|| d.sibling_order_rank()),
            });
        }
        if p.has_track_event() {
            let e = p.track_event().unwrap();
            let kind = match e.r#type() {
                Some(track_event::Type::SliceBegin) => Kind::Begin,
                Some(track_event::Type::SliceEnd) => Kind::End,
                Some(track_event::Type::Instant) => Kind::Instant,
                Some(track_event::Type::Counter) => Kind::Counter,
                _ => Kind::Other(e.type_raw()),
            };
            let track = if e.has_track_uuid() {
                e.track_uuid()
            } else {
                match seq.default_track {
                    Some(t) => t,
                    None => {
                        unresolved.push("no track".into());
                        0
                    }
                }
            };
            let name = if e.has_name_iid() {
                let n = seq.names.get(&e.name_iid()).cloned();
                if n.is_none() {
                    unresolved.push(format!("event name iid {}", e.name_iid()));
                }
                n
            } else if e.has_name() {
                Some(s(e.name()))
            } else {
                None
            };
            let mut categories = Vec::new();
            for iid in e.category_iids() {
                let iid = iid.unwrap();
                match seq.categories.get(&iid) {
                    Some(c) => categories.push(c.clone()),
                    None => unresolved.push(format!("category iid {iid}")),
                }
            }
            for c in e.categories() {
                categories.push(s(c));
            }
            let mut args = Vec::new();
            for a in e.debug_annotations() {
                let a = a.unwrap();
                let key = if a.has_name_iid() {
                    match seq.arg_names.get(&a.name_iid()) {
                        Some(n) => n.clone(),
                        None => {
                            unresolved.push(format!("debug annotation name iid {}", a.name_iid()));
                            format!("<iid {}>", a.name_iid())
                        }
                    }
                } else {
                    s(a.name())
                };
                let v = if a.has_int_value() {
                    Arg::Int(a.int_value())
                } else if a.has_uint_value() {
                    Arg::Uint(a.uint_value())
                } else if a.has_double_value() {
                    Arg::Double(a.double_value())
                } else if a.has_bool_value() {
                    Arg::Bool(a.bool_value())
                } else if a.has_string_value() {
                    Arg::Str(s(a.string_value()))
                } else {
                    Arg::Other
                };
                args.push((key, v));
            }
            let location = if e.has_source_location_iid() {
                let l = seq.locations.get(&e.source_location_iid()).cloned();
                if l.is_none() {
                    unresolved.push(format!("source location iid {}", e.source_location_iid()));
                }
                l
            } else {
                None
            };
            let counter = if e.has_counter_value() {
                Some(CounterValue::Int(e.counter_value()))
            } else if e.has_double_counter_value() {
                Some(CounterValue::Double(e.double_counter_value()))
            } else {
                None
            };
            let log = e
                .log_message()
                .ok()
                .filter(|_| e.has_log_message())
                .map(|m| {
                    let body = seq.log_bodies.get(&m.body_iid()).cloned();
                    if body.is_none() {
                        unresolved.push(format!("log body iid {}", m.body_iid()));
                    }
                    let loc = m
                        .has_source_location_iid()
                        .then(|| seq.locations.get(&m.source_location_iid()).cloned())
                        .flatten();
                    if m.has_source_location_iid() && loc.is_none() {
                        unresolved.push(format!(
                            "log source location iid {}",
                            m.source_location_iid()
                        ));
                    }
                    (body.unwrap_or_default(), m.prio_raw(), loc)
                });
            if !p.has_timestamp() {
                unresolved.push("no timestamp".into());
            }
            self.events.push(Event {
                index,
                seq: seq_id,
                ts,
                clock,
                kind,
                track,
                name,
                categories,
                args,
                flow_ids: e.flow_ids().map(Result::unwrap).collect(),
                terminating_flow_ids: e.terminating_flow_ids().map(Result::unwrap).collect(),
                counter,
                location,
                log,
                unresolved,
            });
        } else if !unresolved.is_empty() {
            self.errors
                .push(format!("packet {index} (seq {seq_id}): {unresolved:?}"));
        }
    }

    /// Events whose names, arguments or timestamps did not resolve, with what was missing.
    pub fn unresolved(&self) -> Vec<&Event> {
        self.events
            .iter()
            .filter(|e| !e.unresolved.is_empty())
            .collect()
    }

    /// The thread descriptors of `tid` (in trace order).
    pub fn thread_descriptors(&self, tid: i64) -> Vec<&Descriptor> {
        self.descriptors
            .iter()
            .filter(|d| d.thread.as_ref().is_some_and(|t| t.1 == tid))
            .collect()
    }

    /// The track uuid of thread `tid` (panics if it has no descriptor or several uuids).
    pub fn thread_track(&self, tid: i64) -> u64 {
        let ds = self.thread_descriptors(tid);
        assert!(!ds.is_empty(), "no thread descriptor for tid {tid}");
        assert!(
            ds.iter().all(|d| d.uuid == ds[0].uuid),
            "thread {tid} has several track uuids"
        );
        ds[0].uuid
    }

    /// The process descriptors of this process (every sequence emits one).
    pub fn process_descriptors(&self) -> Vec<&Descriptor> {
        self.descriptors
            .iter()
            .filter(|d| d.process.is_some())
            .collect()
    }

    /// The uuid of this process's track (panics unless exactly one uuid describes `pid`).
    pub fn process_track(&self, pid: i32) -> u64 {
        let ds: Vec<_> = self
            .process_descriptors()
            .into_iter()
            .filter(|d| d.process.as_ref().unwrap().0 == pid)
            .collect();
        assert!(!ds.is_empty(), "no process descriptor for pid {pid}");
        assert!(ds.iter().all(|d| d.uuid == ds[0].uuid));
        ds[0].uuid
    }

    /// Descriptors of `uuid`.
    pub fn descriptors_of(&self, uuid: u64) -> Vec<&Descriptor> {
        self.descriptors.iter().filter(|d| d.uuid == uuid).collect()
    }

    /// The events on `track`, ordered by timestamp (ties: trace order).
    pub fn on_track(&self, track: u64) -> Vec<&Event> {
        let mut v: Vec<&Event> = self.events.iter().filter(|e| e.track == track).collect();
        v.sort_by_key(|e| (e.ts, e.index));
        v
    }

    /// Matches the begins and ends of `track` (in timestamp order): (name, depth, begin, end).
    /// Panics on an end without a begin or a begin never ended.
    pub fn slices(&self, track: u64) -> Vec<Slice<'_>> {
        let mut stack: Vec<usize> = Vec::new();
        let mut out: Vec<Slice<'_>> = Vec::new();
        for e in self.on_track(track) {
            match e.kind {
                Kind::Begin => {
                    stack.push(out.len());
                    out.push(Slice {
                        begin: e,
                        end: None,
                        depth: stack.len() - 1,
                    });
                }
                Kind::End => {
                    let i = stack.pop().unwrap_or_else(|| {
                        panic!("end without a begin on track {track:#x}: {e:?}")
                    });
                    out[i].end = Some(e);
                }
                _ => {}
            }
        }
        assert!(
            stack.is_empty(),
            "{} slices never ended on track {track:#x}",
            stack.len()
        );
        out
    }

    /// Maps a trace-clock timestamp (`clock`) onto BOOTTIME through the nearest earlier global
    /// snapshot that has both.
    pub fn to_boottime(&self, clock: u32, ts: u64) -> Option<u64> {
        let mut best: Option<(u64, u64)> = None;
        for snap in &self.snapshots {
            let c = snap.iter().find(|c| c.0 == clock);
            let b = snap.iter().find(|c| c.0 == BOOTTIME);
            if let (Some(c), Some(b)) = (c, b) {
                if best.is_none() || c.1 <= ts {
                    best = Some((c.1, b.1));
                }
            }
        }
        best.map(|(c, b)| (b as i128 + ts as i128 - c as i128) as u64)
    }
}

/// A slice: its begin, its end, its depth on the track.
#[derive(Clone, Debug)]
pub struct Slice<'a> {
    pub begin: &'a Event,
    pub end: Option<&'a Event>,
    pub depth: usize,
}

/// This thread's kernel id (Linux; `None` elsewhere).
pub fn current_tid() -> Option<i64> {
    // "/proc/thread-self" links to "<pid>/task/<tid>".
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

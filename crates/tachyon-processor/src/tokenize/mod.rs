//! Tokenizing: from trace bytes to timestamped, self-contained events, in file order.
//!
//! This stage owns everything that depends on the order packets were *written* in, which is
//! why it runs before sorting, as Perfetto's `ProtoTraceReader` and `TrackEventTokenizer` do:
//! per-sequence incremental state (interned data, TracePacketDefaults, incremental counters),
//! loss bookkeeping (`previous_packet_dropped`), clock snapshots and incremental clocks, and
//! the reservation of track descriptors. What comes out is an [`Event`] with its timestamp in
//! trace time and every interned id already resolved to a pooled string, so the sorter may
//! reorder events freely and the parser ([`crate::importers::track_event`]) needs no sequence state.

use std::collections::hash_map::Entry;
use std::io::Read;

use flate2::read::{MultiGzDecoder, ZlibDecoder};
use protozero::decoder::{FieldValue, ProtoDecoder};
use tachyon_protos::trace_packet::{DataLossReason, SequenceFlags};
use tachyon_protos::{
    debug_annotation, DebugAnnotationView, TracePacketView, TrackDescriptorView, TrackEventView,
};

use crate::importers::{
    Aux, CounterDetails, Event, EventKind, Parser, Reservation, LEGACY_SCOPE_THREAD,
};
use crate::sort::Sorter;
use crate::storage::stats::Stat;
use crate::storage::strings::{FxHashMap, StrId};
use crate::storage::{ArgValue, NONE};
use crate::SortMode;
use clock::{ClockId, ClockReading, ClockTracker, Converted, Pending};

mod arg_cache;
pub(crate) mod clock;
mod iid_map;
pub(crate) mod json_args;
pub(crate) mod lazy;
mod sequences;
mod streaming;

use iid_map::IidMap;
use sequences::Sequences;

const SEQ_INCREMENTAL_STATE_CLEARED: u32 = SequenceFlags::SeqIncrementalStateCleared as u32;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = SequenceFlags::SeqNeedsIncrementalState as u32;
/// The loss causes `previous_packet_dropped` can name, each with the per-buffer stat it is
/// counted in. The first six are also counted by the service itself (`BufferStats`).
const LOSS_CAUSES: [(DataLossReason, Stat); 8] = [
    (
        DataLossReason::DataLossReadGap,
        Stat::traced_buf_data_loss_read_gap,
    ),
    (
        DataLossReason::DataLossChunkCorrupted,
        Stat::traced_buf_data_loss_chunk_corrupted,
    ),
    (
        DataLossReason::DataLossOrphanContinuation,
        Stat::traced_buf_data_loss_orphan_continuation,
    ),
    (
        DataLossReason::DataLossReassemblyGap,
        Stat::traced_buf_data_loss_reassembly_gap,
    ),
    (
        DataLossReason::DataLossReassemblyBrokenChain,
        Stat::traced_buf_data_loss_reassembly_broken_chain,
    ),
    (
        DataLossReason::DataLossOverwrite,
        Stat::traced_buf_data_loss_overwrite,
    ),
    (
        DataLossReason::DataLossWriterAbort,
        Stat::traced_buf_data_loss_writer_abort,
    ),
    (
        DataLossReason::DataLossSmbFull,
        Stat::traced_buf_data_loss_smb_full,
    ),
];
/// A `file_write_period_ms` of a day or more asks for ring-buffer behaviour (Perfetto's cutoff).
const STREAMING_PERIOD_LIMIT_MS: u32 = 24 * 60 * 60 * 1000;
/// Nesting limit for debug annotations (dicts in arrays in dicts…): deeper values are dropped
/// rather than recursing without bound on hostile input.
const MAX_ANNOTATION_DEPTH: u32 = 32;
/// A decompressed `compressed_packets` payload larger than this is refused (a zip bomb would
/// otherwise exhaust memory).
const MAX_INFLATED_BYTES: u64 = 1 << 30;
/// How much of a trace file [`Tokenizer::push_stream`] reads at a time.
pub(crate) const STREAM_WINDOW: usize = 8 << 20;
/// The first bytes of a gzip stream.
pub(crate) const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

#[derive(Debug, Default)]
struct Defaults {
    clock_id: u32,
    track_uuid: Option<u64>,
    extra_counter_uuids: Vec<u64>,
    extra_double_counter_uuids: Vec<u64>,
}

/// Per-sequence state (Perfetto's PacketSequenceState and its current generation).
#[derive(Debug, Default)]
struct Sequence {
    valid: bool,
    defaults: Option<Defaults>,
    names: IidMap<StrId>,
    categories: IidMap<StrId>,
    /// Interned annotation names: the name, and its top-level arg key (`debug.<name>`).
    annotation_names: IidMap<(StrId, StrId)>,
    annotation_strings: IidMap<StrId>,
    source_locations: IidMap<(StrId, StrId, u32)>,
    log_bodies: IidMap<StrId>,
    counter_values: FxHashMap<u64, f64>,
    /// The (pid, tid) of the sequence's legacy ThreadDescriptor.
    legacy_thread: Option<(Option<i64>, i64)>,
    legacy_ts_us: Option<i64>,
    /// Bases of `thread_time_delta_us` and `thread_instruction_count_delta`.
    legacy_thread_time_us: Option<i64>,
    legacy_thread_instructions: Option<i64>,
    // Loss accounting, attributed to buffers at the end via TraceStats.writer_stats.
    dropped: i64,
    /// Packets the writer says it dropped (Tachyon's `tachyon_packets_dropped`).
    writer_dropped: i64,
    loss_causes: [i64; 8],
    needs_total: u64,
    needs_skipped: u64,
    /// Interned call stacks (`profile.rs`).
    profile: crate::importers::profile::SeqProfile,
    /// Annotations and source locations seen recently, with their arg entries; emptied
    /// whenever the interned data changes.
    arg_cache: arg_cache::ArgCache,
}

impl Sequence {
    /// A new generation of incremental state: interned data and incremental counters start
    /// over; TracePacketDefaults stay until new ones replace them, as in Perfetto.
    fn clear(&mut self) {
        self.valid = true;
        self.names.clear();
        self.categories.clear();
        self.annotation_names.clear();
        self.annotation_strings.clear();
        self.source_locations.clear();
        self.log_bodies.clear();
        self.counter_values.clear();
        self.profile.clear();
        self.arg_cache.clear();
    }
}

/// A packet whose clock had no path to the trace clock yet: converted at the end of the file.
#[derive(Debug)]
struct Deferred {
    time: Pending,
    event: Event,
}

/// A TrackEvent's log message with its interned data resolved: its args and its
/// `android_logs` row are made from this.
#[derive(Clone, Copy)]
struct LogMessage {
    body: StrId,
    /// The message's source location (file, function, line); `Err`: its iid is not interned.
    location: Result<Option<(StrId, StrId, u32)>, ()>,
    /// The priority, when the message states one (clamped to Android's 0..=7).
    prio: Option<u32>,
}

/// The tokenize stage's state; the stages after it are the sorter and the [`Parser`] it feeds.
#[derive(Debug)]
pub(crate) struct Tokenizer {
    /// The importers' state (and the storage they write), downstream of the sorter.
    pub(crate) parser: Parser,
    clocks: ClockTracker,
    seqs: Sequences<Sequence>,
    pub(crate) sorter: Sorter,
    legacy_thread_ids: FxHashMap<(Option<i64>, i64, u8), u64>,
    /// With a `write_into_file` config draining at least daily: how many buffers it had.
    streamed_buffers: Option<i64>,
    /// Drop TrackEvents before the range of interest (Options::crop_track_events).
    pub(crate) crop_track_events: bool,
    range_of_interest: Option<i64>,
    latest_ts: i64,
    deferred: Vec<Deferred>,
    writer_buffers: Vec<(u32, u32)>,
    top_key_cache: FxHashMap<StrId, StrId>,
    /// Flow v1 (id, category, name) → flow id.
    v1_flow_ids: FxHashMap<(u64, StrId, StrId), u64>,
    key_debug: StrId,
    /// The keys of a source location's args (`source.file_name`, `source.function_name`,
    /// `source.line_number`, `source_location_iid`), interned once rather than per event.
    keys_source: [StrId; 4],
    /// The keys of a log message's args (`track_event.log_message.{message,file_name,
    /// function_name,line_number}`, `track_event.priority`).
    keys_log: [StrId; 5],
    /// Reused for the events of one TrackEvent, so that tokenizing does not allocate.
    scratch: Vec<Event>,
    /// The sequence of the packet being tokenized: the sorter keeps each sequence's events
    /// together.
    cur_seq: u32,
    /// The highest arg entry id a debug annotation has become (`u32::MAX`: none yet).
    newest_arg_entry: u32,
}

impl Tokenizer {
    pub(crate) fn new(sort: SortMode) -> Self {
        let mut parser = Parser::default();
        let key_debug = parser.st.strings.intern("debug");
        let keys_source = [
            "source.file_name",
            "source.function_name",
            "source.line_number",
            "source_location_iid",
        ]
        .map(|k| parser.st.strings.intern(k));
        let keys_log = [
            "track_event.log_message.message",
            "track_event.log_message.file_name",
            "track_event.log_message.function_name",
            "track_event.log_message.line_number",
            "track_event.priority",
        ]
        .map(|k| parser.st.strings.intern(k));
        Tokenizer {
            parser,
            clocks: ClockTracker::default(),
            seqs: Sequences::default(),
            sorter: Sorter::new(sort),
            legacy_thread_ids: FxHashMap::default(),
            crop_track_events: false,
            streamed_buffers: None,
            range_of_interest: None,
            latest_ts: 0,
            deferred: Vec::new(),
            writer_buffers: Vec::new(),
            top_key_cache: FxHashMap::default(),
            v1_flow_ids: FxHashMap::default(),
            key_debug,
            keys_source,
            keys_log,
            scratch: Vec::new(),
            cur_seq: 0,
            newest_arg_entry: u32::MAX,
        }
    }

    // === Trace framing ===

    /// Imports the packets of a `Trace` message read from `r` (a plain trace file of `len`
    /// bytes), holding only a window of it (`window` bytes, more for a larger packet): the packets are framed as in [`Self::push_trace`],
    /// and the bytes of those already tokenized are dropped as the window moves on, so the file
    /// never needs to fit in memory beside the import. `progress` is called with the offset
    /// reached, now and then.
    pub(crate) fn push_stream(
        &mut self,
        r: &mut dyn Read,
        len: u64,
        window: usize,
        progress: &mut dyn FnMut(usize),
    ) -> std::io::Result<()> {
        use protozero::decoder::DecodeError;
        let mut buf: Vec<u8> = Vec::new();
        // File offset of `buf[0]`.
        let mut base = 0u64;
        let mut eof = false;
        let mut count = 0u32;
        loop {
            // Frame what the window holds.
            let mut dec = ProtoDecoder::new(&buf);
            let mut done = 0;
            let mut need = None;
            loop {
                match dec.read_field() {
                    Ok(Some(f)) => {
                        if f.id() == 1 {
                            match f.value() {
                                FieldValue::Bytes(packet) => {
                                    self.push_packet(packet, false);
                                    count += 1;
                                    if count % 4096 == 0 {
                                        progress((base as usize).saturating_add(dec.offset()));
                                    }
                                }
                                _ => self.parser.st.stats.inc(Stat::trace_packet_malformed),
                            }
                        }
                        done = dec.offset();
                    }
                    Ok(None) => break,
                    // Cut by the window's end: read on, unless the file ends there too.
                    Err(DecodeError::PayloadPastEnd { offset, len: n })
                        if !eof && base + offset as u64 + n <= len =>
                    {
                        need = Some(offset + n as usize);
                        break;
                    }
                    Err(
                        DecodeError::TruncatedVarint { .. }
                        | DecodeError::TruncatedFixed32 { .. }
                        | DecodeError::TruncatedFixed64 { .. },
                    ) if !eof => {
                        need = Some(buf.len() + 16);
                        break;
                    }
                    Err(_) => {
                        // A broken length or tag: nothing after it can be framed again.
                        self.parser.st.stats.inc(Stat::trace_truncated);
                        progress(len as usize);
                        return Ok(());
                    }
                }
            }
            if eof && need.is_none() {
                break;
            }
            // Drop what was framed; read at least what the cut field needs.
            buf.drain(..done);
            base += done as u64;
            let want = need.map_or(0, |n| n - done).max(window.max(1));
            if buf.capacity() > 2 * want {
                buf.shrink_to(want); // After a packet larger than the window.
            }
            while buf.len() < want && !eof {
                let at = buf.len();
                buf.resize(want, 0);
                let n = loop {
                    match r.read(&mut buf[at..]) {
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        other => break other,
                    }
                };
                buf.truncate(at + *n.as_ref().unwrap_or(&0));
                let n = n?;
                eof = n == 0;
            }
        }
        progress(len as usize);
        Ok(())
    }

    /// Imports the packets of a `Trace` message (a whole file, or the payload of
    /// `compressed_packets`). `progress` is called with the offset reached, now and then.
    pub(crate) fn push_trace(
        &mut self,
        bytes: &[u8],
        nested: bool,
        progress: &mut dyn FnMut(usize),
    ) {
        let mut pos = 0;
        let mut count = 0u32;
        while pos < bytes.len() {
            // A packet in the common form is framed inline; anything else takes the general
            // field reader, one field, from the same offset.
            let packet = match lazy::trace_packet(bytes, pos) {
                Some((packet, next)) => {
                    pos = next;
                    packet
                }
                None => {
                    let mut dec = ProtoDecoder::new(&bytes[pos..]);
                    let field = dec.read_field();
                    pos += dec.offset();
                    match field {
                        Ok(Some(f)) => {
                            if f.id() != 1 {
                                continue; // Not a packet: Trace has no other fields we know.
                            }
                            match f.value() {
                                FieldValue::Bytes(packet) => packet,
                                _ => {
                                    self.parser.st.stats.inc(Stat::trace_packet_malformed);
                                    continue;
                                }
                            }
                        }
                        Ok(None) => break,
                        Err(_) => {
                            // A broken length or tag: nothing after it can be framed again.
                            self.parser.st.stats.inc(Stat::trace_truncated);
                            break;
                        }
                    }
                }
            };
            self.push_packet(packet, nested);
            count += 1;
            if count % 4096 == 0 {
                progress(pos);
            }
        }
        progress(bytes.len());
    }

    fn push_packet(&mut self, bytes: &[u8], nested: bool) {
        // The fields every event's packet has, read straight from the bytes; a packet with
        // anything else (descriptors, interned data, clock snapshots, …) also gets its view.
        let Ok(packet) = lazy::Packet::decode(bytes) else {
            self.parser.st.stats.inc(Stat::trace_packet_malformed);
            return;
        };
        let view = if packet.other {
            match lazy::Packet::view(bytes) {
                Ok(v) => Some(v),
                Err(_) => {
                    self.parser.st.stats.inc(Stat::trace_packet_malformed);
                    return;
                }
            }
        } else {
            None
        };
        if let Some(v) = &view {
            if v.has_compressed_packets() || v.has_zstd_compressed_packets() {
                self.push_compressed(v, nested);
                return;
            }
        }
        if let Err(()) = self.tokenize_packet(&packet, view.as_ref()) {
            self.parser.st.stats.inc(Stat::trace_packet_malformed);
        }
    }

    fn push_compressed(&mut self, packet: &TracePacketView<'_>, nested: bool) {
        if nested || packet.has_zstd_compressed_packets() {
            self.parser.st.stats.inc(Stat::compressed_packets_errors);
            return;
        }
        let (out, complete) = inflate(packet.compressed_packets(), MAX_INFLATED_BYTES + 1);
        if !complete || out.len() as u64 > MAX_INFLATED_BYTES {
            self.parser.st.stats.inc(Stat::compressed_packets_errors);
            if out.len() as u64 > MAX_INFLATED_BYTES {
                return;
            }
            // A truncated stream: keep the whole packets that came out before the error.
        }
        self.push_trace(&out, true, &mut |_| {});
    }

    // === Packets ===

    /// `view` is the packet's generated view when it has fields besides the per-event ones
    /// [`lazy::Packet`] keeps.
    fn tokenize_packet(
        &mut self,
        p: &lazy::Packet<'_>,
        view: Option<&TracePacketView<'_>>,
    ) -> Result<(), ()> {
        let seq_id = p.trusted_packet_sequence_id.unwrap_or(0);
        let has_seq = p.trusted_packet_sequence_id.is_some();
        self.cur_seq = seq_id;
        let dropped = p.previous_packet_dropped;
        // The first packet of a sequence always says "dropped" (the service cannot know what
        // came before), so it is not counted as a loss, as in Perfetto.
        match self.seqs.get_or_insert(seq_id) {
            (_, true) => {}
            (seq, false) if has_seq && dropped != 0 => {
                seq.dropped += 1;
                for ((reason, _), count) in LOSS_CAUSES.iter().zip(&mut seq.loss_causes) {
                    if dropped & *reason as u32 != 0 {
                        *count += 1;
                    }
                }
            }
            (_, false) => {}
        }
        let writer_dropped = p.tachyon_packets_dropped;
        if writer_dropped != 0 && has_seq {
            let seq = self.seq(seq_id);
            seq.writer_dropped = seq.writer_dropped.saturating_add_unsigned(writer_dropped);
        }
        if p.first_packet_on_sequence {
            self.parser.first_packet_seqs.insert(seq_id, ());
        }
        let flags = p.sequence_flags;
        if p.incremental_state_cleared || flags & SEQ_INCREMENTAL_STATE_CLEARED != 0 {
            if has_seq {
                self.seq(seq_id).clear();
            } else {
                self.parser
                    .st
                    .stats
                    .inc(Stat::incremental_state_cleared_missing_sequence_id);
            }
        } else if dropped != 0 {
            if has_seq {
                self.seq(seq_id).valid = false;
            } else {
                self.parser
                    .st
                    .stats
                    .inc(Stat::previous_packet_dropped_missing_sequence_id);
            }
        }

        if let Some(v) = view {
            if self.packet_state(seq_id, has_seq, v)? {
                return Ok(());
            }
        }

        if flags & SEQ_NEEDS_INCREMENTAL_STATE != 0 {
            if !has_seq || seq_id == 0 {
                // Perfetto rejects this outright (the service is too old): count and skip.
                self.parser
                    .st
                    .stats
                    .inc(Stat::packet_skipped_seq_needs_incremental_state_invalid);
                return Ok(());
            }
            let seq = self.seq(seq_id);
            seq.needs_total += 1;
            if !seq.valid {
                seq.needs_skipped += 1;
                self.parser
                    .st
                    .stats
                    .inc(Stat::packet_skipped_seq_needs_incremental_state_invalid);
                return Ok(());
            }
        }

        // Every timestamped packet's time is converted once, here, whatever it carries, as in
        // Perfetto (which converts each packet's timestamp before dispatching it): an
        // incremental clock advances by every delta, and the SDKs write descriptors with deltas
        // too — skipping one would put every later event of the sequence early by it, and
        // converting twice (a packet with two descriptors) would advance it twice.
        let time = self.packet_time(seq_id, p);

        if let Some(v) = view {
            self.packet_data(seq_id, has_seq, v, &time)?;
        }
        if let Some(event) = p.track_event {
            return self.track_event(seq_id, has_seq, event, time);
        }
        Ok(())
    }

    /// The sequence state and service bookkeeping a packet's other fields carry (defaults,
    /// interned data, clock snapshots, stats, config, service events). `Ok(true)`: the packet
    /// is done (a clock snapshot or service event carries nothing else we look at).
    fn packet_state(
        &mut self,
        seq_id: u32,
        has_seq: bool,
        p: &TracePacketView<'_>,
    ) -> Result<bool, ()> {
        // Defaults first: they affect this packet's own timestamp and track.
        if p.has_trace_packet_defaults() {
            if has_seq {
                let d = p.trace_packet_defaults().map_err(drop)?;
                let mut defaults = Defaults {
                    clock_id: d.timestamp_clock_id(),
                    ..Default::default()
                };
                if d.has_track_event_defaults() {
                    let te = d.track_event_defaults().map_err(drop)?;
                    if te.has_track_uuid() {
                        defaults.track_uuid = Some(te.track_uuid());
                    }
                    defaults.extra_counter_uuids = te
                        .extra_counter_track_uuids()
                        .filter_map(Result::ok)
                        .collect();
                    defaults.extra_double_counter_uuids = te
                        .extra_double_counter_track_uuids()
                        .filter_map(Result::ok)
                        .collect();
                }
                self.seq(seq_id).defaults = Some(defaults);
            } else {
                self.parser
                    .st
                    .stats
                    .inc(Stat::trace_packet_defaults_missing_sequence_id);
            }
        }
        if p.has_interned_data() {
            if !has_seq {
                self.parser
                    .st
                    .stats
                    .inc(Stat::interned_data_missing_sequence_id);
            } else if !self.seq(seq_id).valid {
                self.parser
                    .st
                    .stats
                    .inc(Stat::interned_data_skipped_incremental_state_invalid);
            } else {
                self.ingest_interned(seq_id, p)?;
            }
        }
        if p.has_clock_snapshot() {
            // Like Perfetto, a clock snapshot packet carries nothing else we look at.
            return self.clock_snapshot(seq_id, p).map(|()| true);
        }
        if p.has_trace_stats() {
            self.trace_stats(p)?;
        }
        if p.has_trace_config() {
            let c = p.trace_config().map_err(drop)?;
            self.streamed_buffers = (c.write_into_file()
                && c.file_write_period_ms() < STREAMING_PERIOD_LIMIT_MS)
                .then(|| c.buffers().count() as i64);
        }
        if p.has_track_event_range_of_interest() {
            let r = p.track_event_range_of_interest().map_err(drop)?;
            self.range_of_interest = Some(r.start_us().saturating_mul(1000));
        }
        if p.has_service_event() {
            let e = p.service_event().map_err(drop)?;
            if e.all_data_sources_flushed() {
                self.sorter.notify_flush();
            }
            if e.read_tracing_buffers_completed() {
                self.notify_read_buffers();
            }
            return Ok(true);
        }
        Ok(false)
    }

    /// What a packet's other fields describe, at the packet's time: descriptors, system probes,
    /// profiles.
    fn packet_data(
        &mut self,
        seq_id: u32,
        has_seq: bool,
        p: &TracePacketView<'_>,
        time: &Time,
    ) -> Result<(), ()> {
        let time = *time;
        if p.has_track_descriptor() {
            let d = p.track_descriptor().map_err(drop)?;
            let ts = self.naming_time(&time);
            self.track_descriptor(&d, seq_id, ts)?;
        }
        if p.has_thread_descriptor() {
            let d = p.thread_descriptor().map_err(drop)?;
            let (pid, tid) = (d.pid() as i64, d.tid());
            let name = if d.has_thread_name() {
                self.parser.st.strings.intern_bytes(d.thread_name_bytes())
            } else {
                NONE
            };
            if has_seq {
                let seq = self.seq(seq_id);
                seq.legacy_thread = Some((Some(pid), tid));
                seq.legacy_ts_us = d
                    .has_reference_timestamp_us()
                    .then(|| d.reference_timestamp_us());
                seq.legacy_thread_time_us = d
                    .has_reference_thread_time_us()
                    .then(|| d.reference_thread_time_us());
                seq.legacy_thread_instructions = d
                    .has_reference_thread_instruction_count()
                    .then(|| d.reference_thread_instruction_count());
            }
            let aux = Aux {
                pid: Some(pid),
                tid,
                name,
                cmdline: NONE,
                ppid: None,
                uid: None,
            };
            let ts = self.naming_time(&time);
            self.push_aux(ts, EventKind::Thread, aux);
        }
        if p.has_process_descriptor() {
            let d = p.process_descriptor().map_err(drop)?;
            let (name, cmdline) = self.process_names(&d);
            let aux = Aux {
                pid: Some(d.pid() as i64),
                tid: 0,
                name,
                cmdline,
                ppid: None,
                uid: None,
            };
            let ts = self.naming_time(&time);
            self.push_aux(ts, EventKind::Process, aux);
        }
        if p.has_process_tree() {
            let ts = self.naming_time(&time);
            let mut out = std::mem::take(&mut self.scratch);
            let result = self.parser.process_tree(p, ts, &mut out);
            for ev in out.drain(..) {
                self.emit(ev);
            }
            self.scratch = out;
            result?;
        }
        if p.has_sys_stats() {
            let mut out = std::mem::take(&mut self.scratch);
            let result = self.parser.sys_stats(p, &mut out);
            self.emit_timed(&time, &mut out);
            self.scratch = out;
            result?;
        }
        if p.has_process_stats() {
            let mut out = std::mem::take(&mut self.scratch);
            let result = self.parser.process_stats(p, &mut out);
            self.emit_timed(&time, &mut out);
            self.scratch = out;
            result?;
        }
        if p.has_profile_packet() {
            let ts = match time {
                Time::At(ts) => ts,
                _ => self.latest_ts,
            };
            let clocks = &mut self.clocks;
            let mut to_trace = |raw: u64| match clocks.convert(
                tachyon_protos::BuiltinClock::MonotonicCoarse as ClockId,
                raw,
            ) {
                Converted::At(ts) => Some(ts),
                _ => None,
            };
            crate::importers::heap::profile_packet(
                &mut self.parser.st,
                seq_id,
                ts,
                p,
                &mut to_trace,
            )?;
        }
        if p.has_perf_sample() && has_seq {
            let s = p.perf_sample().map_err(drop)?;
            let seq = self.seqs.get_mut(&seq_id).expect("sequence exists");
            if let Some(idx) = crate::importers::profile::tokenize_perf_sample(
                &mut seq.profile,
                &mut self.parser.st,
                &s,
            ) {
                let mut out = std::mem::take(&mut self.scratch);
                out.push(Event::bare(EventKind::PerfSample, 0, 0, idx));
                self.emit_timed(&time, &mut out);
                self.scratch = out;
            }
        }
        if p.has_streaming_profile_packet() && has_seq {
            self.streaming_profile_packet(seq_id, p);
        }
        if p.has_module_symbols() {
            let m = p.module_symbols().map_err(drop)?;
            crate::importers::profile::queue_module_symbols(&mut self.parser.st, &m)?;
        }
        Ok(())
    }

    /// Emits `events` (timestamps still unset) at the packet's time: a packet without a
    /// timestamp takes the latest one seen, as in Perfetto's `ProtoTraceReader`; one whose clock
    /// has no path yet waits for the end of the file; one whose time cannot be converted is
    /// dropped and counted.
    fn emit_timed(&mut self, time: &Time, events: &mut Vec<Event>) {
        if events.is_empty() {
            return;
        }
        match *time {
            Time::At(ts) if ts >= 0 => {
                for ev in events.drain(..) {
                    self.emit(Event { ts, ..ev });
                }
            }
            Time::Missing => {
                let ts = self.latest_ts;
                for ev in events.drain(..) {
                    self.emit(Event { ts, ..ev });
                }
            }
            Time::Deferred(time) => {
                self.sorter.force_full_sort();
                for event in events.drain(..) {
                    self.deferred.push(Deferred { time, event });
                }
            }
            Time::At(_) | Time::Failed => {
                self.parser.st.stats.inc(Stat::clock_sync_failure);
                events.clear();
            }
        }
    }

    fn seq(&mut self, id: u32) -> &mut Sequence {
        self.seqs.or_default(id)
    }

    fn legacy_thread(&mut self, pid: Option<i64>, tid: i64, scope: u8) -> u64 {
        let next = self.parser.legacy_threads.len() as u64;
        *self
            .legacy_thread_ids
            .entry((pid, tid, scope))
            .or_insert_with(|| {
                self.parser.legacy_threads.push((pid, tid, scope));
                next
            })
    }

    fn process_names(&mut self, d: &tachyon_protos::ProcessDescriptorView<'_>) -> (StrId, StrId) {
        let args: Vec<String> = d
            .cmdline()
            .filter_map(Result::ok)
            .map(str::to_owned)
            .collect();
        let cmdline = if args.is_empty() {
            NONE
        } else {
            self.parser.st.strings.intern(&args.join(" "))
        };
        let name = if d.has_process_name() {
            self.parser.st.strings.intern_bytes(d.process_name_bytes())
        } else if let Some(first) = args.first() {
            self.parser.st.strings.intern(first)
        } else {
            NONE
        };
        (name, cmdline)
    }

    /// When a thread/process descriptor packet names something: at the packet's time, or the
    /// latest time seen (naming never fails for want of a clock).
    fn naming_time(&self, time: &Time) -> i64 {
        match *time {
            Time::At(ts) => ts,
            _ => self.latest_ts,
        }
    }

    /// Queues a thread/process naming event (`kind` is `Thread`, `Process`, `TreeThread` or
    /// `TreeProcess`) at `ts`.
    pub(crate) fn push_aux(&mut self, ts: i64, kind: EventKind, aux: Aux) {
        let ev = self.parser.aux_event(ts, kind, aux);
        self.emit(ev);
    }

    // === Interned data ===

    fn ingest_interned(&mut self, seq_id: u32, p: &TracePacketView<'_>) -> Result<(), ()> {
        let d = p.interned_data().map_err(drop)?;
        let mut names = Vec::new();
        for e in d.event_names() {
            let e = e.map_err(drop)?;
            names.push((e.iid(), self.parser.st.strings.intern_bytes(e.name_bytes())));
        }
        let mut cats = Vec::new();
        for e in d.event_categories() {
            let e = e.map_err(drop)?;
            cats.push((e.iid(), self.parser.st.strings.intern_bytes(e.name_bytes())));
        }
        let mut ann = Vec::new();
        for e in d.debug_annotation_names() {
            let e = e.map_err(drop)?;
            let name = self
                .parser
                .st
                .strings
                .intern_bytes(&annotation_name(e.name_bytes()));
            ann.push((e.iid(), (name, self.top_key(name))));
        }
        let mut strs = Vec::new();
        for e in d.debug_annotation_string_values() {
            let e = e.map_err(drop)?;
            strs.push((e.iid(), self.parser.st.strings.intern_bytes(e.str())));
        }
        let mut locs = Vec::new();
        for e in d.source_locations() {
            let e = e.map_err(drop)?;
            let file = self.parser.st.strings.intern_bytes(e.file_name_bytes());
            let func = self.parser.st.strings.intern_bytes(e.function_name_bytes());
            locs.push((e.iid(), (file, func, e.line_number())));
        }
        let mut bodies = Vec::new();
        for e in d.log_message_body() {
            let e = e.map_err(drop)?;
            bodies.push((e.iid(), self.parser.st.strings.intern_bytes(e.body_bytes())));
        }
        let seq = self.seqs.get_mut(&seq_id).expect("sequence exists");
        crate::importers::profile::ingest_interned(
            &mut seq.profile,
            &d,
            &mut self.parser.st.strings,
        )?;
        seq.arg_cache.clear();
        seq.log_bodies.extend(bodies);
        seq.names.extend(names);
        seq.categories.extend(cats);
        seq.annotation_names.extend(ann);
        seq.annotation_strings.extend(strs);
        seq.source_locations.extend(locs);
        Ok(())
    }

    // === Clocks ===

    fn clock_snapshot(&mut self, seq_id: u32, p: &TracePacketView<'_>) -> Result<(), ()> {
        let snap = p.clock_snapshot().map_err(drop)?;
        if snap.has_primary_trace_clock()
            && !self
                .clocks
                .set_trace_clock(snap.primary_trace_clock_raw() as ClockId)
        {
            self.parser.st.stats.inc(Stat::invalid_clock_snapshots);
        }
        let mut readings = Vec::new();
        for c in snap.clocks() {
            let c = c.map_err(drop)?;
            let mut id = c.clock_id() as ClockId;
            if clock::is_sequence_clock(c.clock_id()) {
                if seq_id == 0 {
                    self.parser.st.stats.inc(Stat::invalid_clock_snapshots);
                    return Ok(());
                }
                id = clock::sequence_clock(seq_id, c.clock_id());
            }
            readings.push(ClockReading {
                id,
                value: c.timestamp(),
                is_incremental: c.is_incremental(),
                unit_multiplier_ns: c.unit_multiplier_ns(),
            });
        }
        if self.clocks.add_snapshot(&readings).is_err() {
            self.parser.st.stats.inc(Stat::invalid_clock_snapshots);
        }
        Ok(())
    }

    fn packet_time(&mut self, seq_id: u32, p: &lazy::Packet<'_>) -> Time {
        let Some(raw) = p.timestamp else {
            return Time::Missing;
        };
        let clock_id = if let Some(id) = p.timestamp_clock_id {
            id
        } else {
            self.seqs
                .get(&seq_id)
                .and_then(|s| s.defaults.as_ref())
                .map_or(0, |d| d.clock_id)
        };
        if clock_id == 0 {
            return Time::At(raw as i64);
        }
        let mut id = clock_id as ClockId;
        if clock::is_sequence_clock(clock_id) {
            if seq_id == 0 {
                return Time::Failed;
            }
            id = clock::sequence_clock(seq_id, clock_id);
        }
        match self.clocks.convert(id, raw) {
            Converted::At(ts) => Time::At(ts),
            // No snapshot links this clock to the trace clock yet: one may come later in the
            // file (Perfetto defers such packets to the end of the file too). That happens to a
            // sequence-scoped clock when a ring buffer overwrote the head of its sequence up to
            // the packet that defines it: the clock is tied to the trace clock, but the snapshot
            // tying the trace clock to BOOTTIME was in the lost part, and other sequences' come
            // later in the file. Its delta is already taken (in order); the rest waits.
            Converted::Later(p) if p.clock_known() || !clock::is_sequence_clock(clock_id) => {
                Time::Deferred(p)
            }
            // A sequence-scoped clock no snapshot on its sequence defined: it cannot wait,
            // since whether it carries deltas (which only make sense in order) is unknown.
            Converted::Later(_) | Converted::Failed => Time::Failed,
        }
    }

    // === TraceStats and service events ===

    fn trace_stats(&mut self, p: &TracePacketView<'_>) -> Result<(), ()> {
        let t = p.trace_stats().map_err(drop)?;
        let s = &mut self.parser.st.stats;
        let u = |v: u64| v.min(i64::MAX as u64) as i64;
        s.set(
            Stat::traced_producers_connected,
            t.producers_connected() as i64,
        );
        s.set(Stat::traced_producers_seen, u(t.producers_seen()));
        s.set(
            Stat::traced_data_sources_registered,
            t.data_sources_registered() as i64,
        );
        s.set(Stat::traced_data_sources_seen, u(t.data_sources_seen()));
        s.set(Stat::traced_tracing_sessions, t.tracing_sessions() as i64);
        s.set(Stat::traced_total_buffers, t.total_buffers() as i64);
        s.set(Stat::traced_chunks_discarded, u(t.chunks_discarded()));
        s.set(Stat::traced_patches_discarded, u(t.patches_discarded()));
        s.set(Stat::traced_flushes_requested, u(t.flushes_requested()));
        s.set(Stat::traced_flushes_succeeded, u(t.flushes_succeeded()));
        s.set(Stat::traced_flushes_failed, u(t.flushes_failed()));
        match t.final_flush_outcome_raw() {
            1 => s.add(Stat::traced_final_flush_succeeded, 1),
            2 => s.add(Stat::traced_final_flush_failed, 1),
            _ => {}
        }
        for (i, b) in t.buffer_stats().enumerate() {
            let b = b.map_err(drop)?;
            let i = i as i64;
            for (stat, v) in [
                (Stat::traced_buf_buffer_size, b.buffer_size()),
                (Stat::traced_buf_bytes_written, b.bytes_written()),
                (Stat::traced_buf_bytes_overwritten, b.bytes_overwritten()),
                (Stat::traced_buf_bytes_read, b.bytes_read()),
                (
                    Stat::traced_buf_padding_bytes_written,
                    b.padding_bytes_written(),
                ),
                (
                    Stat::traced_buf_padding_bytes_cleared,
                    b.padding_bytes_cleared(),
                ),
                (Stat::traced_buf_chunks_written, b.chunks_written()),
                (Stat::traced_buf_chunks_rewritten, b.chunks_rewritten()),
                (Stat::traced_buf_chunks_overwritten, b.chunks_overwritten()),
                (Stat::traced_buf_chunks_discarded, b.chunks_discarded()),
                (Stat::traced_buf_chunks_read, b.chunks_read()),
                (
                    Stat::traced_buf_chunks_committed_out_of_order,
                    b.chunks_committed_out_of_order(),
                ),
                (Stat::traced_buf_chunks_relocated, b.chunks_relocated()),
                (Stat::traced_buf_write_wrap_count, b.write_wrap_count()),
                (Stat::traced_buf_patches_succeeded, b.patches_succeeded()),
                (Stat::traced_buf_patches_failed, b.patches_failed()),
                (
                    Stat::traced_buf_readaheads_succeeded,
                    b.readaheads_succeeded(),
                ),
                (Stat::traced_buf_readaheads_failed, b.readaheads_failed()),
                (Stat::traced_buf_abi_violations, b.abi_violations()),
                (
                    Stat::traced_buf_trace_writer_packet_loss,
                    b.trace_writer_packet_loss(),
                ),
            ] {
                s.set_indexed(stat, i, u(v));
            }
            // Loss causes the service counted itself (TraceBufferV2), in LOSS_CAUSES order; the
            // per-sequence previous_packet_dropped bits may add to them at the end.
            let service_counted = [
                b.data_loss_read_gap(),
                b.data_loss_chunk_corrupted(),
                b.data_loss_orphan_continuation(),
                b.data_loss_reassembly_gap(),
                b.data_loss_reassembly_broken_chain(),
                b.data_loss_overwrite(),
            ];
            for ((_, stat), v) in LOSS_CAUSES.iter().zip(service_counted) {
                if v != 0 {
                    s.set_indexed(*stat, i, u(v));
                }
            }
        }
        self.writer_buffers.clear();
        for w in t.writer_stats() {
            let w = w.map_err(drop)?;
            self.writer_buffers
                .push((w.sequence_id() as u32, w.buffer()));
        }
        Ok(())
    }

    fn notify_read_buffers(&mut self) {
        let mut batch = self.sorter.on_read_buffers();
        if !batch.is_empty() {
            self.parser.apply_batch(&mut batch);
        }
    }

    // === Track descriptors ===

    /// Reserves a descriptor's track. `ts` is the packet's time: a later descriptor of the
    /// same track renames it only if no event has created the track by then, as in Perfetto.
    fn track_descriptor(
        &mut self,
        d: &TrackDescriptorView<'_>,
        seq_id: u32,
        ts: i64,
    ) -> Result<(), ()> {
        if !d.has_uuid() {
            self.parser
                .st
                .stats
                .inc(Stat::track_descriptor_missing_uuid);
            return Ok(());
        }
        let uuid = d.uuid();
        let strings = &mut self.parser.st.strings;
        let name = if d.has_name() {
            Some(strings.intern_bytes(d.name_bytes()))
        } else if d.has_static_name() {
            Some(strings.intern_bytes(d.static_name_bytes()))
        } else if d.has_atrace_name() {
            Some(strings.intern_bytes(d.atrace_name_bytes()))
        } else {
            None
        };
        let mut r = Reservation {
            parent: if uuid == 0 { 0 } else { d.parent_uuid() },
            name,
            description: d
                .has_description()
                .then(|| strings.intern_bytes(d.description_bytes())),
            child_ordering: d.child_ordering_raw(),
            disallow_merging: d.disallow_merging_with_system_tracks(),
            state: d.has_state(),
            never_merged: d.sibling_merge_behavior_raw() == 2,
            merge_key: (d.sibling_merge_behavior_raw() == 3).then(|| {
                if d.has_sibling_merge_key() {
                    strings.intern_bytes(d.sibling_merge_key_bytes())
                } else if d.has_sibling_merge_key_int() {
                    strings.intern(&format!(
                        "sibling_merge_key_int:{}",
                        d.sibling_merge_key_int()
                    ))
                } else {
                    NONE
                }
            }),
            explicit_process_order: d.process_ordering_raw() == 1,
            explicit_thread_order: d.thread_ordering_raw() == 1,
            seq_id,
            sibling_order_rank: d.has_sibling_order_rank().then(|| d.sibling_order_rank()),
            ..Default::default()
        };
        let mut thread_name = NONE;
        if d.has_thread() {
            let t = d.thread().map_err(drop)?;
            r.tid = Some(t.tid());
            r.pid = t.has_pid().then(|| t.pid() as i64);
            if t.has_thread_name() {
                thread_name = strings.intern_bytes(t.thread_name_bytes());
            }
            // As in Perfetto, a thread's descriptor is also its sequence's thread: legacy
            // events without a track uuid go to that thread (and name it as their emitter).
            if let Some(seq) = self.seqs.get_mut(&seq_id).filter(|_| seq_id != 0) {
                seq.legacy_thread = Some((r.pid, t.tid()));
            }
        }
        if d.has_chrome_process() {
            let c = d.chrome_process().map_err(drop)?;
            if c.has_host_app_package_name() {
                r.host_app = Some(
                    self.parser
                        .st
                        .strings
                        .intern_bytes(c.host_app_package_name_bytes()),
                );
            }
        }
        let mut process = None;
        if d.has_process() {
            let pd = d.process().map_err(drop)?;
            if r.tid.is_none() {
                r.pid = Some(pd.pid() as i64);
            }
            process = Some((pd.pid() as i64, self.process_names(&pd)));
        }
        if d.has_counter() {
            let c = d.counter().map_err(drop)?;
            let strings = &mut self.parser.st.strings;
            let unit = if c.has_unit_name() {
                Some(strings.intern_bytes(c.unit_name_bytes()))
            } else {
                match c.unit_raw() {
                    // COUNTER_THREAD_TIME_NS counts ns whatever unit it was given.
                    _ if c.type_raw() == 1 => Some(strings.intern("ns")),
                    1 => Some(strings.intern("ns")),
                    2 => Some(strings.intern("count")),
                    3 => Some(strings.intern("bytes")),
                    _ => None,
                }
            };
            let cats: Vec<&str> = c.categories().filter_map(Result::ok).collect();
            r.counter = Some(CounterDetails {
                unit,
                multiplier: c.unit_multiplier(),
                incremental: c.is_incremental(),
                builtin_type: c.type_raw(),
                category: (!cats.is_empty()).then(|| strings.intern(&cats.join(","))),
                y_axis_share_key: c
                    .has_y_axis_share_key()
                    .then(|| strings.intern_bytes(c.y_axis_share_key_bytes())),
            });
        }
        let (pid, tid) = (r.pid, r.tid);
        match self.parser.reservations.entry(uuid) {
            Entry::Vacant(e) => {
                e.insert(r);
            }
            Entry::Occupied(mut e) => {
                let old = e.get_mut();
                let same = old.parent == r.parent
                    && old.pid == r.pid
                    && old.tid == r.tid
                    && old.counter.is_some() == r.counter.is_some();
                if !same {
                    self.parser
                        .st
                        .stats
                        .inc(Stat::track_descriptor_conflicting_reservation);
                    return Ok(());
                }
                if let Some(name) = r.name {
                    let rename = Event::bare(EventKind::TrackRename, ts, uuid, name as u64);
                    self.emit(rename);
                }
            }
        }
        // Track descriptors name from the start of the trace (`i64::MIN`): a name is a
        // property of the thread, not of a moment, and events before the descriptor should
        // see it too.
        if let Some(tid) = tid {
            let aux = Aux {
                pid,
                tid,
                name: thread_name,
                cmdline: NONE,
                ppid: None,
                uid: None,
            };
            self.parser
                .aux_uuid
                .insert(self.parser.aux.len() as u64, uuid);
            self.push_aux(i64::MIN, EventKind::Thread, aux);
        }
        if let Some((pid, (name, cmdline))) = process {
            self.parser
                .aux_uuid
                .insert(self.parser.aux.len() as u64, uuid);
            let aux = Aux {
                pid: Some(pid),
                tid: 0,
                name,
                cmdline,
                ppid: None,
                uid: None,
            };
            self.push_aux(i64::MIN, EventKind::Process, aux);
        }
        Ok(())
    }

    // === TrackEvent ===

    fn track_event(
        &mut self,
        seq_id: u32,
        has_seq: bool,
        bytes: &[u8],
        packet_time: Time,
    ) -> Result<(), ()> {
        let ev = match lazy::TrackEvent::decode(bytes) {
            Ok(ev) => ev,
            Err(_) => {
                self.parser.st.stats.inc(Stat::track_event_tokenizer_errors);
                return Ok(());
            }
        };
        if !has_seq {
            self.parser
                .st
                .stats
                .inc(Stat::track_event_missing_sequence_id);
            return Ok(());
        }
        // Fields outside the common set (legacy events and timestamps, inline categories,
        // thread time, extra counters, log messages, call stacks) are read through the view.
        let rare_view = ev.view();
        let rare = rare_view.as_ref();
        // Legacy microsecond timestamps are CLOCK_MONOTONIC readings, as in Perfetto.
        let legacy_us = if let Some(r) = rare.filter(|r| r.has_timestamp_absolute_us()) {
            Some(r.timestamp_absolute_us())
        } else if let Some(r) = rare.filter(|r| r.has_timestamp_delta_us()) {
            let seq = self.seq(seq_id);
            match seq.legacy_ts_us {
                Some(base) => {
                    let t = base.saturating_add(r.timestamp_delta_us());
                    seq.legacy_ts_us = Some(t);
                    Some(t)
                }
                None => {
                    self.parser.st.stats.inc(Stat::clock_sync_failure);
                    return Ok(());
                }
            }
        } else {
            None
        };
        let time = match legacy_us.map(|us| us.saturating_mul(1000)) {
            Some(ns) if ns < 0 => {
                self.parser
                    .st
                    .stats
                    .inc(Stat::track_event_invalid_timestamp);
                return Ok(());
            }
            Some(ns) => match self.clocks.convert(clock::MONOTONIC, ns as u64) {
                Converted::At(ts) => Time::At(ts),
                Converted::Later(p) => Time::Deferred(p),
                Converted::Failed => Time::Failed,
            },
            None => packet_time,
        };
        let (ts, deferred) = match time {
            Time::At(ts) => (ts, None),
            Time::Deferred(time) => (0, Some(time)),
            Time::Missing => {
                self.parser
                    .st
                    .stats
                    .inc(Stat::track_event_missing_timestamp);
                return Ok(());
            }
            Time::Failed => {
                self.parser.st.stats.inc(Stat::clock_sync_failure);
                return Ok(());
            }
        };
        if deferred.is_none() && ts < 0 {
            self.parser
                .st
                .stats
                .inc(Stat::track_event_invalid_timestamp);
            return Ok(());
        }
        if self.crop_track_events
            && deferred.is_none()
            && self.range_of_interest.is_some_and(|start| ts < start)
        {
            return Ok(());
        }
        let mut out = std::mem::take(&mut self.scratch);
        self.tokenize_track_event(seq_id, &ev, rare, ts, &mut out);
        match deferred {
            None => {
                for &event in &out {
                    self.emit(event);
                }
            }
            Some(time) if !out.is_empty() => {
                self.sorter.force_full_sort();
                for &event in &out {
                    self.deferred.push(Deferred { time, event });
                }
            }
            Some(_) => {}
        }
        out.clear();
        self.scratch = out;
        Ok(())
    }

    /// `rare` is the event's view when it has fields outside [`lazy::TrackEvent`]'s.
    fn tokenize_track_event(
        &mut self,
        seq_id: u32,
        ev: &lazy::TrackEvent<'_>,
        rare: Option<&TrackEventView<'_>>,
        ts: i64,
        out: &mut Vec<Event>,
    ) {
        let seq = self
            .seqs
            .get(&seq_id)
            .expect("sequence exists once a packet was seen");
        let defaults = seq.defaults.as_ref();
        let legacy = rare
            .filter(|r| r.has_legacy_event())
            .and_then(|r| r.legacy_event().ok());
        let default_uuid = defaults.and_then(|d| d.track_uuid);
        let uuid = if ev.has_track_uuid() {
            ev.track_uuid()
        } else {
            default_uuid.unwrap_or(0)
        };
        // Events on the default track (uuid 0, explicit or not) that are legacy events, or on
        // a sequence with a legacy ThreadDescriptor, belong to a thread, as in Perfetto: the
        // legacy event's pid/tid override, else the ThreadDescriptor's thread, else the thread
        // of the sequence's default track. Legacy instants with a process or global scope go
        // to that process's (or the global) legacy instant track instead.
        let mut legacy_target = None;
        // An explicit track uuid 0 on a typed event means the default track, not a fallback.
        let explicit_default = ev.has_track_uuid()
            && ev.has_type()
            && !legacy
                .as_ref()
                .is_some_and(|l| l.has_pid_override() || l.has_tid_override());
        if uuid == 0 && !explicit_default && (legacy.is_some() || seq.legacy_thread.is_some()) {
            let overridden = legacy.as_ref().and_then(|l| {
                l.has_tid_override()
                    .then(|| (Some(l.pid_override() as i64), l.tid_override() as i64))
            });
            let thread = overridden.or(seq.legacy_thread).or_else(|| {
                let r = self.parser.reservations.get(&default_uuid?)?;
                Some((r.pid, r.tid?))
            });
            if let Some((pid, tid)) = thread {
                let is_instant = ev.type_raw() == 3
                    || legacy
                        .as_ref()
                        .is_some_and(|l| matches!(l.phase() as u8, b'I' | b'i' | b'n' | b'R'));
                let scope = match legacy.as_ref().map(|l| l.instant_event_scope_raw()) {
                    Some(s @ (1 | 2)) if is_instant => s as u8,
                    _ => LEGACY_SCOPE_THREAD,
                };
                legacy_target = Some((pid, tid, scope));
            }
        }
        let (track, legacy_thread) = match legacy_target {
            Some((pid, tid, scope)) => (self.legacy_thread(pid, tid, scope), true),
            None => (uuid, false),
        };
        let seq = &self.seqs[&seq_id];
        let mut kind = match ev.type_raw() {
            1 => EventKind::SliceBegin,
            2 => EventKind::SliceEnd,
            3 => EventKind::Instant,
            4 => EventKind::Counter,
            5 if !ev.has_track_uuid() && default_uuid.is_none() => {
                self.parser
                    .st
                    .stats
                    .inc(Stat::track_event_state_missing_track_uuid);
                return;
            }
            // TYPE_STATE: only on a described state track, never a legacy thread's.
            5 if !legacy_thread
                && uuid != 0
                && self.parser.reservations.get(&uuid).is_some_and(|r| r.state) =>
            {
                EventKind::State
            }
            // Unset: a legacy event (its phase decides, below).
            0 => EventKind::Instant,
            // TYPE_STATE (state tracks are not modelled) and types this importer does not
            // know: counted, not guessed.
            _ => {
                self.parser.st.stats.inc(Stat::track_event_parser_errors);
                return;
            }
        };
        let mut data = 0u64;
        let mut legacy_name_iid = None;
        // A flow event riding on the slice (legacy `bind_id` with a direction).
        let mut bound_flow = None;
        let mut v1_flow_id = None;
        let mut async_phase = None;
        if let Some(l) = &legacy {
            if l.has_name_iid() {
                legacy_name_iid = Some(l.name_iid());
            }
            if l.has_bind_id() {
                bound_flow = match l.flow_direction_raw() {
                    1 => Some((EventKind::FlowIn, l.bind_id())),
                    2 => Some((EventKind::FlowOut, l.bind_id())),
                    3 => Some((EventKind::FlowStep, l.bind_id())),
                    _ => None,
                };
            }
        }
        if ev.type_raw() == 0 || !ev.has_type() {
            // A legacy (TRACE_EVENT-era) event: the phase says what it is.
            let Some(l) = &legacy else {
                self.parser.st.stats.inc(Stat::track_event_parser_errors);
                return;
            };
            kind = match l.phase() as u8 {
                b'B' => EventKind::SliceBegin,
                b'E' => EventKind::SliceEnd,
                b'I' | b'i' | b'R' => EventKind::Instant,
                phase if crate::importers::legacy::is_async_phase(phase) => {
                    async_phase = Some(phase);
                    crate::importers::legacy::slice_kind(phase)
                }
                b'X' => {
                    data = l.duration_us().saturating_mul(1000).max(0) as u64;
                    EventKind::Complete
                }
                phase @ (b's' | b't' | b'f') => {
                    // Flow v1: the id is scoped by the event's category and name (resolved
                    // below), as in Chrome's JSON format.
                    let id = if l.has_unscoped_id() {
                        l.unscoped_id()
                    } else if l.has_local_id() {
                        l.local_id()
                    } else {
                        l.global_id()
                    };
                    v1_flow_id = Some(id);
                    match phase {
                        b's' => EventKind::FlowOut,
                        b't' => EventKind::FlowStep,
                        _ if l.bind_to_enclosing() => EventKind::FlowEnd,
                        _ => EventKind::FlowEndNext,
                    }
                }
                _ => {
                    self.parser.st.stats.inc(Stat::track_event_parser_errors);
                    return;
                }
            };
        }

        // Name and categories, through the sequence's interned data.
        let mut interned_misses = 0;
        let name = if ev.has_name() {
            self.parser.st.strings.intern_bytes(ev.name_bytes())
        } else if let Some(iid) = ev.has_name_iid().then(|| ev.name_iid()).or(legacy_name_iid) {
            match seq.names.get(&iid) {
                Some(&n) => n,
                None => {
                    interned_misses += 1;
                    NONE
                }
            }
        } else {
            NONE
        };
        // Categories: one is used as is (no allocation on this per-event path); several, the
        // interned ones then the inline ones, are joined with ",".
        let mut interned_category = NONE;
        let mut interned_categories = 0;
        for iid in ev.category_iids() {
            match iid.ok().and_then(|iid| seq.categories.get(&iid)) {
                Some(&c) => {
                    interned_category = c;
                    interned_categories += 1;
                }
                None => interned_misses += 1,
            }
        }
        let mut inline = rare.into_iter().flat_map(|r| r.categories().flatten());
        let category = match (interned_categories, inline.next()) {
            (0, None) => NONE,
            (1, None) => interned_category,
            (0, Some(c)) if inline.next().is_none() => self.parser.st.strings.intern(c),
            _ => {
                let strings = &self.parser.st.strings;
                let joined = ev
                    .category_iids()
                    .filter_map(|iid| seq.categories.get(&iid.ok()?))
                    .map(|&c| strings.get(c))
                    .chain(rare.into_iter().flat_map(|r| r.categories().flatten()))
                    .collect::<Vec<_>>()
                    .join(",");
                self.parser.st.strings.intern(&joined)
            }
        };

        // A legacy async event goes to an async track of its id (`legacy.rs`).
        let mut async_track = None;
        if let (Some(phase), Some(l)) = (async_phase, &legacy) {
            let emitter = if legacy_thread {
                crate::importers::legacy::Emitter::LegacyThread(track)
            } else {
                crate::importers::legacy::Emitter::Track(track)
            };
            match self
                .parser
                .tokenize_async(phase, l, emitter, name, category)
            {
                Some(t) => async_track = Some((t, phase)),
                None => return,
            }
        }

        if let Some(id) = v1_flow_id {
            // Flow v1 ids live in their own space (the top bit set), one per (id, category,
            // name).
            let next = (self.v1_flow_ids.len() as u64) | (1 << 63);
            data = *self.v1_flow_ids.entry((id, category, name)).or_insert(next);
        }

        // Counter values: the main one, then the extra ones (which may ride on any event).
        if kind == EventKind::Counter {
            let value = if ev.has_counter_value() {
                ev.counter_value() as f64
            } else if ev.has_double_counter_value() {
                ev.double_counter_value()
            } else {
                self.parser
                    .st
                    .stats
                    .inc(Stat::track_event_counter_missing_value);
                return;
            };
            // A legacy thread's track is never a counter track.
            let value = if legacy_thread {
                None
            } else {
                self.counter_value(seq_id, track, value)
            };
            match value {
                Some(v) => out.push(Event::counter(ts, track, v)),
                None => self
                    .parser
                    .st
                    .stats
                    .inc(Stat::track_event_counter_invalid_track_uuid),
            }
        }
        if let Some(r) = rare {
            self.extra_counters(seq_id, r, ts, out);
            self.thread_counters(seq_id, r, ts, track, legacy_thread, out);
        }

        if kind != EventKind::Counter {
            let args = self.parser.arena_args.len() as u32;
            if let Some((t, phase)) = async_track {
                self.parser.async_args_before(t, phase);
            }
            // A log message's interned data, resolved once: for its args now and its row later.
            let log = rare
                .filter(|r| r.has_log_message())
                .map(|r| self.log_message(seq_id, r));
            self.annotations(seq_id, ev, rare, log.flatten(), &mut interned_misses);
            if let Some((t, phase)) = async_track {
                self.parser.async_args_after(t, phase);
            } else if !legacy_thread && kind != EventKind::SliceEnd {
                if let Some(thread) = self.seqs.get(&seq_id).and_then(|s| s.legacy_thread) {
                    self.parser.passthrough_placeholder(track, thread);
                }
            } else if legacy_thread {
                // A legacy instant with a process or global scope names its thread.
                if let Some(&(pid, tid, scope)) = self.parser.legacy_threads.get(track as usize) {
                    if scope != LEGACY_SCOPE_THREAD {
                        self.parser.passthrough_placeholder(u64::MAX, (pid, tid));
                    }
                }
            }
            let nargs = self.parser.arena_args.len() as u32 - args;
            self.parser.arena_args.hold(args, nargs);
            // Most events carry no flow ids: they leave the flow arena alone, and their
            // `flows` is 0, which the sorter encodes in no bytes.
            let (flows, nflows, nterm) = if ev.has_flows() || rare.is_some() {
                self.event_flows(ev, rare)
            } else {
                (0, 0, 0)
            };
            // (Call stacks are rare fields: an event without them has no callsite.)
            if let (Some(r), EventKind::SliceBegin | EventKind::SliceEnd | EventKind::Instant) =
                (rare, kind)
            {
                // The callsite, + 1 (0: none), for `__intrinsic_track_event_callstacks`.
                // The event's process, if its track has one: its mappings are that process's
                // (Perfetto resolves track event stacks with the track's upid).
                let pid = if legacy_thread {
                    self.parser
                        .legacy_threads
                        .get(track as usize)
                        .and_then(|t| t.0)
                } else {
                    self.parser.reservations.get(&track).and_then(|r| r.pid)
                };
                let seq = self.seqs.get_mut(&seq_id).expect("sequence exists");
                if let Some(c) = crate::importers::profile::track_event_callsite(
                    &mut seq.profile,
                    &mut self.parser.st,
                    pid,
                    r,
                ) {
                    data = u64::from(c) + 1;
                    if r.has_callstack_weight() {
                        let w = &mut self.parser.st.profile.callstack_weights;
                        w.push(r.callstack_weight());
                        data |= (w.len() as u64) << 32;
                    }
                }
            }
            let (track, legacy_thread) = match async_track {
                Some((t, _)) => (t, true),
                None => (track, legacy_thread),
            };
            let event = Event {
                ts,
                track,
                data,
                name,
                category,
                args,
                nargs,
                flows,
                nflows,
                nterm,
                kind,
                legacy_thread,
                order: 0,
            };
            out.push(event);
            if let Some((flow_kind, id)) = bound_flow {
                // After its slice (the sort is stable), so the slice encloses it.
                let mut flow = Event::bare(flow_kind, ts, track, id);
                flow.legacy_thread = legacy_thread;
                out.push(flow);
            }
            if let Some(log) = log {
                // As Perfetto: an unresolved body or location is an interning miss and a
                // parser error, and no row.
                match log.and_then(|l| self.log_row(l)) {
                    Some(row) => self.parser.push_log(&event, row, out),
                    None => {
                        interned_misses += 1;
                        self.parser.st.stats.inc(Stat::track_event_parser_errors);
                    }
                }
            }
        }
        if interned_misses > 0 {
            self.parser
                .st
                .stats
                .add(Stat::interned_data_tokenizer_errors, interned_misses);
        }
    }

    /// Appends an event's flow ids, then its terminating flow ids, to the flow arena: (where
    /// they start, how many of each). An event carries at most u16::MAX flow ids of each kind;
    /// more are dropped and counted.
    fn event_flows(
        &mut self,
        ev: &lazy::TrackEvent<'_>,
        rare: Option<&TrackEventView<'_>>,
    ) -> (u32, u16, u16) {
        let arena = &mut self.parser.arena_flows;
        let flows = arena.len() as u32;
        let rare_flows = rare
            .into_iter()
            .flat_map(|r| r.flow_ids_old().filter_map(Result::ok));
        let (nflows, flows_dropped) = capped_extend(
            arena,
            ev.flow_ids().filter_map(Result::ok).chain(rare_flows),
        );
        let rare_terms = rare
            .into_iter()
            .flat_map(|r| r.terminating_flow_ids_old().filter_map(Result::ok));
        let (nterm, terms_dropped) = capped_extend(
            arena,
            ev.terminating_flow_ids()
                .filter_map(Result::ok)
                .chain(rare_terms),
        );
        let dropped = flows_dropped + terms_dropped;
        if dropped > 0 {
            self.parser
                .st
                .stats
                .add(Stat::flow_ids_dropped, dropped as i64);
        }
        (flows, nflows, nterm)
    }

    /// A track event's `log_message` with its interned data resolved; `None` when it does not
    /// decode or its body is not interned on the sequence.
    fn log_message(&self, seq_id: u32, ev: &TrackEventView<'_>) -> Option<LogMessage> {
        let m = ev.log_message().ok()?;
        let seq = &self.seqs[&seq_id];
        let body = *seq.log_bodies.get(&m.body_iid())?;
        let location = if m.has_source_location_iid() {
            let loc = seq.source_locations.get(&m.source_location_iid()).copied();
            loc.map(Some).ok_or(())
        } else {
            Ok(None)
        };
        Some(LogMessage {
            body,
            location,
            prio: m.has_prio().then(|| m.prio_raw().clamp(0, 7) as u32),
        })
    }

    /// A resolved log message's `android_logs` row: its priority (INFO when it states none),
    /// `file:line` tag and body; `None` when its source location is not interned.
    fn log_row(&mut self, log: LogMessage) -> Option<crate::importers::logs::PendingLog> {
        let tag = match log.location.ok()? {
            Some((file, _, line)) => {
                let t = format!("{}:{line}", self.parser.st.strings.get(file));
                self.parser.st.strings.intern(&t)
            }
            None => NONE,
        };
        Some(crate::importers::logs::PendingLog {
            prio: log.prio.unwrap_or(crate::importers::logs::PRIO_INFO),
            tag,
            msg: log.body,
        })
    }

    fn extra_counters(
        &mut self,
        seq_id: u32,
        ev: &TrackEventView<'_>,
        ts: i64,
        out: &mut Vec<Event>,
    ) {
        let seq = &self.seqs[&seq_id];
        let pick = |own: Vec<u64>, dflt: Option<&Vec<u64>>| {
            if own.is_empty() {
                dflt.cloned().unwrap_or_default()
            } else {
                own
            }
        };
        let defaults = seq.defaults.as_ref();
        let int_values: Vec<f64> = ev
            .extra_counter_values()
            .filter_map(Result::ok)
            .map(|v| v as f64)
            .collect();
        let dbl_values: Vec<f64> = ev
            .extra_double_counter_values()
            .filter_map(Result::ok)
            .collect();
        if int_values.is_empty() && dbl_values.is_empty() {
            return;
        }
        let int_uuids = pick(
            ev.extra_counter_track_uuids()
                .filter_map(Result::ok)
                .collect(),
            defaults.map(|d| &d.extra_counter_uuids),
        );
        let dbl_uuids = pick(
            ev.extra_double_counter_track_uuids()
                .filter_map(Result::ok)
                .collect(),
            defaults.map(|d| &d.extra_double_counter_uuids),
        );
        for (values, uuids) in [(int_values, int_uuids), (dbl_values, dbl_uuids)] {
            if values.len() > uuids.len() {
                self.parser
                    .st
                    .stats
                    .inc(Stat::track_event_extra_counter_track_uuid_mismatch);
            }
            for (v, uuid) in values.into_iter().zip(uuids) {
                match self.counter_value(seq_id, uuid, v) {
                    Some(v) => out.push(Event::counter(ts, uuid, v)),
                    None => self
                        .parser
                        .st
                        .stats
                        .inc(Stat::track_event_extra_counter_invalid_track),
                }
            }
        }
    }

    /// The thread time and instruction count an event carries, absolute or as deltas on the
    /// sequence's running values (from the ThreadDescriptor's reference values).
    fn thread_counters(
        &mut self,
        seq_id: u32,
        ev: &TrackEventView<'_>,
        ts: i64,
        track: u64,
        legacy_thread: bool,
        out: &mut Vec<Event>,
    ) {
        let seq = self.seq(seq_id);
        let time_us = if ev.has_thread_time_absolute_us() {
            Some(ev.thread_time_absolute_us())
        } else if ev.has_thread_time_delta_us() {
            seq.legacy_thread_time_us
                .map(|base| base.saturating_add(ev.thread_time_delta_us()))
        } else {
            None
        };
        let instructions = if ev.has_thread_instruction_count_absolute() {
            Some(ev.thread_instruction_count_absolute())
        } else if ev.has_thread_instruction_count_delta() {
            seq.legacy_thread_instructions
                .map(|base| base.saturating_add(ev.thread_instruction_count_delta()))
        } else {
            None
        };
        if let Some(t) = time_us {
            seq.legacy_thread_time_us = Some(t);
            let mut e = Event::counter(ts, track, t.saturating_mul(1000) as f64);
            e.kind = EventKind::ThreadTime;
            e.legacy_thread = legacy_thread;
            out.push(e);
        }
        if let Some(n) = instructions {
            seq.legacy_thread_instructions = Some(n);
            let mut e = Event::counter(ts, track, n as f64);
            e.kind = EventKind::ThreadInstructions;
            e.legacy_thread = legacy_thread;
            out.push(e);
        }
    }

    /// Applies the counter track's multiplier and, for incremental counters, the sequence's
    /// running total (reset with the incremental state). `None` if `uuid` is not a counter.
    fn counter_value(&mut self, seq_id: u32, uuid: u64, value: f64) -> Option<f64> {
        let c = self.parser.reservations.get(&uuid)?.counter.as_ref()?;
        let mut v = value;
        if c.multiplier > 0 {
            v *= c.multiplier as f64;
        }
        if c.incremental {
            let total = self.seq(seq_id).counter_values.entry(uuid).or_insert(0.0);
            *total += v;
            v = *total;
        }
        Some(v)
    }

    // === Debug annotations → args ===

    #[inline(always)]
    fn annotations(
        &mut self,
        seq_id: u32,
        ev: &lazy::TrackEvent<'_>,
        rare: Option<&TrackEventView<'_>>,
        log: Option<LogMessage>,
        misses: &mut i64,
    ) {
        // Source location, interned or inline, as `source.*` args: first, as Perfetto orders
        // them (before the debug annotations). As Perfetto: the line as the proto's `uint32`,
        // and an interned location's iid beside it.
        let [kf, kn, kl, ki] = self.keys_source;
        if ev.has_source_location_iid() {
            let iid = ev.source_location_iid();
            let seq = &self.seqs[&seq_id];
            if let Some(ids) = seq.arg_cache.location(iid) {
                for id in ids {
                    self.parser.arena_args.push_id(id);
                }
            } else if let Some(&(file, func, line)) = seq.source_locations.get(&iid) {
                let table = &mut self.parser.st.args;
                let ids = [
                    (kf, ArgValue::Str(file)),
                    (kn, ArgValue::Str(func)),
                    (kl, ArgValue::UInt(u64::from(line))),
                    (ki, ArgValue::UInt(iid)),
                ]
                .map(|(k, v)| table.entry_id(k, k, v));
                for id in ids {
                    self.parser.arena_args.push_id(id);
                }
                self.seq(seq_id).arg_cache.put_location(iid, ids);
            } else {
                *misses += 1;
            }
        } else if let Some(r) = rare.filter(|r| r.has_source_location()) {
            if let Ok(l) = r.source_location() {
                let file = self.parser.st.strings.intern_bytes(l.file_name_bytes());
                let func = self.parser.st.strings.intern_bytes(l.function_name_bytes());
                for (k, v) in [
                    (kf, ArgValue::Str(file)),
                    (kn, ArgValue::Str(func)),
                    (kl, ArgValue::UInt(u64::from(l.line_number()))),
                ] {
                    self.parser.pend_arg(k, k, v);
                }
            }
        }
        if let Some(log) = log {
            self.log_message_args(log);
        }
        for bytes in ev.debug_annotation_bytes() {
            // An annotation seen before on the sequence (same bytes, same interned data) is
            // the arg it became then.
            let cache_key = match self.seq(seq_id).arg_cache.annotation(bytes) {
                Ok(id) => {
                    self.parser.arena_args.push_id(id);
                    continue;
                }
                Err(key) => key,
            };
            let Ok(a) = lazy::Annotation::decode(bytes) else {
                self.parser.st.stats.inc(Stat::track_event_tokenizer_errors);
                continue;
            };
            let key = if let Some(name) = a.name {
                let name = self.parser.st.strings.intern_bytes(&annotation_name(name));
                self.top_key(name)
            } else if let Some(&(_, key)) = self.seqs[&seq_id]
                .annotation_names
                .get(&a.name_iid.unwrap_or(0))
            {
                key
            } else {
                *misses += 1;
                continue;
            };
            match a.view() {
                Some(view) => self.annotation_value(seq_id, &view, key, key, 0, misses),
                None => {
                    // Entry ids are handed out in order, so an id above every one seen here
                    // is a new argument: one that may never repeat (a counter, a timestamp)
                    // is not cached, where it would evict one that does.
                    if let Some(id) = self.scalar_annotation(seq_id, &a, key, misses) {
                        if id.wrapping_add(1) > self.newest_arg_entry.wrapping_add(1) {
                            self.newest_arg_entry = id;
                        } else if let Some(k) = cache_key {
                            self.seq(seq_id).arg_cache.put_annotation(k, id);
                        }
                    }
                }
            }
        }
    }

    /// A log message's args on its event, as Perfetto adds them (after the source location,
    /// before the debug annotations): the body, the message's own source location, and its
    /// priority when the message states one. The line is a signed int here, where the
    /// event's own `source.line_number` is a uint: Perfetto types the two differently. A
    /// source location that is not interned ends the args after the body, where Perfetto's
    /// parser stops; the log row's own path counts the miss.
    fn log_message_args(&mut self, log: LogMessage) {
        let [kb, kf, kn, kl, kp] = self.keys_log;
        self.parser.pend_arg(kb, kb, ArgValue::Str(log.body));
        let Ok(location) = log.location else {
            return;
        };
        if let Some((file, func, line)) = location {
            self.parser.pend_arg(kf, kf, ArgValue::Str(file));
            self.parser.pend_arg(kn, kn, ArgValue::Str(func));
            self.parser.pend_arg(kl, kl, ArgValue::Int(i64::from(line)));
        }
        if let Some(prio) = log.prio {
            self.parser.pend_arg(kp, kp, ArgValue::Int(i64::from(prio)));
        }
    }

    /// The arg key of a top-level annotation named `name`: `debug.<name>`.
    fn top_key(&mut self, name: StrId) -> StrId {
        if let Some(&k) = self.top_key_cache.get(&name) {
            return k;
        }
        let k = format!(
            "{}.{}",
            self.parser.st.strings.get(self.key_debug),
            self.parser.st.strings.get(name)
        );
        let k = self.parser.st.strings.intern(&k);
        self.top_key_cache.insert(name, k);
        k
    }

    /// A top-level annotation with a scalar value (or none): the common case of
    /// [`Tokenizer::annotation_value`], read from the lazily decoded annotation. The order of
    /// precedence between values is the same.
    fn scalar_annotation(
        &mut self,
        seq_id: u32,
        a: &lazy::Annotation<'_>,
        key: StrId,
        misses: &mut i64,
    ) -> Option<u32> {
        let value = if let Some(v) = a.bool_value {
            ArgValue::Bool(v)
        } else if let Some(v) = a.uint_value {
            ArgValue::UInt(v)
        } else if let Some(v) = a.int_value {
            ArgValue::Int(v)
        } else if let Some(v) = a.double_value {
            ArgValue::Real(v)
        } else if let Some(s) = a.string_value {
            ArgValue::Str(self.parser.st.strings.intern_bytes(s))
        } else if let Some(iid) = a.string_value_iid {
            match self.seqs[&seq_id].annotation_strings.get(&iid) {
                Some(&s) => ArgValue::Str(s),
                None => {
                    *misses += 1;
                    return None;
                }
            }
        } else if let Some(v) = a.pointer_value {
            ArgValue::Pointer(v)
        } else {
            // No value: nothing (dictionaries, arrays and the rest take the view's path).
            return None;
        };
        let id = self.parser.st.args.entry_id(key, key, value);
        self.parser.arena_args.push_id(id);
        Some(id)
    }

    fn annotation_value(
        &mut self,
        seq_id: u32,
        a: &DebugAnnotationView<'_>,
        flat_key: StrId,
        key: StrId,
        depth: u32,
        misses: &mut i64,
    ) {
        if depth > MAX_ANNOTATION_DEPTH {
            self.parser.st.stats.inc(Stat::track_event_tokenizer_errors);
            return;
        }
        let strings = &mut self.parser.st.strings;
        let value = if a.has_bool_value() {
            ArgValue::Bool(a.bool_value())
        } else if a.has_uint_value() {
            ArgValue::UInt(a.uint_value())
        } else if a.has_int_value() {
            ArgValue::Int(a.int_value())
        } else if a.has_double_value() {
            ArgValue::Real(a.double_value())
        } else if a.has_string_value() {
            ArgValue::Str(strings.intern_bytes(a.string_value_bytes()))
        } else if a.has_string_value_iid() {
            match self.seqs[&seq_id]
                .annotation_strings
                .get(&a.string_value_iid())
            {
                Some(&s) => ArgValue::Str(s),
                None => {
                    *misses += 1;
                    return;
                }
            }
        } else if a.has_pointer_value() {
            ArgValue::Pointer(a.pointer_value())
        } else if a.has_legacy_json_value() {
            let json = a.legacy_json_value_bytes();
            let mut out = Vec::new();
            crate::tokenize::json_args::push(strings, &mut out, flat_key, key, json);
            for a in out {
                self.parser.arena_args.push(&mut self.parser.st.args, a);
            }
            return;
        } else if a.has_nested_value() {
            match a.nested_value() {
                Ok(n) => self.nested_value(&n, flat_key, key, depth + 1),
                Err(_) => self.parser.st.stats.inc(Stat::track_event_tokenizer_errors),
            }
            return;
        } else {
            // A dictionary, an array, or nothing.
            let entries: Vec<_> = a.dict_entries().collect();
            for e in entries {
                let Ok(e) = e else {
                    self.parser.st.stats.inc(Stat::track_event_tokenizer_errors);
                    continue;
                };
                let name = if e.has_name() {
                    String::from_utf8_lossy(&annotation_name(e.name_bytes())).into_owned()
                } else if let Some(&(n, _)) = self.seqs[&seq_id].annotation_names.get(&e.name_iid())
                {
                    self.parser.st.strings.get(n).to_owned()
                } else {
                    *misses += 1;
                    continue;
                };
                let (fk, k) = self.child_keys(flat_key, key, &name);
                self.annotation_value(seq_id, &e, fk, k, depth + 1, misses);
            }
            let elems: Vec<_> = a.array_values().collect();
            for (i, e) in elems.into_iter().enumerate() {
                let Ok(e) = e else {
                    self.parser.st.stats.inc(Stat::track_event_tokenizer_errors);
                    continue;
                };
                let k = format!("{}[{i}]", self.parser.st.strings.get(key));
                let k = self.parser.st.strings.intern(&k);
                self.annotation_value(seq_id, &e, flat_key, k, depth + 1, misses);
            }
            return;
        };
        self.parser.pend_arg(flat_key, key, value);
    }

    fn child_keys(&mut self, flat_key: StrId, key: StrId, name: &str) -> (StrId, StrId) {
        let fk = format!("{}.{name}", self.parser.st.strings.get(flat_key));
        let k = format!("{}.{name}", self.parser.st.strings.get(key));
        (
            self.parser.st.strings.intern(&fk),
            self.parser.st.strings.intern(&k),
        )
    }

    /// The legacy `NestedValue` form of nested annotations.
    fn nested_value(
        &mut self,
        n: &debug_annotation::NestedValueView<'_>,
        flat_key: StrId,
        key: StrId,
        depth: u32,
    ) {
        if depth > MAX_ANNOTATION_DEPTH {
            self.parser.st.stats.inc(Stat::track_event_tokenizer_errors);
            return;
        }
        match n.nested_type_raw() {
            1 => {
                let keys: Vec<String> = n
                    .dict_keys()
                    .filter_map(Result::ok)
                    .map(|k| String::from_utf8_lossy(&annotation_name(k.as_bytes())).into_owned())
                    .collect();
                let values: Vec<_> = n.dict_values().collect();
                for (name, v) in keys.iter().zip(values) {
                    if let Ok(v) = v {
                        let (fk, k) = self.child_keys(flat_key, key, name);
                        self.nested_value(&v, fk, k, depth + 1);
                    }
                }
            }
            2 => {
                let values: Vec<_> = n.array_values().collect();
                for (i, v) in values.into_iter().enumerate() {
                    if let Ok(v) = v {
                        let k = format!("{}[{i}]", self.parser.st.strings.get(key));
                        let k = self.parser.st.strings.intern(&k);
                        self.nested_value(&v, flat_key, k, depth + 1);
                    }
                }
            }
            _ => {
                let value = if n.has_int_value() {
                    ArgValue::Int(n.int_value())
                } else if n.has_double_value() {
                    ArgValue::Real(n.double_value())
                } else if n.has_bool_value() {
                    ArgValue::Bool(n.bool_value())
                } else if n.has_string_value() {
                    ArgValue::Str(self.parser.st.strings.intern_bytes(n.string_value_bytes()))
                } else {
                    return;
                };
                self.parser.pend_arg(flat_key, key, value);
            }
        }
    }

    // === Sorting and the end of the file ===

    fn emit(&mut self, ev: Event) {
        if ev.ts != i64::MIN {
            self.latest_ts = self.latest_ts.max(ev.ts);
        }
        self.sorter.push(ev, self.cur_seq);
    }

    /// End of input: converts deferred packets, sorts what is left, parses it, and computes
    /// the stats that need the whole trace.
    pub(crate) fn finish(&mut self) {
        for d in std::mem::take(&mut self.deferred) {
            match self.clocks.finish(d.time) {
                Some(ts) if ts >= 0 => self.emit(Event { ts, ..d.event }),
                Some(_) => self
                    .parser
                    .st
                    .stats
                    .inc(Stat::track_event_invalid_timestamp),
                None => self.parser.st.stats.inc(Stat::clock_sync_failure),
            }
        }
        let parser = &mut self.parser;
        self.sorter.drain_all(|ev| parser.apply(ev));
        self.parser.st.stats.add(
            Stat::sorter_push_event_out_of_order,
            self.sorter.out_of_order,
        );
        self.sorter.out_of_order = 0;
        self.parser.finish_parse();
        crate::importers::profile::finish(&mut self.parser.st);
        crate::importers::heap::finish(&mut self.parser.st);

        // How many packets each writer says it dropped, per sequence (whatever its buffer).
        for (&seq_id, seq) in self.seqs.iter() {
            if seq.writer_dropped != 0 {
                self.parser.st.stats.add_indexed(
                    Stat::sequence_writer_packets_dropped,
                    seq_id as i64,
                    seq.writer_dropped,
                );
            }
        }
        // In a streamed trace (write_into_file, drained at least daily; a longer period means
        // the user wants ring-buffer behaviour, as in Perfetto) overwritten bytes never
        // reached the file: data loss.
        for b in 0..self.streamed_buffers.unwrap_or(0) {
            let overwritten = self
                .parser
                .st
                .stats
                .get_indexed(Stat::traced_buf_bytes_overwritten, b);
            if let Some(v) = overwritten.filter(|&v| v > 0) {
                self.parser
                    .st
                    .stats
                    .set_indexed(Stat::long_trace_mode_bytes_overwritten, b, v);
            }
        }

        // Per-buffer loss, attributed through TraceStats.writer_stats (sequence → buffer).
        let mut seen_buffers = Vec::new();
        for &(seq_id, buffer) in &self.writer_buffers {
            let Some(seq) = self.seqs.get(&seq_id) else {
                continue;
            };
            let b = buffer as i64;
            if !seen_buffers.contains(&b) {
                seen_buffers.push(b);
                self.parser
                    .st
                    .stats
                    .add_indexed(Stat::traced_buf_sequence_packet_loss, b, 0);
                self.parser.st.stats.add_indexed(
                    Stat::traced_buf_incremental_sequences_dropped,
                    b,
                    0,
                );
            }
            let s = &mut self.parser.st.stats;
            s.add_indexed(Stat::traced_buf_sequence_packet_loss, b, seq.dropped);
            if seq.writer_dropped != 0 {
                s.add_indexed(
                    Stat::traced_buf_writer_packets_dropped,
                    b,
                    seq.writer_dropped,
                );
            }
            let all_dropped = seq.needs_skipped > 0 && seq.needs_skipped == seq.needs_total;
            s.add_indexed(
                Stat::traced_buf_incremental_sequences_dropped,
                b,
                all_dropped as i64,
            );
            for ((_, stat), &n) in LOSS_CAUSES.iter().zip(&seq.loss_causes) {
                if n != 0 {
                    s.add_indexed(*stat, b, n);
                }
            }
        }
    }
}

/// A packet's timestamp, resolved.
#[derive(Clone, Copy)]
enum Time {
    At(i64),
    Missing,
    Deferred(Pending),
    Failed,
}

/// Inflates a gzip (one or more members) or else zlib stream, stopping after `limit` bytes, as
/// Perfetto does with zlib's automatic header detection. A truncated or corrupt stream keeps
/// what came out before the error; the `bool` says whether there was none.
pub(crate) fn inflate(data: &[u8], limit: u64) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let res = if data.starts_with(&GZIP_MAGIC) {
        MultiGzDecoder::new(data).take(limit).read_to_end(&mut out)
    } else {
        ZlibDecoder::new(data).take(limit).read_to_end(&mut out)
    };
    (out, res.is_ok())
}

/// Appends `ids` to the flow arena, keeping at most `u16::MAX` of them (an event's limit per
/// kind of flow id): (how many were kept, how many dropped).
fn capped_extend(arena: &mut Vec<u64>, ids: impl Iterator<Item = u64>) -> (u16, u32) {
    let start = arena.len();
    arena.extend(ids);
    let kept = (arena.len() - start).min(u16::MAX as usize);
    let dropped = (arena.len() - start - kept) as u32;
    arena.truncate(start + kept);
    (kept as u16, dropped)
}

/// A debug annotation's name as an arg key's part: `.`, `[` and `]` (which the key syntax
/// uses) become `_`, as Perfetto's `SanitizeDebugAnnotationName` makes them.
fn annotation_name(name: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if !name.iter().any(|b| matches!(b, b'.' | b'[' | b']')) {
        return std::borrow::Cow::Borrowed(name);
    }
    std::borrow::Cow::Owned(
        name.iter()
            .map(|&b| {
                if matches!(b, b'.' | b'[' | b']') {
                    b'_'
                } else {
                    b
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_is_small() {
        assert!(std::mem::size_of::<Event>() <= 56);
    }
}

//! The `stats` table: what the recording reported about itself and what the import noticed.
//!
//! Names, kinds (single or indexed), severities and sources follow Perfetto's
//! `src/trace_processor/storage/stats.h` for every stat that also exists there, so that the
//! standard data-loss query (`SELECT * FROM stats WHERE severity = 'data_loss' AND value != 0`)
//! means the same thing on both tools. Only the stats this importer can produce are listed; the
//! three marked "Tachyon" have no Perfetto counterpart (Perfetto aborts the import in those
//! cases, we import what we can and count the rest), nor do `flow_ids_dropped`,
//! `flow_step_without_start`, `flow_without_enclosing_slice` and
//! `track_event_thread_counter_without_thread` (Perfetto drops those silently or logs them).
//! Descriptions are ours.

use std::collections::BTreeMap;

/// How bad a non-zero value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// A diagnostic counter.
    Info,
    /// Worth surfacing, but neither a bug nor data loss.
    Notice,
    /// Everything worked as designed and data was still lost.
    DataLoss,
    /// Something is wrong with the trace or the importer.
    Error,
}

impl Severity {
    /// The string in the `severity` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Notice => "notice",
            Severity::DataLoss => "data_loss",
            Severity::Error => "error",
        }
    }
}

/// Where the number comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Recorded on the device (e.g. the service's TraceStats) and copied here.
    Trace,
    /// Computed by the importer.
    Analysis,
}

impl Source {
    /// The string in the `source` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Trace => "trace",
            Source::Analysis => "analysis",
        }
    }
}

/// Whether a stat has one value or one value per index (e.g. per buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Single,
    Indexed,
}

/// One stat's static description.
#[derive(Debug)]
pub(crate) struct StatDef {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) severity: Severity,
    pub(crate) source: Source,
    pub(crate) description: &'static str,
}

macro_rules! stats {
    ($($id:ident: $kind:ident, $sev:ident, $src:ident, $desc:expr;)*) => {
        /// Every stat the importer knows, in the order of the table below.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub(crate) enum Stat { $($id,)* }

        pub(crate) const STATS: &[StatDef] = &[$(StatDef {
            name: stringify!($id),
            kind: Kind::$kind,
            severity: Severity::$sev,
            source: Source::$src,
            description: $desc,
        },)*];
    };
}

stats! {
    // --- Import of the file itself (Tachyon) ---
    trace_packet_malformed: Single, Error, Analysis,
        "TracePackets (or their payloads) that are not well-formed protobuf and were skipped.";
    trace_truncated: Single, DataLoss, Analysis,
        "Bytes at the end of the trace that do not form a whole TracePacket (a truncated file).";
    compressed_packets_errors: Single, Error, Analysis,
        "compressed_packets payloads that could not be inflated (or zstd payloads, which are not supported); their packets are missing.";
    // --- Incremental state and sequences ---
    packet_skipped_seq_needs_incremental_state_invalid: Single, Notice, Analysis,
        "Packets flagged SEQ_NEEDS_INCREMENTAL_STATE skipped because their sequence had no valid incremental state (before the first SEQ_INCREMENTAL_STATE_CLEARED, or after a packet loss until the next clear).";
    interned_data_skipped_incremental_state_invalid: Single, Notice, Analysis,
        "InternedData ignored because its sequence had no valid incremental state.";
    interned_data_tokenizer_errors: Single, Info, Analysis,
        "Interned ids (names, categories, annotation names or values, source locations) that were not found in the sequence's interned data.";
    incremental_state_cleared_missing_sequence_id: Single, Error, Analysis,
        "Packets that clear incremental state without a trusted_packet_sequence_id.";
    previous_packet_dropped_missing_sequence_id: Single, Error, Analysis,
        "Packets with previous_packet_dropped but no trusted_packet_sequence_id.";
    trace_packet_defaults_missing_sequence_id: Single, Error, Analysis,
        "TracePacketDefaults without a trusted_packet_sequence_id; ignored.";
    interned_data_missing_sequence_id: Single, Error, Analysis,
        "InternedData without a trusted_packet_sequence_id; ignored.";
    // --- Clocks and sorting ---
    clock_sync_failure: Single, Error, Analysis,
        "Timestamps that could not be converted to the trace clock (no ClockSnapshot path to it); those packets were dropped.";
    invalid_clock_snapshots: Single, Error, Analysis,
        "ClockSnapshots ignored because a clock went backwards relative to an earlier snapshot, or the snapshot was malformed.";
    sorter_push_event_out_of_order: Single, Error, Trace,
        "Events that arrived after later events had already been handed on by the windowed sorter; dropped. Import with full sort to keep them.";
    // --- TrackEvent ---
    track_event_missing_sequence_id: Single, Error, Analysis,
        "TrackEvent packets without a trusted_packet_sequence_id; dropped.";
    track_event_missing_timestamp: Single, Error, Analysis,
        "TrackEvent packets without any timestamp; dropped.";
    track_event_invalid_timestamp: Single, Error, Analysis,
        "TrackEvents whose timestamp resolved to a negative value; dropped.";
    track_event_tokenizer_errors: Single, Info, Analysis,
        "TrackEvents (or parts of them) that could not be decoded.";
    track_event_parser_errors: Single, Info, Analysis,
        "TrackEvents that could not be imported: unknown types, unknown legacy phases, TYPE_STATE off a state track, async legacy events without an id or (local ids) a process.";
    track_event_state_missing_track_uuid: Single, Error, Analysis,
        "TYPE_STATE events without a track uuid (in the event or its defaults); dropped.";
    track_event_counter_missing_value: Single, Error, Analysis,
        "TYPE_COUNTER events without counter_value or double_counter_value; dropped.";
    track_event_counter_invalid_track_uuid: Single, Error, Analysis,
        "TYPE_COUNTER events whose track is not a counter track; dropped.";
    track_event_extra_counter_track_uuid_mismatch: Single, Error, Analysis,
        "Events with more extra counter values than extra counter track uuids; the extra values were dropped.";
    track_event_extra_counter_invalid_track: Single, Error, Analysis,
        "Extra counter values aimed at a track that is not a counter track; dropped.";
    track_event_thread_counter_without_thread: Single, Error, Analysis,
        "Thread time or instruction counts on events whose track belongs to no thread; dropped.";
    track_descriptor_missing_uuid: Single, Error, Analysis,
        "TrackDescriptors without a uuid; ignored.";
    track_descriptor_conflicting_reservation: Single, Error, Analysis,
        "TrackDescriptors that redefine an earlier descriptor of the same uuid differently (other parent, thread, process or counter-ness); ignored.";
    track_hierarchy_missing_uuid: Single, Info, Analysis,
        "Events dropped because their track's parent_uuid chain names a track that was never described.";
    track_event_track_hierarchy_loop: Single, Error, Analysis,
        "Events dropped because their track is its own ancestor through parent_uuid.";
    misplaced_end_event: Single, DataLoss, Analysis,
        "SLICE_END events with no open slice on their track (their begin was lost or never written).";
    slice_max_depth_exceeded: Single, Error, Analysis,
        "Slices dropped because their track's stack was deeper than the supported limit.";
    flow_end_without_start: Single, Info, Trace,
        "terminating_flow_ids that no earlier event started.";
    flow_ids_dropped: Single, DataLoss, Analysis,
        "Flow ids beyond the 65535 of each kind (flow_ids, terminating_flow_ids) one event may carry; dropped.";
    flow_step_without_start: Single, Info, Trace,
        "Flow steps (legacy phase t, FLOW_INOUT) whose flow no earlier event started; they start it.";
    flow_without_enclosing_slice: Single, Info, Trace,
        "Flow events (legacy phases s, t, f with bind_to_enclosing; bind_id) with no open slice on their track to bind to; dropped.";
    // --- System probes (linux.sys_stats, linux.process_stats) ---
    meminfo_unknown_keys: Single, Error, Analysis,
        "SysStats meminfo values whose key is not a MeminfoCounters value this importer knows; dropped.";
    vmstat_unknown_keys: Single, Error, Analysis,
        "SysStats vmstat values whose key is not a VmstatCounters value this importer knows; dropped.";
    invalid_cpu_times: Single, Error, Analysis,
        "SysStats cpu_stat entries without a cpu_id; dropped.";
    psi_unknown_resource: Single, Error, Analysis,
        "SysStats psi samples of a PsiResource value this importer does not know; dropped.";
    proc_stat_unknown_counters: Single, Error, Analysis,
        "ProcessStats process fields this importer does not know; dropped.";
    // --- Call stacks and CPU samples ---
    stackprofile_invalid_string_id: Single, Error, Trace,
        "Interned strings (function names, build ids, source paths) a frame or mapping refers to that the sequence never interned.";
    stackprofile_invalid_mapping_id: Single, Error, Trace,
        "Mappings a frame (or a ModuleSymbols packet) refers to that do not exist.";
    stackprofile_invalid_frame_id: Single, Error, Trace,
        "Frames a callstack (or a ModuleSymbols address) refers to that do not exist.";
    stackprofile_invalid_callstack_id: Single, Error, Trace,
        "Callstacks an event or sample refers to that the sequence never interned.";
    // --- Heap profiles (ProfilePacket) ---
    stackprofile_empty_callstack: Single, Error, Trace, "Callstacks without frames; ignored.";
    heapprofd_buffer_corrupted: Indexed, Error, Trace,
        "Heap profile dumps whose client found its buffer corrupted, per pid.";
    heapprofd_hit_guardrail: Indexed, Error, Trace,
        "Heap profile dumps cut short by a CPU or memory guardrail, per pid.";
    heapprofd_buffer_overran: Indexed, DataLoss, Trace,
        "Heap profile dumps whose client lost records because its buffer was full (the profile is short), per pid.";
    heapprofd_client_disconnected: Indexed, Info, Trace, "Heap profile dumps of a client that went away, per pid.";
    heapprofd_malformed_packet: Indexed, Error, Trace,
        "Heap profile samples whose cumulative totals went down between dumps; dropped. Per upid.";
    heapprofd_missing_packet: Single, Error, Trace,
        "Gaps in the index of ProfilePackets on a sequence (lost packets).";
    heapprofd_rejected_concurrent: Indexed, Error, Trace,
        "Heap profiles not taken because another session profiled the process, per pid.";
    heapprofd_non_finalized_profile: Single, Error, Trace,
        "Heap profile dumps whose last packet (continued unset) never came; their samples are not imported.";
    heapprofd_last_profile_timestamp: Indexed, Info, Trace, "Time of the last heap profile dump of a process, per pid.";
    perf_samples_skipped: Single, Error, Trace,
        "CPU samples the profiler could not read or unwind.";
    perf_cpu_lost_records: Indexed, DataLoss, Trace,
        "Records the kernel lost in a CPU's perf ring buffer (the reader was too slow).";
    stackprofile_parser_error: Single, Error, Trace,
        "StreamingProfilePackets with more callstacks than timestamps, and their samples whose callstack could not be resolved; dropped.";
    streaming_profile_invalid_timestamp: Single, Error, Analysis,
        "StreamingProfilePackets whose timestamp resolved to a negative value (or came before any ThreadDescriptor); the rest of the packet is dropped.";
    // --- The tracing service's own statistics (TraceStats) ---
    traced_producers_connected: Single, Info, Trace, "Producers connected to the service.";
    traced_producers_seen: Single, Info, Trace, "Producers the service has seen since it started.";
    traced_data_sources_registered: Single, Info, Trace, "Data sources registered with the service.";
    traced_data_sources_seen: Single, Info, Trace, "Data sources the service has seen.";
    traced_tracing_sessions: Single, Info, Trace, "Tracing sessions active in the service.";
    traced_total_buffers: Single, Info, Trace, "Central buffers allocated by the service.";
    traced_chunks_discarded: Single, Info, Trace, "Chunks the service discarded (all buffers).";
    traced_patches_discarded: Single, Info, Trace, "Patches the service discarded because their chunk was gone.";
    traced_flushes_requested: Single, Info, Trace, "Flushes the service asked for.";
    traced_flushes_succeeded: Single, Info, Trace, "Flushes every data source acknowledged.";
    traced_flushes_failed: Single, DataLoss, Trace,
        "Flushes some data source did not acknowledge in time: data written before them may be missing.";
    traced_final_flush_succeeded: Single, Info, Trace, "The flush at the end of the trace succeeded.";
    traced_final_flush_failed: Single, DataLoss, Trace,
        "The flush at the end of the trace failed: the tail of some sequences may be missing.";
    traced_buf_buffer_size: Indexed, Info, Trace, "Size of the central buffer, in bytes.";
    traced_buf_bytes_written: Indexed, Info, Trace, "Bytes written into the buffer.";
    traced_buf_bytes_overwritten: Indexed, Info, Trace, "Bytes overwritten (ring buffer wrap) before they were read.";
    traced_buf_bytes_read: Indexed, Info, Trace, "Bytes read out of the buffer.";
    traced_buf_padding_bytes_written: Indexed, Info, Trace, "Padding bytes written into the buffer.";
    traced_buf_padding_bytes_cleared: Indexed, Info, Trace, "Padding bytes cleared in the buffer.";
    traced_buf_chunks_written: Indexed, Info, Trace, "Chunks written into the buffer.";
    traced_buf_chunks_rewritten: Indexed, Info, Trace, "Chunks rewritten in place (a producer recommitted a chunk).";
    traced_buf_chunks_overwritten: Indexed, Info, Trace, "Chunks overwritten by the ring buffer before being read.";
    traced_buf_chunks_discarded: Indexed, Info, Trace, "Chunks discarded because a DISCARD buffer was full.";
    traced_buf_chunks_read: Indexed, Info, Trace, "Chunks read out of the buffer.";
    traced_buf_chunks_committed_out_of_order: Indexed, Info, Trace, "Chunks committed out of order.";
    traced_buf_chunks_relocated: Indexed, Info, Trace, "Chunks moved to the write cursor instead of being rewritten in place.";
    traced_buf_write_wrap_count: Indexed, Info, Trace, "Times the buffer's write pointer wrapped.";
    traced_buf_patches_succeeded: Indexed, Info, Trace, "Patches applied to chunks in the buffer.";
    traced_buf_patches_failed: Indexed, DataLoss, Trace,
        "Patches that could not be applied because their chunk was gone: the packets they belonged to may be corrupt or missing (expected when a DISCARD buffer filled up).";
    traced_buf_readaheads_succeeded: Indexed, Info, Trace, "Read-aheads over fragmented packets that succeeded.";
    traced_buf_readaheads_failed: Indexed, Info, Trace, "Read-aheads over fragmented packets that failed.";
    traced_buf_abi_violations: Indexed, DataLoss, Trace,
        "Chunks a producer committed that broke the shared memory ABI; they were dropped.";
    traced_buf_trace_writer_packet_loss: Indexed, DataLoss, Trace,
        "Packets the service saw lost on this buffer's writer sequences (counted by the service).";
    long_trace_mode_bytes_overwritten: Indexed, DataLoss, Trace,
        "Bytes this buffer overwrote while the trace was streamed to a file (write_into_file with a file_write_period_ms under a day): they never reached the file. A larger buffer or a shorter period keeps them.";
    traced_buf_sequence_packet_loss: Indexed, DataLoss, Analysis,
        "Groups of consecutive packets lost, per buffer, counted from previous_packet_dropped on the sequences writing into it.";
    traced_buf_incremental_sequences_dropped: Indexed, DataLoss, Analysis,
        "Sequences, per buffer, all of whose packets needing incremental state were dropped: incremental state was never (re)established, e.g. because clearing is disabled or too rare.";
    traced_buf_data_loss_read_gap: Indexed, DataLoss, Trace, "Losses attributed to a gap in chunk ids when reading.";
    traced_buf_data_loss_chunk_corrupted: Indexed, DataLoss, Trace, "Losses attributed to a chunk whose fragments could not be parsed.";
    traced_buf_data_loss_orphan_continuation: Indexed, DataLoss, Trace, "Losses attributed to a continuation fragment with no beginning.";
    traced_buf_data_loss_reassembly_gap: Indexed, DataLoss, Trace, "Losses attributed to a chunk id gap inside a fragmented packet.";
    traced_buf_data_loss_reassembly_broken_chain: Indexed, DataLoss, Trace, "Losses attributed to a broken fragment chain.";
    traced_buf_data_loss_overwrite: Indexed, DataLoss, Trace, "Losses attributed to the ring buffer overwriting unread chunks.";
    traced_buf_data_loss_writer_abort: Indexed, DataLoss, Trace, "Losses attributed to a writer abandoning a fragmented packet.";
    traced_buf_data_loss_smb_full: Indexed, DataLoss, Trace, "Losses the producer attributed to its shared memory buffer being full.";
    // --- Tachyon's own (not Perfetto's): how many, beside the flags above ---
    traced_buf_writer_packets_dropped: Indexed, DataLoss, Trace,
        "Packets the writers of this buffer's sequences dropped while their shared memory buffer was full, as the writers counted them (TracePacket.tachyon_packets_dropped).";
    sequence_writer_packets_dropped: Indexed, DataLoss, Trace,
        "Packets the writer of a sequence (idx: trusted_packet_sequence_id) dropped while its shared memory buffer was full, as it counted them (TracePacket.tachyon_packets_dropped).";
}

impl Stat {
    pub(crate) fn def(self) -> &'static StatDef {
        &STATS[self as usize]
    }
}

/// The stats collected during an import.
#[derive(Debug)]
pub(crate) struct Stats {
    single: Vec<i64>,
    indexed: BTreeMap<(usize, i64), i64>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            single: vec![0; STATS.len()],
            indexed: BTreeMap::new(),
        }
    }
}

impl Stats {
    pub(crate) fn inc(&mut self, stat: Stat) {
        self.add(stat, 1);
    }

    pub(crate) fn add(&mut self, stat: Stat, n: i64) {
        debug_assert_eq!(stat.def().kind, Kind::Single);
        let v = &mut self.single[stat as usize];
        *v = v.saturating_add(n);
    }

    pub(crate) fn set(&mut self, stat: Stat, value: i64) {
        debug_assert_eq!(stat.def().kind, Kind::Single);
        self.single[stat as usize] = value;
    }

    pub(crate) fn set_indexed(&mut self, stat: Stat, idx: i64, value: i64) {
        debug_assert_eq!(stat.def().kind, Kind::Indexed);
        self.indexed.insert((stat as usize, idx), value);
    }

    #[cfg(test)]
    pub(crate) fn get(&self, stat: Stat) -> i64 {
        self.single[stat as usize]
    }

    pub(crate) fn get_indexed(&self, stat: Stat, idx: i64) -> Option<i64> {
        self.indexed.get(&(stat as usize, idx)).copied()
    }

    pub(crate) fn add_indexed(&mut self, stat: Stat, idx: i64, n: i64) {
        debug_assert_eq!(stat.def().kind, Kind::Indexed);
        let v = self.indexed.entry((stat as usize, idx)).or_insert(0);
        *v = v.saturating_add(n);
    }

    /// Rows of the `stats` table: every single stat (zero or not, as Perfetto lists them) and
    /// every index that was set, as (key, name, idx, value).
    pub(crate) fn rows(&self) -> Vec<(usize, Option<i64>, i64)> {
        let mut rows = Vec::new();
        for (key, def) in STATS.iter().enumerate() {
            match def.kind {
                Kind::Single => rows.push((key, None, self.single[key])),
                Kind::Indexed => {
                    for (&(_, idx), &v) in self.indexed.range((key, i64::MIN)..=(key, i64::MAX)) {
                        rows.push((key, Some(idx), v));
                    }
                }
            }
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_kinds_respected() {
        let mut names: Vec<_> = STATS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), STATS.len());
        assert_eq!(Stat::misplaced_end_event.def().severity, Severity::DataLoss);
        assert_eq!(
            Stat::packet_skipped_seq_needs_incremental_state_invalid
                .def()
                .severity,
            Severity::Notice
        );
        assert_eq!(
            Stat::traced_buf_chunks_overwritten.def().kind,
            Kind::Indexed
        );
    }

    #[test]
    fn rows_list_singles_and_set_indexes() {
        let mut s = Stats::default();
        s.inc(Stat::misplaced_end_event);
        s.set_indexed(Stat::traced_buf_bytes_written, 1, 10);
        s.set_indexed(Stat::traced_buf_bytes_written, 0, 5);
        let rows = s.rows();
        let singles = STATS.iter().filter(|d| d.kind == Kind::Single).count();
        assert_eq!(rows.len(), singles + 2);
        let written: Vec<_> = rows
            .iter()
            .filter(|r| r.0 == Stat::traced_buf_bytes_written as usize)
            .map(|r| (r.1, r.2))
            .collect();
        assert_eq!(written, vec![(Some(0), 5), (Some(1), 10)]);
    }
}

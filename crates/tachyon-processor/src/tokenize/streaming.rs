//! Chrome's `StreamingProfilePacket`: its sampling profiler's stacks of one thread, imported
//! into `cpu_profile_stack_sample` as Perfetto's `ProfileModule` does.
//!
//! A packet holds `callstack_iid`s (into the sequence's `InternedData.callstacks`) and as many
//! `timestamp_delta_us`. Its samples are timed by the sequence's ThreadDescriptor reference
//! timestamp (CLOCK_MONOTONIC, microseconds), the one TrackEvents' `timestamp_delta_us` build
//! on: each delta advances that shared reference, so a profile packet moves the time of the
//! TrackEvents after it, as in Perfetto. The times are resolved here, while tokenizing, because
//! a later ThreadDescriptor would reset the reference; the samples then go through the sorter.
//! They belong to the sequence's thread (its ThreadDescriptor's pid and tid; 0 and 0 without
//! one, as in Perfetto).
//!
//! Problems are counted, never fatal: a reference timestamp that is missing or negative ends the
//! packet (`streaming_profile_invalid_timestamp`); a callstack without its delta ends the
//! packet and one that does not resolve drops its sample (`stackprofile_parser_error`).

use tachyon_protos::TracePacketView;

use super::Tokenizer;
use crate::importers::profile::resolve_callstack;
use crate::importers::{Event, EventKind};
use crate::storage::profile::PendingCpuSample;
use crate::storage::stats::Stat;
use crate::tokenize::clock;

impl Tokenizer {
    /// Tokenizes a packet's `streaming_profile_packet` (the packet has a sequence id).
    pub(super) fn streaming_profile_packet(&mut self, seq_id: u32, p: &TracePacketView<'_>) {
        let Ok(sp) = p.streaming_profile_packet() else {
            self.parser.st.stats.inc(Stat::stackprofile_parser_error);
            return;
        };
        let seq = self.seqs.or_default(seq_id);
        // The reference timestamp, in ns: Perfetto reads it with a zero delta first.
        let packet_ns = seq.legacy_ts_us.map(|us| us.saturating_mul(1000));
        let Some(packet_ns) = packet_ns.filter(|&ns| ns >= 0) else {
            self.parser
                .st
                .stats
                .inc(Stat::streaming_profile_invalid_timestamp);
            return;
        };
        let (pid, tid) = match seq.legacy_thread {
            Some((pid, tid)) => (pid.unwrap_or(0), tid),
            None => (0, 0),
        };
        // Perfetto falls back to the raw CLOCK_MONOTONIC reading when it cannot convert it yet.
        let mut sample_ts = self
            .clocks
            .convert(clock::MONOTONIC, packet_ns as u64)
            .at()
            .unwrap_or(packet_ns);
        let priority = sp.process_priority();
        let mut deltas = sp.timestamp_delta_us();
        let mut samples = Vec::new();
        let mut invalid = false;
        for iid in sp.callstack_iid() {
            let (Ok(iid), Some(Ok(delta_us))) = (iid, deltas.next()) else {
                self.parser.st.stats.inc(Stat::stackprofile_parser_error);
                break;
            };
            if !advance(&mut seq.legacy_ts_us, delta_us) {
                invalid = true;
                break;
            }
            sample_ts = sample_ts.saturating_add(delta_us.saturating_mul(1000));
            match resolve_callstack(&mut seq.profile, &mut self.parser.st, Some(pid), iid) {
                // Negative only when the clock conversion moved it below 0.
                Some(_) if sample_ts < 0 => self
                    .parser
                    .st
                    .stats
                    .inc(Stat::streaming_profile_invalid_timestamp),
                Some(callsite) => samples.push((sample_ts, callsite)),
                None => self.parser.st.stats.inc(Stat::stackprofile_parser_error),
            }
        }
        // Deltas beyond the last callstack still move the reference, as in Perfetto.
        if !invalid {
            for delta_us in deltas.by_ref() {
                let Ok(delta_us) = delta_us else {
                    self.parser.st.stats.inc(Stat::stackprofile_parser_error);
                    break;
                };
                if !advance(&mut seq.legacy_ts_us, delta_us) {
                    invalid = true;
                    break;
                }
            }
        }
        if invalid {
            self.parser
                .st
                .stats
                .inc(Stat::streaming_profile_invalid_timestamp);
        }
        for (ts, callsite) in samples {
            let idx = self.parser.st.profile.pending_cpu_samples.len() as u64;
            self.parser
                .st
                .profile
                .pending_cpu_samples
                .push(PendingCpuSample {
                    pid,
                    tid,
                    callsite,
                    priority,
                });
            self.emit(Event::bare(EventKind::CpuProfileSample, ts, 0, idx));
        }
    }
}

/// Advances the sequence's reference timestamp by `delta_us`, saturating; false if the result
/// is negative in nanoseconds (Perfetto keeps the saturated value, and so do we).
fn advance(reference_us: &mut Option<i64>, delta_us: i64) -> bool {
    let us = reference_us.unwrap_or(0).saturating_add(delta_us);
    *reference_us = Some(us);
    us.saturating_mul(1000) >= 0
}

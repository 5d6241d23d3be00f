//! Counters of one central buffer, named and numbered as Perfetto's `TraceStats.BufferStats`
//! (`protos/perfetto/common/trace_stats.proto`), so Perfetto's trace processor turns them into
//! its `traced_buf_*` rows of the `stats` table.

use protozero::Message;

/// What happened to one central buffer. Every loss a producer or the buffer causes is counted
/// here; [`LossCounters`] adds the per-packet view the tests reconcile exactly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferStats {
    /// Size of the buffer in bytes (field 12).
    pub buffer_size: u64,
    /// Bytes of chunks written into the buffer (1).
    pub bytes_written: u64,
    /// Bytes of unread chunks overwritten by the ring (13).
    pub bytes_overwritten: u64,
    /// Bytes of packets read out (14).
    pub bytes_read: u64,
    /// Bytes of padding written when the ring wrapped (15).
    pub padding_bytes_written: u64,
    /// Bytes of padding overwritten again (16).
    pub padding_bytes_cleared: u64,
    /// Chunks written (2).
    pub chunks_written: u64,
    /// Chunks committed again with more data, e.g. after the service scraped them (10).
    pub chunks_rewritten: u64,
    /// Unread chunks overwritten by the ring (3).
    pub chunks_overwritten: u64,
    /// Chunks refused: a full DISCARD buffer, or a commit the producer may not make (18).
    pub chunks_discarded: u64,
    /// Chunks read out completely (17).
    pub chunks_read: u64,
    /// Chunks committed with an id lower than one already seen for their sequence (11).
    pub chunks_committed_out_of_order: u64,
    /// Times the ring wrapped (4).
    pub write_wrap_count: u64,
    /// Patches applied (5).
    pub patches_succeeded: u64,
    /// Patches that named an unknown chunk or an offset outside it (6).
    pub patches_failed: u64,
    /// Reads of a packet spanning chunks that found all its fragments (7).
    pub readaheads_succeeded: u64,
    /// Reads of a packet spanning chunks that had to wait for a fragment (8).
    pub readaheads_failed: u64,
    /// Chunks or fragments that broke the ABI (bad lengths, oversized records) (9).
    pub abi_violations: u64,
    /// Packets a writer dropped and marked with the drop sentinel (19).
    pub trace_writer_packet_loss: u64,
}

impl BufferStats {
    /// Writes the counters as a `TraceStats.BufferStats` message (all fields, zeros included,
    /// so a reader can tell "nothing lost" from "not reported").
    pub fn write_to(&self, m: &mut Message<'_>) {
        m.append_uint64(12, self.buffer_size);
        m.append_uint64(1, self.bytes_written);
        m.append_uint64(13, self.bytes_overwritten);
        m.append_uint64(14, self.bytes_read);
        m.append_uint64(15, self.padding_bytes_written);
        m.append_uint64(16, self.padding_bytes_cleared);
        m.append_uint64(2, self.chunks_written);
        m.append_uint64(10, self.chunks_rewritten);
        m.append_uint64(3, self.chunks_overwritten);
        m.append_uint64(18, self.chunks_discarded);
        m.append_uint64(17, self.chunks_read);
        m.append_uint64(11, self.chunks_committed_out_of_order);
        m.append_uint64(4, self.write_wrap_count);
        m.append_uint64(5, self.patches_succeeded);
        m.append_uint64(6, self.patches_failed);
        m.append_uint64(7, self.readaheads_succeeded);
        m.append_uint64(8, self.readaheads_failed);
        m.append_uint64(9, self.abi_violations);
        m.append_uint64(19, self.trace_writer_packet_loss);
    }
}

/// Packets lost inside the buffer, by cause. Perfetto reports chunks and bytes; these count
/// *packets*, so that "packets written = packets read + packets lost" can be checked exactly.
/// A packet is attributed to the chunk holding its first fragment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LossCounters {
    /// Packets whose first fragment was in a chunk overwritten before it was read.
    pub overwritten: u64,
    /// Packets whose first fragment was in a chunk the buffer refused (DISCARD full, oversized).
    pub discarded: u64,
    /// Packets the writer itself dropped (drop sentinel).
    pub writer_dropped: u64,
    /// Packets cut short: a later fragment never arrived (gap, broken chain, overwritten tail).
    pub incomplete: u64,
    /// Packets in chunks that failed validation (bad fragment lengths) or were still waiting
    /// for patches when the buffer was read for the last time.
    pub corrupted: u64,
}

impl LossCounters {
    /// All packets lost, whatever the cause.
    pub fn total(&self) -> u64 {
        self.overwritten + self.discarded + self.writer_dropped + self.incomplete + self.corrupted
    }
}

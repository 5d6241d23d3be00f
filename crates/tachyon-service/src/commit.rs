//! Commit handling: moves the chunks a producer says are Complete from its shared memory buffer
//! into central buffers, applies its patches, and scrapes chunks still being written.
//!
//! The producer is untrusted and shares the memory: it may change any byte at any moment, and
//! its commit may lie. So every chunk is **copied out before it is parsed** (the copy is what
//! the buffer sees), every index and size is checked, the target buffer must be one this
//! producer may write to, and every failure is counted — never a panic, never a stop.

use std::collections::HashMap;

use tachyon_abi::{ChunkCopy, ChunkHeader, CommitRequest, ServiceView};

use crate::trace_buffer::{ChunkToCopy, CommittedChunk, ProducerId, TraceBuffer, WriterId};

/// Session-wide counters for commits that could not be attributed to a buffer (they become
/// the top-level `TraceStats` fields of the same names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Chunks refused before reaching any buffer: a page or chunk index outside the SMB, a chunk
    /// not in the Complete state, a target buffer that does not exist or is not allowed.
    pub chunks_discarded: u64,
    /// Patches refused before reaching any buffer (unknown or forbidden target buffer).
    pub patches_discarded: u64,
    /// Chunks whose header did not validate after the copy (bad writer id, impossible count).
    pub abi_violations: u64,
}

/// A producer as the commit path sees it.
#[derive(Debug)]
pub struct ProducerState {
    /// The id the service gave the connection.
    pub id: ProducerId,
    /// Central buffers (indices) this producer may write to.
    pub allowed_buffers: Vec<u16>,
    /// The target buffer of each writer, learned from its commits (used when scraping, where
    /// the chunk does not say).
    pub writer_targets: HashMap<WriterId, u16>,
    /// Where a committed chunk is copied out of shared memory before the buffer parses it: one
    /// buffer, reused for every chunk (as large as the largest chunk seen), so a commit costs no
    /// allocation, no zeroing and no free.
    scratch: Vec<u8>,
}

impl ProducerState {
    /// A producer allowed to write to `allowed_buffers`.
    pub fn new(id: ProducerId, allowed_buffers: Vec<u16>) -> Self {
        ProducerState {
            id,
            allowed_buffers,
            writer_targets: HashMap::new(),
            scratch: Vec::new(),
        }
    }

    fn allowed(&self, buffer: u16, buffers: &[TraceBuffer]) -> bool {
        (buffer as usize) < buffers.len() && self.allowed_buffers.contains(&buffer)
    }
}

/// Applies one commit: every `ChunksToMove` first (Complete → BeingRead, copy, free), then the
/// patches (Perfetto applies patches after the moves of the same request).
pub fn apply_commit(
    view: &ServiceView<'_>,
    producer: &mut ProducerState,
    req: &CommitRequest,
    buffers: &mut [TraceBuffer],
    stats: &mut CommitStats,
) {
    for mv in &req.chunks_to_move {
        let chunk = match view.try_acquire_chunk_for_reading(mv.page as usize, mv.chunk as usize) {
            Ok(c) => c,
            Err(_) => {
                // Out of range, not Complete, a corrupt page header: skipped, as Perfetto does.
                stats.chunks_discarded += 1;
                continue;
            }
        };
        if !producer.allowed(mv.target_buffer, buffers) {
            // Refused, but the chunk still goes back to the producer, or its SMB leaks a chunk.
            stats.chunks_discarded += 1;
            let _ = view.release_chunk_as_free(chunk);
            continue;
        }
        let size = chunk.payload_size();
        // The plain case (a chunk new to its sequence): validate the header, then copy the
        // payload from shared memory straight into the ring, where it is parsed when read.
        if let Ok(header) = chunk.validated_header() {
            let meta = CommittedChunk {
                producer: producer.id,
                writer: header.writer_id,
                chunk_id: header.chunk_id,
                num_fragments: header.packets.count(),
                flags: header.packets.flags().0,
            };
            let target = &mut buffers[mv.target_buffer as usize];
            // `copy_payload_into` fails only on a destination shorter than the payload, and
            // the buffer gives it exactly `size` bytes.
            if target.copy_new_committed_chunk(&meta, size, |dst| {
                let _ = chunk.copy_payload_into(dst);
            }) {
                let _ = view.release_chunk_as_free(chunk);
                producer
                    .writer_targets
                    .insert(header.writer_id, mv.target_buffer);
                continue;
            }
        }
        // Anything else (or a header that did not validate, checked again on the copy's
        // snapshot): a copy out of shared memory first, which the buffer compares or counts.
        if producer.scratch.len() < size {
            // Grows to the largest chunk size once; the bytes past a chunk's payload are never
            // read.
            producer.scratch.resize(size, 0);
        }
        let header = chunk.copy_into(&mut producer.scratch);
        // Free the chunk whatever the copy found: the producer may reuse it now.
        let _ = view.release_chunk_as_free(chunk);
        let Ok(header) = header else {
            stats.abi_violations += 1;
            buffers[mv.target_buffer as usize].count_abi_violation();
            continue;
        };
        producer
            .writer_targets
            .insert(header.writer_id, mv.target_buffer);
        let copy = to_copy_committed(producer.id, header, &producer.scratch[..size]);
        buffers[mv.target_buffer as usize].copy_chunk(&copy);
    }
    for p in &req.chunks_to_patch {
        if !producer.allowed(p.target_buffer, buffers) {
            stats.patches_discarded += p.patches.len().max(1) as u64;
            continue;
        }
        buffers[p.target_buffer as usize].try_patch_chunk(
            producer.id,
            p.writer_id,
            p.chunk_id,
            &p.patches,
            p.has_more_patches,
        );
    }
}

/// What the buffer needs of a committed chunk copied out of shared memory: `header` as
/// [`ReadChunk::copy_into`](tachyon_abi::ReadChunk::copy_into) validated it, `payload` the copy.
fn to_copy_committed<'a>(
    producer: ProducerId,
    header: ChunkHeader,
    payload: &'a [u8],
) -> ChunkToCopy<'a> {
    chunk_to_copy(producer, header, payload, true)
}

/// What the buffer needs of a chunk scraped out of shared memory.
fn to_copy(producer: ProducerId, copy: &ChunkCopy) -> ChunkToCopy<'_> {
    chunk_to_copy(producer, copy.header(), copy.payload(), copy.is_complete())
}

fn chunk_to_copy(
    producer: ProducerId,
    header: ChunkHeader,
    payload: &[u8],
    complete: bool,
) -> ChunkToCopy<'_> {
    ChunkToCopy {
        producer,
        writer: header.writer_id,
        chunk_id: header.chunk_id,
        num_fragments: header.packets.count(),
        flags: header.packets.flags().0,
        payload,
        complete,
    }
}

/// Copies every chunk of the SMB that is Complete (committed or not) or still being written
/// with finished packets, without changing any state: done on flush, at stop and when a
/// producer disconnects, so packets finished but not yet committed are not lost. A later real
/// commit of the same chunk rewrites it in the buffer.
pub fn scrape(
    view: &ServiceView<'_>,
    producer: &mut ProducerState,
    buffers: &mut [TraceBuffer],
    stats: &mut CommitStats,
) {
    let producer = &*producer;
    scrape_with(view, producer, buffers, stats, |writer| {
        Some(producer.writer_targets.get(&writer).copied().unwrap_or(0))
    });
}

/// [`scrape`], with the caller deciding each writer's target buffer: `target_of(writer)` is the
/// buffer index to copy the writer's chunks into, or `None` to leave them alone (e.g. a writer
/// of a producer that serves several sessions, whose chunks belong to another session). A
/// target the producer may not write to is counted as `chunks_discarded`.
pub fn scrape_with(
    view: &ServiceView<'_>,
    producer: &ProducerState,
    buffers: &mut [TraceBuffer],
    stats: &mut CommitStats,
    mut target_of: impl FnMut(WriterId) -> Option<u16>,
) {
    for page in 0..view.num_pages() {
        let Ok(layout) = view.page_layout(page) else {
            continue;
        };
        for chunk in 0..layout.num_chunks() {
            let copy = match view.scrape_chunk(page, chunk) {
                Ok(Some(c)) => c,
                Ok(None) => continue,
                Err(_) => {
                    stats.abi_violations += 1;
                    continue;
                }
            };
            let Some(target) = target_of(copy.header().writer_id) else {
                continue;
            };
            if !producer.allowed(target, buffers) {
                stats.chunks_discarded += 1;
                continue;
            }
            buffers[target as usize].copy_scraped_chunk(&to_copy(producer.id, &copy));
        }
    }
}

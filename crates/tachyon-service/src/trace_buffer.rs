//! The central trace buffer: chunks copied out of producers' shared memory go in, whole trace
//! packets come out, and every packet that cannot come out is counted.
//!
//! # Storage
//!
//! One contiguous byte ring (Perfetto's TraceBuffer keeps the same shape). Each chunk payload
//! takes `align16(payload)` bytes at the write position; when it does not fit before the end,
//! the tail is padding and the write wraps. Chunk metadata lives beside the ring, in a slab, and
//! a FIFO of ring entries records what occupies which bytes, in write order, so making room is
//! popping the oldest entries:
//!
//! - `RING_BUFFER`: unread chunks in the way are overwritten (`chunks_overwritten`,
//!   `bytes_overwritten`, and the packets that started in them).
//! - `DISCARD`: the first write that would clobber unread data is refused, and so is every
//!   later one (`chunks_discarded`), as Perfetto's TraceBuffer does: the trace keeps its
//!   beginning, without gaps.
//!
//! # Sequences and reassembly
//!
//! Packets of one `{producer, writer}` sequence are read in chunk-id order (ids wrap at 2^32;
//! each sequence extends them to 64 bits relative to the highest id seen). A packet is emitted
//! only when all its fragments are present: a chunk flagged "continues on next" leaves its last
//! fragment pending until the next chunk arrives. A sequence *waits* at the last fragment of a
//! chunk that still needs patches (only that fragment can: it is the packet the writer continued
//! in the next chunk), on a scraped chunk the writer may still be in, or on the missing
//! continuation of a packet; a chunk-id gap is *loss*, and the next packet of that sequence
//! carries `previous_packet_dropped` with the reason bits.
//!
//! # Loss accounting
//!
//! Besides Perfetto's chunk and byte counters ([`BufferStats`]), the buffer counts lost
//! *packets* ([`LossCounters`]), attributing each packet to the chunk that holds its first
//! fragment, so that for every sequence: packets in committed chunks = packets read + packets
//! counted lost, exactly (the property tests check this).
//!
//! Nothing here trusts the producer: every fragment length is bounded by its chunk, and bad ones
//! are counted as `abi_violations`.

use std::collections::VecDeque;

use tachyon_abi::{decode_fragment_header, ChunkFlags, Patch};

use crate::chunk_index::ChunkIndex;
use crate::fast_hash::IdMap;
use crate::stats::{BufferStats, LossCounters};

/// Identifies a producer connection (assigned by the service, never by the producer).
pub type ProducerId = u16;
/// A trace writer inside a producer (one per thread: one packet sequence).
pub type WriterId = u16;
/// Chunk ids count up per writer and wrap at 2^32.
pub type ChunkId = u32;

/// Chunk flag (raw bits of [`ChunkFlags`]): the first fragment continues a packet from the
/// previous chunk.
pub const FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK: u8 =
    ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK.0;
/// Chunk flag: the last fragment continues in the next chunk.
pub const LAST_PACKET_CONTINUES_ON_NEXT_CHUNK: u8 =
    ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK.0;
/// Chunk flag: some size fields in the chunk will arrive later as patches.
pub const CHUNK_NEEDS_PATCHING: u8 = ChunkFlags::CHUNK_NEEDS_PATCHING.0;

pub use tachyon_abi::PACKET_SIZE_DROP_PACKET;

/// `previous_packet_dropped` reason bits (Perfetto's `TracePacket.DataLossReason`).
pub mod data_loss {
    /// Some loss happened before this packet.
    pub const PRESENT: u32 = 1;
    /// Chunk ids were skipped.
    pub const READ_GAP: u32 = 2;
    /// A chunk of the sequence could not be parsed.
    pub const CHUNK_CORRUPTED: u32 = 4;
    /// A continuation arrived without the beginning of its packet.
    pub const ORPHAN_CONTINUATION: u32 = 8;
    /// A packet was abandoned on a gap in the middle of it.
    pub const REASSEMBLY_GAP: u32 = 16;
    /// A packet was abandoned on a broken fragment chain.
    pub const REASSEMBLY_BROKEN_CHAIN: u32 = 32;
    /// Unread data of the sequence was overwritten.
    pub const OVERWRITE: u32 = 64;
    /// The writer dropped a packet.
    pub const WRITER_ABORT: u32 = 128;
}

/// How a full buffer behaves (Perfetto's `BufferConfig.FillPolicy`; defined in `tachyon-abi`
/// so that the client's configuration names it without this crate).
pub use tachyon_abi::FillPolicy;

/// One chunk as the service copied it out of a producer's shared memory.
#[derive(Clone, Copy, Debug)]
pub struct ChunkToCopy<'a> {
    /// The producer (from the connection).
    pub producer: ProducerId,
    /// From the chunk header.
    pub writer: WriterId,
    /// From the chunk header.
    pub chunk_id: ChunkId,
    /// Packet count from the chunk header (fragments in the chunk).
    pub num_fragments: u16,
    /// Flags from the chunk header.
    pub flags: u8,
    /// The chunk's payload (after its 8-byte header), already copied out of shared memory.
    pub payload: &'a [u8],
    /// False when the service scraped a chunk still being written: its last fragment may be
    /// unfinished and is ignored, and its continuation flags are meaningless.
    pub complete: bool,
}

/// A committed chunk's header as the service loaded and validated it, for
/// [`TraceBuffer::copy_new_committed_chunk`] (the payload is copied by the caller).
#[derive(Clone, Copy, Debug)]
pub struct CommittedChunk {
    /// The producer (from the connection).
    pub producer: ProducerId,
    /// From the chunk header.
    pub writer: WriterId,
    /// From the chunk header.
    pub chunk_id: ChunkId,
    /// Packet count from the chunk header (fragments in the chunk).
    pub num_fragments: u16,
    /// Flags from the chunk header.
    pub flags: u8,
}

/// What a read-out packet came with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketInfo {
    /// The producer that wrote it.
    pub producer: ProducerId,
    /// The writer (sequence) within the producer.
    pub writer: WriterId,
    /// `previous_packet_dropped` bits (0: nothing lost before this packet on its sequence).
    /// The first packet of every sequence has [`data_loss::PRESENT`], as in Perfetto: the
    /// service cannot know whether anything came before it.
    pub previous_packet_dropped: u32,
}

type SeqKey = (ProducerId, WriterId);
type RecIdx = usize;

const ALIGN: usize = 16;

/// How far ahead of the first pass's writes the ring's pages are mapped, in one `madvise`:
/// 64 pages of 4 KiB, about 70 µs of the kernel's time here, so that a batch does not hold up
/// the commits behind it for long, while the per-page cost is already the batched one
/// (measured the same from 64 KiB to 1 MiB steps).
const POPULATE_STEP: usize = 256 << 10;

fn align_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// A chunk in the ring.
#[derive(Debug)]
struct Record {
    seq: SeqKey,
    ext: u64,
    offset: usize,
    payload_len: usize,
    num_fragments: u16,
    flags: u8,
    complete: bool,
    /// Fragments already processed by reads.
    fragments_read: u16,
    /// Payload offset of the next unread fragment.
    read_offset: usize,
    /// Still indexed by its sequence (not yet read to the end).
    live: bool,
    /// Holds fragments of its sequence's pending packet: evicting it loses that packet.
    pinned: bool,
    /// Copied by a scrape, and no commit of it came since: the chunks before it may still
    /// have commits on the way (see [`TraceBuffer::copy_scraped_chunk`]).
    scraped: bool,
    /// Loss bits for the first packet read from it: its first fragments were lost with an
    /// earlier scraped copy of it ([`Accounted::loss`]), and no chunk-id gap says so, because
    /// the chunk itself is read.
    resume_loss: u32,
}

/// What left the buffer of a scraped chunk before its real commit came.
#[derive(Clone, Copy, Debug, Default)]
struct Accounted {
    /// Its first fragments already read or counted lost: the commit neither repeats nor
    /// re-counts them.
    fragments: u16,
    /// Loss bits owed to the packet that follows those fragments: some of them were lost, not
    /// read (overwritten or refused), and the packets read before the commit came may all be
    /// older than them.
    loss: u32,
}

impl Record {
    /// Its content may still grow or be confirmed by a commit: copied by a scrape (finished or
    /// mid-write) and not committed since.
    fn awaits_commit(&self) -> bool {
        self.scraped || !self.complete
    }

    /// Fragments a reader may look at: a scraped chunk's last one may be unfinished.
    fn readable_fragments(&self) -> u16 {
        if self.complete {
            self.num_fragments
        } else {
            self.num_fragments.saturating_sub(1)
        }
    }

    fn flag(&self, f: u8) -> bool {
        // "Continues from the previous chunk" is fixed when the writer acquires the chunk; the
        // other flags of a scraped chunk describe a state still in flux and are ignored.
        (self.complete || f == FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK) && self.flags & f != 0
    }

    /// Packets that start in this chunk and have not been read (or counted) yet; `ring` holds
    /// its bytes.
    ///
    /// Only a chunk left partly unread needs this (overwritten before it was read, or its rest
    /// dropped as corrupt), so the walk over its unread fragment headers that tells whether the
    /// last one is an empty filler (not a packet) is made here, not when the chunk arrives: a
    /// session whose read-out keeps up never walks a chunk but to read it. An overwritten
    /// chunk's bytes are the ones the write that evicts it is about to store over, so the walk
    /// reads the cache lines that write would have fetched anyway.
    fn unread_packet_starts(&self, ring: &[u8]) -> u64 {
        let n = self.readable_fragments();
        if self.fragments_read >= n {
            return 0;
        }
        let mut starts = (n - self.fragments_read) as u64;
        if self.fragments_read == 0 && self.flag(FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK) {
            starts -= 1;
        }
        // The fragments before `fragments_read` parsed when they were read (a sentinel or a
        // bad header ends the reading of a chunk, and sets `read_offset` past its end), so
        // the walk starts at the first unread one.
        let payload = &ring[self.offset..self.offset + self.payload_len];
        if starts > 0 {
            // The walk is a chain of dependent loads, and an overwritten chunk is cold (written
            // a ring ago): with packets longer than a cache line, a miss per fragment header,
            // one after the other, was half of `buffer/write/single_writer`'s time. Loading
            // every line of the unread part first, each load independent of the others, lets
            // the misses overlap; they are the lines the write evicting this chunk then stores
            // over. Packets shorter than a line (the SDK's zones) walk the lines in order,
            // which the hardware prefetcher follows already: the extra loads only cost there.
            let unread = payload.get(self.read_offset..).unwrap_or_default();
            if usize::from(n - self.fragments_read) * 64 < unread.len() {
                touch_lines(unread);
            }
            if ends_with_filler(payload, self.read_offset, self.fragments_read, n) {
                starts -= 1;
            }
        }
        starts
    }
}

/// One entry of the ring, in write order.
#[derive(Clone, Copy, Debug)]
struct RingEntry {
    offset: usize,
    size: usize,
    /// `None` for padding.
    rec: Option<RecIdx>,
}

/// A packet waiting for its next fragment.
#[derive(Debug, Default)]
struct Pending {
    /// (record, payload offset, length) of each fragment so far.
    fragments: Vec<(RecIdx, usize, usize)>,
}

#[derive(Debug, Default)]
struct Sequence {
    /// Unread chunks by extended id.
    chunks: ChunkIndex,
    /// Highest extended id committed.
    max_ext: Option<u64>,
    /// Extended id of the last chunk read to its end.
    last_read_ext: Option<u64>,
    pending: Option<Pending>,
    /// Loss bits to report on the next packet read.
    loss: u32,
    /// Whether a packet of this sequence was ever read.
    started: bool,
    /// Scraped chunks that left the buffer (read, overwritten or refused) before their real
    /// commit: how many of their fragments are already accounted for (read or counted lost), so
    /// that the real commit neither repeats nor re-counts them.
    partial: IdMap<u64, Accounted>,
    /// Highest extended id of a refused chunk whose packets were counted lost.
    refused_max: Option<u64>,
    /// Its producer is gone (after a last scrape): nothing more will come, so reads do not
    /// wait for commits ([`TraceBuffer::producer_gone`]).
    gone: bool,
}

impl Sequence {
    /// Extends a 32-bit chunk id to 64 bits relative to the highest seen so far, so that ids
    /// order correctly across the 2^32 wrap (a new id within 2^31 after the highest is newer).
    fn extend(&self, chunk_id: ChunkId) -> u64 {
        match self.max_ext {
            None => (1u64 << 32) + chunk_id as u64,
            Some(max) => {
                let delta = chunk_id.wrapping_sub(max as u32) as i32;
                max.wrapping_add_signed(delta as i64)
            }
        }
    }
}

/// The central buffer of a tracing session (one per `TraceConfig.buffers` entry).
#[derive(Debug)]
pub struct TraceBuffer {
    ring: Vec<u8>,
    policy: FillPolicy,
    wptr: usize,
    fifo: VecDeque<RingEntry>,
    slab: Vec<Option<Record>>,
    free: Vec<RecIdx>,
    sequences: IdMap<SeqKey, Sequence>,
    /// Sequences in order of first commit (read-out order).
    seq_order: Vec<SeqKey>,
    /// Where the pass of [`TraceBuffer::read_some_packets`] under way goes on: the index in
    /// `seq_order` of the next sequence to read (0: no pass under way).
    read_cursor: usize,
    /// DISCARD mode after the first refusal: everything new is refused.
    discarding: bool,
    /// Ring bytes from 0 already mapped, on the first pass round the ring: the writes map the
    /// pages ahead of them a batch at a time ([`POPULATE_STEP`]). The ring's length once it
    /// has been round once, or prefaulted, or where the kernel cannot populate (then each page
    /// faults in on its first write).
    populated: usize,
    /// Whether the ring asked the kernel for transparent huge pages (at its creation or by
    /// [`prefault`](Self::prefault)), and was not refused.
    huge_pages: bool,
    /// How many entries at the front of `fifo` are known to hold nothing anyone needs (read,
    /// or padding, and no pending packet's fragment): a record never becomes needed again once
    /// read, so the count only grows until those entries are popped.
    dead_front: usize,
    stats: BufferStats,
    losses: LossCounters,
}

impl TraceBuffer {
    /// A buffer of `size` bytes (rounded down to a multiple of 16, at least 4 KiB).
    pub fn new(size: usize, policy: FillPolicy) -> Self {
        let size = (size.max(4096) / ALIGN) * ALIGN;
        // Mapped lazily. In 2 MiB pages where the kernel has free ones to spare now
        // (`huge_pages_pay_for`): a fresh ring's first pass then takes one fault per 2 MiB
        // instead of 512, and commits memory at most a huge page ahead of the writes. Where it
        // would have to compact memory for them on the service thread mid-stream, in 4 KiB
        // pages. [`TraceBuffer::prefault`] asks for them anyway, at the session's start.
        let mut ring = vec![0; size];
        let huge_pages = crate::populate::huge_pages_pay_for(size)
            && crate::populate::advise_huge_pages(&mut ring[..]);
        TraceBuffer {
            ring,
            policy,
            wptr: 0,
            fifo: VecDeque::new(),
            slab: Vec::new(),
            free: Vec::new(),
            sequences: IdMap::default(),
            seq_order: Vec::new(),
            read_cursor: 0,
            discarding: false,
            populated: 0,
            huge_pages,
            dead_front: 0,
            stats: BufferStats {
                buffer_size: size as u64,
                ..BufferStats::default()
            },
            losses: LossCounters::default(),
        }
    }

    /// Maps every page of the ring now, by storing into each, instead of on the first write to
    /// it.
    ///
    /// The ring is allocated zeroed, and the kernel maps such memory lazily, as Perfetto commits
    /// its buffers' pages: a page costs nothing until a chunk is first copied into it, and then
    /// a page fault (about one per 4 KiB chunk on the first pass round the ring, a third of the
    /// service thread's CPU time in a session's first 64 MiB). Prefaulting moves those faults
    /// to the session's start and commits the whole buffer's memory at once: worth it when the
    /// session is expected to fill its buffer anyway and the writes must keep up from the first
    /// event. One `madvise(MADV_POPULATE_WRITE)` over the ring; where the kernel does not offer
    /// it, a store of zero per 4 KiB, which the compiler must keep because it cannot see that
    /// the bytes are zero already.
    pub fn prefault(&mut self) {
        const PAGE: usize = 4096;
        // Committing it all anyway: in 2 MiB pages where the kernel has them, so that the
        // writes and the read-out walk 32 TLB entries for 64 MiB instead of 16 384 (the
        // service's CPU per event, prefaulted: 2.4-3.0 ns against 3.1-3.8 ns in 4 KiB pages).
        self.huge_pages |= crate::populate::advise_huge_pages(&mut self.ring[..]);
        // One `madvise` for the whole ring where the kernel offers it (no trap per page).
        if !crate::populate::populate_for_write(&mut self.ring[..]) {
            let ring = std::hint::black_box(&mut self.ring[..]);
            for page in ring.chunks_mut(PAGE) {
                page[0] = 0;
            }
        }
        self.populated = self.ring.len();
    }

    /// Maps the ring's pages up to `end` (and a batch beyond) before a write reaches them: one
    /// `madvise` per [`POPULATE_STEP`] bytes instead of a page fault per page in the copy.
    fn populate_to(&mut self, end: usize) {
        if end <= self.populated {
            return;
        }
        let to = end
            .saturating_add(POPULATE_STEP)
            .min(self.ring.len())
            .max(end);
        if crate::populate::populate_for_write(&mut self.ring[self.populated..to]) {
            self.populated = to;
        } else {
            // Not offered: the pages fault in on first write, and nothing is asked again.
            self.populated = self.ring.len();
        }
    }

    /// Whether the ring asked for transparent huge pages and the kernel took the advice (a
    /// lazily mapped ring only when free 2 MiB blocks were plentiful at its creation;
    /// [`prefault`](Self::prefault) always asks). The kernel may still map 4 KiB pages where
    /// it has no huge page free at the fault.
    pub fn asked_for_huge_pages(&self) -> bool {
        self.huge_pages
    }

    /// The counters, with Perfetto's names.
    pub fn stats(&self) -> &BufferStats {
        &self.stats
    }

    /// Packets lost inside this buffer, by cause.
    pub fn losses(&self) -> &LossCounters {
        &self.losses
    }

    /// The fill policy.
    pub fn policy(&self) -> FillPolicy {
        self.policy
    }

    /// Counts a chunk that broke the ABI before it could be stored (e.g. its header did not
    /// validate after the copy out of shared memory).
    pub fn count_abi_violation(&mut self) {
        self.stats.abi_violations += 1;
    }

    // === writing ===

    /// Copies a chunk a producer committed into the buffer (or rewrites the same chunk
    /// committed again with more fragments, or first scraped). Never fails: what cannot be
    /// stored is counted.
    pub fn copy_chunk(&mut self, chunk: &ChunkToCopy<'_>) {
        self.copy(chunk, false);
    }

    /// Stores a committed chunk that is new to its sequence straight into the ring: `fill` is
    /// given the `payload_len` bytes reserved for the payload and writes them (the commit path
    /// copies them there out of the producer's shared memory, so the chunk crosses memory
    /// once). Nothing is parsed before the copy: `chunk`'s fields are the header the service
    /// loaded and validated, and the payload is only parsed when it is read, from the ring,
    /// where the producer can no longer change it; a producer that rewrites the chunk while it
    /// is copied gets garbage into its own packets, which the read-out counts and marks as it
    /// does any corrupt chunk.
    ///
    /// Returns false, having stored nothing and counted nothing, when the chunk is not the
    /// plain case: already present (a scraped chunk now committed, a recommit), partly
    /// accounted for by a scrape, older than what the sequence read or holds, too large, or
    /// refused by a full `DISCARD` buffer. The caller then copies it out and hands it to
    /// [`copy_chunk`](Self::copy_chunk), which deals with each of those with the payload in
    /// hand (comparing or counting its fragments).
    pub fn copy_new_committed_chunk(
        &mut self,
        chunk: &CommittedChunk,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> bool {
        let key = (chunk.producer, chunk.writer);
        let Some(seq) = self.sequences.get(&key) else {
            return false;
        };
        let ext = seq.extend(chunk.chunk_id);
        if seq.chunks.get(ext).is_some()
            || seq.partial.get(&ext).is_some_and(|a| a.fragments > 0)
            || seq.last_read_ext.is_some_and(|last| ext <= last)
            || seq.max_ext.is_some_and(|max| ext < max)
        {
            return false;
        }
        let size = align_up(payload_len.max(1));
        if payload_len > u32::MAX as usize || size > self.ring.len() || self.discarding {
            return false;
        }
        // Evicts what is in the way (counting it); a refusal leaves the buffer discarding, and
        // `copy_chunk` then refuses the chunk and counts what it held.
        let Some(offset) = self.reserve(size) else {
            return false;
        };
        fill(&mut self.ring[offset..offset + payload_len]);
        let rec = Record {
            seq: key,
            ext,
            offset,
            payload_len,
            num_fragments: chunk.num_fragments,
            flags: chunk.flags,
            complete: true,
            fragments_read: 0,
            read_offset: 0,
            live: true,
            pinned: false,
            scraped: false,
            resume_loss: 0,
        };
        self.store_record(key, ext, offset, size, rec);
        true
    }

    /// Copies a chunk the service scraped out of a producer's shared memory without a commit
    /// (on flush, stop or disconnect). Unlike a commit, a scraped chunk says nothing of the
    /// chunks before it: a scrape copies chunks one at a time while the writers go on, so it
    /// can miss a chunk that had no finished packet yet and then copy the writer's next one
    /// already finished, while the commit of the one it missed is on its way. So while
    /// streaming, reading stops at a scraped chunk that does not directly follow what was
    /// read, until a commit confirms it (or the session ends, or the producer is gone).
    pub fn copy_scraped_chunk(&mut self, chunk: &ChunkToCopy<'_>) {
        self.copy(chunk, true);
    }

    /// Marks `producer` gone: its sequences get nothing more, so reading them never waits for
    /// a commit again.
    pub fn producer_gone(&mut self, producer: ProducerId) {
        for ((p, _), seq) in self.sequences.iter_mut() {
            if *p == producer {
                seq.gone = true;
            }
        }
    }

    fn copy(&mut self, chunk: &ChunkToCopy<'_>, scraped: bool) {
        let key = (chunk.producer, chunk.writer);
        let seq = match self.sequences.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                self.seq_order.push(key);
                e.insert(Sequence::default())
            }
        };
        let ext = seq.extend(chunk.chunk_id);

        // The same chunk again: a scraped chunk now committed for real, or a recommit.
        if let Some(idx) = seq.chunks.get(ext) {
            self.rewrite_chunk(idx, chunk, scraped);
            return;
        }
        // Only a commit of a finished chunk is the last word on it: after a scrape, its commit
        // is to come.
        let is_final = chunk.complete && !scraped;
        let owed = seq.partial.get(&ext).copied().unwrap_or_default();
        let accounted = owed.fragments;
        if accounted > 0 && readable_in(chunk) <= accounted {
            // A scrape (or recommit) that adds nothing to what was already accounted for.
            if is_final {
                seq.partial.remove(&ext);
                if owed.loss != 0 {
                    // The chunk is never read, so the chunk-id gap after it reports the loss
                    // (or, if nothing follows, the trailing marker).
                    seq.refused_max = seq.refused_max.max(Some(ext));
                }
            }
            return;
        }
        if seq.last_read_ext.is_some_and(|last| ext <= last) {
            // Too late: the sequence has been read past this chunk.
            self.stats.chunks_committed_out_of_order += 1;
            self.refuse(key, ext, chunk, owed, is_final);
            return;
        }
        if seq.max_ext.is_some_and(|max| ext < max) {
            self.stats.chunks_committed_out_of_order += 1;
        }

        let size = align_up(chunk.payload.len().max(1));
        if chunk.payload.len() > u32::MAX as usize || size > self.ring.len() {
            self.stats.abi_violations += 1;
            self.refuse(key, ext, chunk, owed, is_final);
            return;
        }
        if self.discarding {
            self.refuse(key, ext, chunk, owed, is_final);
            return;
        }
        let Some(offset) = self.reserve(size) else {
            self.refuse(key, ext, chunk, owed, is_final);
            return;
        };
        self.ring[offset..offset + chunk.payload.len()].copy_from_slice(chunk.payload);
        let rec = Record {
            seq: key,
            ext,
            offset,
            payload_len: chunk.payload.len(),
            num_fragments: chunk.num_fragments,
            flags: chunk.flags,
            complete: chunk.complete,
            fragments_read: 0,
            read_offset: 0,
            live: true,
            pinned: false,
            scraped,
            resume_loss: 0,
        };
        let mut rec = rec;
        if accounted > 0 {
            rec.resume_loss = owed.loss;
            // Skip the fragments a scraped copy of this chunk already accounted for.
            match skip_fragments(chunk.payload, accounted) {
                Some(off) => {
                    rec.fragments_read = accounted;
                    rec.read_offset = off;
                }
                None => {
                    self.stats.abi_violations += 1;
                    rec.fragments_read = rec.readable_fragments();
                    rec.read_offset = rec.payload_len;
                    self.losses.corrupted += starts_after(chunk, accounted);
                }
            }
        }
        self.store_record(key, ext, offset, size, rec);
    }

    /// Indexes a chunk just copied to `offset` (`size` ring bytes).
    fn store_record(&mut self, key: SeqKey, ext: u64, offset: usize, size: usize, rec: Record) {
        let idx = match self.free.pop() {
            Some(i) => {
                self.slab[i] = Some(rec);
                i
            }
            None => {
                self.slab.push(Some(rec));
                self.slab.len() - 1
            }
        };
        self.fifo.push_back(RingEntry {
            offset,
            size,
            rec: Some(idx),
        });
        let seq = self.sequences.get_mut(&key).expect("exists");
        seq.chunks.insert(ext, idx);
        seq.max_ext = Some(seq.max_ext.map_or(ext, |m| m.max(ext)));
        self.stats.chunks_written += 1;
        self.stats.bytes_written += size as u64;
    }

    /// Counts a chunk the buffer will not store.
    fn refuse(
        &mut self,
        key: SeqKey,
        ext: u64,
        chunk: &ChunkToCopy<'_>,
        owed: Accounted,
        is_final: bool,
    ) {
        self.stats.chunks_discarded += 1;
        let accounted = owed.fragments;
        let lost = starts_after(chunk, accounted);
        self.losses.discarded += lost;
        let seq = self.sequences.get_mut(&key).expect("exists");
        if lost > 0 {
            if seq.last_read_ext.is_some_and(|last| ext <= last) {
                // Too late: what it held belonged before packets already read; the next packet
                // read is the first place left to say so.
                seq.loss |= data_loss::PRESENT;
            } else {
                // Chunks before it may still be read: the packets after the gap say so (a
                // read gap), or, if none comes, the trailing marker does.
                seq.refused_max = seq.refused_max.max(Some(ext));
            }
        }
        if is_final {
            seq.partial.remove(&ext);
        } else {
            // Its commit (still to come after a scrape) must not count these again.
            let loss = if lost > 0 {
                data_loss::PRESENT | data_loss::READ_GAP
            } else {
                0
            };
            seq.partial.insert(
                ext,
                Accounted {
                    fragments: readable_in(chunk).max(accounted),
                    loss: owed.loss | loss,
                },
            );
        }
    }

    fn rewrite_chunk(&mut self, idx: RecIdx, chunk: &ChunkToCopy<'_>, scraped: bool) {
        let rec = self.slab[idx].as_mut().expect("indexed records exist");
        if !scraped {
            // A commit, in order after the sequence's earlier commits.
            rec.scraped = false;
        }
        if chunk.payload.len() != rec.payload_len || chunk.num_fragments < rec.num_fragments {
            // A recommit must keep the chunk size and may only add fragments.
            self.stats.abi_violations += 1;
            return;
        }
        if rec.complete && !chunk.complete {
            // A late scrape of a chunk already committed: nothing new.
            return;
        }
        if rec.fragments_read > 0 && rec.read_offset > 0 {
            // Bytes already read must not change; only the tail may be new.
            let read = rec.read_offset.min(rec.payload_len);
            if chunk.payload[..read] != self.ring[rec.offset..rec.offset + read] {
                self.stats.abi_violations += 1;
                return;
            }
        }
        let (offset, len) = (rec.offset, rec.payload_len);
        rec.num_fragments = chunk.num_fragments;
        rec.flags = chunk.flags;
        rec.complete = chunk.complete;
        self.ring[offset..offset + len].copy_from_slice(chunk.payload);
        self.stats.chunks_rewritten += 1;
    }

    /// Applies patches to a chunk still in the buffer. `has_more_patches` false clears the
    /// chunk's needs-patching flag, letting its sequence be read past it.
    pub fn try_patch_chunk(
        &mut self,
        producer: ProducerId,
        writer: WriterId,
        chunk_id: ChunkId,
        patches: &[Patch],
        has_more_patches: bool,
    ) -> bool {
        let Some(seq) = self.sequences.get(&(producer, writer)) else {
            self.stats.patches_failed += patches.len().max(1) as u64;
            return false;
        };
        let ext = seq.extend(chunk_id);
        let Some(idx) = seq.chunks.get(ext) else {
            self.stats.patches_failed += patches.len().max(1) as u64;
            return false;
        };
        let rec = self.slab[idx].as_mut().expect("indexed records exist");
        let mut ok = true;
        for &Patch { offset, data } in patches {
            let offset = offset as usize;
            // A patch may not touch bytes already read out.
            if offset + 4 > rec.payload_len || offset < rec.read_offset {
                self.stats.patches_failed += 1;
                ok = false;
                continue;
            }
            let at = rec.offset + offset;
            self.ring[at..at + 4].copy_from_slice(&data);
            self.stats.patches_succeeded += 1;
        }
        if !has_more_patches {
            rec.flags &= !CHUNK_NEEDS_PATCHING;
        }
        ok
    }

    /// Makes room for `size` bytes at the write position (wrapping if needed) and returns the
    /// offset, or `None` if the policy refuses to overwrite unread data.
    fn reserve(&mut self, size: usize) -> Option<usize> {
        let cap = self.ring.len();
        if self.wptr > 0 && self.all_read() {
            self.rewind();
        }
        if self.wptr + size > cap {
            if !self.clear(self.wptr, cap) {
                return None;
            }
            let tail = cap - self.wptr;
            if tail > 0 {
                self.fifo.push_back(RingEntry {
                    offset: self.wptr,
                    size: tail,
                    rec: None,
                });
                self.stats.padding_bytes_written += tail as u64;
            }
            self.wptr = 0;
            self.stats.write_wrap_count += 1;
            // Round once: every page the writes use is mapped.
            self.populated = cap;
        }
        if !self.clear(self.wptr, self.wptr + size) {
            return None;
        }
        let offset = self.wptr;
        self.wptr += size;
        self.populate_to(self.wptr);
        Some(offset)
    }

    /// Whether every entry in the ring was read (or is padding) and no pending packet has a
    /// fragment there: nothing in the ring is needed any more. Amortized O(1): each entry is
    /// passed once (`dead_front`), and a needed one stops the walk.
    fn all_read(&mut self) -> bool {
        while let Some(entry) = self.fifo.get(self.dead_front) {
            let needed = entry
                .rec
                .is_some_and(|idx| self.slab[idx].as_ref().is_some_and(|r| r.live || r.pinned));
            if needed {
                return false;
            }
            self.dead_front += 1;
        }
        true
    }

    /// Starts writing at the ring's start again when nothing in it is needed ([`all_read`]):
    /// a session whose read-out keeps up (streaming into a file) then writes into pages it
    /// has written before, already mapped and likely in the cache, instead of going round the
    /// whole ring and taking a page fault per 4 KiB of it on the first pass. Nothing is lost
    /// or counted: the entries dropped were read, or are padding.
    ///
    /// [`all_read`]: Self::all_read
    fn rewind(&mut self) {
        while let Some(front) = self.fifo.pop_front() {
            match front.rec {
                None => self.stats.padding_bytes_cleared += front.size as u64,
                Some(idx) => self.evict(idx, front.size),
            }
        }
        self.dead_front = 0;
        self.wptr = 0;
    }

    /// Evicts the entries occupying `[a, b)`. They are always the oldest ones: entries ahead of
    /// the write position, in order. Returns false (and evicts nothing more) when DISCARD meets
    /// unread data.
    fn clear(&mut self, a: usize, b: usize) -> bool {
        while let Some(&front) = self.fifo.front() {
            if front.offset < a || front.offset >= b {
                break;
            }
            match front.rec {
                None => self.stats.padding_bytes_cleared += front.size as u64,
                Some(idx) => {
                    let live = self.slab[idx].as_ref().is_some_and(|r| r.live);
                    if live && self.policy == FillPolicy::Discard {
                        self.discarding = true;
                        return false;
                    }
                    self.evict(idx, front.size);
                }
            }
            self.fifo.pop_front();
            self.dead_front = self.dead_front.saturating_sub(1);
        }
        true
    }

    fn evict(&mut self, idx: RecIdx, size: usize) {
        let rec = self.slab[idx]
            .take()
            .expect("ring entries point at records");
        self.free.push(idx);
        let seq = self
            .sequences
            .get_mut(&rec.seq)
            .expect("records belong to sequences");
        if rec.pinned && drop_pending(seq, &mut self.slab) {
            // The pending packet of the sequence had fragments here: it can never complete.
            // Its bytes were not read out yet, so this is an overwrite of unread data.
            self.losses.incomplete += 1;
            seq.loss |= data_loss::PRESENT | data_loss::OVERWRITE | data_loss::REASSEMBLY_GAP;
            self.stats.chunks_overwritten += 1;
            self.stats.bytes_overwritten += size as u64;
        }
        if rec.live {
            seq.chunks.remove(rec.ext);
            if rec.awaits_commit() {
                let readable = rec.readable_fragments();
                let lost = if rec.fragments_read < readable {
                    data_loss::PRESENT | data_loss::OVERWRITE
                } else {
                    0
                };
                seq.partial.insert(
                    rec.ext,
                    Accounted {
                        fragments: readable,
                        loss: rec.resume_loss | lost,
                    },
                );
            } else {
                seq.partial.remove(&rec.ext);
            }
            self.stats.chunks_overwritten += 1;
            self.stats.bytes_overwritten += size as u64;
            self.losses.overwritten += rec.unread_packet_starts(&self.ring);
            // A continuation fragment at the front of this chunk belonged to the pending
            // packet, if any; it is now lost too.
            if rec.fragments_read == 0
                && rec.flag(FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK)
                && drop_pending(seq, &mut self.slab)
            {
                self.losses.incomplete += 1;
            }
            seq.loss |= data_loss::PRESENT | data_loss::OVERWRITE;
        }
    }

    // === reading ===

    /// Reads every packet that is complete now, in order within each sequence, calling `sink`
    /// with the packet's fragments (one slice per fragment, to be concatenated) and its info.
    ///
    /// With `last` set (the final read of a session), nothing is left waiting: packets still
    /// missing fragments and chunks still waiting for patches are counted lost.
    pub fn read_packets(&mut self, last: bool, mut sink: impl FnMut(PacketInfo, &[&[u8]])) {
        // A whole pass: one left under way by `read_some_packets` is finished by it too.
        self.read_cursor = 0;
        let mut unlimited = usize::MAX;
        for i in 0..self.seq_order.len() {
            let key = self.seq_order[i];
            self.read_sequence(key, last, &mut unlimited, &mut sink);
        }
    }

    /// Part of a pass of [`read_packets`](Self::read_packets) (without `last`): reads on from
    /// where the previous call stopped until `max_chunks` chunks are read (a chunk is never
    /// left half read by this limit), and returns whether the pass reached the end of the last
    /// sequence. A streaming service reads a period's data in such steps so that the commits
    /// arriving meanwhile are applied between them: a producer's shared memory buffer is not
    /// left full while the read-out of a whole period runs. Each sequence is still read in
    /// order, so a pass made of steps reads what one call would (and what was committed
    /// meanwhile to the sequences it had not reached yet).
    pub fn read_some_packets(
        &mut self,
        max_chunks: usize,
        mut sink: impl FnMut(PacketInfo, &[&[u8]]),
    ) -> bool {
        let mut budget = max_chunks.max(1);
        while self.read_cursor < self.seq_order.len() {
            let key = self.seq_order[self.read_cursor];
            self.read_sequence(key, false, &mut budget, &mut sink);
            if budget == 0 {
                // The sequence may have more: the next step starts with it.
                return false;
            }
            self.read_cursor += 1;
        }
        self.read_cursor = 0;
        true
    }

    /// After the final read: the loss no packet reported, because nothing was read after it
    /// on its sequence (say, a writer's last chunks were refused, or their packets cut short).
    /// One [`PacketInfo`] per such sequence, for an empty packet that carries the loss bits in
    /// its `previous_packet_dropped`, so the trace says so where the loss happened. Taking
    /// them clears them.
    pub fn take_trailing_losses(&mut self) -> Vec<PacketInfo> {
        let mut out = Vec::new();
        for key in &self.seq_order {
            let seq = self
                .sequences
                .get_mut(key)
                .expect("ordered sequences exist");
            if seq.refused_max > seq.last_read_ext {
                // Refused chunks after the last one read: no later packet crossed the gap.
                seq.loss |= data_loss::PRESENT | data_loss::READ_GAP;
            }
            if seq.loss != 0 {
                out.push(take_packet_info(seq, *key));
            }
        }
        out
    }

    /// The sequences that committed into this buffer, in order of first commit.
    pub fn sequences(&self) -> impl Iterator<Item = (ProducerId, WriterId)> + '_ {
        self.seq_order.iter().copied()
    }

    fn read_sequence(
        &mut self,
        key: SeqKey,
        last: bool,
        budget: &mut usize,
        sink: &mut impl FnMut(PacketInfo, &[&[u8]]),
    ) {
        loop {
            if *budget == 0 {
                return;
            }
            let seq = self
                .sequences
                .get_mut(&key)
                .expect("ordered sequences exist");
            let Some((ext, idx)) = seq.chunks.first() else {
                if last && drop_pending(seq, &mut self.slab) {
                    // Its continuation never came.
                    self.losses.incomplete += 1;
                    seq.loss |= data_loss::PRESENT | data_loss::REASSEMBLY_GAP;
                }
                return;
            };
            let rec = self.slab[idx].as_ref().expect("indexed records exist");
            // Nothing more comes once the session ends or the producer is gone.
            let may_wait = !last && !seq.gone;
            if may_wait && rec.awaits_commit() {
                // A scraped chunk is read while streaming only right after its predecessor. A
                // scrape copies the chunks one at a time while the writer goes on, so it can
                // pass over a writer's chunk (no finished packet yet, or still being written)
                // and then find the next one, mid-write or finished, while the commit of the
                // one passed over is on its way: reading past it would lose it. The first
                // chunk of a sequence follows nothing read: a fresh writer's chunk 0 is the
                // start, any other waits for a commit.
                let follows = match seq.last_read_ext {
                    Some(prev) => ext == prev + 1,
                    None => ext as u32 == 0 && !rec.flag(FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK),
                };
                if !follows {
                    return;
                }
            }
            if let Some(prev) = seq.last_read_ext {
                if ext != prev + 1 {
                    seq.loss |= data_loss::PRESENT | data_loss::READ_GAP;
                    if drop_pending(seq, &mut self.slab) {
                        self.losses.incomplete += 1;
                        seq.loss |= data_loss::REASSEMBLY_GAP;
                    }
                    // Treat the gap as crossed.
                    seq.last_read_ext = Some(ext - 1);
                }
            }
            if let Some(rec) = self.slab[idx].as_mut() {
                seq.loss |= std::mem::take(&mut rec.resume_loss);
            }
            self.read_chunk(idx, sink);
            let rec = self.slab[idx].as_ref().expect("indexed records exist");
            if rec.flag(CHUNK_NEEDS_PATCHING) && rec.fragments_read < rec.readable_fragments() {
                // `read_chunk` stopped before the last fragment, the only one patches may touch
                // (the writer patches the sizes of a packet it continues in the next chunk).
                if !last {
                    return; // wait for the patches
                }
                // The session is over and the patches never came: that packet is corrupt.
                self.drop_rest_of_chunk(idx, data_loss::CHUNK_CORRUPTED);
                self.finish_chunk(key, ext, idx);
                continue;
            }
            let done = rec.fragments_read >= rec.readable_fragments();
            if !rec.complete && may_wait {
                // A scraped chunk: the writer may still be in it, or has left it and its real
                // commit is still to come (a producer's commits arrive in order, so until then
                // no later chunk of the sequence was committed either). Nothing proves it is
                // done before that commit: a later chunk scraped in the Complete state does not
                // (a scrape copies chunks one at a time while the writer goes on, so it can copy
                // this one mid-write and the next one finished), and reading past this one
                // would refuse its commit as late and lose its last packets. If the producer
                // dies instead, the scrape at its disconnect copies this chunk as it was left.
                return;
            }
            if !done {
                // Cannot happen (read_chunk reads to the end or drops the rest); be safe.
                self.drop_rest_of_chunk(idx, data_loss::CHUNK_CORRUPTED);
            }
            self.finish_chunk(key, ext, idx);
            *budget -= 1;
        }
    }

    /// Removes a read chunk from its sequence's index; its bytes stay in the ring (pinned if a
    /// pending packet still points into them) until overwritten.
    fn finish_chunk(&mut self, key: SeqKey, ext: u64, idx: RecIdx) {
        let rec = self.slab[idx].as_mut().expect("indexed records exist");
        rec.live = false;
        let readable = rec.readable_fragments();
        // Its commit may still come (after a scrape): remember what was read of it.
        let scraped = rec.awaits_commit();
        self.stats.chunks_read += 1;
        let seq = self.sequences.get_mut(&key).expect("exists");
        seq.chunks.remove(ext);
        seq.last_read_ext = Some(ext);
        if scraped {
            seq.partial.insert(
                ext,
                Accounted {
                    fragments: readable,
                    loss: 0,
                },
            );
        } else {
            seq.partial.remove(&ext);
        }
    }

    /// Counts every packet starting in the unread rest of a chunk as corrupted, and drops the
    /// pending packet if the chunk would have continued it.
    fn drop_rest_of_chunk(&mut self, idx: RecIdx, reason: u32) {
        let rec = self.slab[idx].as_mut().expect("indexed records exist");
        let starts = rec.unread_packet_starts(&self.ring);
        let continues = rec.fragments_read == 0 && rec.flag(FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK);
        rec.fragments_read = rec.readable_fragments();
        rec.read_offset = rec.payload_len;
        let key = rec.seq;
        self.losses.corrupted += starts;
        let seq = self.sequences.get_mut(&key).expect("exists");
        seq.loss |= data_loss::PRESENT | reason;
        if continues && drop_pending(seq, &mut self.slab) {
            self.losses.incomplete += 1;
        }
    }

    fn read_chunk(&mut self, idx: RecIdx, sink: &mut impl FnMut(PacketInfo, &[&[u8]])) {
        loop {
            self.read_whole_packets(idx, sink);
            let rec = self.slab[idx].as_ref().expect("indexed records exist");
            let n = rec.readable_fragments();
            if rec.fragments_read >= n {
                return;
            }
            let i = rec.fragments_read;
            let is_first = i == 0;
            let is_last = i + 1 == rec.num_fragments;
            if is_last && rec.flag(CHUNK_NEEDS_PATCHING) {
                // Its size fields are still to be patched (the caller decides what to do).
                return;
            }
            let continues_prev = is_first && rec.flag(FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK);
            let continues_next = is_last && rec.flag(LAST_PACKET_CONTINUES_ON_NEXT_CHUNK);
            let payload = &self.ring[rec.offset..rec.offset + rec.payload_len];
            let Some((len, header)) = parse_fragment_header(&payload[rec.read_offset..]) else {
                self.stats.abi_violations += 1;
                self.drop_rest_of_chunk(idx, data_loss::CHUNK_CORRUPTED);
                return;
            };
            let key = rec.seq;
            let data_start = rec.read_offset + header;
            if len == PACKET_SIZE_DROP_PACKET {
                // The writer dropped this packet (or the one this fragment continues). The
                // sentinel ends the chunk's data.
                self.stats.trace_writer_packet_loss += 1;
                let rec = self.slab[idx].as_mut().expect("exists");
                rec.fragments_read += 1;
                rec.read_offset = rec.payload_len;
                let seq = self.sequences.get_mut(&key).expect("exists");
                seq.loss |= data_loss::PRESENT | data_loss::WRITER_ABORT;
                if continues_prev {
                    if drop_pending(seq, &mut self.slab) {
                        self.losses.writer_dropped += 1;
                    }
                } else {
                    self.losses.writer_dropped += 1;
                    if drop_pending(seq, &mut self.slab) {
                        self.losses.incomplete += 1;
                    }
                }
                // Anything the header claims after the sentinel cannot be trusted.
                self.drop_rest_of_chunk(idx, data_loss::CHUNK_CORRUPTED);
                return;
            }
            let len = len as usize;
            if len > rec.payload_len - data_start {
                self.stats.abi_violations += 1;
                self.drop_rest_of_chunk(idx, data_loss::CHUNK_CORRUPTED);
                return;
            }
            {
                let rec = self.slab[idx].as_mut().expect("exists");
                rec.fragments_read += 1;
                rec.read_offset = data_start + len;
            }
            let seq = self.sequences.get_mut(&key).expect("exists");
            if continues_prev {
                match seq.pending.as_mut() {
                    Some(p) => p.fragments.push((idx, data_start, len)),
                    None => {
                        // Its beginning was lost (and counted) already.
                        seq.loss |= data_loss::PRESENT | data_loss::ORPHAN_CONTINUATION;
                        continue;
                    }
                }
            } else {
                if drop_pending(seq, &mut self.slab) {
                    // The previous chunk promised a continuation that is not here.
                    self.losses.incomplete += 1;
                    seq.loss |= data_loss::PRESENT | data_loss::REASSEMBLY_BROKEN_CHAIN;
                }
                if !continues_next {
                    // The common case, a packet in one fragment: emitted straight from the
                    // ring, without gathering (or pinning) fragments.
                    if len == 0 {
                        // An empty packet: the byte a writer appends to keep an inflated
                        // packet count honest. Not a packet.
                        continue;
                    }
                    let info = take_packet_info(seq, key);
                    let rec = self.slab[idx].as_ref().expect("exists");
                    let start = rec.offset + data_start;
                    self.stats.bytes_read += len as u64;
                    sink(info, &[&self.ring[start..start + len]]);
                    continue;
                }
                seq.pending = Some(Pending {
                    fragments: vec![(idx, data_start, len)],
                });
            }
            if continues_next {
                // Wait for the next chunk; keep this one's bytes.
                self.slab[idx].as_mut().expect("exists").pinned = true;
                self.stats.readaheads_failed += 1;
                continue;
            }
            // The last fragment of a packet that spans chunks (one-fragment packets took the
            // fast path above).
            let pending = seq.pending.take().expect("continued above");
            let total: usize = pending.fragments.iter().map(|f| f.2).sum();
            self.stats.readaheads_succeeded += 1;
            if total == 0 {
                // An empty packet (see above).
                continue;
            }
            let info = take_packet_info(seq, key);
            for &(r, _, _) in &pending.fragments {
                if let Some(rec) = self.slab[r].as_mut() {
                    rec.pinned = false;
                }
            }
            let slices: Vec<&[u8]> = pending
                .fragments
                .iter()
                .map(|&(r, start, len)| {
                    let rec = self.slab[r].as_ref().expect("pinned records stay");
                    &self.ring[rec.offset + start..rec.offset + start + len]
                })
                .collect();
            self.stats.bytes_read += total as u64;
            sink(info, &slices);
        }
    }
}

impl TraceBuffer {
    /// The common case of [`read_chunk`](Self::read_chunk), in one tight loop: the run of
    /// packets in one fragment each, from the chunk's next fragment up to (not including) the
    /// first one that needs more thought: a continuation, a fragment patches may touch, a
    /// sentinel or a bad header, or anything while a packet spanning chunks is pending. It does
    /// exactly what `read_chunk`'s loop does for those fragments, with the sequence and the
    /// chunk looked up once instead of per packet; `read_chunk` handles what it stops at.
    fn read_whole_packets(&mut self, idx: RecIdx, sink: &mut impl FnMut(PacketInfo, &[&[u8]])) {
        let TraceBuffer {
            ring,
            slab,
            sequences,
            stats,
            ..
        } = self;
        let rec = slab[idx].as_mut().expect("indexed records exist");
        let key = rec.seq;
        let seq = sequences
            .get_mut(&key)
            .expect("records belong to sequences");
        if seq.pending.is_some()
            || (rec.fragments_read == 0 && rec.flag(FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK))
        {
            return;
        }
        let mut end = rec.readable_fragments();
        if end == rec.num_fragments
            && (rec.flag(LAST_PACKET_CONTINUES_ON_NEXT_CHUNK) || rec.flag(CHUNK_NEEDS_PATCHING))
        {
            end = end.saturating_sub(1);
        }
        let payload = &ring[rec.offset..rec.offset + rec.payload_len];
        let mut read = rec.fragments_read;
        let mut offset = rec.read_offset;
        let mut bytes = 0u64;
        // Only the first packet read can carry the sequence's loss bits or be its first: the
        // ones after it get the same info with none (what `take_packet_info` would give them).
        let mut first = true;
        let later = PacketInfo {
            producer: key.0,
            writer: key.1,
            previous_packet_dropped: 0,
        };
        while read < end {
            let Some((len, header)) = parse_fragment_header(&payload[offset..]) else {
                break;
            };
            let start = offset + header;
            if len == PACKET_SIZE_DROP_PACKET || len as usize > payload.len() - start {
                break;
            }
            let len = len as usize;
            read += 1;
            offset = start + len;
            if len == 0 {
                // A filler, not a packet (see `read_chunk`).
                continue;
            }
            bytes += len as u64;
            let info = if first {
                first = false;
                take_packet_info(seq, key)
            } else {
                later
            };
            sink(info, &[&payload[start..offset]]);
        }
        rec.fragments_read = read;
        rec.read_offset = offset;
        stats.bytes_read += bytes;
    }
}

/// The info of the next packet read from `seq`: its sequence's loss bits since the last packet
/// (reset here), and `DATA_LOSS_PRESENT` on a sequence's first packet.
fn take_packet_info(seq: &mut Sequence, key: SeqKey) -> PacketInfo {
    let mut info = PacketInfo {
        producer: key.0,
        writer: key.1,
        previous_packet_dropped: std::mem::take(&mut seq.loss),
    };
    if !seq.started {
        info.previous_packet_dropped |= data_loss::PRESENT;
        seq.started = true;
    }
    info
}

/// Abandons the sequence's pending packet, if any, releasing the pins on its chunks. Returns
/// whether there was one (the caller counts it lost).
fn drop_pending(seq: &mut Sequence, slab: &mut [Option<Record>]) -> bool {
    match seq.pending.take() {
        Some(p) => {
            for (r, _, _) in p.fragments {
                if let Some(rec) = slab[r].as_mut() {
                    rec.pinned = false;
                }
            }
            true
        }
        None => false,
    }
}

/// Fragments of a chunk a reader may look at (a scraped chunk's last one may be unfinished).
fn readable_in(chunk: &ChunkToCopy<'_>) -> u16 {
    if chunk.complete {
        chunk.num_fragments
    } else {
        chunk.num_fragments.saturating_sub(1)
    }
}

/// Packets that start in a chunk after its first `accounted` fragments.
fn starts_after(chunk: &ChunkToCopy<'_>, accounted: u16) -> u64 {
    let n = readable_in(chunk);
    if n <= accounted {
        return 0;
    }
    let mut starts = (n - accounted) as u64;
    if accounted == 0 && chunk.flags & FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK != 0 {
        starts -= 1;
    }
    if starts > 0 {
        if let Some(off) = skip_fragments(chunk.payload, accounted) {
            if ends_with_filler(chunk.payload, off, accounted, n) {
                starts -= 1;
            }
        }
    }
    starts
}

/// Whether the last of fragments `from..n` (the first at byte `offset`) is a zero-length filler:
/// the byte a writer appends to keep an inflated packet count honest, which is not a packet.
/// False when the headers do not parse (then every fragment counts).
fn ends_with_filler(payload: &[u8], mut offset: usize, from: u16, n: u16) -> bool {
    for i in from..n {
        let Some((len, header)) = payload.get(offset..).and_then(parse_fragment_header) else {
            return false;
        };
        if i + 1 == n {
            return len == 0;
        }
        if len == PACKET_SIZE_DROP_PACKET {
            return false;
        }
        offset = match offset.checked_add(header + len as usize) {
            Some(o) if o <= payload.len() => o,
            _ => return false,
        };
    }
    false
}

/// Loads one byte of every 64-byte line of `bytes`, the loads independent of each other, so
/// that the lines' cache misses overlap instead of coming one at a time behind a walk.
#[inline]
fn touch_lines(bytes: &[u8]) {
    let mut any = 0u8;
    for b in bytes.iter().step_by(64) {
        any |= *b;
    }
    std::hint::black_box(any);
}

/// The payload offset after the first `n` fragments, or `None` if their headers are invalid.
fn skip_fragments(payload: &[u8], n: u16) -> Option<usize> {
    let mut off = 0usize;
    for _ in 0..n {
        let (len, header) = parse_fragment_header(payload.get(off..)?)?;
        if len == PACKET_SIZE_DROP_PACKET {
            return None;
        }
        off = off.checked_add(header)?.checked_add(len as usize)?;
        if off > payload.len() {
            return None;
        }
    }
    Some(off)
}

/// Parses a fragment header (a varint of at most 4 bytes: usually the redundant 4-byte form, or a
/// compacted single byte). Returns (length, header size).
///
/// The one-byte form (fragments under 128 bytes: the SDK's zones) is decided inline: chunks of
/// small packets have hundreds of headers, walked when the chunk is read (and, for a chunk
/// overwritten unread, by [`ends_with_filler`]).
#[inline(always)]
fn parse_fragment_header(bytes: &[u8]) -> Option<(u32, usize)> {
    match bytes.first() {
        Some(&b) if b < 0x80 => Some((u32::from(b), 1)),
        _ => decode_fragment_header(bytes, 0).ok(),
    }
}

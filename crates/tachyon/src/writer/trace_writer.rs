//! [`TraceWriter`]: one packet sequence, serialized with protozero straight into chunks of the
//! shared memory buffer.
//!
//! The design (layout, fragmentation, patches, drops, allocations) is documented on
//! [`TraceWriter`], where users read it. Maintainers: the protozero [`Delegate`] is
//! `ChunkDelegate`; every write into chunk memory goes through `ChunkDelegate::store`, which
//! checks bounds before its one `unsafe` copy.

use std::fmt;
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use protozero::{ContiguousMemoryRange, Delegate, Message, MessageWriter, ScatteredStreamWriter};
use tachyon_abi::{
    Chunk, ChunkFlags, ChunkHeader, ChunkToMove, CommitRequest, Packets,
    DROP_PACKET_FRAGMENT_HEADER, FRAGMENT_HEADER_SIZE, MAX_PACKET_COUNT, MAX_WRITER_PACKET_COUNT,
};
use tachyon_protos::TracePacket;

use crate::writer::arbiter::{BufferExhaustedPolicy, SmbArbiter};
use crate::writer::patch_list::PatchList;

/// Size of each writer's scratch chunk, where dropped packets go (Perfetto's garbage chunk is
/// 1 KiB too, but one static buffer shared by all threads).
pub const SCRATCH_CHUNK_SIZE: usize = 1024;

/// `previous_packet_dropped` on the first packet after drops: `DATA_LOSS_PRESENT` (1) |
/// `DATA_LOSS_SMB_FULL` (256), Perfetto's `DataLossReason` bits.
pub const PREVIOUS_PACKET_DROPPED_SMB_FULL: u32 = 257;

/// A packet does not start with less room than this in the chunk (Perfetto: header + 8).
const MIN_PACKET_ROOM: usize = FRAGMENT_HEADER_SIZE + 8;

/// Bytes at the end of every chunk the stream never writes: room for a drop marker (4 bytes) or
/// the filler of an inflated count (1 byte).
const CHUNK_TAIL_RESERVE: usize = FRAGMENT_HEADER_SIZE;

/// Per-writer counters (exact).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Packets started with [`TraceWriter::new_trace_packet`].
    pub packets: u64,
    /// Of those, packets that did not reach the buffer whole (buffer exhausted, or the writer
    /// broke).
    pub packets_dropped: u64,
    /// Of the dropped packets, those marked in a chunk handed to the service (a drop sentinel,
    /// or a continuation that never comes), which the service counts lost too (see the module
    /// docs).
    pub packets_dropped_marked: u64,
    /// Episodes of dropping (Perfetto's `drop_count_`).
    pub drop_episodes: u64,
    /// Chunks handed back and committed.
    pub chunks_committed: u64,
    /// Patches committed.
    pub patches_committed: u64,
    /// protozero errors that broke the writer (0 or 1).
    pub errors: u64,
}

/// What a call to `get_new_buffer` outside a packet is for (the writer made the stream leave its
/// buffer with `switch_buffer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Switch {
    /// A packet is about to start and needs a fresh chunk.
    NewPacket,
    /// `flush()`: hand the chunk back and take none.
    Park,
}

/// What looking for the next chunk without waiting found.
enum Next {
    /// A chunk.
    Found(Chunk<'static>),
    /// None, and the policy allows waiting: the writer will, after handing its chunk back.
    Wait,
    /// None, and the writer drops.
    Drop,
}

// === Flags ===

/// The writer's yes/no state, one bit each in one byte, so that the fast paths test all of
/// them with one load and one compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Flags(u8);

impl Flags {
    /// The count includes one packet more than has started (count inflation, see
    /// [`TraceWriter`]).
    const INFLATED: u8 = 1;
    /// The next packet must start in a new chunk (1022 packets in this one, or a retry after a
    /// dropped packet went round the scratch chunk).
    const NEED_SWITCH: u8 = 1 << 1;
    /// Writing into the scratch chunk: packets are lost.
    const DROPPING: u8 = 1 << 2;
    /// The next packet that reaches the buffer gets `previous_packet_dropped`.
    const REPORT_DROP: u8 = 1 << 3;
    /// The next packet is the writer's first.
    const FIRST_PACKET: u8 = 1 << 4;
    /// The stream hit a protozero error; every later packet is dropped.
    const BROKEN: u8 = 1 << 5;
    /// A packet was lost (or the writer is new) and the owner of the sequence's incremental
    /// state has not set it up again since ([`TraceWriter::mark_synced`]): the event fast paths
    /// ([`TraceWriter::try_write_event`], `try_write_short_event`) refuse while it is set, and
    /// the track-event layer asks for it ([`TraceWriter::is_synced`]); packets written any
    /// other way ignore it.
    const UNSYNCED: u8 = 1 << 6;

    #[inline(always)]
    fn has(self, flag: u8) -> bool {
        self.0 & flag != 0
    }

    #[inline(always)]
    fn set(&mut self, flag: u8, on: bool) {
        if on {
            self.0 |= flag;
        } else {
            self.0 &= !flag;
        }
    }

    /// Clears `flag` and says whether it was set.
    #[inline(always)]
    fn take(&mut self, flag: u8) -> bool {
        let was = self.has(flag);
        self.0 &= !flag;
        was
    }
}

/// `v` (below [`TraceWriter::FAST_DELTA_LIMIT`]) as a varint in the low bytes of a little-endian word, and
/// its length: one compare for the one-byte case, no loop. The 7-bit groups are spread with
/// adds: `v + (v & !0x7f)` moves every bit from bit 7 up one place (the low group is below
/// 128, the moved part a multiple of 256: no carry), and adding `(v & !0x3fff) << 1` moves the
/// bits from 14 up once more; the continuation bits go into the gaps this opens.
#[inline(always)]
fn varint3_le(v: u64) -> (u64, usize) {
    if v < 1 << 7 {
        (v, 1)
    } else if v < 1 << 14 {
        (v + (v & !0x7f) + 0x80, 2)
    } else {
        (v + (v & !0x7f) + ((v & !0x3fff) << 1) + 0x8080, 3)
    }
}

// === Scratch ===

/// A heap buffer owned through a raw pointer (protozero writes into it through raw pointers).
struct Scratch {
    /// From `Box::<[u8]>::into_raw`, `len` bytes, freed in `Drop`.
    ptr: *mut u8,
    len: usize,
}

impl Scratch {
    fn new(len: usize) -> Self {
        let ptr = Box::into_raw(vec![0u8; len].into_boxed_slice()).cast::<u8>();
        Scratch { ptr, len }
    }

    /// The first `n` bytes (`n <= len`).
    fn head(&self, n: usize) -> ContiguousMemoryRange {
        ContiguousMemoryRange {
            begin: self.ptr,
            end: self.ptr.wrapping_add(n.min(self.len)),
        }
    }

    fn range(&self) -> ContiguousMemoryRange {
        self.head(self.len)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let slice = ptr::slice_from_raw_parts_mut(self.ptr, self.len);
        // SAFETY: `ptr`/`len` come from `Box::into_raw` of a boxed slice of exactly `len` bytes,
        // freed once, here.
        drop(unsafe { Box::from_raw(slice) });
    }
}

// === ChunkDelegate ===

/// The writer's state, living inside the protozero stream as its [`Delegate`]. The
/// [`TraceWriter`] reaches it between protozero calls with `delegate_mut()`.
// `repr(C)`: what the fast paths touch comes first (the delegate itself sits after protozero's
// size-field stack in the stream), apart from the arbiter (its flush generation), which must
// come after every chunk (below).
#[repr(C)]
struct ChunkDelegate {
    // The chunks come first: fields drop in declaration order, and a `Chunk<'static>` must not
    // outlive the arbiter (below) that keeps its memory alive.
    /// The chunk being written (BeingWritten, ours).
    cur: Option<Chunk<'static>>,
    /// The writer's yes/no state (see [`Flags`]).
    flags: Flags,
    /// `cur`'s packet count as we last stored it.
    count: u16,
    /// End of the last finished fragment in `cur` (where a filler or marker goes).
    data_end: *mut u8,
    flush_seen: u64,
    stats: WriterStats,
    /// The outcome of looking for the next chunk for the open packet, found early by
    /// `carry_over` (to carry the packet into it, see "A packet across chunks" on
    /// [`TraceWriter`]) or by `annotate_patch` (it must know whether the packet will continue
    /// before it redirects a size field).
    prefetched: Option<Next>,
    /// A free chunk `TraceWriter::try_make_room` acquired, installed by the `get_new_buffer`
    /// call it makes right after (between packets).
    staged: Option<Chunk<'static>>,
    /// The write pointer `carry_over` saw when it asked protozero to carry the open packet
    /// (null: no carry asked).
    carry_end: *mut u8,
    arbiter: Arc<SmbArbiter>,
    /// `cur`'s payload, `[payload_begin, payload_end)`; null without a chunk.
    payload_begin: *mut u8,
    payload_end: *mut u8,
    cur_chunk_id: u32,
    /// A size field of `cur` was redirected to a patch slot.
    cur_needs_patching: bool,
    /// Inside a packet (protozero asking for a buffer means the packet continues).
    in_packet: bool,
    switch: Switch,
    /// Header and first data byte of the open packet's fragment in `cur` (null: none).
    fragment_header: *mut u8,
    fragment_start: *mut u8,
    next_chunk_id: u32,
    page_hint: usize,
    writer_id: u16,
    target_buffer: u16,
    policy: BufferExhaustedPolicy,
    scratch: Scratch,
    patches: PatchList,
    /// `stats.packets_dropped` when a packet last reported drops (`tachyon_packets_dropped`).
    dropped_reported: u64,
}

// SAFETY: the raw pointers point into memory this delegate owns exclusively: the chunk it holds
// in the BeingWritten state (no other writer may touch it, and the arbiter's contract keeps this
// process's service off it), its scratch chunk and its patch slots (heap allocations freed only
// in its `Drop`). Moving the delegate to another thread moves that ownership with it; nothing is
// left shared with the old thread. `Chunk` and `Arc<SmbArbiter>` are `Send` themselves.
unsafe impl Send for ChunkDelegate {}

impl fmt::Debug for ChunkDelegate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkDelegate")
            .field("writer_id", &self.writer_id)
            .field("target_buffer", &self.target_buffer)
            .field(
                "cur_chunk_id",
                &self.cur.as_ref().map(|_| self.cur_chunk_id),
            )
            .field("count", &self.count)
            .field("dropping", &self.flags.has(Flags::DROPPING))
            .field("broken", &self.flags.has(Flags::BROKEN))
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl ChunkDelegate {
    fn chunk_header(&self, count: u16, flags: ChunkFlags) -> ChunkHeader {
        ChunkHeader {
            packets: Packets::new(count, flags).unwrap_or(Packets::EMPTY),
            ..ChunkHeader::new(self.writer_id, self.next_chunk_id)
        }
    }

    /// The policy in force: `StallThenDrop` does not wait again while the writer is already
    /// dropping.
    fn may_wait(&self) -> bool {
        match self.policy {
            BufferExhaustedPolicy::Drop => false,
            BufferExhaustedPolicy::StallThenDrop { timeout } => {
                !self.flags.has(Flags::DROPPING) && !timeout.is_zero()
            }
            BufferExhaustedPolicy::Stall { timeout } => !timeout.is_zero(),
        }
    }

    /// Looks for the next chunk without waiting.
    fn try_next(&mut self, count: u16, flags: ChunkFlags) -> Next {
        let header = self.chunk_header(count, flags);
        match self.arbiter.try_acquire_chunk(header, &mut self.page_hint) {
            Some(chunk) => Next::Found(chunk),
            None if self.may_wait() => Next::Wait,
            None => Next::Drop,
        }
    }

    /// Waits for the next chunk as long as the policy allows. The writer holds no chunk while
    /// it waits (see [`TraceWriter`]'s docs).
    #[cold]
    fn stall_for(&mut self, count: u16, flags: ChunkFlags) -> Option<Chunk<'static>> {
        let header = self.chunk_header(count, flags);
        let timeout = self.policy.timeout();
        self.arbiter.stall(header, timeout, &mut self.page_hint)
    }

    /// Leaves drop mode (a chunk was acquired): the next packet says packets were lost.
    fn leave_drop_mode(&mut self) {
        if self.flags.has(Flags::DROPPING) {
            self.flags.set(Flags::DROPPING, false);
            self.flags.set(Flags::REPORT_DROP, true);
        }
    }

    /// Makes `chunk` (acquired with `count` packets) the current chunk.
    fn install(&mut self, mut chunk: Chunk<'static>, count: u16) {
        self.payload_begin = chunk.payload_ptr();
        self.payload_end = self.payload_begin.wrapping_add(chunk.payload_size());
        self.cur_chunk_id = self.next_chunk_id;
        self.next_chunk_id = self.next_chunk_id.wrapping_add(1);
        self.count = count;
        self.flags.set(Flags::INFLATED, false);
        self.cur_needs_patching = false;
        self.flags.set(Flags::NEED_SWITCH, false);
        self.data_end = ptr::null_mut();
        self.cur = Some(chunk);
    }

    /// The stream's range in the current chunk, from `begin`.
    fn chunk_range(&self, begin: *mut u8) -> ContiguousMemoryRange {
        ContiguousMemoryRange {
            begin,
            end: self.payload_end.wrapping_sub(CHUNK_TAIL_RESERVE),
        }
    }

    /// Whether `[p, p + n)` lies in the current chunk's payload.
    fn in_chunk(&self, p: *const u8, n: usize) -> bool {
        self.cur.is_some()
            && ContiguousMemoryRange {
                begin: self.payload_begin,
                end: self.payload_end,
            }
            .contains(p, n)
    }

    /// Writes `bytes` at `at` in the current chunk; does nothing if that is not entirely inside
    /// the chunk's payload (a bug, but never a stray write).
    #[inline(always)]
    fn store(&mut self, at: *mut u8, bytes: &[u8]) {
        if self.in_chunk(at, bytes.len()) {
            // SAFETY: `at .. at + len` lies in the payload of `cur` (checked above), a chunk
            // this writer holds in the BeingWritten state: no other writer may write it and, by
            // `SmbArbiter::new`'s contract, nothing else in this process accesses it in a way
            // that races with this store. The protozero
            // stream writes the same chunk only through its own raw pointers, never at the
            // positions the writer patches here (fragment headers are reserved before the packet
            // data; markers and fillers go after the last finished fragment, only once the stream
            // has left the chunk for good), and never during this call: stream and delegate run
            // on this thread, one call at a time. `bytes` is a shared borrow of other memory.
            unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len()) };
        }
    }

    /// Back-fills the fragment header of the open packet with the size of its data up to `end`.
    #[inline(always)]
    fn close_fragment(&mut self, end: *mut u8) {
        let size = (end as usize).saturating_sub(self.fragment_start as usize);
        // A fragment is at most a chunk (< 2^16), far below the 2^28 − 1 the 4-byte redundant
        // varint holds (`tachyon_abi::encode_fragment_header` without its range check).
        let header = protozero::wire::redundant_varint(size as u32);
        self.store(self.fragment_header, &header);
        self.fragment_header = ptr::null_mut();
    }

    /// Counts one more packet in the current chunk (release store: everything written before
    /// is visible to a service that loads the count).
    #[inline(always)]
    fn bump_count(&mut self) {
        if let Some(chunk) = self.cur.as_mut() {
            // Cannot overflow: the writer stops at 1022 packets plus one inflated.
            self.count = chunk.increment_packet_count().unwrap_or(self.count);
        }
    }

    /// Completes the current chunk and commits it with the ready patches.
    fn return_chunk(&mut self) {
        let Some(chunk) = self.cur.take() else {
            return;
        };
        let (page, index) = (chunk.page_idx() as u32, chunk.chunk_idx() as u32);
        self.payload_begin = ptr::null_mut();
        self.payload_end = ptr::null_mut();
        self.fragment_header = ptr::null_mut();
        self.data_end = ptr::null_mut();
        self.flags.set(Flags::INFLATED, false);
        if !self.arbiter.complete_chunk(chunk) {
            // Someone corrupted the page word; the chunk is lost (counted by the arbiter).
            self.commit_ready_patches();
            return;
        }
        let mut request = CommitRequest {
            chunks_to_move: vec![ChunkToMove {
                page,
                chunk: index,
                target_buffer: self.target_buffer,
            }],
            ..CommitRequest::default()
        };
        self.stats.patches_committed += self.patches.take_ready(
            self.writer_id,
            self.target_buffer,
            &mut request.chunks_to_patch,
        ) as u64;
        self.arbiter.commit(request);
        self.stats.chunks_committed += 1;
        self.arbiter
            .counters
            .chunks_committed
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Commits the patches that are ready, if any.
    #[cold]
    fn commit_ready_patches(&mut self) {
        if !self.patches.any_ready() {
            return;
        }
        let mut request = CommitRequest::default();
        self.stats.patches_committed += self.patches.take_ready(
            self.writer_id,
            self.target_buffer,
            &mut request.chunks_to_patch,
        ) as u64;
        self.arbiter.commit(request);
    }

    /// Hands the current chunk back between packets: with a drop marker in the slot of the
    /// inflated count when `marker`, else with the filler byte an inflated count needs.
    fn close_chunk_between_packets(&mut self, marker: bool) {
        if self.cur.is_none() {
            return;
        }
        let at = self.data_end;
        if !at.is_null() {
            if marker {
                if !self.flags.has(Flags::INFLATED) {
                    self.bump_count();
                }
                self.store(at, &DROP_PACKET_FRAGMENT_HEADER);
                self.stats.packets_dropped_marked += 1;
            } else if self.flags.has(Flags::INFLATED) {
                self.store(at, &[0]);
            }
        }
        self.return_chunk();
    }

    /// Starts (or continues) an episode of dropping.
    #[cold]
    fn enter_drop_mode(&mut self) {
        if !self.flags.has(Flags::DROPPING) {
            self.flags.set(Flags::DROPPING, true);
            self.stats.drop_episodes += 1;
            self.arbiter
                .counters
                .drop_episodes
                .fetch_add(1, Ordering::Relaxed);
        }
        self.flags.set(Flags::NEED_SWITCH, false);
    }

    /// Counts one lost packet; `marked` if a sentinel in the buffer stands for it.
    #[cold]
    fn record_drop(&mut self, marked: bool) {
        self.flags.set(Flags::UNSYNCED, true);
        self.stats.packets_dropped += 1;
        if marked {
            self.stats.packets_dropped_marked += 1;
        }
        self.arbiter
            .counters
            .packets_dropped
            .fetch_add(1, Ordering::Relaxed);
    }

    /// `carry_over`: asks protozero to carry the open packet whole into the next chunk, when it
    /// started in this chunk after other packets, is at most half a chunk so far (what the
    /// carry leaves unused in this chunk), and a free chunk is there right now (acquired here,
    /// kept as `prefetched`). Otherwise 0: the packet continues in a new chunk as a fragment,
    /// or is dropped, as before (with what was found here).
    #[cold]
    fn carry_packet(&mut self, used_end: *mut u8, min_len: usize) -> usize {
        self.carry_end = ptr::null_mut();
        let header = self.fragment_header;
        if !self.in_packet
            || self.flags.has(Flags::DROPPING)
            || self.prefetched.is_some()
            || header.is_null()
            || header == self.payload_begin
            || !self.in_chunk(header, FRAGMENT_HEADER_SIZE)
        {
            return 0;
        }
        let Some(n) = (used_end as usize).checked_sub(header as usize) else {
            return 0;
        };
        let room = (self.payload_end as usize - self.payload_begin as usize)
            .saturating_sub(CHUNK_TAIL_RESERVE);
        if !self.in_chunk(header, n) || n > room / 2 || n.saturating_add(min_len) > room {
            return 0;
        }
        // Every chunk of the buffer has this chunk's size (one page layout per arbiter). The
        // chunk is taken as one that starts with a whole packet.
        let next = self.try_next(1, ChunkFlags::NONE);
        let found = matches!(next, Next::Found(_));
        // No chunk: waiting hands this chunk back first, and dropping marks the packet in it,
        // both as for a packet that continues (`continue_packet`, with this outcome).
        self.prefetched = Some(next);
        if !found {
            return 0;
        }
        self.carry_end = used_end;
        n
    }

    /// `get_new_buffer` for the carried packet `used_end..carry_end` (protozero moved its
    /// write pointer): copies it to the start of `chunk` (found by `carry_packet`), takes it out
    /// of the current chunk, which goes back between packets, and makes `chunk` the current
    /// one.
    fn carry_into(
        &mut self,
        mut chunk: Chunk<'static>,
        used_end: *mut u8,
        carry_end: *mut u8,
    ) -> ContiguousMemoryRange {
        let n = carry_end as usize - used_end as usize;
        let to = chunk.payload_ptr();
        if self.in_chunk(used_end, n) && n <= chunk.payload_size() - CHUNK_TAIL_RESERVE {
            // SAFETY: `used_end .. used_end + n` lies in the payload of `cur` (checked above)
            // and `to .. to + n` in the payload of `chunk` (checked above): two distinct chunks
            // this writer holds in the BeingWritten state, so the ranges do not overlap, no
            // other writer touches them and, by `SmbArbiter::new`'s contract, nothing else in
            // this process accesses them in a way that races with the copy. The protozero
            // stream is inside this call (it called `get_new_buffer`) and writes neither.
            unsafe { ptr::copy_nonoverlapping(used_end, to, n) };
        }
        // The packet was counted in the current chunk when it started: an empty fragment at
        // its place (what an inflated count gets) keeps the count right.
        self.data_end = used_end;
        self.flags.set(Flags::INFLATED, true);
        self.fragment_header = ptr::null_mut();
        self.close_chunk_between_packets(false);
        self.install(chunk, 1);
        self.fragment_header = self.payload_begin;
        self.fragment_start = self.payload_begin.wrapping_add(FRAGMENT_HEADER_SIZE);
        self.chunk_range(self.payload_begin)
    }

    /// `get_new_buffer` inside a packet: carry it whole into the chunk `carry_packet` found,
    /// continue it in a new chunk, or drop it.
    #[cold]
    fn continue_packet(&mut self, used_end: *mut u8) -> ContiguousMemoryRange {
        if self.flags.has(Flags::DROPPING) || self.cur.is_none() {
            // The packet is already lost: go round the scratch chunk again, and try the buffer
            // again at the next packet.
            self.flags.set(Flags::NEED_SWITCH, true);
            return self.scratch.range();
        }
        let next = match self.prefetched.take() {
            Some(next) => next,
            None => self.try_next(1, ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK),
        };
        match next {
            Next::Found(mut chunk) => {
                let carry_end = std::mem::replace(&mut self.carry_end, ptr::null_mut());
                if !carry_end.is_null() {
                    if used_end == self.fragment_header {
                        return self.carry_into(chunk, used_end, carry_end);
                    }
                    // protozero declined the carry (it would split a size field, which a carry
                    // from the fragment header never does): the chunk, taken for a whole
                    // packet, continues this one.
                    chunk.set_flags(ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK);
                }
                self.hand_over_continuing(used_end);
                self.continue_in(chunk)
            }
            Next::Wait => {
                // Hand the chunk back before waiting, as if the packet went on: a writer that
                // waits holds no chunk, so the service can always make progress.
                self.hand_over_continuing(used_end);
                match self.stall_for(1, ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK) {
                    Some(chunk) => self.continue_in(chunk),
                    None => {
                        // The continuation never comes: the service counts the packet lost when
                        // the sequence's next chunk does not continue it (or at its last read).
                        self.enter_drop_mode();
                        self.record_drop(true);
                        self.scratch.range()
                    }
                }
            }
            Next::Drop => {
                // The packet cannot be finished: its fragment here becomes the drop sentinel so
                // the service discards it (size fields pointing here were already dropped:
                // `annotate_patch` returned null). No continuation or patching flags.
                let header = self.fragment_header;
                self.store(header, &DROP_PACKET_FRAGMENT_HEADER);
                self.return_chunk();
                self.enter_drop_mode();
                self.record_drop(true);
                self.scratch.range()
            }
        }
    }

    /// Closes the open packet's fragment at `used_end`, flags the chunk "continues on next"
    /// (and "needs patching" if a size field was redirected), and hands it back.
    fn hand_over_continuing(&mut self, used_end: *mut u8) {
        self.close_fragment(used_end);
        let mut flags = ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK;
        if self.cur_needs_patching {
            flags = flags.union(ChunkFlags::CHUNK_NEEDS_PATCHING);
        }
        if let Some(cur) = self.cur.as_mut() {
            cur.set_flags(flags);
        }
        self.return_chunk();
    }

    /// Makes `chunk` (acquired with count 1, "continues from previous") the current chunk and
    /// opens the continuation fragment at its start.
    fn continue_in(&mut self, chunk: Chunk<'static>) -> ContiguousMemoryRange {
        self.install(chunk, 1);
        let header = self.payload_begin;
        self.store(header, &[0; FRAGMENT_HEADER_SIZE]);
        self.fragment_header = header;
        self.fragment_start = header.wrapping_add(FRAGMENT_HEADER_SIZE);
        self.chunk_range(self.fragment_start)
    }

    /// `get_new_buffer` between packets (the writer made the stream leave its buffer with
    /// `switch_buffer`). The chunk's filler or drop marker goes at `data_end`, the end of its
    /// last finished fragment; the bytes after it are left as they are.
    #[cold]
    fn switch_between_packets(&mut self) -> ContiguousMemoryRange {
        if self.switch == Switch::Park {
            self.close_chunk_between_packets(false);
            // No room (an empty range, non-null as protozero requires): the next packet starts
            // with a chunk switch.
            return self.scratch.head(0);
        }
        if let Some(chunk) = self.staged.take() {
            // `try_make_room`: a free chunk it found; the writer is not dropping.
            self.close_chunk_between_packets(false);
            self.install(chunk, 0);
            return self.chunk_range(self.payload_begin);
        }
        self.flags.set(Flags::NEED_SWITCH, false);
        let next = self.try_next(0, ChunkFlags::NONE);
        let chunk = match next {
            Next::Found(chunk) => {
                self.close_chunk_between_packets(false);
                Some(chunk)
            }
            Next::Wait => {
                // Hand the chunk back first: a writer that waits holds no chunk.
                self.close_chunk_between_packets(false);
                self.stall_for(0, ChunkFlags::NONE)
            }
            Next::Drop => {
                // The packet about to start is lost: mark it after the last packet of the chunk
                // handed back (if this episode just began; later ones have no chunk).
                let starts = !self.flags.has(Flags::DROPPING);
                self.close_chunk_between_packets(starts);
                None
            }
        };
        match chunk {
            Some(chunk) => {
                self.leave_drop_mode();
                self.install(chunk, 0);
                self.chunk_range(self.payload_begin)
            }
            None => {
                self.enter_drop_mode();
                self.scratch.range()
            }
        }
    }

    /// `annotate_patch`: where the size of an open nested message at `size_field` must go now
    /// that the writer leaves the buffer holding it.
    #[cold]
    fn redirect_size_field(&mut self, size_field: *mut u8) -> *mut u8 {
        if !self.in_packet
            || self.flags.has(Flags::DROPPING)
            || !self.in_chunk(size_field, FRAGMENT_HEADER_SIZE)
        {
            // In the scratch chunk (or not ours at all): the size is worthless, drop it.
            return ptr::null_mut();
        }
        // Only a packet that continues in a new chunk needs its sizes: find out now.
        if self.prefetched.is_none() {
            let next = self.try_next(1, ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK);
            self.prefetched = Some(next);
        }
        if matches!(self.prefetched, Some(Next::Drop)) {
            // The packet will be dropped and its fragment here marked: no patch.
            return ptr::null_mut();
        }
        // Found, or the writer will wait for it: the chunk is handed over as continuing.
        let offset = size_field as usize - self.payload_begin as usize;
        self.cur_needs_patching = true;
        self.patches.alloc(self.cur_chunk_id, offset as u32)
    }

    /// The stream failed (protozero error): abandon the packet and stop writing.
    #[cold]
    fn break_writer(&mut self) {
        self.flags.set(Flags::BROKEN, true);
        self.stats.errors += 1;
        if !self.flags.has(Flags::DROPPING) && !self.fragment_header.is_null() {
            let header = self.fragment_header;
            self.store(header, &DROP_PACKET_FRAGMENT_HEADER);
            self.record_drop(true);
        }
        // Nested messages of the packet will never end: release the chunks waiting for them.
        self.patches.force_ready();
        self.return_chunk();
        self.commit_ready_patches();
    }
}

// SAFETY: the three promises of the `Delegate` contract:
// 1. Ranges are either the payload of a chunk this writer just acquired (BeingWritten: exclusively
//    ours in the SMB protocol; nothing else in this process touches it by `SmbArbiter::new`'s
//    contract), minus its last 4 bytes, or a prefix of the writer's own scratch allocation. The
//    chunk ranges are at least 280 bytes, the scratch ranges empty (`Park`, where the writer asks
//    for 0 bytes; the pointer is the scratch allocation's, never null) or 1024 bytes, so every
//    range is at least `min_len` (0 for `Park`, else 1 or 4). A new range never overlaps a range
//    still in use (the previous one is left by then), nor a patch slot (separate heap blocks).
// 2. A chunk range stays valid until the next `get_new_buffer` call, where the chunk is returned;
//    `annotate_patch` never returns the address it was given, so nothing in a returned chunk is
//    written later. The scratch chunk lives as long as the delegate.
// 3. Patch slots come from `PatchList`: blocks freed only when the delegate is dropped, a slot
//    reused only after its first byte became non-zero. Null is returned when a size must be
//    dropped.
// 4. A carry (`carry_over` returned n > 0) is copied by `carry_into` from the chunk being left to
//    the start of the staged chunk's payload, the range then returned, before the chunk being
//    left is handed back; `carry_packet` made sure the n bytes fit in a chunk with `min_len`.
unsafe impl Delegate for ChunkDelegate {
    fn get_new_buffer(
        &mut self,
        used_end: *mut u8,
        _min_len: usize,
    ) -> Option<ContiguousMemoryRange> {
        Some(if self.in_packet {
            self.continue_packet(used_end)
        } else {
            self.switch_between_packets()
        })
    }

    fn annotate_patch(&mut self, size_field: *mut u8) -> *mut u8 {
        self.redirect_size_field(size_field)
    }

    fn carry_over(&mut self, used_end: *mut u8, min_len: usize) -> usize {
        self.carry_packet(used_end, min_len)
    }
}

// === TraceWriter ===

/// Writes one packet sequence (one per thread) with protozero straight into chunks of an
/// arbiter's shared memory buffer.
///
/// Made by [`SmbArbiter::create_trace_writer`] (or per thread by
/// [`SmbArbiter::with_thread_writer`]). Start a packet with
/// [`new_trace_packet`](TraceWriter::new_trace_packet) or write one with
/// [`write_packet`](TraceWriter::write_packet). Not `Sync`: one thread writes at a time (the
/// writer may be moved between threads). Dropping it flushes and releases its writer id.
///
/// # A packet in a chunk
///
/// ```text
///  chunk payload (the writer's range ends 4 bytes early: room for a drop marker)
///  +----------+----------+----------+----------+-----+---------------------------+------+
///  | hdr (4B) | packet 0 | hdr (4B) | packet 1 | ... | unused (left unwritten)   | tail |
///  +----------+----------+----------+----------+-----+---------------------------+------+
///  hdr: fragment size as a 4-byte redundant varint, e.g. 7 = 87 80 80 00
/// ```
///
/// [`new_trace_packet`](TraceWriter::new_trace_packet) reserves the 4-byte fragment header and
/// counts the packet in the chunk header (release store) *before* the packet is written, as
/// Perfetto does; when the packet handle is dropped the header is back-filled and the count is
/// *inflated* by one more, so that a service scraping the chunk (which ignores the last counted
/// packet, possibly unfinished) sees the finished packet. The next packet reuses the inflated
/// count; a chunk returned with the count still inflated gets a 0x00 byte at the end of its data
/// (an empty fragment, which the service skips). A chunk is returned when fewer than 12 bytes are
/// left or after 1022 packets (so that inflation never exceeds the 10-bit count).
///
/// Root fragment headers are always the 4-byte redundant form: the 1-byte compaction Perfetto
/// does for small packets needs to move the stream's write pointer back, which protozero's public
/// writer does not offer. Nested messages are compacted by protozero as usual.
///
/// # A packet across chunks
///
/// When the packet does not fit, protozero asks the delegate for a new buffer. A packet that
/// started in this chunk after other packets and is at most half a chunk so far is *carried*:
/// if a free chunk is there right now, the writer copies the packet so far to the start of that
/// chunk (protozero moves its write pointer and the open size fields with it), leaves an empty
/// fragment where it was (the count already covered it), hands the chunk back between packets
/// and goes on in the new one. The packet is then whole in one chunk and its sizes are written
/// in place: nothing waits on a patch. Patches are why Perfetto loses a packet per chunk when a
/// producer dies before its next commit (the service reads a chunk that needs patching only up
/// to its last fragment); carried packets survive that. A carry costs a copy of at most half a
/// chunk and leaves that much of the chunk unused, so it is kept for packets that small.
///
/// Any other packet (larger, first in its chunk, or no free chunk) continues. The writer looks
/// for the next chunk (header: count 1, "first packet continues from previous chunk"),
/// back-fills the fragment size in the chunk it leaves, flags it "last packet continues on next
/// chunk", returns and commits it, then reserves a fragment header at the start of the new
/// chunk. Size fields of nested messages still open in the chunk being left are redirected
/// (protozero calls `annotate_patch` for each, before asking for the buffer) to patch slots,
/// and that chunk is flagged "needs patching"; ready patches travel with the next commit, grouped
/// per chunk, with `has_more_patches` (see `patch_list.rs`).
///
/// # When the buffer is full
///
/// The writer first looks for a free chunk without waiting. If there is none:
///
/// - If its [`BufferExhaustedPolicy`] lets it wait (`Stall`, or `StallThenDrop` at the start of
///   an episode), it **hands its current chunk back first** (as a packet boundary, or as
///   "continues on next chunk" in the middle of a packet), then waits, bounded. Perfetto waits
///   while holding its chunk: a writer then needs two chunks to make progress, a buffer with one
///   free chunk deadlocks a lone stalling writer, and N stalling writers pin N chunks. Here a
///   waiting writer pins nothing, so the service can always free what it needs.
/// - Otherwise, or once the wait timed out, the writer drops: it writes into its own 1 KiB
///   scratch chunk (allocated with the writer) and throws it away, and every packet that does
///   not reach the buffer is counted ([`WriterStats::packets_dropped`], exact).
///
/// The loss is also *marked in the buffer* whenever the writer still holds the chunk where it
/// happens, so the service reports it even if the writer never gets another chunk:
///
/// - A packet cut in the middle when the writer drops without waiting gets the drop sentinel
///   (2^28 − 1) as the size of its fragment in the chunk it leaves; the service discards the
///   partial packet (`trace_writer_packet_loss`). Size fields pointing into that chunk are
///   dropped (`annotate_patch` returns null); earlier chunks' patches still ship.
/// - A packet cut in the middle after a wait that timed out already left its chunk as
///   "continues on next chunk": the service counts it lost when the sequence's next chunk does
///   not continue it, or at its last read. Its patches ship as usual.
/// - A packet that cannot even start (no chunk at a packet boundary, no wait) is marked by a
///   sentinel fragment appended in the slot of the inflated count of the chunk being returned.
///   Perfetto instead overwrites the size of the *last finished packet* with the sentinel,
///   sacrificing a packet that was fine; Tachyon keeps 4 bytes free at the end of each chunk for
///   the marker and loses nothing extra. For the service both look the same: one sentinel, one
///   `trace_writer_packet_loss`, one packet lost.
/// - A packet that cannot start after a wait timed out, and later packets of an episode, have no
///   chunk to be marked in: only the writer's counters (summed in the arbiter's
///   [`crate::ArbiterStats`], for the session's stats) and the next packet's
///   `previous_packet_dropped` report them.
///
/// So a packet counted in [`WriterStats::packets_dropped_marked`] is one the service counts
/// lost too; the others it cannot see. With `written` = packets started:
/// written = read + (dropped − dropped_marked) + packets the service counts lost, exactly.
///
/// The writer retries the buffer at the next packet start once the scratch chunk is full (or a
/// dropped packet went round it), as Perfetto. [`TraceWriter::make_room`] makes that retry (and
/// any chunk switch a packet of known size needs) before the packet, so that a caller learns
/// whether the packet will reach the buffer before it writes it. The first packet that reaches the buffer again
/// carries `previous_packet_dropped = 257` (`DATA_LOSS_PRESENT | DATA_LOSS_SMB_FULL`). The very
/// first packet of every writer carries `first_packet_on_sequence = true` (even if it is the one
/// dropped: then no packet does, and the next one says `previous_packet_dropped`).
///
/// # What allocates
///
/// Creating a writer (the scratch chunk, one block of 16 patch slots, small vectors). Handing a
/// chunk back: the commit's `Vec` of one chunk to move (and of patches, if any), plus the
/// channel's block every 31 commits — once per chunk, i.e. about once per 4 KiB written. A
/// 17th simultaneously outstanding patch slot adds a block. Nothing else: starting a packet,
/// writing fields, finishing a packet within a chunk do not allocate.
///
/// # Errors
///
/// protozero's sticky errors (more than 64 nested messages open, a nested message above 256 MiB)
/// leave the stream unable to write. The writer then marks the packet dropped in its chunk,
/// hands the chunk back and drops every later packet (counted). It is *broken*:
/// [`TraceWriter::is_broken`]; the thread-local facility replaces a broken writer.
pub struct TraceWriter {
    stream: ScatteredStreamWriter<ChunkDelegate>,
}

impl fmt::Debug for TraceWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceWriter")
            .field("state", self.stream.delegate())
            .finish_non_exhaustive()
    }
}

impl TraceWriter {
    /// Timestamp deltas [`try_write_event`](Self::try_write_event) takes: below 2^21, a varint
    /// of at most three bytes (about 2 ms of trace-clock nanoseconds; a longer gap takes the
    /// caller's slow path, which writes the same bytes).
    pub(crate) const FAST_DELTA_LIMIT: u64 = 1 << 21;

    pub(crate) fn new(
        arbiter: Arc<SmbArbiter>,
        writer_id: u16,
        first_chunk_id: u32,
        target_buffer: u16,
        policy: BufferExhaustedPolicy,
    ) -> TraceWriter {
        let scratch = Scratch::new(SCRATCH_CHUNK_SIZE);
        // Start with an empty range (no room) at the scratch chunk, so that the first packet
        // switches to a chunk like any other.
        let start = scratch.head(0);
        let delegate = ChunkDelegate {
            cur: None,
            prefetched: None,
            staged: None,
            carry_end: ptr::null_mut(),
            payload_begin: ptr::null_mut(),
            payload_end: ptr::null_mut(),
            cur_chunk_id: 0,
            count: 0,
            cur_needs_patching: false,
            fragment_header: ptr::null_mut(),
            fragment_start: ptr::null_mut(),
            data_end: ptr::null_mut(),
            in_packet: false,
            switch: Switch::NewPacket,
            flags: Flags(Flags::FIRST_PACKET | Flags::UNSYNCED),
            next_chunk_id: first_chunk_id,
            page_hint: arbiter.initial_page_hint(writer_id),
            flush_seen: arbiter.flush_generation(),
            writer_id,
            target_buffer,
            policy,
            scratch,
            patches: PatchList::new(),
            stats: WriterStats::default(),
            dropped_reported: 0,
            arbiter,
        };
        // SAFETY: `start` is an empty range (no byte to write) at the start of the delegate's
        // scratch allocation, which moves into the stream with the delegate (the heap memory
        // itself does not move) and lives as long as it.
        let stream = unsafe { ScatteredStreamWriter::with_range(delegate, start) };
        TraceWriter { stream }
    }

    /// Starts a packet. Write it through the handle ([`TracePacketHandle::packet`] for the
    /// generated `TracePacket` writer, [`TracePacketHandle::message`] for a raw
    /// [`Message`]); dropping the handle finishes it. The handle borrows the writer, so packets
    /// are written one at a time, checked by the compiler.
    ///
    /// Never blocks longer than the writer's [`BufferExhaustedPolicy`] allows, never allocates
    /// unless it hands a full chunk back (see "What allocates" on [`TraceWriter`]). A packet
    /// with no fields is not emitted: the service takes a zero-length fragment for filler.
    #[inline]
    pub fn new_trace_packet(&mut self) -> TracePacketHandle<'_> {
        let avail = self.stream.bytes_available();
        let core = self.stream.delegate_mut();
        core.stats.packets += 1;
        if core.flags.has(Flags::BROKEN) {
            core.record_drop(false);
            return TracePacketHandle { writer: self };
        }
        if avail < MIN_PACKET_ROOM || core.flags.has(Flags::NEED_SWITCH) {
            core.in_packet = false;
            core.switch = Switch::NewPacket;
            self.switch_for_packet();
        } else {
            self.stream.write_bytes(&[0; FRAGMENT_HEADER_SIZE]);
        }
        // The 4 bytes just written, contiguous: the fragment header.
        let header = self.stream.write_ptr().wrapping_sub(FRAGMENT_HEADER_SIZE);
        let core = self.stream.delegate_mut();
        core.in_packet = true;
        if core.flags.has(Flags::DROPPING) {
            core.record_drop(false);
        } else {
            core.fragment_header = header;
            core.fragment_start = header.wrapping_add(FRAGMENT_HEADER_SIZE);
            if core.flags.has(Flags::INFLATED) {
                // The count already covers this packet.
                core.flags.set(Flags::INFLATED, false);
            } else {
                core.bump_count();
            }
            if core.count >= MAX_WRITER_PACKET_COUNT {
                core.flags.set(Flags::NEED_SWITCH, true);
            }
        }
        if core.flags.has(Flags::FIRST_PACKET) || core.flags.has(Flags::REPORT_DROP) {
            self.write_sequence_marks();
        }
        TracePacketHandle { writer: self }
    }

    /// Writes one small, already encoded packet: `block[0]` must hold the packet's length `n`
    /// (below 128: a one-byte fragment header) and `block[1..=n]` its bytes.
    ///
    /// The fast path, for the SDK's counters (and the track-event layer's events that missed
    /// its own fast path): when the current chunk has room for the whole block (or, near its
    /// end, for the packet) and nothing special is pending (first packet, a loss to report, a
    /// chunk switch, a flush request, dropping), the block is copied with one fixed-size move
    /// (or, near the end, the packet's bytes) and the count bumped once. Otherwise the packet goes through
    /// [`new_trace_packet`](Self::new_trace_packet) with the same bytes, so the result on the
    /// wire is the same packet either way (the slow path's fragment header is 4 bytes instead
    /// of 1).
    #[inline]
    pub fn write_small_packet<const N: usize>(&mut self, block: &[u8; N]) {
        let n = block[0] as usize;
        debug_assert!(n < 128 && n < N, "not a small packet: {n} bytes");
        // `INFLATED` implies a current chunk with a finished packet and a count that already
        // covers the next one; every other flag but `UNSYNCED` is a reason to leave the fast
        // path.
        let core = self.stream.delegate();
        let fast = core.flags.0 & !Flags::UNSYNCED == Flags::INFLATED
            && core.flush_seen == core.arbiter.flush_generation();
        if fast && self.stream.try_write_block_prefix(block, n + 1) {
            self.small_packet_written();
            return;
        }
        // Near the chunk's end (less room than the block, enough for the packet): the packet's
        // own bytes, one-byte header included, rather than the general path's 4-byte header.
        let len = (n + 1).min(N);
        if fast && self.stream.bytes_available() >= len {
            self.stream.write_bytes(&block[..len]);
            self.small_packet_written();
            return;
        }
        self.write_small_packet_slow(&block[1..=n.min(N - 1)]);
    }

    /// The track-event layer's fast path (for the events its threads queue, encoded by whoever
    /// drains the queue): writes the packet `prefix[1..=n]` (`n = prefix[0]`,
    /// below `N`) followed by the varint `value` (below [`Self::FAST_DELTA_LIMIT`]), if it
    /// goes straight into the current chunk ([`can_write_event`](Self::can_write_event)), and
    /// runs `accepted` once that is settled, before the bytes are written (the caller updates
    /// its clock there: nothing of its own stays in registers across the writes). Returns
    /// false otherwise, having written nothing: the caller takes its slow path, which sorts out
    /// whatever stopped this one.
    #[inline(always)]
    pub(crate) fn try_write_event<const N: usize>(
        &mut self,
        prefix: &[u8; N],
        value: u64,
        accepted: impl FnOnce(),
    ) -> bool {
        if !self.can_write_event::<N>(value) {
            return false;
        }
        accepted();
        self.write_event(prefix, value);
        true
    }

    /// [`try_write_event`](Self::try_write_event) for a packet whose bytes before the delta are
    /// exactly the 8 of `prefix` (`prefix[0] == 7`, as a slice end's): header, packet and
    /// varint are two words, written with one fixed-size store pair and one room check.
    #[inline(always)]
    pub(crate) fn try_write_short_event(
        &mut self,
        prefix: &[u8; 8],
        value: u64,
        accepted: impl FnOnce(),
    ) -> bool {
        // The prefix is a constant template: the first compare folds away.
        if prefix[0] != 7 || !self.can_write_event::<8>(value) {
            return false;
        }
        accepted();
        let (varint, varint_len) = varint3_le(value);
        let mut block = [0u8; 16];
        block[..8]
            .copy_from_slice(&(u64::from_le_bytes(*prefix) + varint_len as u64).to_le_bytes());
        block[8..].copy_from_slice(&varint.to_le_bytes());
        if self.stream.try_write_block_prefix(&block, 8 + varint_len) {
            self.small_packet_written();
        }
        true
    }

    /// Whether [`write_event`](Self::write_event) can write an event of an `N`-byte prefix
    /// with the timestamp delta `value` now: nothing pending (as for
    /// [`write_small_packet`](Self::write_small_packet)), the sequence's incremental state in
    /// sync ([`mark_synced`](Self::mark_synced)), room for `N + 8` bytes, and `value` below
    /// [`Self::FAST_DELTA_LIMIT`]. Changes nothing.
    #[inline(always)]
    fn can_write_event<const N: usize>(&self, value: u64) -> bool {
        let core = self.stream.delegate();
        core.flags.0 == Flags::INFLATED
            && core.flush_seen == core.arbiter.flush_generation()
            && self.stream.bytes_available() >= N + 8
            && value < Self::FAST_DELTA_LIMIT
    }

    /// Writes the event (see [`try_write_event`](Self::try_write_event)) once
    /// [`can_write_event`](Self::can_write_event) said yes (so the caller has nothing left to
    /// check, or to keep in registers, meanwhile). Had it said no, this writes nothing the
    /// chunk has no room for (protozero checks every store) and counts no packet.
    ///
    /// Fixed-size stores straight into the chunk, nothing built on the stack and read back:
    /// the `N` prefix bytes (the first one fixed into the packet's one-byte fragment header) as
    /// words, then the varint's 8-byte word; each advances the write position by its real
    /// length, so the bytes past the packet land in free space that the next write overwrites.
    #[inline(always)]
    fn write_event<const N: usize>(&mut self, prefix: &[u8; N], value: u64) {
        const { assert!(N % 8 == 0 && 8 <= N && N <= 128) };
        // Not `can_write_event` again: its flush generation is another thread's to bump at any
        // time, and a flush asked for after the check is the next event's to notice.
        debug_assert!(
            (prefix[0] as usize) < N
                && self.stream.bytes_available() >= N + 8
                && value < Self::FAST_DELTA_LIMIT
        );
        let n = (prefix[0] as usize).min(N - 1);
        let (varint, varint_len) = varint3_le(value);
        // The prefix as words, its first byte (the packet's one-byte fragment header) grown by
        // the varint's length with one add (no carry: n + 3 < 256): the compiler keeps them in
        // registers and stores them straight into the chunk.
        // (Under callgrind, the loop costs a zone 2 instructions fewer than a copy of `prefix`
        // with its first word rewritten.)
        let mut block = [0u8; N];
        for (i, (dst, src)) in block
            .chunks_exact_mut(8)
            .zip(prefix.chunks_exact(8))
            .enumerate()
        {
            let mut word = u64::from_le_bytes(src.try_into().unwrap_or([0; 8]));
            if i == 0 {
                word += varint_len as u64;
            }
            dst.copy_from_slice(&word.to_le_bytes());
        }
        // Both fit after `can_write_event`: `N + 8` bytes are available, the first call takes
        // `N` and keeps `n + 1 <= N`.
        if self.stream.try_write_block_prefix(&block, n + 1)
            && self
                .stream
                .try_write_block_prefix(&varint.to_le_bytes(), varint_len)
        {
            self.small_packet_written();
        }
    }

    /// The track-event layer's fast path for a run of events (what the drainer encodes from a
    /// thread's queue): writes packets as [`try_write_event`](Self::try_write_event) does,
    /// one for each `(prefix, value)` that `next` hands out (`value` below
    /// [`Self::FAST_DELTA_LIMIT`]), while they go straight into the current chunk; the number
    /// written. `next` is asked for an event only once there is room for it, and returns `None`
    /// to end the run (an event the fast path cannot take, or none left); an event it hands out
    /// is written.
    ///
    /// What does not change between the packets of a run is checked once, at its start: no
    /// flag but [`Flags::INFLATED`] (nothing pending, the sequence in sync), no flush asked for
    /// since the last packet (one asked for during the run is noticed by the packet after it,
    /// as by the next event of [`write_event`](Self::write_event)'s caller). The chunk's packet
    /// count is stored once at the end of the run (one release store for the run's packets):
    /// until then a scraping service sees the packets counted before the run, the first of the
    /// run as the unfinished last one, as it would while that packet was being written. The
    /// run stops at the writer's maximum packet count, where the next packet switches chunks.
    ///
    /// A prefix comes as the little-endian words of its `N = 8 * W` bytes (the packet's length
    /// in the low byte of the first): words go from the template into registers and from there
    /// into the chunk, with nothing built on the stack and read back.
    #[inline(always)]
    pub(crate) fn write_event_run<const N: usize, const W: usize>(
        &mut self,
        mut next: impl FnMut() -> Option<([u64; W], u64)>,
    ) -> usize {
        const { assert!(N == 8 * W && 8 <= N && N <= 128) };
        let core = self.stream.delegate();
        if core.flags.0 != Flags::INFLATED || core.flush_seen != core.arbiter.flush_generation() {
            return 0;
        }
        // With `INFLATED`, the count (at most the writer's maximum) already covers the first
        // packet of the run; after `k` packets it is `count + k`, at most `MAX_PACKET_COUNT`.
        let max = usize::from(MAX_PACKET_COUNT.saturating_sub(core.count));
        // Encoded in place: the position is a local, so the loop keeps it (and the room
        // left) in a register instead of storing the stream's pointer after every packet.
        let k = self.stream.write_in_place(|free| {
            let (mut pos, mut k) = (0, 0);
            while k < max {
                // Room for the whole block and a full varint word: both stores below are
                // fixed-size (the bytes past the packet are free space, overwritten next).
                let Some(dst) = free.get_mut(pos..pos + N + 8) else {
                    break;
                };
                let Some((mut words, value)) = next() else {
                    break;
                };
                let n = (words[0] as u8 as usize).min(N - 1);
                debug_assert!(value < Self::FAST_DELTA_LIMIT);
                let (varint, varint_len) = varint3_le(value);
                // The fragment header: the packet's length grown by the varint's (no carry:
                // n + 3 < 256).
                words[0] += varint_len as u64;
                for (d, word) in dst.chunks_exact_mut(8).zip(words) {
                    d.copy_from_slice(&word.to_le_bytes());
                }
                // n + 1 <= N, so the varint's word ends within the N + 8 bytes.
                dst[n + 1..n + 9].copy_from_slice(&varint.to_le_bytes());
                pos += n + 1 + varint_len;
                k += 1;
            }
            (pos, k)
        });
        if k > 0 {
            self.packets_written(k);
        }
        k
    }

    /// [`small_packet_written`](Self::small_packet_written) for `k` packets written whole in a
    /// row by [`write_event_run`](Self::write_event_run).
    #[inline(always)]
    fn packets_written(&mut self, k: usize) {
        let end = self.stream.write_ptr();
        // `bump_count`, written out: keeping the count only when it changed saves reading it
        // again (under callgrind, calling `bump_count` here cost a zone a few instructions).
        let core = self.stream.delegate_mut();
        core.stats.packets += k as u64;
        core.data_end = end;
        if let Some(count) = core
            .cur
            .as_mut()
            .and_then(|chunk| chunk.add_packet_count(k as u16).ok())
        {
            core.count = count;
        }
        // The count now covers the next packet too: above the maximum, the last one written
        // was the chunk's last.
        if core.count > MAX_WRITER_PACKET_COUNT {
            core.flags.set(Flags::NEED_SWITCH, true);
        }
    }

    /// Bookkeeping after a packet written whole by a fast path: counted, finished (its end is
    /// where a filler or marker goes) and the count inflated, as `finish_packet` leaves it.
    #[inline(always)]
    fn small_packet_written(&mut self) {
        self.packets_written(1);
    }

    /// Whether the sequence's incremental state was set up since the writer's last loss (see
    /// [`mark_synced`](Self::mark_synced)).
    #[inline(always)]
    pub(crate) fn is_synced(&self) -> bool {
        !self.stream.delegate().flags.has(Flags::UNSYNCED)
    }

    /// Says the sequence's incremental state is set up again after the writer's last loss (or
    /// since it was created): [`try_write_event`](Self::try_write_event) refuses until then,
    /// and again after every lost packet.
    pub(crate) fn mark_synced(&mut self) {
        self.stream.delegate_mut().flags.set(Flags::UNSYNCED, false);
    }

    #[cold]
    #[inline(never)]
    fn write_small_packet_slow(&mut self, bytes: &[u8]) {
        let mut handle = self.new_trace_packet();
        handle.message().append_raw_proto_bytes(bytes);
    }

    /// Whether a packet of at most `len` bytes, started next, reaches the buffer whole. Makes
    /// the chunk switch it needs now, between packets, so that the answer holds: when the
    /// `len` bytes (plus a fragment header) do not fit in the current chunk, the chunk holds
    /// its maximum packet count, or the writer is dropping and a retry of the buffer is due
    /// (the scratch chunk is full, or a dropped packet went round it), the writer switches as
    /// [`new_trace_packet`](Self::new_trace_packet) would: waiting as its policy allows, and
    /// entering (or staying in) drop mode when no chunk comes.
    ///
    /// `false`: the writer is dropping (or broken) and the next packet started is lost for
    /// sure. No packet is started or counted here: the caller decides what to do with that
    /// knowledge, but must then start a packet (or call [`skip_packet`](Self::skip_packet)):
    /// when the episode began here, the chunk handed back carries a drop marker for that packet
    /// (counted in [`WriterStats::packets_dropped_marked`] already), as if it had started. The track-event layer uses it to start its incremental state again only with
    /// the first packet that reaches the buffer after a loss (see `track_event/state.rs`), and
    /// to skip descriptors the reader could not get anyway.
    ///
    /// `true` promises the start of the packet, and the whole packet when `len` bytes fit in a
    /// chunk at all (a larger one fragments into the next chunk as usual, which may be lost).
    #[cold]
    #[inline(never)]
    pub fn make_room(&mut self, len: usize) -> bool {
        if self.short_of_room(len) {
            let core = self.stream.delegate_mut();
            core.in_packet = false;
            core.switch = Switch::NewPacket;
            self.stream.switch_buffer(FRAGMENT_HEADER_SIZE);
        }
        !self.is_dropping()
    }

    /// Like [`make_room`](Self::make_room), for a packet that may wait: never waits, never
    /// drops. When the packet does not fit in the current chunk, takes a new chunk only if one
    /// is free right now; `false` (no free chunk, or the writer is dropping) leaves the writer
    /// as it was. The track-event layer writes its periodic clock snapshots and the new
    /// generation an incremental-state clear asks for this way: when the buffer is that full,
    /// they wait for the next chunk rather than cost an event.
    #[cold]
    #[inline(never)]
    pub fn try_make_room(&mut self, len: usize) -> bool {
        if self.is_dropping() {
            return false;
        }
        if !self.short_of_room(len) {
            return true;
        }
        if self.stream.error().is_some() {
            return false;
        }
        let core = self.stream.delegate_mut();
        let header = core.chunk_header(0, ChunkFlags::NONE);
        let Some(chunk) = core.arbiter.try_acquire_chunk(header, &mut core.page_hint) else {
            return false;
        };
        core.staged = Some(chunk);
        core.in_packet = false;
        core.switch = Switch::NewPacket;
        // `switch_between_packets` installs the staged chunk (the stream has no error: it
        // calls the delegate).
        self.stream.switch_buffer(FRAGMENT_HEADER_SIZE);
        debug_assert!(self.stream.delegate().staged.is_none());
        true
    }

    /// Whether the next packet (of at most `len` bytes) would switch chunks at its start, or
    /// (not dropping) fragment because it does not fit.
    fn short_of_room(&self, len: usize) -> bool {
        let avail = self.stream.bytes_available();
        let core = self.stream.delegate();
        if core.flags.has(Flags::BROKEN) {
            return false;
        }
        let needed = if core.flags.has(Flags::DROPPING) {
            // While dropping, only the retry `new_trace_packet` would make.
            MIN_PACKET_ROOM
        } else {
            MIN_PACKET_ROOM.max(FRAGMENT_HEADER_SIZE.saturating_add(len))
        };
        core.flags.has(Flags::NEED_SWITCH) || avail < needed
    }

    /// Counts a packet the caller gives up on as started and dropped, without writing it: the
    /// next packet that reaches the buffer says `previous_packet_dropped`. For a caller that
    /// must not let the packet reach the buffer (the track-event layer, when it could not set
    /// up its sequence's state before it).
    #[cold]
    pub fn skip_packet(&mut self) {
        let core = self.stream.delegate_mut();
        core.stats.packets += 1;
        core.record_drop(false);
        if !core.flags.has(Flags::DROPPING) {
            core.flags.set(Flags::REPORT_DROP, true);
        }
    }

    /// Writes `first_packet_on_sequence` / `previous_packet_dropped` into the new packet.
    #[cold]
    fn write_sequence_marks(&mut self) {
        let core = self.stream.delegate_mut();
        let first = core.flags.take(Flags::FIRST_PACKET);
        let dropped = core.flags.has(Flags::REPORT_DROP) && !core.flags.has(Flags::DROPPING);
        if dropped {
            core.flags.set(Flags::REPORT_DROP, false);
        }
        // How many: every packet dropped since the last report (the service only sees that
        // some were, a sentinel per episode at most).
        let lost = core.stats.packets_dropped - core.dropped_reported;
        if dropped {
            core.dropped_reported = core.stats.packets_dropped;
        }
        let mut packet = TracePacket::from_message(self.stream.root_message());
        if first {
            packet.set_first_packet_on_sequence(true);
        }
        if dropped {
            packet.set_previous_packet_dropped(PREVIOUS_PACKET_DROPPED_SMB_FULL);
            if lost > 0 {
                packet.set_tachyon_packets_dropped(lost);
            }
        }
    }

    /// Makes the stream leave its buffer now (for the reason in `switch`) and writes the 4 bytes
    /// of the fragment header at the start of the next one, which holds at least 4.
    #[cold]
    #[inline(never)]
    fn switch_for_packet(&mut self) {
        self.stream.switch_buffer(FRAGMENT_HEADER_SIZE);
        self.stream.write_bytes(&[0; FRAGMENT_HEADER_SIZE]);
    }

    /// Ends the packet started by the last `new_trace_packet` (the handle's `Drop`).
    #[inline]
    fn finish_packet(&mut self) {
        if self.stream.nesting_depth() != 0 {
            self.close_leaked_messages();
        }
        let end = self.stream.write_ptr();
        let failed = self.stream.error().is_some();
        let core = self.stream.delegate_mut();
        core.in_packet = false;
        if failed && !core.flags.has(Flags::BROKEN) {
            core.break_writer();
        } else if !core.flags.has(Flags::DROPPING) && !core.flags.has(Flags::BROKEN) {
            core.close_fragment(end);
            core.data_end = end;
            // Inflate: a service scraping the chunk now sees this packet as finished.
            core.bump_count();
            core.flags.set(Flags::INFLATED, true);
        }
        if core.patches.has_outstanding() {
            core.commit_ready_patches();
        }
        self.flush_if_requested();
    }

    /// Nested messages of the packet were leaked (`mem::forget`) instead of dropped: pop them
    /// with a zero size, so the next packet starts at nesting depth 0 and their patch slots (if
    /// any) become ready.
    #[cold]
    fn close_leaked_messages(&mut self) {
        let written = self.stream.written();
        self.stream.end_nested(1, written);
    }

    /// Hands the current chunk back, even if only partly filled, and commits it with every ready
    /// patch. The next packet takes a new chunk. Cheap when there is nothing to flush.
    pub fn flush(&mut self) {
        let core = self.stream.delegate_mut();
        core.flush_seen = core.arbiter.flush_generation();
        if core.cur.is_some() && !core.flags.has(Flags::BROKEN) {
            core.in_packet = false;
            core.switch = Switch::Park;
            // The delegate hands the chunk back and parks the stream on an empty range.
            self.stream.switch_buffer(0);
            self.stream.delegate_mut().switch = Switch::NewPacket;
        }
        self.stream.delegate_mut().commit_ready_patches();
    }

    /// [`flush`](Self::flush)es if a flush was requested since the last one: at the end of
    /// every packet, and from the SDK's drainer for a thread that writes none.
    #[inline]
    pub(crate) fn flush_if_requested(&mut self) {
        let core = self.stream.delegate();
        if core.arbiter.flush_generation() != core.flush_seen {
            self.flush();
        }
    }

    /// The writer id (packet sequence within the producer), 1..=32767.
    pub fn writer_id(&self) -> u16 {
        self.stream.delegate().writer_id
    }

    /// The central buffer this writer targets.
    pub fn target_buffer(&self) -> u16 {
        self.stream.delegate().target_buffer
    }

    /// The buffer-exhaustion policy.
    pub fn policy(&self) -> BufferExhaustedPolicy {
        self.stream.delegate().policy
    }

    /// The counters.
    pub fn stats(&self) -> WriterStats {
        self.stream.delegate().stats
    }

    /// Packets that did not reach the buffer, exactly (`stats().packets_dropped`).
    pub fn packets_dropped(&self) -> u64 {
        self.stream.delegate().stats.packets_dropped
    }

    /// Whether the writer is currently dropping packets (the buffer was exhausted).
    pub fn is_dropping(&self) -> bool {
        let core = self.stream.delegate();
        core.flags.has(Flags::DROPPING) || core.flags.has(Flags::BROKEN)
    }

    /// Whether a protozero error made the writer drop everything from now on (see the module
    /// docs). A new writer starts afresh.
    pub fn is_broken(&self) -> bool {
        self.stream.delegate().flags.has(Flags::BROKEN)
    }

    /// The arbiter this writer belongs to.
    pub fn arbiter(&self) -> &Arc<SmbArbiter> {
        &self.stream.delegate().arbiter
    }

    /// Writes one packet with `f` and finishes it: `new_trace_packet` in one call.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # let smb = Arc::new(tachyon::backend::OwnedSmb::new(16 * 1024, tachyon::backend::PageSize::Kib4)?);
    /// # let (sink, _commits) = tachyon::backend::commit_channel();
    /// # // SAFETY: nothing scrapes the buffer.
    /// # let arbiter = unsafe { tachyon::backend::SmbArbiter::new(smb, Default::default(), sink) };
    /// # let mut writer = arbiter.create_trace_writer(0)?;
    /// writer.write_packet(|packet| {
    ///     packet.set_timestamp(1_000);
    ///     let mut event = packet.set_track_event();
    ///     event.set_type(tachyon_protos::track_event::Type::Instant);
    ///     event.set_name_iid(1);
    /// });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn write_packet<R>(&mut self, f: impl FnOnce(&mut TracePacket<'_>) -> R) -> R {
        let mut handle = self.new_trace_packet();
        let mut packet = handle.packet();
        f(&mut packet)
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        self.flush();
        let core = self.stream.delegate();
        core.arbiter
            .release_writer_id(core.writer_id, core.next_chunk_id);
    }
}

// === TracePacketHandle ===

/// A packet being written; dropping it finishes the packet (back-fills its size, counts it).
///
/// Get the generated writer with [`packet`](Self::packet) or a raw protozero [`Message`] with
/// [`message`](Self::message); both append to the same packet and may be called several times.
pub struct TracePacketHandle<'a> {
    writer: &'a mut TraceWriter,
}

impl fmt::Debug for TracePacketHandle<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TracePacketHandle")
            .field("writer_id", &self.writer.writer_id())
            .field("dropped", &self.is_dropped())
            .finish()
    }
}

impl TracePacketHandle<'_> {
    /// The packet as the generated `TracePacket` writer.
    #[inline(always)]
    pub fn packet(&mut self) -> TracePacket<'_> {
        TracePacket::from_message(self.writer.stream.root_message())
    }

    /// The packet as a raw protozero message (fields by number).
    #[inline(always)]
    pub fn message(&mut self) -> Message<'_> {
        self.writer.stream.root_message()
    }

    /// Whether this packet is being dropped (the buffer is exhausted): callers may skip
    /// expensive work. Its writes are accepted and thrown away.
    pub fn is_dropped(&self) -> bool {
        self.writer.is_dropping()
    }

    /// Finishes the packet (same as dropping the handle).
    pub fn finish(self) {}
}

impl Drop for TracePacketHandle<'_> {
    #[inline]
    fn drop(&mut self) {
        self.writer.finish_packet();
    }
}

#[cfg(test)]
mod varint_tests {
    use super::varint3_le;

    #[test]
    fn varint3_le_is_protobufs_varint() {
        for v in [0, 1, 127, 128, 300, 16_383, 16_384, 1 << 20, (1 << 21) - 1] {
            let mut want = [0u8; 10];
            let n = protozero::wire::encode_varint(v, &mut want);
            let (word, len) = varint3_le(v);
            assert_eq!(len, n, "{v}");
            assert_eq!(&word.to_le_bytes()[..len], &want[..n], "{v}");
            assert_eq!(word >> (8 * len), 0, "{v}");
        }
    }
}

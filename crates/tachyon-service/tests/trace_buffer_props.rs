//! Property tests of the central buffer: random packet sizes, chunk sizes, buffer sizes and
//! policies, several writers interleaved, writer drops, patches arriving late or never, reads
//! in the middle (streaming) and at the end. Every packet read must equal the packet written,
//! in order per sequence, and packets written = packets read + packets counted lost, exactly.

use std::collections::HashMap;

use proptest::prelude::*;
use tachyon_abi::{decode_fragment_header, Patch};
use tachyon_service::{
    ChunkToCopy, FillPolicy, TraceBuffer, CHUNK_NEEDS_PATCHING,
    FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK, LAST_PACKET_CONTINUES_ON_NEXT_CHUNK,
    PACKET_SIZE_DROP_PACKET,
};

/// A chunk as a writer would commit it, with the patch it still owes.
#[derive(Clone, Debug)]
struct BuiltChunk {
    writer: u16,
    chunk_id: u32,
    num_fragments: u16,
    flags: u8,
    payload: Vec<u8>,
    /// (offset, real bytes) zeroed in `payload` until the patch arrives.
    patch: Option<(u32, [u8; 4])>,
}

/// What one writer does: the packets it writes (8-byte index prefix, then filler) and which
/// ones it drops.
#[derive(Clone, Debug)]
struct WriterPlan {
    sizes: Vec<usize>,
    drops: Vec<bool>,
    chunk_size: usize,
    patch_every: usize,
}

fn packet_bytes(writer: u16, index: usize, size: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(size);
    p.extend_from_slice(&(index as u32).to_le_bytes());
    p.extend_from_slice(&(writer as u32).to_le_bytes());
    while p.len() < size {
        p.push((p.len() as u8).wrapping_mul(31).wrapping_add(index as u8));
    }
    p.truncate(size.max(8));
    p
}

/// Splits a writer's packets into chunks the way the TraceWriter does: 4-byte fragment
/// headers, packets fragmented across chunks with the continuation flags, a dropped packet
/// marked with the sentinel (ending its chunk). Returns the chunks and the packets that count
/// as written (all of them, dropped ones included: they are written and then lost).
fn build_chunks(writer: u16, plan: &WriterPlan) -> (Vec<BuiltChunk>, Vec<Vec<u8>>) {
    let mut chunks = Vec::new();
    let mut written = Vec::new();
    let mut cur = BuiltChunk {
        writer,
        chunk_id: 0,
        num_fragments: 0,
        flags: 0,
        payload: Vec::new(),
        patch: None,
    };
    let cap = plan.chunk_size;
    let mut next_id = 0u32;
    let close = |cur: &mut BuiltChunk, chunks: &mut Vec<BuiltChunk>, next_id: &mut u32| {
        let mut done = std::mem::replace(
            cur,
            BuiltChunk {
                writer,
                chunk_id: *next_id + 1,
                num_fragments: 0,
                flags: 0,
                payload: Vec::new(),
                patch: None,
            },
        );
        done.chunk_id = *next_id;
        *next_id += 1;
        done.payload.resize(cap, 0);
        chunks.push(done);
    };
    for (i, (&size, &drop)) in plan.sizes.iter().zip(&plan.drops).enumerate() {
        let packet = packet_bytes(writer, i, size);
        written.push(packet.clone());
        // Room for a header and at least one byte, else start a new chunk.
        if cap - cur.payload.len() < 5 {
            close(&mut cur, &mut chunks, &mut next_id);
        }
        if drop {
            cur.payload
                .extend_from_slice(&protozero::wire::redundant_varint(PACKET_SIZE_DROP_PACKET));
            cur.num_fragments += 1;
            close(&mut cur, &mut chunks, &mut next_id);
            continue;
        }
        let mut rest: &[u8] = &packet;
        loop {
            let room = cap - cur.payload.len() - 4;
            let n = room.min(rest.len());
            let start = cur.payload.len() + 4;
            cur.payload
                .extend_from_slice(&protozero::wire::redundant_varint(n as u32));
            cur.payload.extend_from_slice(&rest[..n]);
            cur.num_fragments += 1;
            // Only a fragment that continues in the next chunk can owe a patch (the sizes of
            // its open nested messages): it is always the chunk's last.
            let continues = n < rest.len();
            if plan.patch_every > 0
                && i % plan.patch_every == 0
                && continues
                && n >= 4
                && cur.patch.is_none()
            {
                let mut real = [0u8; 4];
                real.copy_from_slice(&cur.payload[start..start + 4]);
                cur.payload[start..start + 4].fill(0);
                cur.patch = Some((start as u32, real));
                cur.flags |= CHUNK_NEEDS_PATCHING;
            }
            rest = &rest[n..];
            if rest.is_empty() {
                break;
            }
            cur.flags |= LAST_PACKET_CONTINUES_ON_NEXT_CHUNK;
            close(&mut cur, &mut chunks, &mut next_id);
            cur.flags |= FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK;
        }
    }
    if cur.num_fragments > 0 {
        close(&mut cur, &mut chunks, &mut next_id);
    }
    (chunks, written)
}

/// The chunk as the service would see it while the writer is still in it: `finished`
/// fragments done, the next one open (counted, as the writer counts a packet when it starts it),
/// nothing after it written yet; only the "continues from previous" flag set so far.
fn scrape(c: &BuiltChunk, finished: usize) -> BuiltChunk {
    let mut end = 0;
    for _ in 0..finished {
        // Every fragment header the builder writes is a 4-byte redundant varint.
        end += 4 + decode_fragment_header(&c.payload[end..], end).unwrap().0 as usize;
    }
    let mut payload = vec![0u8; c.payload.len()];
    payload[..end].copy_from_slice(&c.payload[..end]);
    BuiltChunk {
        writer: c.writer,
        chunk_id: c.chunk_id,
        num_fragments: finished as u16 + 1,
        flags: c.flags & FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK,
        payload,
        patch: None,
    }
}

fn plan() -> impl Strategy<Value = WriterPlan> {
    let size = prop_oneof![
        6 => 8usize..200,
        3 => 200usize..5000,
        1 => 5000usize..65536,
    ];
    (
        proptest::collection::vec((size, proptest::bool::weighted(0.03)), 1..60),
        prop::sample::select(vec![64usize, 100, 292, 584, 1020, 2044, 4088]),
        prop::sample::select(vec![0usize, 0, 3, 7]),
    )
        .prop_map(|(packets, chunk_size, patch_every)| WriterPlan {
            sizes: packets.iter().map(|p| p.0).collect(),
            drops: packets.iter().map(|p| p.1).collect(),
            chunk_size,
            patch_every,
        })
}

/// One step of the schedule.
#[derive(Clone, Debug)]
enum Step {
    /// Commit the next chunk of writer `w % writers`.
    Commit(usize),
    /// Deliver the oldest owed patch, if any.
    Patch,
    /// A streaming read.
    Read,
    /// The service scrapes writer `w`'s chunk in progress (its next chunk, with only some of its
    /// fragments finished); the real commit comes later. With `ahead`, the writer has already
    /// taken the chunk after it too (as a writer does before handing back a chunk whose last
    /// packet continues), and that one is scraped with its first `k` fragments as well.
    Scrape(usize, usize, bool),
    /// A step of a streaming read-out: at most `n % 4 + 1` chunks
    /// (`TraceBuffer::read_some_packets`), going on from where the previous step stopped.
    ReadSome(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => any::<usize>().prop_map(Step::Commit),
        3 => Just(Step::Patch),
        1 => Just(Step::Read),
        2 => any::<usize>().prop_map(Step::ReadSome),
        2 => (any::<usize>(), any::<usize>(), any::<bool>())
            .prop_map(|(w, k, ahead)| Step::Scrape(w, k, ahead)),
    ]
}

fn run(
    plans: Vec<WriterPlan>,
    schedule: Vec<Step>,
    buffer_size: usize,
    policy: FillPolicy,
    deliver_all_patches: bool,
) -> Result<(), TestCaseError> {
    let mut buf = TraceBuffer::new(buffer_size, policy);
    let mut chunks = Vec::new();
    let mut written = Vec::new();
    for (w, p) in plans.iter().enumerate() {
        let (c, wr) = build_chunks(w as u16 + 1, p);
        chunks.push(std::collections::VecDeque::from(c));
        written.push(wr);
    }
    let mut owed: std::collections::VecDeque<(u16, u32, u32, [u8; 4])> = Default::default();
    // Per writer: each packet read, with its previous_packet_dropped bits.
    let mut read: HashMap<u16, Vec<(Vec<u8>, u32)>> = HashMap::new();
    let mut sink = |info: tachyon_service::PacketInfo, frags: &[&[u8]]| {
        read.entry(info.writer)
            .or_default()
            .push((frags.concat(), info.previous_packet_dropped));
    };
    let commit =
        |buf: &mut TraceBuffer, c: BuiltChunk, owed: &mut std::collections::VecDeque<_>| {
            copy(buf, &c, true);
            if let Some((off, data)) = c.patch {
                owed.push_back((c.writer, c.chunk_id, off, data));
            }
        };
    for s in schedule {
        match s {
            Step::Commit(w) => {
                let w = w % chunks.len();
                if let Some(c) = chunks[w].pop_front() {
                    commit(&mut buf, c, &mut owed);
                }
            }
            Step::Patch => {
                if let Some((w, id, off, data)) = owed.pop_front() {
                    buf.try_patch_chunk(1, w, id, &[Patch { offset: off, data }], false);
                }
            }
            Step::Read => buf.read_packets(false, &mut sink),
            Step::ReadSome(n) => {
                buf.read_some_packets(n % 4 + 1, &mut sink);
            }
            Step::Scrape(w, k, ahead) => {
                let w = w % chunks.len();
                let take = if ahead { 2 } else { 1 };
                for c in chunks[w].iter().take(take) {
                    // A chunk waiting for patches is one the writer has finished with: it is
                    // never scraped mid-write.
                    if c.patch.is_none() && c.num_fragments > 0 {
                        copy(&mut buf, &scrape(c, k % c.num_fragments as usize), false);
                    }
                }
            }
        }
    }
    // The rest of every writer's chunks, then (maybe) the patches, then the final read.
    for q in &mut chunks {
        while let Some(c) = q.pop_front() {
            commit(&mut buf, c, &mut owed);
        }
    }
    if deliver_all_patches {
        while let Some((w, id, off, data)) = owed.pop_front() {
            buf.try_patch_chunk(1, w, id, &[Patch { offset: off, data }], false);
        }
    }
    buf.read_packets(true, &mut sink);
    let trailing: Vec<u16> = buf
        .take_trailing_losses()
        .iter()
        .map(|info| {
            assert_ne!(info.previous_packet_dropped, 0);
            info.writer
        })
        .collect();

    let mut total_written = 0u64;
    let mut total_read = 0u64;
    for (w, wr) in written.iter().enumerate() {
        let got = read.remove(&(w as u16 + 1)).unwrap_or_default();
        total_written += wr.len() as u64;
        total_read += got.len() as u64;
        // In order, each equal to the packet written with its index.
        let mut last_index = None;
        for (p, dropped) in &got {
            prop_assert!(p.len() >= 8, "a packet shorter than its prefix");
            let index = u32::from_le_bytes(p[..4].try_into().unwrap()) as usize;
            let writer = u32::from_le_bytes(p[4..8].try_into().unwrap());
            prop_assert_eq!(writer, w as u32 + 1);
            prop_assert!(index < wr.len());
            prop_assert!(
                last_index.is_none_or(|l| index > l),
                "out of order or duplicated"
            );
            // Every loss is said: a packet read after lost ones carries the loss bits (the
            // writer's own drops included, which it marks in the chunk).
            let expected_next = last_index.map_or(0, |l| l + 1);
            if index > expected_next {
                prop_assert!(
                    *dropped != 0,
                    "packets {}..{} of writer {} lost without a mark",
                    expected_next,
                    index,
                    w + 1
                );
            }
            prop_assert!(
                p == &wr[index],
                "packet {} of writer {} differs",
                index,
                w + 1
            );
            prop_assert!(!plans[w].drops[index], "a dropped packet was read");
            last_index = Some(index);
        }
        // A loss after the last packet read is still reported: by the trailing marker.
        let lost_at_end = match last_index {
            Some(l) => l + 1 < wr.len(),
            None => !wr.is_empty(),
        };
        if lost_at_end {
            prop_assert!(
                trailing.contains(&(w as u16 + 1)),
                "writer {} lost its last packets without a mark",
                w + 1
            );
        }
    }
    prop_assert!(read.is_empty(), "packets from an unknown writer");
    let losses = *buf.losses();
    prop_assert_eq!(
        total_written,
        total_read + losses.total(),
        "written {} read {} lost {:?} stats {:?}",
        total_written,
        total_read,
        losses,
        buf.stats()
    );
    if deliver_all_patches
        && policy == FillPolicy::RingBuffer
        && buf.stats().chunks_overwritten == 0
    {
        // Nothing overwritten and every patch delivered: only writer drops are lost.
        prop_assert_eq!(
            losses.total(),
            losses.writer_dropped,
            "{:?} {:?}",
            losses,
            buf.stats()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn ring_buffer_accounts_for_every_packet(
        plans in proptest::collection::vec(plan(), 1..5),
        schedule in proptest::collection::vec(step(), 0..200),
        buffer_kb in prop::sample::select(vec![4usize, 8, 32, 256, 4096]),
        patches in any::<bool>(),
    ) {
        run(plans, schedule, buffer_kb * 1024, FillPolicy::RingBuffer, patches)?;
    }

    #[test]
    fn discard_accounts_for_every_packet(
        plans in proptest::collection::vec(plan(), 1..5),
        schedule in proptest::collection::vec(step(), 0..200),
        buffer_kb in prop::sample::select(vec![4usize, 8, 32, 256, 4096]),
        patches in any::<bool>(),
    ) {
        run(plans, schedule, buffer_kb * 1024, FillPolicy::Discard, patches)?;
    }
}

#[test]
fn nothing_lost_when_the_buffer_is_big_enough() {
    let plans = [
        WriterPlan {
            sizes: vec![10, 5000, 30, 70000],
            drops: vec![false; 4],
            chunk_size: 292,
            patch_every: 2,
        },
        WriterPlan {
            sizes: vec![100; 50],
            drops: vec![false; 50],
            chunk_size: 4088,
            patch_every: 0,
        },
    ];
    let mut buf = TraceBuffer::new(1 << 20, FillPolicy::RingBuffer);
    let mut expected = 0;
    for (w, p) in plans.iter().enumerate() {
        let (chunks, written) = build_chunks(w as u16 + 1, p);
        expected += written.len();
        for c in chunks {
            copy(&mut buf, &c, true);
            if let Some((off, data)) = c.patch {
                assert!(buf.try_patch_chunk(
                    1,
                    c.writer,
                    c.chunk_id,
                    &[Patch { offset: off, data }],
                    false
                ));
            }
        }
    }
    let mut n = 0;
    let mut first_flags = HashMap::new();
    buf.read_packets(true, |info, _| {
        n += 1;
        first_flags
            .entry(info.writer)
            .or_insert(info.previous_packet_dropped);
    });
    assert_eq!(n, expected);
    assert_eq!(buf.losses().total(), 0);
    // The first packet of each sequence says "something may have come before".
    assert!(first_flags.values().all(|&f| f == 1));
    assert!(buf.stats().readaheads_succeeded > 0);
}

/// The zero-length filler a writer appends after an inflated packet count is not a packet: when
/// its chunk is overwritten or refused, it is not counted lost (regression: it was).
#[test]
fn filler_fragments_are_not_counted_as_lost_packets() {
    // Two packets and the filler byte.
    let mut payload = vec![2, 0x08, 0x01, 2, 0x08, 0x02, 0];
    payload.resize(4000, 0);
    for policy in [FillPolicy::RingBuffer, FillPolicy::Discard] {
        let mut buf = TraceBuffer::new(4096, policy);
        for id in 0..3 {
            buf.copy_chunk(&ChunkToCopy {
                producer: 1,
                writer: 1,
                chunk_id: id,
                num_fragments: 3,
                flags: 0,
                payload: &payload,
                complete: true,
            });
        }
        let mut read = 0;
        buf.read_packets(true, |_, _| read += 1);
        // 3 chunks of 2 packets each; one 4 KiB buffer holds one chunk at a time.
        assert_eq!(
            read + buf.losses().total(),
            6,
            "{policy:?}: {:?}",
            buf.losses()
        );
        assert_eq!(read, 2);
    }
}

/// A chunk read up to its last fragment (held back for patches that never come) and then
/// overwritten: only its unread rest is walked for the filler, which is not a packet.
#[test]
fn a_partly_read_chunk_overwritten_counts_only_its_unread_packets() {
    let chunk = |id, payload: &[u8], fragments, flags| {
        let mut p = payload.to_vec();
        p.resize(4000, 0);
        (id, p, fragments, flags)
    };
    // Two packets and the filler byte; the last fragment awaits patches.
    let cases = [
        (
            chunk(
                0,
                &[2, 0x08, 0x01, 2, 0x08, 0x02, 0],
                3,
                CHUNK_NEEDS_PATCHING,
            ),
            0,
        ),
        // Two packets and a third one, not a filler: that one is lost.
        (
            chunk(
                0,
                &[2, 0x08, 0x01, 2, 0x08, 0x02, 2, 0x08, 0x03],
                3,
                CHUNK_NEEDS_PATCHING,
            ),
            1,
        ),
    ];
    for ((id, payload, fragments, flags), lost) in cases {
        let mut buf = TraceBuffer::new(4096, FillPolicy::RingBuffer);
        buf.copy_chunk(&ChunkToCopy {
            producer: 1,
            writer: 1,
            chunk_id: id,
            num_fragments: fragments,
            flags,
            payload: &payload,
            complete: true,
        });
        let mut read = 0;
        buf.read_packets(false, |_, _| read += 1);
        assert_eq!(read, 2);
        // The next chunk of another writer takes the whole ring.
        buf.copy_chunk(&ChunkToCopy {
            producer: 1,
            writer: 2,
            chunk_id: 0,
            num_fragments: 0,
            flags: 0,
            payload: &[0; 4000],
            complete: true,
        });
        assert_eq!(buf.stats().chunks_overwritten, 1);
        assert_eq!(buf.losses().total(), lost, "{:?}", buf.losses());
    }
}

/// A writer's chunks where the first one's last packet continues in the next one, with patches
/// owed for it (the sizes of its open nested messages), all committed into a fresh buffer.
fn patched_chunks_committed() -> (Vec<BuiltChunk>, TraceBuffer) {
    let plan = WriterPlan {
        sizes: vec![40, 40, 300, 40],
        drops: vec![false; 4],
        chunk_size: 200,
        patch_every: 2,
    };
    let (chunks, _) = build_chunks(1, &plan);
    assert_eq!(chunks[0].num_fragments, 3);
    assert!(chunks[0].patch.is_some() && chunks[0].flags & CHUNK_NEEDS_PATCHING != 0);
    assert!(chunks[1..].iter().all(|c| c.patch.is_none()));
    let mut buf = TraceBuffer::new(1 << 16, FillPolicy::RingBuffer);
    for c in &chunks {
        copy(&mut buf, c, true);
    }
    (chunks, buf)
}

/// `c` as producer 1's chunk, finished (`complete`) or not.
fn as_copy(c: &BuiltChunk, complete: bool) -> ChunkToCopy<'_> {
    ChunkToCopy {
        producer: 1,
        writer: c.writer,
        chunk_id: c.chunk_id,
        num_fragments: c.num_fragments,
        flags: c.flags,
        payload: &c.payload,
        complete,
    }
}

/// Copies `c` into the buffer as producer 1's: a real commit (`complete`) or a scrape.
fn copy(buf: &mut TraceBuffer, c: &BuiltChunk, complete: bool) {
    buf.copy_chunk(&as_copy(c, complete));
}

/// Copies `c` into the buffer as producer 1's, scraped (`complete`: in the Complete state).
fn copy_scraped(buf: &mut TraceBuffer, c: &BuiltChunk, complete: bool) {
    buf.copy_scraped_chunk(&as_copy(c, complete));
}

/// Packets read, as (index, previous_packet_dropped).
fn read_indices(buf: &mut TraceBuffer, last: bool) -> Vec<(u32, u32)> {
    let mut got = Vec::new();
    buf.read_packets(last, |info, frags| {
        let p = frags.concat();
        got.push((
            u32::from_le_bytes(p[..4].try_into().unwrap()),
            info.previous_packet_dropped,
        ));
    });
    got
}

/// Only a chunk's last fragment can owe patches: the packets before it are read at once, and
/// when the patches never come (the producer died) only that packet is lost, not the chunk
/// (regression: the whole chunk was dropped at the final read).
#[test]
fn a_chunk_waiting_for_patches_holds_back_only_its_last_packet() {
    let (_, mut buf) = patched_chunks_committed();
    assert_eq!(read_indices(&mut buf, false), vec![(0, 1), (1, 0)]);
    // The final read: the packet whose sizes were never patched is lost, and said so; the
    // continuation in the next chunk has lost its beginning; the packet after it is intact.
    let rest = read_indices(&mut buf, true);
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(rest[0].0, 3);
    assert_ne!(rest[0].1 & 4, 0, "CHUNK_CORRUPTED in {:#x}", rest[0].1);
    assert_eq!(buf.losses().corrupted, 1);
    assert_eq!(buf.losses().total(), 1);
}

/// The same with the patches delivered: nothing lost, the spanning packet whole.
#[test]
fn a_patched_chunk_releases_its_last_packet() {
    let (chunks, mut buf) = patched_chunks_committed();
    assert_eq!(read_indices(&mut buf, false).len(), 2);
    let (off, data) = chunks[0].patch.unwrap();
    assert!(buf.try_patch_chunk(1, 1, 0, &[Patch { offset: off, data }], false));
    let rest = read_indices(&mut buf, true);
    assert_eq!(rest, vec![(2, 0), (3, 0)]);
    assert_eq!(buf.losses().total(), 0);
}

/// A writer takes its next chunk before it hands back the one whose last packet continues in
/// it, so a scrape can find both mid-write. Reading must wait for the first one's real commit,
/// not move past it because the next one exists (regression: it did, the real commit was then
/// refused as late and the packet spanning the two was lost).
#[test]
fn a_scraped_chunk_is_not_passed_because_its_successor_was_scraped() {
    let plan = WriterPlan {
        sizes: vec![40, 40, 300, 40, 40],
        drops: vec![false; 5],
        chunk_size: 200,
        patch_every: 0,
    };
    let (chunks, written) = build_chunks(1, &plan);
    let mut buf = TraceBuffer::new(1 << 16, FillPolicy::RingBuffer);
    for (c, finished) in [(&chunks[0], 2), (&chunks[1], 1)] {
        copy(&mut buf, &scrape(c, finished), false);
    }
    // Streaming reads meanwhile: only what was finished in the first chunk.
    assert_eq!(read_indices(&mut buf, false), vec![(0, 1), (1, 0)]);
    assert!(read_indices(&mut buf, false).is_empty());
    for c in &chunks {
        copy(&mut buf, c, true);
    }
    let rest = read_indices(&mut buf, true);
    let indices: Vec<u32> = rest.iter().map(|r| r.0).collect();
    assert_eq!(indices, (2..written.len() as u32).collect::<Vec<_>>());
    assert!(rest.iter().all(|r| r.1 == 0), "{rest:?}");
    assert_eq!(buf.losses().total(), 0);
}

/// A scrape copies chunks one at a time while the writer goes on: it can copy a chunk
/// mid-write and then the writer's next chunk already finished (Complete, its commit not yet
/// sent). That finished successor proves nothing about the first chunk's last packets, which
/// arrive with its real commit (regression: reading moved past the first chunk, whose commit
/// was then refused as late, and its packets after the scrape were lost).
#[test]
fn a_scraped_chunk_is_not_passed_because_its_successor_was_scraped_complete() {
    let plan = WriterPlan {
        sizes: vec![40, 40, 40, 40, 40, 40],
        drops: vec![false; 6],
        chunk_size: 200,
        patch_every: 0,
    };
    let (chunks, written) = build_chunks(1, &plan);
    assert!(chunks.len() >= 2);
    let mut buf = TraceBuffer::new(1 << 16, FillPolicy::RingBuffer);
    copy(&mut buf, &scrape(&chunks[0], 1), false);
    copy_scraped(&mut buf, &chunks[1], true);
    // Streaming reads meanwhile: only what was finished in the first chunk when scraped.
    assert_eq!(read_indices(&mut buf, false), vec![(0, 1)]);
    assert!(read_indices(&mut buf, false).is_empty());
    // The first chunk's real commit: the scraped finished second one follows and is read.
    copy(&mut buf, &chunks[0], true);
    let mut rest = read_indices(&mut buf, false);
    // Then the second's commit (commits arrive in order): what was read of it is not read
    // again, nor refused as late and counted lost.
    for c in &chunks[1..] {
        copy(&mut buf, c, true);
    }
    rest.extend(read_indices(&mut buf, true));
    let indices: Vec<u32> = rest.iter().map(|r| r.0).collect();
    assert_eq!(indices, (1..written.len() as u32).collect::<Vec<_>>());
    assert!(rest.iter().all(|r| r.1 == 0), "{rest:?}");
    assert_eq!(buf.losses().total(), 0);
    assert_eq!(buf.stats().chunks_discarded, 0);
}

/// The same race with nothing scraped of the chunk passed over (it had no finished packet
/// yet): the finished next chunk must not be read across the gap while its predecessor's
/// commit may be on its way; a gap is a loss only once a commit (or the end) says so.
#[test]
fn a_gap_before_a_scraped_chunk_is_not_crossed_while_streaming() {
    let plan = WriterPlan {
        sizes: vec![40; 16],
        drops: vec![false; 16],
        chunk_size: 200,
        patch_every: 0,
    };
    let (chunks, written) = build_chunks(1, &plan);
    assert!(chunks.len() >= 3);
    let mut buf = TraceBuffer::new(1 << 16, FillPolicy::RingBuffer);
    copy(&mut buf, &chunks[0], true);
    let first = read_indices(&mut buf, false);
    assert!(!first.is_empty());
    // Chunk 1 passed over by the scrape, chunk 2 scraped finished.
    copy_scraped(&mut buf, &chunks[2], true);
    assert!(read_indices(&mut buf, false).is_empty());
    for c in &chunks[1..] {
        copy(&mut buf, c, true);
    }
    let rest = read_indices(&mut buf, true);
    let all: Vec<u32> = first.iter().chain(&rest).map(|r| r.0).collect();
    assert_eq!(all, (0..written.len() as u32).collect::<Vec<_>>());
    assert!(rest.iter().all(|r| r.1 == 0), "{rest:?}");
    assert_eq!(buf.losses().total(), 0);
    assert_eq!(buf.stats().chunks_discarded, 0);

    // A producer gone after its last scrape: its scraped chunk is read across the gap, which
    // is a loss then.
    let mut buf = TraceBuffer::new(1 << 16, FillPolicy::RingBuffer);
    copy(&mut buf, &chunks[0], true);
    read_indices(&mut buf, false);
    copy_scraped(&mut buf, &chunks[2], true);
    buf.producer_gone(1);
    let rest = read_indices(&mut buf, false);
    assert!(!rest.is_empty());
    assert_ne!(rest[0].1, 0, "the gap is reported: {rest:?}");
}

/// A hostile producer's chunk with no fragments that still claims its last packet goes on (or
/// awaits patches) has nothing to hold back: every read is empty, and nothing panics (found
/// by the `trace_buffer` fuzz target, as a scrape and as a commit, at the final read).
#[test]
fn an_empty_chunk_claiming_a_continuation_reads_as_nothing() {
    for flags in [2u8, 4, 6] {
        for scraped in [false, true] {
            let mut buf = TraceBuffer::new(4096, FillPolicy::RingBuffer);
            let chunk = ChunkToCopy {
                producer: 1,
                writer: 3,
                chunk_id: 0,
                num_fragments: 0,
                flags,
                payload: &[],
                complete: true,
            };
            if scraped {
                buf.copy_scraped_chunk(&chunk);
            } else {
                buf.copy_chunk(&chunk);
            }
            let mut read = 0;
            buf.read_packets(false, |_, _| read += 1);
            buf.read_packets(true, |_, _| read += 1);
            assert_eq!(read, 0, "flags {flags}, scraped {scraped}");
        }
    }
}

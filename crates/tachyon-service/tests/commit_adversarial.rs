//! The commit path against a hostile producer: random shared memory contents, lying commits,
//! and a thread that scribbles over the SMB while the service copies out of it. The service must
//! never panic, must count what it refused, and must still deliver what an honest producer
//! commits.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use tachyon_abi::{
    encode_fragment_header, ChunkHeader, ChunkToMove, ChunkToPatch, CommitRequest, OwnedSmb,
    PageLayout, PageSize, Patch,
};
use tachyon_service::{apply_commit, scrape, CommitStats, FillPolicy, ProducerState, TraceBuffer};

fn buffers() -> Vec<TraceBuffer> {
    vec![
        TraceBuffer::new(64 * 1024, FillPolicy::RingBuffer),
        TraceBuffer::new(64 * 1024, FillPolicy::Discard),
    ]
}

/// Writes `packets` into one chunk the honest way and returns its place.
fn honest_chunk(smb: &OwnedSmb, writer: u16, chunk_id: u32, packets: &[&[u8]]) -> ChunkToMove {
    let abi = smb.producer();
    let mut chunk = (0..abi.num_pages())
        .find_map(|p| {
            abi.try_acquire_any_chunk_for_writing(
                p,
                PageLayout::Div4,
                ChunkHeader::new(writer, chunk_id),
            )
            .ok()
        })
        .expect("a free chunk");
    let mut off = 0;
    for p in packets {
        chunk.increment_packet_count().unwrap();
        let header = encode_fragment_header(p.len() as u32).unwrap();
        chunk.write_payload(off, &header).unwrap();
        chunk.write_payload(off + 4, p).unwrap();
        off += 4 + p.len();
    }
    let (page, idx) = (chunk.page_idx(), chunk.chunk_idx());
    abi.release_chunk_as_complete(chunk).unwrap();
    ChunkToMove {
        page: page as u32,
        chunk: idx as u32,
        target_buffer: 0,
    }
}

fn read_all(buf: &mut TraceBuffer) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    buf.read_packets(true, |_, f| out.push(f.concat()));
    out
}

#[test]
fn honest_commit_is_delivered_and_the_chunk_freed() {
    let smb = OwnedSmb::new(16 * 4096, PageSize::Kib4).unwrap();
    let mut producer = ProducerState::new(1, vec![0]);
    let mut bufs = buffers();
    let mut stats = CommitStats::default();
    let mv = honest_chunk(&smb, 3, 0, &[b"\x08\x01", b"\x08\x02\x10\x03"]);
    let req = CommitRequest {
        chunks_to_move: vec![mv],
        ..Default::default()
    };
    apply_commit(&smb.service(), &mut producer, &req, &mut bufs, &mut stats);
    assert_eq!(stats, CommitStats::default());
    assert_eq!(
        read_all(&mut bufs[0]),
        [b"\x08\x01".to_vec(), b"\x08\x02\x10\x03".to_vec()]
    );
    // The chunk went back to the producer: committing it again is refused and counted.
    apply_commit(&smb.service(), &mut producer, &req, &mut bufs, &mut stats);
    assert_eq!(stats.chunks_discarded, 1);
}

#[test]
fn forbidden_and_missing_buffers_are_refused_but_the_chunk_is_returned() {
    let smb = OwnedSmb::new(4 * 4096, PageSize::Kib4).unwrap();
    let mut producer = ProducerState::new(1, vec![0]);
    let mut bufs = buffers();
    let mut stats = CommitStats::default();
    let mut mv = honest_chunk(&smb, 1, 0, &[b"\x08\x01"]);
    mv.target_buffer = 1; // exists, not allowed
    let mut mv2 = honest_chunk(&smb, 1, 1, &[b"\x08\x02"]);
    mv2.target_buffer = 9; // does not exist
    let req = CommitRequest {
        chunks_to_move: vec![mv, mv2],
        chunks_to_patch: vec![ChunkToPatch {
            target_buffer: 7,
            writer_id: 1,
            chunk_id: 0,
            patches: vec![Patch {
                offset: 0,
                data: [0x81, 0x80, 0x80, 0],
            }],
            has_more_patches: false,
        }],
        flush_request_id: None,
    };
    apply_commit(&smb.service(), &mut producer, &req, &mut bufs, &mut stats);
    assert_eq!(stats.chunks_discarded, 2);
    assert_eq!(stats.patches_discarded, 1);
    assert!(read_all(&mut bufs[0]).is_empty() && read_all(&mut bufs[1]).is_empty());
    // Both chunks are free again: every page can be fully acquired.
    let abi = smb.producer();
    for p in 0..abi.num_pages() {
        assert!(abi.is_page_free(p).unwrap(), "page {p} leaked a chunk");
    }
}

fn lying_request() -> impl Strategy<Value = CommitRequest> {
    let mv = (0u32..40, 0u32..20, 0u16..4).prop_map(|(page, chunk, target_buffer)| ChunkToMove {
        page,
        chunk,
        target_buffer,
    });
    let patch = (
        0u16..4,
        0u16..5,
        0u32..6,
        proptest::collection::vec((0u32..5000, any::<[u8; 4]>()), 0..4),
        any::<bool>(),
    )
        .prop_map(
            |(target_buffer, writer_id, chunk_id, p, has_more_patches)| ChunkToPatch {
                target_buffer,
                writer_id,
                chunk_id,
                patches: p
                    .into_iter()
                    .map(|(offset, data)| Patch { offset, data })
                    .collect(),
                has_more_patches,
            },
        );
    (
        proptest::collection::vec(mv, 0..20),
        proptest::collection::vec(patch, 0..6),
    )
        .prop_map(|(chunks_to_move, chunks_to_patch)| CommitRequest {
            chunks_to_move,
            chunks_to_patch,
            flush_request_id: None,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random SMB words (any states, layouts, headers, lengths) and random commits: no panic.
    #[test]
    fn random_memory_and_lying_commits_never_panic(
        words in proptest::collection::vec(any::<u32>(), 8 * 1024),
        dense_states in any::<bool>(),
        reqs in proptest::collection::vec(lying_request(), 1..4),
    ) {
        let smb = OwnedSmb::new(8 * 4096, PageSize::Kib4).unwrap();
        for (w, v) in smb.words().iter().zip(&words) {
            w.store(*v, Ordering::Relaxed);
        }
        if dense_states {
            // Make most page headers plausible (Div4, all Complete) so the copy path is reached.
            for page in 0..8 {
                smb.words()[page * 1024].store(0x3000_00ff, Ordering::Relaxed);
            }
        }
        let mut producer = ProducerState::new(1, vec![0, 1]);
        let mut bufs = buffers();
        let mut stats = CommitStats::default();
        for req in &reqs {
            apply_commit(&smb.service(), &mut producer, req, &mut bufs, &mut stats);
        }
        scrape(&smb.service(), &mut producer, &mut bufs, &mut stats);
        for b in &mut bufs {
            b.read_packets(true, |_, f| { let _ = f.concat(); });
        }
    }
}

/// A thread flips random words of the SMB (states, headers, payload lengths) while the service
/// copies committed chunks and scrapes. The service only ever counts errors. (What a producer
/// scribbles over its own data before the copy is its own business: content is not checked.)
#[test]
fn concurrent_scribbler_cannot_crash_the_service() {
    let smb = Arc::new(OwnedSmb::new(16 * 4096, PageSize::Kib4).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    // The scribbler's damage is paced by the producer's progress (a few words per round), so a
    // descheduled producer does not come back to an SMB the scribbler has had a whole time
    // slice to wreck: the stores still race with the service's reads, but how much is broken
    // per round does not depend on the machine's load.
    let rounds_done = Arc::new(AtomicU32::new(0));
    let scribbler = {
        let (smb, stop, rounds_done) = (smb.clone(), stop.clone(), rounds_done.clone());
        std::thread::spawn(move || {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut written = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if written >= (u64::from(rounds_done.load(Ordering::Relaxed)) + 1) * 8 {
                    std::thread::yield_now();
                    continue;
                }
                written += 1;
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x as usize >> 8) % smb.words().len();
                smb.words()[i].store((x >> 32) as u32, Ordering::Relaxed);
            }
        })
    };
    let mut producer = ProducerState::new(1, vec![0]);
    let mut bufs = buffers();
    let mut stats = CommitStats::default();
    let packets: Vec<Vec<u8>> = (0..8u8).map(|i| vec![0x08, i + 1]).collect();
    let mut read = 0;
    for round in 0..2000u32 {
        // An honest producer keeps committing; the scribbler breaks some of it.
        let abi = smb.producer();
        let page = (round % 16) as usize;
        if let Ok(mut chunk) = abi.try_acquire_any_chunk_for_writing(
            page,
            PageLayout::Div4,
            ChunkHeader::new(1, round),
        ) {
            let p = &packets[round as usize % 8];
            let ok = chunk.increment_packet_count().is_ok()
                && chunk.write_payload(0, &[p.len() as u8]).is_ok()
                && chunk.write_payload(1, p).is_ok();
            let (pg, ci) = (chunk.page_idx() as u32, chunk.chunk_idx() as u32);
            if ok && abi.release_chunk_as_complete(chunk).is_ok() {
                let req = CommitRequest {
                    chunks_to_move: vec![ChunkToMove {
                        page: pg,
                        chunk: ci,
                        target_buffer: 0,
                    }],
                    ..Default::default()
                };
                apply_commit(&smb.service(), &mut producer, &req, &mut bufs, &mut stats);
            }
        }
        if round % 50 == 0 {
            // The producer lies outright from time to time (a page that does not exist).
            let req = CommitRequest {
                chunks_to_move: vec![ChunkToMove {
                    page: 999,
                    chunk: 0,
                    target_buffer: 0,
                }],
                ..Default::default()
            };
            apply_commit(&smb.service(), &mut producer, &req, &mut bufs, &mut stats);
        }
        if round % 97 == 0 {
            scrape(&smb.service(), &mut producer, &mut bufs, &mut stats);
            bufs[0].read_packets(false, |_, _| read += 1);
        }
        rounds_done.store(round + 1, Ordering::Relaxed);
    }
    stop.store(true, Ordering::Relaxed);
    scribbler.join().unwrap();
    bufs[0].read_packets(true, |_, _| read += 1);
    // Honest commits got through despite the noise, and the lies were counted (the scribbler's
    // damage may or may not be, depending on what it hit and when).
    let s = bufs[0].stats();
    assert!(s.chunks_written > 0 && read > 0);
    assert!(stats.chunks_discarded >= 40);
}

/// Commits take one of two ways into a buffer: a chunk new to its sequence is copied straight
/// from shared memory into the ring; anything else (the sequence's first chunk, a recommit, a
/// chunk older than what the sequence holds, a full `DISCARD` buffer) is copied out first and
/// compared or counted. Through both, in a `DISCARD` buffer that fills up: every packet
/// committed is read or counted lost.
#[test]
fn direct_and_copied_commits_account_for_every_packet() {
    let smb = OwnedSmb::new(16 * 4096, PageSize::Kib4).unwrap();
    let mut producer = ProducerState::new(1, vec![0, 1]);
    // 8 KiB: seven 1 KiB chunks fit (each takes its payload rounded up to 16 bytes).
    let mut bufs = vec![
        TraceBuffer::new(64 * 1024, FillPolicy::RingBuffer),
        TraceBuffer::new(8 * 1024, FillPolicy::Discard),
    ];
    let mut stats = CommitStats::default();
    let packet = [0x08u8; 200];
    let mut committed = 0u64;
    let mut commit = |bufs: &mut Vec<TraceBuffer>, id: u32, stats: &mut CommitStats| {
        let mut mv = honest_chunk(&smb, 5, id, &[&packet, &packet, &packet[..100]]);
        mv.target_buffer = 1;
        let req = CommitRequest {
            chunks_to_move: vec![mv],
            ..Default::default()
        };
        apply_commit(&smb.service(), &mut producer, &req, bufs, stats);
    };
    for id in [0, 1, 2, 4, 3, 5, 6, 7, 8, 9, 10, 11] {
        commit(&mut bufs, id, &mut stats);
        committed += 3;
    }
    assert_eq!(stats, CommitStats::default());
    let mut read = 0u64;
    bufs[1].read_packets(true, |_, f| {
        assert!(f.concat().len() == 200 || f.concat().len() == 100);
        read += 1;
    });
    let b = &bufs[1];
    assert!(b.stats().chunks_discarded > 0, "the buffer filled up");
    assert_eq!(read + b.losses().total(), committed);
    // Chunk 3 came after chunk 4 (counted out of order, stored all the same); what DISCARD
    // refused at the end is counted.
    assert_eq!(b.stats().chunks_committed_out_of_order, 1);
    assert!(b.losses().discarded > 0);
}

//! The writer's exact behaviour, checked on the bytes it leaves in the shared memory buffer and
//! on the commits it sends: fragment headers, count inflation, continuation flags, patches,
//! drops and their marks, policies, flushes, errors.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{check_run, spawn_service, write_test_packet, TestService, Written};
use protozero::ProtoDecoder;
use tachyon::backend::{
    commit_channel, ArbiterConfig, CommitReceiver, CommitRequest, OwnedSmb, PageLayout, PageSize,
    SmbArbiter, TraceWriter, PREVIOUS_PACKET_DROPPED_SMB_FULL,
};
use tachyon::BufferExhaustedPolicy;
use tachyon_abi::{ChunkFlags, Fragment, Fragments, DROP_PACKET_FRAGMENT_HEADER};
use tachyon_protos::TracePacketView;
use tachyon_service::FillPolicy;

struct Setup {
    smb: Arc<OwnedSmb>,
    arbiter: Arc<SmbArbiter>,
    commits: CommitReceiver,
}

fn setup(size: usize, page: PageSize, layout: PageLayout, policy: BufferExhaustedPolicy) -> Setup {
    let smb = Arc::new(OwnedSmb::new(size, page).unwrap());
    let (sink, commits) = commit_channel();
    let config = ArbiterConfig {
        page_layout: Some(layout),
        buffer_exhausted_policy: policy,
    };
    // SAFETY: these tests scrape only from the writer's own thread, between packets.
    let arbiter = unsafe { SmbArbiter::new(Arc::clone(&smb), config, sink) };
    Setup {
        smb,
        arbiter,
        commits,
    }
}

/// `size` bytes of 4 KiB chunks (one per page), the `Drop` policy.
fn setup_4k_chunks(size: usize) -> Setup {
    setup(
        size,
        PageSize::Kib4,
        PageLayout::Div1,
        BufferExhaustedPolicy::Drop,
    )
}

fn drain(commits: &CommitReceiver) -> Vec<CommitRequest> {
    commits.try_iter().collect()
}

/// Copies a committed chunk out (`common::take_chunk`): `(flags, count, payload, chunk_id)`.
fn take_chunk(smb: &OwnedSmb, page: u32, chunk: u32) -> (ChunkFlags, u16, Vec<u8>, u32) {
    let copy = common::take_chunk(smb, page, chunk);
    let h = copy.header();
    (
        h.packets.flags(),
        h.packets.count(),
        copy.payload().to_vec(),
        h.chunk_id,
    )
}

fn fragments(payload: &[u8], count: u16) -> Vec<Fragment<'_>> {
    Fragments::new(payload, count)
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

fn timestamp_packet(w: &mut TraceWriter, ts: u64) {
    w.write_packet(|p| p.set_timestamp(ts));
}

#[test]
fn a_packet_is_a_4_byte_header_then_the_packet_and_the_inflated_count_gets_a_filler() {
    let s = setup_4k_chunks(16 * 1024);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    assert_eq!(w.writer_id(), 1);
    timestamp_packet(&mut w, 7);
    timestamp_packet(&mut w, 300);
    w.flush();
    let commits = drain(&s.commits);
    assert_eq!(commits.len(), 1);
    let mv = commits[0].chunks_to_move[0];
    let (flags, count, payload, chunk_id) = take_chunk(&s.smb, mv.page, mv.chunk);
    assert_eq!(chunk_id, 0);
    assert_eq!(flags, ChunkFlags::NONE);
    // Two packets plus the inflated count's empty fragment.
    assert_eq!(count, 3);
    // first_packet_on_sequence (87) = 1, timestamp (8) = 7.
    let first = [0xb8, 0x05, 0x01, 0x40, 0x07];
    assert_eq!(payload[..4], [0x85, 0x80, 0x80, 0x00]);
    assert_eq!(payload[4..9], first);
    assert_eq!(payload[9..13], [0x83, 0x80, 0x80, 0x00]);
    assert_eq!(payload[13..16], [0x40, 0xac, 0x02]);
    assert_eq!(payload[16], 0x00, "filler for the inflated count");
    let f = fragments(&payload, count);
    assert_eq!(
        f,
        [
            Fragment::Data(&first),
            Fragment::Data(&[0x40, 0xac, 0x02]),
            Fragment::Data(&[])
        ]
    );
    let view = TracePacketView::decode(&first).unwrap();
    assert!(view.first_packet_on_sequence());
    assert_eq!(view.timestamp(), 7);
}

#[test]
fn count_inflation_lets_a_scraper_see_finished_packets() {
    let s = setup_4k_chunks(16 * 1024);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    // On the writer's thread, between its stores: no race (the arbiter's contract).
    timestamp_packet(&mut w, 1);
    let page = s.smb.service().num_pages();
    let chunk_page = (0..page)
        .find(|&p| s.smb.producer().page_bitmap(p).unwrap().0 != 0)
        .unwrap();
    let scrape_at = |p: usize| {
        let copy = s.smb.service().scrape_chunk(p, 0).unwrap().unwrap();
        let count = copy.header().packets.count();
        (count, fragments(copy.payload(), count - 1).len())
    };
    // One finished packet: the count is inflated to 2, so a scraper reads 1 packet.
    assert_eq!(scrape_at(chunk_page), (2, 1));
    {
        let mut h = w.new_trace_packet();
        h.packet().set_timestamp(2);
        // An open packet reuses the inflated count: the scraper still reads 1 finished packet.
        assert_eq!(scrape_at(chunk_page), (2, 1));
    }
    assert_eq!(scrape_at(chunk_page), (3, 2));
}

#[test]
fn a_new_chunk_after_1022_packets() {
    let s = setup(
        64 * 1024,
        PageSize::Kib32,
        PageLayout::Div1,
        BufferExhaustedPolicy::Drop,
    );
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    for i in 0..1100 {
        timestamp_packet(&mut w, i + 1);
    }
    w.flush();
    let commits = drain(&s.commits);
    assert_eq!(commits.len(), 2);
    let mv = commits[0].chunks_to_move[0];
    let (_, count, payload, _) = take_chunk(&s.smb, mv.page, mv.chunk);
    // 1022 packets and the filler of the inflated count: the 10-bit count never overflows.
    assert_eq!(count, 1023);
    assert_eq!(fragments(&payload, count).len(), 1023);
    let mv = commits[1].chunks_to_move[0];
    let (_, count, _, chunk_id) = take_chunk(&s.smb, mv.page, mv.chunk);
    assert_eq!(chunk_id, 1);
    assert_eq!(count, 1100 - 1022 + 1);
}

#[test]
fn a_packet_across_chunks_has_continuation_flags_and_its_sizes_travel_as_patches() {
    let s = setup_4k_chunks(64 * 1024);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    timestamp_packet(&mut w, 1);
    let big = vec![0x5a; 10_000];
    {
        let mut h = w.new_trace_packet();
        h.packet().set_timestamp(2);
        let mut m = h.message();
        let mut outer = m.begin_nested(5001);
        outer.append_varint(1, 99);
        let mut inner = outer.begin_nested(2);
        inner.append_bytes(3, &big);
    }
    // The chunks the packet left were committed while it was written, the patches after it.
    let commits = drain(&s.commits);
    assert_eq!(commits.len(), 3, "{commits:#?}");
    let chunk = |c: &CommitRequest| {
        let mv = c.chunks_to_move[0];
        take_chunk(&s.smb, mv.page, mv.chunk)
    };
    let (flags0, count0, payload0, id0) = chunk(&commits[0]);
    assert_eq!(id0, 0);
    assert_eq!(
        flags0,
        ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK.union(ChunkFlags::CHUNK_NEEDS_PATCHING)
    );
    assert_eq!(count0, 2);
    let (flags1, count1, _, id1) = chunk(&commits[1]);
    assert_eq!(id1, 1);
    // The nested size fields all sit in chunk 0: chunk 1 needs no patch.
    assert_eq!(
        flags1,
        ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK
            .union(ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK)
    );
    assert_eq!(count1, 1);
    let patches = &commits[2];
    assert!(patches.chunks_to_move.is_empty());
    assert_eq!(patches.chunks_to_patch.len(), 1);
    let p = &patches.chunks_to_patch[0];
    assert_eq!((p.writer_id, p.chunk_id, p.has_more_patches), (1, 0, false));
    assert_eq!(p.patches.len(), 2, "outer and inner size fields");
    // The patched offsets hold the 80 80 80 00 placeholder in the chunk.
    for patch in &p.patches {
        let at = patch.offset as usize;
        assert_eq!(payload0[at..at + 4], [0x80, 0x80, 0x80, 0x00]);
    }
    w.flush();
    let last = drain(&s.commits);
    let (flags2, count2, payload2, id2) = chunk(&last[0]);
    assert_eq!(id2, 2);
    assert_eq!(flags2, ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK);
    assert_eq!(count2, 2);
    assert_eq!(
        *fragments(&payload2, count2).last().unwrap(),
        Fragment::Data(&[])
    );
}

#[test]
fn a_small_packet_cut_by_the_chunk_end_is_carried_whole_into_the_next_chunk() {
    // Packets of ~300 bytes with two nested messages: one of them is cut by the end of the
    // first 4 KiB chunk. It moves whole to the next chunk, so no chunk continues a packet and
    // no size needs a patch: a producer killed before its next commit loses none of them.
    let s = setup_4k_chunks(64 * 1024);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    let body = vec![0x5a; 280];
    for i in 0..20u64 {
        let mut h = w.new_trace_packet();
        h.packet().set_timestamp(i + 1);
        let mut m = h.message();
        let mut outer = m.begin_nested(5001);
        outer.append_varint(1, i);
        let mut inner = outer.begin_nested(2);
        inner.append_bytes(3, &body);
    }
    w.flush();
    assert_eq!(w.stats().patches_committed, 0);
    let commits = drain(&s.commits);
    assert_eq!(commits.len(), 2, "{commits:#?}");
    let mut timestamps = Vec::new();
    for (i, c) in commits.iter().enumerate() {
        assert!(c.chunks_to_patch.is_empty());
        let mv = c.chunks_to_move[0];
        let (flags, count, payload, id) = take_chunk(&s.smb, mv.page, mv.chunk);
        assert_eq!(id, i as u32);
        assert_eq!(flags, ChunkFlags::NONE, "chunk {i}: whole packets only");
        for fragment in fragments(&payload, count) {
            let Fragment::Data(bytes) = fragment else {
                panic!("chunk {i}: unexpected {fragment:?}");
            };
            if bytes.is_empty() {
                // The filler where the carried packet was (the count covered it).
                continue;
            }
            let packet = TracePacketView::decode(bytes).unwrap();
            timestamps.push(packet.timestamp());
            let outer = ProtoDecoder::new(bytes)
                .find_field(5001)
                .expect("the nested message")
                .as_message();
            assert_eq!(
                outer.find_field(1).unwrap().as_u64(),
                packet.timestamp() - 1
            );
            let inner = outer.find_field(2).unwrap().as_message();
            assert_eq!(inner.find_field(3).unwrap().as_bytes(), &body[..]);
        }
    }
    assert_eq!(timestamps, (1..=20).collect::<Vec<_>>());
}

#[test]
fn packets_across_chunks_round_trip_through_the_service() {
    let s = setup(
        256 * 1024,
        PageSize::Kib4,
        PageLayout::Div4,
        BufferExhaustedPolicy::Drop,
    );
    let mut service = TestService::new(Arc::clone(&s.smb), 8 << 20, FillPolicy::RingBuffer);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    let mut written = Written {
        writer_id: w.writer_id(),
        seed: 0xfeed,
        ..Written::default()
    };
    for seq in 0..300 {
        written
            .dropped
            .push(write_test_packet(&mut w, written.seed, seq, 64 * 1024));
        service.apply_queued(&s.commits);
    }
    written.stats = w.stats();
    drop(w);
    service.apply_queued(&s.commits);
    assert!(service.patches > 0, "the packets exercised patches");
    assert_eq!(written.stats.packets_dropped, 0);
    assert_eq!(check_run(&mut service, &[written], 64 * 1024, true), 300);
}

#[test]
fn no_chunk_at_a_packet_boundary_marks_the_drop_after_the_last_packet() {
    // One chunk in the whole buffer: the writer cannot take a second one before the service
    // frees the first (it asks for the next chunk before returning the current one).
    let s = setup_4k_chunks(4096);
    let mut service = TestService::new(Arc::clone(&s.smb), 1 << 20, FillPolicy::RingBuffer);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    let mut seq = 0;
    while s
        .commits
        .try_recv()
        .unwrap()
        .map(|c| service.apply(&c))
        .is_none()
    {
        timestamp_packet(&mut w, seq + 1);
        seq += 1;
    }
    // The packet that needed the new chunk is the first dropped one; the chunk handed back
    // ends with a sentinel fragment standing for it.
    let stats = w.stats();
    assert_eq!(stats.packets, seq);
    assert_eq!(stats.packets_dropped, 1);
    assert_eq!(stats.packets_dropped_marked, 1);
    assert_eq!(stats.drop_episodes, 1);
    assert!(w.is_dropping());
    let read = service.read_all();
    assert_eq!(
        read.len() as u64,
        seq - 1,
        "no finished packet is sacrificed"
    );
    assert_eq!(service.buffer.losses().writer_dropped, 1);
    assert_eq!(service.buffer.stats().trace_writer_packet_loss, 1);

    // The scratch chunk fills up (1 KiB), then the writer retries and gets the freed chunk.
    let before = seq;
    while w.is_dropping() {
        timestamp_packet(&mut w, seq + 1);
        seq += 1;
    }
    assert!(
        seq - before > 50,
        "dropped until the scratch chunk was full"
    );
    assert_eq!(w.stats().packets_dropped, seq - before);
    w.flush();
    service.apply_queued(&s.commits);
    let read = service.read_all();
    assert_eq!(read.len(), 1);
    let view = TracePacketView::decode(&read[0].1).unwrap();
    assert_eq!(view.timestamp(), seq);
    assert_eq!(
        view.previous_packet_dropped(),
        PREVIOUS_PACKET_DROPPED_SMB_FULL
    );
    assert!(!view.first_packet_on_sequence());
    // The service flags it too (it saw the sentinel).
    assert_ne!(read[0].0.previous_packet_dropped, 0);
}

#[test]
fn no_chunk_in_the_middle_of_a_packet_drops_it_with_the_sentinel_in_its_fragment() {
    let s = setup_4k_chunks(4096);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    timestamp_packet(&mut w, 1);
    {
        let mut h = w.new_trace_packet();
        h.packet().set_timestamp(2);
        let mut m = h.message();
        let mut nested = m.begin_nested(5001);
        nested.append_bytes(1, &[7; 6000]);
    }
    assert_eq!(w.stats().packets_dropped, 1);
    assert_eq!(w.stats().packets_dropped_marked, 1);
    let commits = drain(&s.commits);
    assert_eq!(commits.len(), 1);
    assert!(
        commits[0].chunks_to_patch.is_empty(),
        "no patches for a dropped fragment"
    );
    let mv = commits[0].chunks_to_move[0];
    let (flags, count, payload, _) = take_chunk(&s.smb, mv.page, mv.chunk);
    assert_eq!(flags, ChunkFlags::NONE, "no continuation, no patching");
    assert_eq!(count, 2);
    let f = fragments(&payload, count);
    assert_eq!(f[1], Fragment::Dropped);
    // The sentinel sits where the packet's fragment header was, right after packet 1.
    let first_len = match f[0] {
        Fragment::Data(d) => d.len(),
        Fragment::Dropped => unreachable!(),
    };
    assert_eq!(
        payload[4 + first_len..8 + first_len],
        DROP_PACKET_FRAGMENT_HEADER
    );
}

#[test]
fn stall_then_drop_waits_once_per_episode_then_drops() {
    let timeout = Duration::from_millis(40);
    let s = setup(
        4096,
        PageSize::Kib4,
        PageLayout::Div1,
        BufferExhaustedPolicy::StallThenDrop { timeout },
    );
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    let t = Instant::now();
    let mut seq = 0;
    while !w.is_dropping() {
        timestamp_packet(&mut w, seq + 1);
        seq += 1;
    }
    let first = t.elapsed();
    assert!(first >= timeout, "stalled before dropping: {first:?}");
    // Dropping: later retries do not wait again.
    let t = Instant::now();
    for _ in 0..2000 {
        timestamp_packet(&mut w, seq + 1);
        seq += 1;
    }
    assert!(t.elapsed() < timeout, "no second stall: {:?}", t.elapsed());
    assert!(w.is_dropping());
    assert_eq!(s.arbiter.stats().stalls, 1);
    assert_eq!(s.arbiter.stats().packets_dropped, w.stats().packets_dropped);
}

#[test]
fn stall_waits_at_every_chunk_request_but_never_forever() {
    let timeout = Duration::from_millis(20);
    let s = setup(
        4096,
        PageSize::Kib4,
        PageLayout::Div1,
        BufferExhaustedPolicy::Stall { timeout },
    );
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    let t = Instant::now();
    let mut seq = 0;
    while w.stats().drop_episodes == 0 || w.is_dropping() {
        timestamp_packet(&mut w, seq + 1);
        seq += 1;
        if seq > 5000 {
            break;
        }
    }
    // Retries after each scratch-chunk fill stall again: several stalls, each bounded.
    assert!(s.arbiter.stats().stalls >= 2, "{:?}", s.arbiter.stats());
    assert!(t.elapsed() < Duration::from_secs(30));
    assert!(w.is_dropping());
}

#[test]
fn a_stalled_writer_continues_when_the_service_frees_a_chunk() {
    let s = setup(
        4096,
        PageSize::Kib4,
        PageLayout::Div1,
        BufferExhaustedPolicy::Stall {
            timeout: Duration::from_secs(20),
        },
    );
    let service = spawn_service(Arc::clone(&s.smb), 1 << 20, s.commits);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    let mut written = Written {
        writer_id: w.writer_id(),
        seed: 0xabc,
        ..Written::default()
    };
    // Each chunk switch hands the only chunk back, then waits for the service to free it.
    for seq in 0..2000 {
        written
            .dropped
            .push(write_test_packet(&mut w, written.seed, seq, 2048));
    }
    written.stats = w.stats();
    drop(w);
    drop(s.arbiter);
    let mut service = service.join().unwrap();
    assert_eq!(
        written.stats.packets_dropped, 0,
        "a writer that waits pins no chunk"
    );
    assert!(written.stats.chunks_committed > 10);
    check_run(&mut service, &[written], 2048, true);
}

#[test]
fn an_empty_packet_is_not_emitted() {
    let s = setup_4k_chunks(16 * 1024);
    let mut service = TestService::new(Arc::clone(&s.smb), 1 << 20, FillPolicy::RingBuffer);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    timestamp_packet(&mut w, 1);
    drop(w.new_trace_packet());
    timestamp_packet(&mut w, 3);
    assert_eq!(w.stats().packets, 3);
    drop(w);
    service.apply_queued(&s.commits);
    let read = service.read_all();
    let ts: Vec<u64> = read
        .iter()
        .map(|(_, b)| TracePacketView::decode(b).unwrap().timestamp())
        .collect();
    assert_eq!(ts, [1, 3]);
    assert_eq!(service.buffer.losses().total(), 0);
}

#[test]
fn dropping_the_writer_flushes_and_releases_its_id() {
    let s = setup_4k_chunks(16 * 1024);
    let mut w = s.arbiter.create_trace_writer(3).unwrap();
    assert_eq!(w.target_buffer(), 3);
    let id = w.writer_id();
    assert!(s.arbiter.is_writer_active(id));
    timestamp_packet(&mut w, 1);
    drop(w);
    assert!(!s.arbiter.is_writer_active(id));
    assert_eq!(s.arbiter.active_writers(), 0);
    let commits = drain(&s.commits);
    assert_eq!(commits.len(), 1);
    assert_eq!(commits[0].chunks_to_move[0].target_buffer, 3);
    // A flush with nothing written commits nothing.
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    w.flush();
    w.flush();
    assert!(drain(&s.commits).is_empty());
}

#[test]
fn request_flush_is_honoured_after_the_next_packet() {
    let s = setup_4k_chunks(16 * 1024);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    timestamp_packet(&mut w, 1);
    assert!(drain(&s.commits).is_empty());
    s.arbiter.request_flush();
    timestamp_packet(&mut w, 2);
    let commits = drain(&s.commits);
    assert_eq!(commits.len(), 1);
    let mv = commits[0].chunks_to_move[0];
    let (_, count, _, _) = take_chunk(&s.smb, mv.page, mv.chunk);
    assert_eq!(count, 3);
    timestamp_packet(&mut w, 3);
    assert!(drain(&s.commits).is_empty(), "one request, one flush");
}

#[test]
fn a_leaked_nested_message_does_not_break_the_next_packets() {
    let s = setup_4k_chunks(16 * 1024);
    let mut service = TestService::new(Arc::clone(&s.smb), 1 << 20, FillPolicy::RingBuffer);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    {
        let mut h = w.new_trace_packet();
        let mut p = h.packet();
        p.set_timestamp(1);
        std::mem::forget(p.set_track_event());
    }
    timestamp_packet(&mut w, 2);
    drop(w);
    service.apply_queued(&s.commits);
    let read = service.read_all();
    assert_eq!(read.len(), 2);
    for (i, (_, bytes)) in read.iter().enumerate() {
        let fields: Vec<_> = ProtoDecoder::new(bytes).collect::<Result<_, _>>().unwrap();
        assert!(!fields.is_empty());
        assert_eq!(
            TracePacketView::decode(bytes).unwrap().timestamp(),
            i as u64 + 1
        );
    }
}

#[test]
fn a_protozero_error_breaks_the_writer_and_everything_after_is_dropped() {
    let s = setup_4k_chunks(16 * 1024);
    let mut service = TestService::new(Arc::clone(&s.smb), 1 << 20, FillPolicy::RingBuffer);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    timestamp_packet(&mut w, 1);
    {
        let mut h = w.new_trace_packet();
        h.packet().set_timestamp(2);
        nest(&mut h.message(), 70);
    }
    assert!(w.is_broken());
    timestamp_packet(&mut w, 3);
    let stats = w.stats();
    assert_eq!(
        (
            stats.packets,
            stats.packets_dropped,
            stats.packets_dropped_marked,
            stats.errors
        ),
        (3, 2, 1, 1)
    );
    drop(w);
    service.apply_queued(&s.commits);
    let read = service.read_all();
    assert_eq!(read.len(), 1);
    assert_eq!(service.buffer.losses().writer_dropped, 1);
}

fn nest(m: &mut protozero::Message<'_>, depth: u32) {
    if depth > 0 {
        nest(&mut m.begin_nested(1), depth - 1);
    }
}

#[test]
fn the_thread_local_facility_replaces_a_broken_writer() {
    let s = setup_4k_chunks(16 * 1024);
    let first = s.arbiter.with_thread_writer(0, |w| {
        let mut h = w.new_trace_packet();
        nest(&mut h.message(), 70);
        drop(h);
        assert!(w.is_broken());
        w.writer_id()
    });
    let second = s.arbiter.with_thread_writer(0, |w| {
        assert!(!w.is_broken());
        w.writer_id()
    });
    assert!(first.is_some() && second.is_some());
    assert_ne!(first, second, "a new sequence");
    // Re-entering the same thread's writer is refused, not a panic.
    let nested = s
        .arbiter
        .with_thread_writer(0, |_| s.arbiter.with_thread_writer(0, |_| ()));
    assert_eq!(nested, Some(None));
    s.arbiter.close();
    assert!(s.arbiter.with_thread_writer(0, |_| ()).is_none());
    assert_eq!(
        s.arbiter.active_writers(),
        0,
        "closing dropped this thread's writer"
    );
}

#[test]
fn a_wait_that_times_out_mid_packet_leaves_a_continuation_the_service_counts_lost() {
    let s = setup(
        4096,
        PageSize::Kib4,
        PageLayout::Div1,
        BufferExhaustedPolicy::StallThenDrop {
            timeout: Duration::from_millis(10),
        },
    );
    let mut service = TestService::new(Arc::clone(&s.smb), 1 << 20, FillPolicy::RingBuffer);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    timestamp_packet(&mut w, 1);
    {
        let mut h = w.new_trace_packet();
        h.packet().set_timestamp(2);
        let mut m = h.message();
        let mut nested = m.begin_nested(5001);
        nested.append_bytes(1, &[7; 6000]);
    }
    let stats = w.stats();
    assert_eq!(
        (stats.packets_dropped, stats.packets_dropped_marked),
        (1, 1)
    );
    let commits = drain(&s.commits);
    // The chunk went back as "continues on next chunk" before the wait, its patch after the
    // packet ended (in the scratch chunk).
    assert_eq!(commits.len(), 2);
    assert_eq!(commits[1].chunks_to_patch[0].chunk_id, 0);
    for c in &commits {
        service.apply(c);
    }
    // The writer recovers once the service freed the chunk and the scratch chunk is full.
    let mut seq = 3;
    while w.is_dropping() {
        timestamp_packet(&mut w, seq);
        seq += 1;
    }
    drop(w);
    service.apply_queued(&s.commits);
    let read = service.read_all();
    let losses = *service.buffer.losses();
    assert_eq!(losses.incomplete, 1, "{losses:?}");
    assert_eq!(losses.total(), 1);
    let ts: Vec<u64> = read
        .iter()
        .map(|(_, b)| TracePacketView::decode(b).unwrap().timestamp())
        .collect();
    assert_eq!(ts, [1, seq - 1]);
}

#[test]
fn writers_move_between_threads_and_arbiters_are_shared() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<TraceWriter>();
    send::<SmbArbiter>();
    sync::<SmbArbiter>();
    let s = setup_4k_chunks(16 * 1024);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    timestamp_packet(&mut w, 1);
    let w = std::thread::spawn(move || {
        timestamp_packet(&mut w, 2);
        w
    })
    .join()
    .unwrap();
    drop(w);
    assert_eq!(drain(&s.commits).len(), 1);
}

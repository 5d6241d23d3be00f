//! `TraceWriter::make_room`, `try_make_room` and `skip_packet`: a caller learns whether its next
//! packet reaches the buffer before it writes it, and the counters only ever count packets
//! that were started (or given up on with `skip_packet`).

mod common;

use std::sync::Arc;

use common::TestService;
use tachyon::backend::{
    commit_channel, ArbiterConfig, CommitReceiver, OwnedSmb, PageLayout, PageSize, SmbArbiter,
    TraceWriter, PREVIOUS_PACKET_DROPPED_SMB_FULL,
};
use tachyon::BufferExhaustedPolicy;
use tachyon_protos::TracePacketView;
use tachyon_service::FillPolicy;

struct Setup {
    smb: Arc<OwnedSmb>,
    arbiter: Arc<SmbArbiter>,
    commits: CommitReceiver,
}

/// `chunks` chunks of 4 KiB, the `Drop` policy.
fn setup(chunks: usize) -> Setup {
    let smb = Arc::new(OwnedSmb::new(chunks * 4096, PageSize::Kib4).unwrap());
    let (sink, commits) = commit_channel();
    let config = ArbiterConfig {
        page_layout: Some(PageLayout::Div1),
        buffer_exhausted_policy: BufferExhaustedPolicy::Drop,
    };
    // SAFETY: the test service copies only chunks the writer committed (Complete).
    let arbiter = unsafe { SmbArbiter::new(Arc::clone(&smb), config, sink) };
    Setup {
        smb,
        arbiter,
        commits,
    }
}

fn timestamp_packet(w: &mut TraceWriter, ts: u64) {
    w.write_packet(|p| p.set_timestamp(ts));
}

/// A packet of about `len` bytes (a timestamp and a string).
fn big_packet(w: &mut TraceWriter, ts: u64, len: usize) {
    w.write_packet(|p| {
        p.set_timestamp(ts);
        p.message().append_bytes(5000, &vec![b'x'; len]);
    });
}

fn service(s: &Setup) -> TestService {
    TestService::new(Arc::clone(&s.smb), 1 << 20, FillPolicy::Discard)
}

/// A buffer of one chunk, a service, and a writer whose first packet (timestamp 1) fills
/// three quarters of that chunk: no other chunk is ever free while the writer holds it.
fn one_chunk_three_quarters_full() -> (Setup, TestService, TraceWriter) {
    let s = setup(1);
    let service = service(&s);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    big_packet(&mut w, 1, 3000);
    (s, service, w)
}

/// Timestamps of the packets read, and whether each says `previous_packet_dropped`.
fn read(service: &mut TestService) -> Vec<(u64, bool)> {
    service
        .read_all()
        .iter()
        .map(|(_, bytes)| {
            let p = TracePacketView::decode(bytes).unwrap();
            (
                p.timestamp(),
                p.previous_packet_dropped() == PREVIOUS_PACKET_DROPPED_SMB_FULL,
            )
        })
        .collect()
}

#[test]
fn room_in_the_current_chunk_changes_nothing() {
    let s = setup(4);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    timestamp_packet(&mut w, 1);
    let before = w.stats();
    assert!(w.make_room(1000));
    assert!(w.try_make_room(1000));
    assert_eq!(w.stats(), before);
    assert!(
        s.commits.try_recv().unwrap().is_none(),
        "no chunk handed back"
    );
}

#[test]
fn a_packet_that_would_not_fit_starts_in_a_new_chunk() {
    let s = setup(4);
    let mut service = service(&s);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    big_packet(&mut w, 1, 2000);
    // 2000 more bytes do not fit in the rest of the 4 KiB chunk: the writer hands it back now.
    assert!(w.make_room(2100));
    service.apply_queued(&s.commits);
    assert_eq!(service.moves, 1);
    big_packet(&mut w, 2, 2000);
    // And `try_make_room` the same way when a chunk is free.
    assert!(w.try_make_room(2100));
    service.apply_queued(&s.commits);
    assert_eq!(service.moves, 2);
    w.flush();
    service.apply_queued(&s.commits);
    // Neither packet was cut in two: three chunks, nothing needed reassembly or patching.
    assert_eq!(read(&mut service), [(1, false), (2, false)]);
    assert_eq!(service.patches, 0);
    assert_eq!(w.stats().packets_dropped, 0);
}

#[test]
fn try_make_room_never_waits_nor_drops() {
    let (s, mut service, mut w) = one_chunk_three_quarters_full();
    assert!(!w.try_make_room(2000));
    assert!(!w.is_dropping());
    assert!(s.commits.try_recv().unwrap().is_none(), "the chunk is kept");
    // A small packet still lands in the rest of the chunk.
    timestamp_packet(&mut w, 2);
    w.flush();
    service.apply_queued(&s.commits);
    assert_eq!(read(&mut service), [(1, false), (2, false)]);
    assert_eq!(w.stats().packets_dropped, 0);
}

#[test]
fn no_room_at_a_full_buffer_marks_the_packet_that_follows() {
    let (s, mut service, mut w) = one_chunk_three_quarters_full();
    assert!(!w.make_room(2000));
    assert!(w.is_dropping());
    // Nothing started, nothing dropped yet; the chunk handed back carries the marker.
    let stats = w.stats();
    assert_eq!((stats.packets, stats.packets_dropped), (1, 0));
    assert_eq!(stats.packets_dropped_marked, 1);
    // The packet the caller writes next is the one lost.
    timestamp_packet(&mut w, 2);
    let stats = w.stats();
    assert_eq!((stats.packets, stats.packets_dropped), (2, 1));
    service.apply_queued(&s.commits);
    assert_eq!(read(&mut service), [(1, false)]);
    assert_eq!(service.buffer.stats().trace_writer_packet_loss, 1);
}

#[test]
fn while_dropping_the_retry_happens_in_make_room_when_due() {
    let s = setup(1);
    let mut service = service(&s);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    let mut ts = 0;
    // Fill the only chunk; the packet that needs the next one is dropped.
    while !w.is_dropping() {
        ts += 1;
        timestamp_packet(&mut w, ts);
    }
    let dropped_at = ts;
    // The service frees the chunk, but the retry is not due before the scratch chunk is full.
    service.apply_queued(&s.commits);
    assert!(!w.make_room(16));
    let mut dropped = 1;
    while !w.make_room(16) {
        ts += 1;
        timestamp_packet(&mut w, ts);
        dropped += 1;
    }
    assert!(dropped > 50, "retried before the scratch chunk was full");
    assert!(!w.is_dropping());
    // `make_room` took the chunk and counted nothing; the next packet reaches the buffer and
    // says what was lost.
    assert_eq!(w.stats().packets_dropped, dropped);
    assert_eq!(w.stats().drop_episodes, 1);
    ts += 1;
    timestamp_packet(&mut w, ts);
    w.flush();
    service.apply_queued(&s.commits);
    let got = read(&mut service);
    let expected: Vec<(u64, bool)> = (1..dropped_at)
        .map(|t| (t, false))
        .chain([(ts, true)])
        .collect();
    assert_eq!(got, expected);
    assert_eq!(w.stats().packets, ts);
}

#[test]
fn a_skipped_packet_is_counted_lost_and_reported() {
    let s = setup(4);
    let mut service = service(&s);
    let mut w = s.arbiter.create_trace_writer(0).unwrap();
    timestamp_packet(&mut w, 1);
    w.skip_packet();
    timestamp_packet(&mut w, 3);
    let stats = w.stats();
    assert_eq!((stats.packets, stats.packets_dropped), (3, 1));
    w.flush();
    service.apply_queued(&s.commits);
    assert_eq!(read(&mut service), [(1, false), (3, true)]);
}

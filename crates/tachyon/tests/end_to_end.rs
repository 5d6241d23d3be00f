//! Property tests, one thread: several writers interleaved on random page sizes and layouts,
//! random packets (0 to 64 KiB, nested messages whose size fields land in chunks already handed
//! off), flushes and service runs at random points (so the buffer fills and writers drop), then
//! the exact end-to-end check of `common::check_run`.

mod common;

use std::sync::Arc;

use common::{check_run, write_test_packet, TestService, Written};
use proptest::prelude::*;
use tachyon::backend::{commit_channel, ArbiterConfig, OwnedSmb, PageLayout, PageSize, SmbArbiter};
use tachyon::BufferExhaustedPolicy;
use tachyon_service::FillPolicy;

const MAX_PACKET: usize = 64 * 1024;

#[derive(Clone, Copy, Debug)]
enum Op {
    /// Writer `i` writes its next packet.
    Write(usize),
    /// Writer `i` flushes.
    Flush(usize),
    /// The service applies every commit queued so far.
    Pump,
}

fn op(writers: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (0..writers).prop_map(Op::Write),
        1 => (0..writers).prop_map(Op::Flush),
        4 => Just(Op::Pump),
    ]
}

/// Runs `ops`, then drops the writers and checks everything. Returns (read, dropped, patches).
fn run(
    page: PageSize,
    layout: PageLayout,
    smb_size: usize,
    writers: usize,
    ops: &[Op],
    seed: u64,
) -> (u64, u64, u64) {
    let smb = Arc::new(OwnedSmb::new(smb_size, page).unwrap());
    let (sink, commits) = commit_channel();
    let config = ArbiterConfig {
        page_layout: Some(layout),
        buffer_exhausted_policy: BufferExhaustedPolicy::Drop,
    };
    // SAFETY: nothing scrapes the buffer.
    let arbiter = unsafe { SmbArbiter::new(Arc::clone(&smb), config, sink) };
    let mut service = TestService::new(smb, 64 << 20, FillPolicy::RingBuffer);
    let mut ws: Vec<_> = (0..writers)
        .map(|_| arbiter.create_trace_writer(0).unwrap())
        .collect();
    let mut written: Vec<Written> = ws
        .iter()
        .enumerate()
        .map(|(i, w)| Written {
            writer_id: w.writer_id(),
            seed: seed.wrapping_add(i as u64 * 0x1000_0001),
            ..Written::default()
        })
        .collect();
    for &op in ops {
        match op {
            Op::Write(i) => {
                let w = &mut written[i];
                let seq = w.dropped.len() as u64;
                let dropped = write_test_packet(&mut ws[i], w.seed, seq, MAX_PACKET);
                w.dropped.push(dropped);
            }
            Op::Flush(i) => ws[i].flush(),
            Op::Pump => service.apply_queued(&commits),
        }
    }
    for (w, record) in ws.iter().zip(&mut written) {
        record.stats = w.stats();
    }
    drop(ws);
    drop(arbiter);
    while let Some(c) = commits.recv() {
        service.apply(&c);
    }
    let dropped = written.iter().map(|w| w.stats.packets_dropped).sum();
    let read = check_run(&mut service, &written, MAX_PACKET, true);
    (read, dropped, service.patches)
}

fn page_size() -> impl Strategy<Value = PageSize> {
    prop::sample::select(PageSize::ALL.to_vec())
}

fn layout() -> impl Strategy<Value = PageLayout> {
    prop::sample::select(PageLayout::PARTITIONED.to_vec())
}

proptest! {
    // 40 cases by default; `PROPTEST_CASES=N` for a longer soak.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(40),
        ..ProptestConfig::default()
    })]

    /// Small buffers: writers run out of chunks often and drop; every loss is accounted for.
    #[test]
    fn small_buffers_drop_and_account_exactly(
        page in page_size(),
        layout in layout(),
        pages in 1usize..=6,
        writers in 1usize..=3,
        ops in prop::collection::vec(op(3), 1..120),
        seed in any::<u64>(),
    ) {
        let ops: Vec<Op> = ops.into_iter().map(|o| match o {
            Op::Write(i) => Op::Write(i % writers),
            Op::Flush(i) => Op::Flush(i % writers),
            Op::Pump => Op::Pump,
        }).collect();
        run(page, layout, pages * page.bytes(), writers, &ops, seed);
    }

    /// Big buffers: large packets cross many chunks and get patched; nothing is dropped.
    #[test]
    fn big_buffers_round_trip_every_packet(
        page in page_size(),
        layout in layout(),
        writers in 1usize..=3,
        ops in prop::collection::vec(op(3), 1..120),
        seed in any::<u64>(),
    ) {
        let ops: Vec<Op> = ops.into_iter().map(|o| match o {
            Op::Write(i) => Op::Write(i % writers),
            Op::Flush(i) => Op::Flush(i % writers),
            Op::Pump => Op::Pump,
        }).collect();
        let writes = ops.iter().filter(|o| matches!(o, Op::Write(_))).count() as u64;
        // Room for every packet even if the service never runs before the end.
        let (read, dropped, _) = run(page, layout, 32 << 20, writers, &ops, seed);
        prop_assert_eq!(dropped, 0);
        prop_assert_eq!(read, writes);
    }
}

/// A fixed run that must exercise patches (a regression guard for the generator: the property
/// tests above only pass if it does).
#[test]
fn patches_are_exercised() {
    let ops: Vec<Op> = (0..200).map(|i| Op::Write(i % 2)).collect();
    let (read, dropped, patches) = run(PageSize::Kib4, PageLayout::Div4, 32 << 20, 2, &ops, 7);
    assert_eq!((read, dropped), (200, 0));
    assert!(patches > 20, "{patches}");
}

/// A fixed small-buffer run that must drop (and still account exactly).
#[test]
fn drops_are_exercised() {
    let mut ops = Vec::new();
    for i in 0..600 {
        ops.push(Op::Write(i % 3));
        if i % 50 == 0 {
            ops.push(Op::Pump);
        }
    }
    let (read, dropped, _) = run(PageSize::Kib4, PageLayout::Div2, 16 * 1024, 3, &ops, 11);
    assert!(dropped > 0);
    assert!(read > 0);
}

/// The same data path through the service's own commit handling (`tachyon_service::apply_commit`)
/// instead of the test harness's: the writer's commits are what the service expects.
#[test]
fn commits_apply_with_the_services_commit_handling() {
    use tachyon_service::{apply_commit, CommitStats, ProducerState};

    let smb = Arc::new(OwnedSmb::new(64 * 1024, PageSize::Kib4).unwrap());
    let (sink, commits) = commit_channel();
    let config = ArbiterConfig {
        page_layout: Some(PageLayout::Div2),
        buffer_exhausted_policy: BufferExhaustedPolicy::Drop,
    };
    // SAFETY: nothing scrapes the buffer.
    let arbiter = unsafe { SmbArbiter::new(Arc::clone(&smb), config, sink) };
    let mut service = TestService::new(Arc::clone(&smb), 64 << 20, FillPolicy::RingBuffer);
    let mut producer = ProducerState::new(common::PRODUCER, vec![0]);
    let mut stats = CommitStats::default();
    let mut ws: Vec<_> = (0..2)
        .map(|_| arbiter.create_trace_writer(0).unwrap())
        .collect();
    let mut written: Vec<Written> = ws
        .iter()
        .enumerate()
        .map(|(i, w)| Written {
            writer_id: w.writer_id(),
            seed: 0xc0ffee + i as u64,
            ..Written::default()
        })
        .collect();
    let view = smb.service();
    for seq in 0..400u64 {
        let i = (seq % 2) as usize;
        let d = write_test_packet(&mut ws[i], written[i].seed, seq / 2, 8 * 1024);
        written[i].dropped.push(d);
        if seq % 7 == 0 {
            for c in commits.try_iter() {
                apply_commit(
                    &view,
                    &mut producer,
                    &c,
                    std::slice::from_mut(&mut service.buffer),
                    &mut stats,
                );
            }
        }
    }
    for (w, record) in ws.iter().zip(&mut written) {
        record.stats = w.stats();
    }
    drop(ws);
    drop(arbiter);
    while let Some(c) = commits.recv() {
        apply_commit(
            &view,
            &mut producer,
            &c,
            std::slice::from_mut(&mut service.buffer),
            &mut stats,
        );
    }
    assert_eq!(stats, CommitStats::default(), "nothing refused");
    check_run(&mut service, &written, 8 * 1024, true);
}

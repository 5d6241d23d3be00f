//! A thread that keeps tracing while the shared memory buffer is full.
//!
//! A 16 KiB SMB (four 4 KiB chunks) with the `Drop` policy overflows many times while one
//! thread writes as fast as it can: the in-process service copies chunks out only every few
//! milliseconds. What must hold:
//!
//! - The writer's drop counter counts events lost, exactly: every event written is either in
//!   the trace or counted in `packets_dropped`, and nothing else is counted (the SDK does not
//!   re-run its incremental-state setup for each event of a drop episode and lose that too).
//! - One generation start per episode: the sequence has one incremental-state clear at its
//!   start and one after each of the writer's loss marks (`previous_packet_dropped`), right
//!   after it, no more: the first packet that reaches the buffer after an episode starts a
//!   generation.
//! - The trace stays decodable: no packet is skipped for invalid incremental state, and every
//!   surviving event resolves its interned name, category and argument name.
//!
//! The SDK has one session per process: the tests take `LOCK` and run one after the other.

mod model;

use std::sync::{Mutex, MutexGuard};

use model::{Arg, Kind, Model, SEQ_INCREMENTAL_STATE_CLEARED};
use tachyon::{BufferExhaustedPolicy, Config, FillPolicy};
use tachyon_processor::{Options, TraceProcessor, Value};
use tachyon_protos::TraceView;

/// `TracePacket.DataLossReason.DATA_LOSS_SMB_FULL`: set by the writer only.
const DATA_LOSS_SMB_FULL: u32 = 256;

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Loop iterations; each writes three events (zone begin, instant, zone end).
const ITERATIONS: u64 = 100_000;
const EVENTS_PER_ITERATION: u64 = 3;

/// What the tracing thread writes: a zone holding an instant whose argument numbers it.
fn workload() {
    for k in 0..ITERATIONS {
        let _z = tachyon::zone!("smb", "zone");
        tachyon::instant!("smb", "tick", k = k);
    }
}

fn config(incremental_timestamps: bool) -> Config {
    Config {
        smb_size: 16 << 10,
        on_full: BufferExhaustedPolicy::Drop,
        // Large enough for everything that reaches it: losses are the writer's only.
        buffer_size: 64 << 20,
        fill_policy: FillPolicy::Discard,
        incremental_timestamps,
        ..Config::in_memory()
    }
}

fn run(incremental_timestamps: bool) {
    let _l = lock();
    tachyon::start(config(incremental_timestamps)).unwrap();
    let tid = std::thread::Builder::new()
        .name("smb full".into())
        .spawn(|| {
            workload();
            model::current_tid().expect("Linux")
        })
        .unwrap()
        .join()
        .unwrap();
    let report = tachyon::shutdown().unwrap().unwrap();
    assert_eq!(report.writers_still_active, 0);
    let stats = report.writers;
    assert!(
        stats.packets_dropped > 0,
        "the SMB never filled: the test did not test anything ({stats:?})"
    );

    let m = Model::read(&report.trace);
    assert!(m.errors.is_empty(), "{:?}", m.errors);
    assert_eq!(
        m.skipped, 0,
        "packets skipped for invalid incremental state"
    );
    let unresolved = m.unresolved();
    assert!(unresolved.is_empty(), "unresolved: {unresolved:#?}");
    let buffer = m.buffer_stats.expect("a TraceStats packet");
    assert_eq!(buffer.chunks_discarded, 0, "the central buffer overflowed");

    // Every surviving event resolves to what was written, in order.
    let track = m.thread_track(tid);
    let events = m.on_track(track);
    let mut last_k = None;
    for e in &events {
        match e.kind {
            Kind::Begin => {
                assert_eq!(e.name.as_deref(), Some("zone"), "{e:?}");
                assert_eq!(e.categories, ["smb"], "{e:?}");
            }
            Kind::Instant => {
                assert_eq!(e.name.as_deref(), Some("tick"), "{e:?}");
                assert_eq!(e.categories, ["smb"], "{e:?}");
                let k = match e.args.as_slice() {
                    [(name, Arg::Uint(k))] if name == "k" => *k,
                    other => panic!("arguments {other:?} in {e:?}"),
                };
                assert!(last_k < Some(k), "k {k} after {last_k:?}");
                last_k = Some(k);
            }
            Kind::End => {}
            other => panic!("unexpected {other:?}: {e:?}"),
        }
    }

    // The exact relation: written = in the trace + counted dropped. The drop counter counts
    // nothing but lost events.
    let written = ITERATIONS * EVENTS_PER_ITERATION;
    assert_eq!(
        events.len() as u64 + stats.packets_dropped,
        written,
        "{} events in the trace, {stats:?}",
        events.len()
    );

    // One sequence (one writer). The writer's own loss marks (`previous_packet_dropped` with
    // `DATA_LOSS_SMB_FULL`; the service may add marks of its own, e.g. on the sequence's first
    // packet or for a loss at its end) each sit on the first packet of a generation start, the
    // clearing packet right after it: one generation start at the beginning and one per
    // episode that ended, no more.
    let seq = events[0].seq;
    assert!(events.iter().all(|e| e.seq == seq));
    assert_eq!(m.per_sequence[&seq][1], 0, "skipped");
    let packets: Vec<(u32, u32)> = TraceView::decode(&report.trace)
        .unwrap()
        .packet()
        .map(|p| p.unwrap())
        .filter(|p| p.trusted_packet_sequence_id() == seq)
        .map(|p| (p.previous_packet_dropped(), p.sequence_flags()))
        .collect();
    let cleared = |i: usize| {
        packets
            .get(i)
            .is_some_and(|p| p.1 & SEQ_INCREMENTAL_STATE_CLEARED != 0)
    };
    let clears = (0..packets.len()).filter(|&i| cleared(i)).count() as u64;
    let mut marks = 0;
    for (i, p) in packets.iter().enumerate() {
        if p.0 & DATA_LOSS_SMB_FULL != 0 {
            marks += 1;
            assert!(
                cleared(i + 1),
                "packet {i} of the sequence after a loss: {p:?}, then {:?}",
                packets.get(i + 1)
            );
        }
    }
    assert!(marks > 0, "no episode ended: {stats:?}");
    assert_eq!(
        clears,
        marks + 1,
        "generation starts ({clears}) vs loss marks ({marks}), {} packets, {stats:?}",
        packets.len()
    );
    // Every episode but possibly the last one (still dropping at the end) ended with a mark.
    assert!(
        stats.drop_episodes == marks || stats.drop_episodes == marks + 1,
        "{marks} marks, {stats:?}"
    );

    // How many were lost reaches the trace, not only that some were: each mark carries the
    // number of packets dropped since the last one (`tachyon_packets_dropped`), so together
    // they are the writer's count, all of it when the last episode ended.
    let reported: u64 = TraceView::decode(&report.trace)
        .unwrap()
        .packet()
        .map(|p| p.unwrap())
        .filter(|p| p.trusted_packet_sequence_id() == seq)
        .map(|p| p.tachyon_packets_dropped())
        .sum();
    if stats.drop_episodes == marks {
        assert_eq!(reported, stats.packets_dropped, "{stats:?}");
    } else {
        assert!(
            reported > 0 && reported < stats.packets_dropped,
            "{reported} reported, {stats:?}"
        );
    }
    // … and `tachyon stats` shows it per sequence and per buffer.
    let tp = TraceProcessor::from_bytes(&report.trace, &Options::default()).unwrap();
    let per = |name: &str| {
        tp.query(&format!(
            "SELECT idx, value FROM stats WHERE name = '{name}' ORDER BY idx"
        ))
        .unwrap()
        .rows
    };
    let expected = |idx: i64| vec![vec![Value::Integer(idx), Value::Integer(reported as i64)]];
    assert_eq!(per("sequence_writer_packets_dropped"), expected(seq as i64));
    assert_eq!(per("traced_buf_writer_packets_dropped"), expected(0));
}

#[test]
fn drops_count_lost_events_with_incremental_timestamps() {
    run(true);
}

#[test]
fn drops_count_lost_events_with_absolute_timestamps() {
    run(false);
}

//! write_into_file: the daemon streams into the descriptor the consumer passed; the file grows
//! while the session runs and is a valid trace at every write boundary; periodic flushes bring
//! in what producers hold; max_file_size_bytes ends the session.

mod support;

use std::time::{Duration, Instant};

use support::*;
use tachyon_processor::{Options, TraceProcessor};
use tachyon_traced::Consumer;

/// Waits until the file holds at least `n` producer packets; checks every snapshot seen on the
/// way is a well-formed trace (whole records only).
fn wait_for_packets(file: &std::fs::File, n: usize) -> Vec<u8> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let bytes = read_all(file);
        // `packets` panics on a partial record: every snapshot is a valid trace.
        if timestamps(&bytes).len() >= n {
            return bytes;
        }
        assert!(
            Instant::now() < deadline,
            "the file did not grow to {n} packets"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_file_grows_during_the_run_and_is_a_valid_trace_at_every_boundary() {
    let (_dir, daemon) = daemon("streaming");
    let mut p = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    let out = output_file();
    let config = Config {
        buffers: vec![(64, false)],
        data_sources: vec![("test.source".into(), 0)],
        write_into_file: true,
        file_write_period_ms: 100,
        flush_period_ms: 150,
        ..Config::default()
    };
    consumer
        .enable_tracing(&config.encode(), Some(&out))
        .unwrap();
    let (_, buffer) = p.wait_start();

    // Committed data is written at the next period.
    let c = p.write_chunk(1, &[packet(1, 0), packet(2, 0)], true);
    p.commit(&[c], buffer);
    let first = wait_for_packets(&out, 2);
    assert_eq!(timestamps(&first), [1, 2]);

    // Data the producer holds (complete, never committed) arrives through the periodic flush
    // and its scrape.
    p.write_chunk(1, &[packet(3, 0)], true);
    let second = wait_for_packets(&out, 3);
    assert!(second.len() > first.len());
    assert!(second.starts_with(&first), "streaming only appends");
    assert_eq!(timestamps(&second), [1, 2, 3]);

    // More rounds: each is in the file after a write period, appended to what was there.
    let mut expected: Vec<u64> = vec![1, 2, 3];
    for round in 0..3u64 {
        for i in 0..20u64 {
            let ts = 1000 * (round + 1) + i;
            let c = p.write_chunk(1, &[packet(ts, 500)], true);
            p.commit(&[c], buffer);
            expected.push(ts);
        }
        let snapshot = wait_for_packets(&out, expected.len());
        assert_eq!(timestamps(&snapshot), expected);
    }

    consumer.disable_tracing().unwrap();
    assert_eq!(
        consumer.wait_for_end(Some(TIMEOUT)).unwrap().unwrap().error,
        None
    );
    let mut rest = Vec::new();
    consumer.read_buffers(&mut rest).unwrap();
    assert!(
        rest.is_empty(),
        "a streaming session has nothing to read back"
    );
    let trace = read_all(&out);
    assert_eq!(timestamps(&trace), expected);
    assert!(
        packets(&trace).last().unwrap().is_stats,
        "the file ends with TraceStats"
    );
    let s = stats(&trace_stats(&trace));
    assert!(s.flushes_requested >= 2, "periodic flushes ran: {s:?}");
    assert_eq!(s.buffers[0].2, 0, "nothing overwritten");

    // The trace processor reads it.
    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
    let r = tp
        .query("select value from stats where name = 'traced_buf_chunks_overwritten'")
        .unwrap();
    assert_eq!(r.rows.len(), 1, "{r:?}");
}

#[test]
fn a_full_file_ends_the_session() {
    let (_dir, daemon) = daemon("max-file-size");
    let mut p = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    let out = output_file();
    let config = Config {
        buffers: vec![(256, false)],
        data_sources: vec![("test.source".into(), 0)],
        write_into_file: true,
        file_write_period_ms: 100,
        max_file_size_bytes: 2000,
        ..Config::default()
    };
    consumer
        .enable_tracing(&config.encode(), Some(&out))
        .unwrap();
    let (_, buffer) = p.wait_start();
    for i in 0..10 {
        let c = p.write_chunk(1, &[packet(i, 500)], true);
        p.commit(&[c], buffer);
    }
    let end = consumer.wait_for_end(Some(TIMEOUT)).unwrap();
    assert!(end.is_some(), "the session stopped by itself");
    let trace = read_all(&out);
    let ts = timestamps(&trace);
    assert!(!ts.is_empty() && ts.len() < 10, "{ts:?}");
    assert_eq!(ts, (0..ts.len() as u64).collect::<Vec<_>>());
    assert!(packets(&trace).last().unwrap().is_stats);
}

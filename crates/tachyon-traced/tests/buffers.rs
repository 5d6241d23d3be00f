//! Central buffers across processes' commits: DISCARD keeps the beginning, RING_BUFFER the end,
//! and the final TraceStats accounts for every chunk; several buffers per session.

mod support;

use support::*;
use tachyon_traced::Consumer;

/// Commits `chunks` chunks of two packets each (timestamps 2i, 2i + 1) into a 4 KiB buffer
/// (exactly four chunk records) with `discard`, and returns (trace timestamps, stats).
fn overflow(name: &str, discard: bool, chunks: u64) -> (Vec<u64>, Stats) {
    let (_dir, daemon) = daemon(name);
    let mut p = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    let config = Config {
        buffers: vec![(4, discard)],
        data_sources: vec![("test.source".into(), 0)],
        ..Config::default()
    };
    consumer.enable_tracing(&config.encode(), None).unwrap();
    let (_, buffer) = p.wait_start();
    for i in 0..chunks {
        let c = p.write_chunk(1, &[packet(2 * i, 300), packet(2 * i + 1, 300)], true);
        p.commit(&[c], buffer);
    }
    consumer.disable_tracing().unwrap();
    consumer.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
    let mut trace = Vec::new();
    consumer.read_buffers(&mut trace).unwrap();
    (timestamps(&trace), stats(&trace_stats(&trace)))
}

#[test]
fn discard_keeps_the_beginning_and_counts_the_rest() {
    let chunks = 10;
    let (ts, s) = overflow("discard", true, chunks);
    let (written, discarded, overwritten, abi) = s.buffers[0];
    assert_eq!(written, 4, "a 4 KiB buffer holds four 1 KiB chunk records");
    assert_eq!(discarded, chunks - written);
    assert_eq!((overwritten, abi), (0, 0));
    assert_eq!(
        ts,
        (0..2 * written).collect::<Vec<_>>(),
        "the oldest packets, in order"
    );
    assert_eq!(
        s.chunks_discarded, 0,
        "no commit was refused before the buffer"
    );
}

#[test]
fn ring_buffer_keeps_the_end_and_counts_what_it_overwrote() {
    let chunks = 10;
    let (ts, s) = overflow("ring", false, chunks);
    let (written, discarded, overwritten, _) = s.buffers[0];
    assert_eq!(written, chunks);
    assert_eq!(discarded, 0);
    let kept = written - overwritten;
    assert_eq!(kept, 4);
    assert_eq!(
        ts,
        (2 * (chunks - kept)..2 * chunks).collect::<Vec<_>>(),
        "the newest packets"
    );
    // Exact accounting: every packet committed is either read or in an overwritten chunk.
    assert_eq!(ts.len() as u64 + 2 * overwritten, 2 * chunks);
}

#[test]
fn data_sources_go_to_their_own_buffers() {
    let (_dir, daemon) = daemon("two-buffers");
    let mut a = FakeProducer::connect(
        daemon.producer_socket(),
        Behaviour {
            data_sources: vec!["a.source".into()],
            ..Behaviour::default()
        },
    );
    let mut b = FakeProducer::connect(
        daemon.producer_socket(),
        Behaviour {
            data_sources: vec!["b.source".into()],
            ..Behaviour::default()
        },
    );
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    let config = Config {
        buffers: vec![(64, false), (4, true)],
        data_sources: vec![("a.source".into(), 0), ("b.source".into(), 1)],
        ..Config::default()
    };
    consumer.enable_tracing(&config.encode(), None).unwrap();
    let (_, buf_a) = a.wait_start();
    let (_, buf_b) = b.wait_start();
    assert_ne!(buf_a, buf_b);
    for i in 0..8 {
        let c = a.write_chunk(1, &[packet(i, 300)], true);
        a.commit(&[c], buf_a);
        let c = b.write_chunk(1, &[packet(100 + i, 300)], true);
        b.commit(&[c], buf_b);
    }
    consumer.disable_tracing().unwrap();
    consumer.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
    let mut trace = Vec::new();
    consumer.read_buffers(&mut trace).unwrap();
    let s = stats(&trace_stats(&trace));
    assert_eq!(s.buffers[0], (8, 0, 0, 0), "buffer 0 holds all of a");
    assert_eq!(
        s.buffers[1],
        (4, 4, 0, 0),
        "buffer 1 (DISCARD, 4 KiB) refused half of b"
    );
    let mut ts = timestamps(&trace);
    ts.sort_unstable();
    assert_eq!(ts, (0..8).chain(100..104).collect::<Vec<_>>());
}

//! A consumer that asks for the buffers and does not read the answer holds up only itself: the
//! daemon's service thread never waits for a consumer's socket, so producers' commits keep being
//! handled (their chunks freed) meanwhile, and the answer is all there once the consumer reads.

mod support;

use std::time::Duration;

use protozero::HeapBuffered;
use support::*;
use tachyon_ipc::rpc;
use tachyon_protos::{EnableTracingRequest, ReadBuffersResponseView};

/// Chunks the producer commits before the read (each about 1 KiB: a reply of a few MiB, far
/// more than a socket buffer holds).
const ROUNDS: u64 = 96;
const CHUNKS_PER_ROUND: u64 = 32;

fn commit_rounds(p: &mut FakeProducer, daemon: &tachyon_traced::DaemonHandle, buffer: u16) {
    let padding = FakeProducer::chunk_payload_size() - 32;
    for _ in 0..ROUNDS {
        let before = daemon.stats().chunks_committed;
        let chunks: Vec<(u32, u32)> = (0..CHUNKS_PER_ROUND)
            .map(|i| p.write_chunk(1, &[packet(i + 1, padding)], true))
            .collect();
        p.commit(&chunks, buffer);
        // Freed before the next round reuses them.
        wait_until("the commit to be handled", || {
            daemon.stats().chunks_committed >= before + CHUNKS_PER_ROUND
        });
    }
}

#[test]
fn a_consumer_that_does_not_read_does_not_hold_up_the_producers() {
    // A write timeout far beyond the test's: a service thread blocked on the consumer's socket
    // would stay blocked for the whole test.
    let (_dir, daemon) = daemon_with("slow-consumer", |c| {
        c.write_timeout = Duration::from_secs(3600);
    });
    let mut p = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let (caller, mut replies) = rpc::connect(
        daemon.consumer_socket(),
        "ConsumerPort",
        Duration::from_secs(5),
        TIMEOUT,
    )
    .unwrap();
    let mut buf = HeapBuffered::new();
    buf.root::<EnableTracingRequest<'_>>()
        .message()
        .append_bytes(
            EnableTracingRequest::TRACE_CONFIG_FIELD_NUMBER,
            &Config::simple(16 * 1024, "test.source").encode(),
        );
    caller
        .invoke("EnableTracing", &buf.serialize().unwrap(), None, false)
        .unwrap();
    let (_, buffer) = p.wait_start();
    commit_rounds(&mut p, &daemon, buffer);

    // Ask for everything, read nothing.
    let read = caller.invoke("ReadBuffers", &[], None, false).unwrap();
    // Give the daemon time to take the request (not an assertion: if it has not yet, the
    // rounds below still must not wait for this consumer).
    std::thread::sleep(Duration::from_millis(300));
    // The producer goes on, and its commits are handled.
    commit_rounds(&mut p, &daemon, buffer);

    // Now the consumer reads: the whole answer, one packet per chunk of the first rounds.
    let mut packets = 0u64;
    loop {
        let r = replies.recv().unwrap().expect("the daemon answers");
        if r.request_id != read {
            continue;
        }
        assert!(r.success);
        if !r.payload.is_empty() {
            let v = ReadBuffersResponseView::decode(&r.payload).unwrap();
            for s in v.slices() {
                packets += u64::from(s.unwrap().last_slice_for_packet());
            }
        }
        if !r.has_more {
            break;
        }
    }
    // The service's own packets come first; every producer packet committed before the read
    // is in the answer.
    assert!(
        packets >= ROUNDS * CHUNKS_PER_ROUND,
        "{packets} packets read"
    );
}

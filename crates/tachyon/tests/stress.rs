//! Real threads: 8 writers, a service thread, a small shared memory buffer so that writers run
//! out of chunks; every packet read must be one written (in order per sequence) and every packet
//! written must be read or counted lost, exactly.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{check_run, spawn_service, write_test_packet, Written};
use tachyon::backend::{commit_channel, ArbiterConfig, OwnedSmb, PageLayout, PageSize, SmbArbiter};
use tachyon::BufferExhaustedPolicy;

const THREADS: usize = 8;
const MAX_PACKET: usize = 16 * 1024;

struct Outcome {
    read: u64,
    dropped: u64,
    written: u64,
}

fn stress(
    smb_size: usize,
    page: PageSize,
    layout: PageLayout,
    policy: BufferExhaustedPolicy,
    packets_per_thread: u64,
) -> Outcome {
    let smb = Arc::new(OwnedSmb::new(smb_size, page).unwrap());
    let (sink, commits) = commit_channel();
    let config = ArbiterConfig {
        page_layout: Some(layout),
        buffer_exhausted_policy: policy,
    };
    // SAFETY: the test service only reads chunks it acquired (Complete → BeingRead); it never
    // scrapes.
    let arbiter = unsafe { SmbArbiter::new(Arc::clone(&smb), config, sink) };
    let service = spawn_service(smb, 256 << 20, commits);
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let arbiter = Arc::clone(&arbiter);
            std::thread::spawn(move || {
                let mut w = arbiter.create_trace_writer(0).unwrap();
                let mut written = Written {
                    writer_id: w.writer_id(),
                    seed: 0x5eed_0000 + t as u64,
                    ..Written::default()
                };
                for seq in 0..packets_per_thread {
                    let dropped = write_test_packet(&mut w, written.seed, seq, MAX_PACKET);
                    written.dropped.push(dropped);
                }
                written.stats = w.stats();
                written
            })
        })
        .collect();
    let written: Vec<Written> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let stats = arbiter.stats();
    drop(arbiter);
    let mut service = service.join().unwrap();
    let dropped: u64 = written.iter().map(|w| w.stats.packets_dropped).sum();
    assert_eq!(stats.packets_dropped, dropped);
    assert_eq!(stats.active_writers, 0);
    let read = check_run(&mut service, &written, MAX_PACKET, true);
    Outcome {
        read,
        dropped,
        written: written.iter().map(|w| w.stats.packets).sum(),
    }
}

#[test]
fn eight_threads_stall_then_drop_on_a_tiny_buffer() {
    // 4 chunks for 8 writers.
    let o = stress(
        16 * 1024,
        PageSize::Kib4,
        PageLayout::Div1,
        BufferExhaustedPolicy::StallThenDrop {
            timeout: Duration::from_micros(200),
        },
        1500,
    );
    assert_eq!(o.written, 8 * 1500);
    assert!(o.dropped > 0, "the buffer is too small not to drop");
    assert_eq!(o.read + o.dropped, o.written);
}

#[test]
fn eight_threads_drop_on_a_tiny_buffer_with_small_chunks() {
    let o = stress(
        16 * 1024,
        PageSize::Kib4,
        PageLayout::Div7,
        BufferExhaustedPolicy::Drop,
        1500,
    );
    assert!(o.dropped > 0);
    assert_eq!(o.read + o.dropped, o.written);
}

#[test]
fn eight_threads_stall_on_a_small_buffer_and_lose_nothing() {
    // 8 chunks of 32 KiB pages split 7 ways = 56 chunks; waiting writers hold no chunk, so
    // every wait ends as soon as the service frees one.
    let o = stress(
        256 * 1024,
        PageSize::Kib32,
        PageLayout::Div7,
        BufferExhaustedPolicy::Stall {
            timeout: Duration::from_secs(20),
        },
        1000,
    );
    assert_eq!(o.dropped, 0);
    assert_eq!(o.read, o.written);
}

#[test]
fn eight_threads_stall_with_fewer_chunks_than_writers() {
    // 2 chunks for 8 writers: a writer that held its chunk while waiting would deadlock the
    // others until the timeout; here they take turns.
    let o = stress(
        8 * 1024,
        PageSize::Kib4,
        PageLayout::Div1,
        BufferExhaustedPolicy::Stall {
            timeout: Duration::from_secs(20),
        },
        300,
    );
    assert_eq!(o.dropped, 0);
    assert_eq!(o.read, o.written);
}

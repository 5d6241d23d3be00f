//! Thread-local writers flush when their thread exits: threads write through
//! `SmbArbiter::with_thread_writer`, never flush, exit; the service still gets every packet.

mod common;

use std::sync::Arc;

use common::{check_run, spawn_service, write_test_packet, Written};
use tachyon::backend::{commit_channel, ArbiterConfig, OwnedSmb, PageSize, SmbArbiter};

#[test]
fn writers_of_exiting_threads_flush_everything() {
    let smb = Arc::new(OwnedSmb::new(4 << 20, PageSize::Kib4).unwrap());
    let (sink, commits) = commit_channel();
    // SAFETY: the service below only reads chunks it acquired; it never scrapes.
    let arbiter = unsafe { SmbArbiter::new(Arc::clone(&smb), ArbiterConfig::default(), sink) };
    let service = spawn_service(smb, 64 << 20, commits);
    let threads: Vec<_> = (0..6u64)
        .map(|t| {
            let arbiter = Arc::clone(&arbiter);
            std::thread::spawn(move || {
                let seed = 0x7000 + t;
                let mut dropped = Vec::new();
                // Small packets, a few chunks at most: each thread's last chunk is committed
                // only by the flush at thread exit.
                for seq in 0..(5 + t * 40) {
                    let d = arbiter
                        .with_thread_writer(0, |w| write_test_packet(w, seed, seq, 256))
                        .expect("a writer");
                    dropped.push(d);
                }
                let (writer_id, stats) = arbiter
                    .with_thread_writer(0, |w| (w.writer_id(), w.stats()))
                    .unwrap();
                Written {
                    writer_id,
                    seed,
                    dropped,
                    stats,
                }
                // No flush: the thread-local writer is dropped when the thread exits.
            })
        })
        .collect();
    let written: Vec<Written> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(
        arbiter.active_writers(),
        0,
        "every thread's writer was dropped"
    );
    drop(arbiter);
    let mut service = service.join().unwrap();
    let total: u64 = written.iter().map(|w| w.stats.packets).sum();
    assert_eq!(
        written.iter().map(|w| w.stats.packets_dropped).sum::<u64>(),
        0
    );
    assert_eq!(check_run(&mut service, &written, 256, true), total);
}

#[test]
fn a_closed_arbiter_releases_this_threads_writer_on_next_use() {
    let smb = Arc::new(OwnedSmb::new(64 * 1024, PageSize::Kib4).unwrap());
    let (sink, commits) = commit_channel();
    // SAFETY: nothing scrapes the buffer.
    let arbiter = unsafe { SmbArbiter::new(smb, ArbiterConfig::default(), sink) };
    arbiter.with_thread_writer(0, |w| w.write_packet(|p| p.set_timestamp(1)));
    assert_eq!(arbiter.active_writers(), 1);
    assert_eq!(commits.try_recv(), Ok(None));
    arbiter.close();
    assert!(arbiter.with_thread_writer(0, |_| ()).is_none());
    assert_eq!(arbiter.active_writers(), 0);
    assert_eq!(commits.try_recv().unwrap().unwrap().chunks_to_move.len(), 1);
}

//! The hot path does not allocate: starting, writing and finishing packets inside a chunk makes
//! no heap allocation (checked with a counting global allocator). Handing a chunk back does (the
//! commit's vector), once per chunk.

mod counting_alloc;

use std::sync::Arc;

use counting_alloc::allocs;
use tachyon::backend::{commit_channel, ArbiterConfig, OwnedSmb, PageSize, SmbArbiter};
use tachyon_protos::track_event;

#[test]
fn packets_within_a_chunk_do_not_allocate() {
    let smb = Arc::new(OwnedSmb::new(1 << 20, PageSize::Kib32).unwrap());
    let (sink, commits) = commit_channel();
    // SAFETY: nothing scrapes the buffer.
    let arbiter = unsafe { SmbArbiter::new(smb, ArbiterConfig::default(), sink) };
    let mut w = arbiter.create_trace_writer(0).unwrap();
    let write = |w: &mut tachyon::backend::TraceWriter, i: u64| {
        w.write_packet(|p| {
            p.set_timestamp(1_000_000 + i);
            let mut e = p.set_track_event();
            e.set_type(track_event::Type::SliceBegin);
            e.set_track_uuid(0x1234_5678);
            e.set_name_iid(i % 16);
        });
    };
    // First packet: takes the first chunk.
    write(&mut w, 0);
    let before = allocs();
    // 100 packets of ~22 bytes stay in the 4680-byte chunk of a 32 KiB page split 7 ways.
    for i in 1..=100 {
        write(&mut w, i);
    }
    assert_eq!(allocs() - before, 0, "the hot path allocated");
    assert_eq!(w.stats().chunks_committed, 0);

    // Crossing chunks allocates once per commit (its Vec), nothing per packet.
    let before = allocs();
    for i in 0..2000 {
        write(&mut w, i);
    }
    let commits_made = w.stats().chunks_committed;
    assert!(commits_made >= 5);
    let per_commit = (allocs() - before) as f64 / commits_made as f64;
    assert!(per_commit <= 2.0, "{per_commit} allocations per chunk");
    drop(w);
    drop(commits);
}

//! `TraceBuffer::prefault`: a prefaulted buffer's first pass takes no page faults (the faults
//! are counted from `/proc/thread-self/stat`; the test is skipped where that is missing).

use tachyon_service::{ChunkToCopy, FillPolicy, TraceBuffer};

/// This thread's minor page faults so far (field 10 of `/proc/thread-self/stat`).
fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // The command name (field 2) may hold spaces: count from the ')' that ends it.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(7)?.parse().ok()
}

/// Whether transparent huge pages are always on (then a fresh buffer faults once per 2 MiB,
/// not per page, and only the prefaulted side of the comparison means anything).
fn thp_always() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]"))
}

/// Copies chunks of 4 KiB into a 16 MiB buffer until it is full once; the page faults taken,
/// and whether the buffer asked for huge pages.
fn faults_of_first_pass(prefault: bool) -> Option<(u64, bool)> {
    const SIZE: usize = 16 << 20;
    const CHUNK: usize = 4096;
    // Zone ends as the SDK writes them: 1-byte fragment header, 9-byte packet.
    let mut payload = Vec::new();
    while payload.len() + 10 <= CHUNK {
        payload.extend_from_slice(&[9, 0x08, 0x01, 0x10, 0x02, 0x18, 0x03, 0x20, 0x04, 0x28]);
    }
    payload.resize(CHUNK, 0);
    let fragments = (CHUNK / 10) as u16;
    let mut buf = TraceBuffer::new(SIZE, FillPolicy::RingBuffer);
    if prefault {
        buf.prefault();
    }
    let before = minor_faults()?;
    for id in 0..(SIZE / CHUNK) as u32 {
        buf.copy_chunk(&ChunkToCopy {
            producer: 1,
            writer: 1,
            chunk_id: id,
            num_fragments: fragments,
            flags: 0,
            payload: &payload,
            complete: true,
        });
    }
    let after = minor_faults()?;
    assert_eq!(buf.stats().chunks_written, (SIZE / CHUNK) as u64);
    Some((after - before, buf.asked_for_huge_pages()))
}

#[test]
fn a_prefaulted_buffer_takes_no_page_faults_on_its_first_pass() {
    let (Some((lazy, lazy_huge)), Some((prefaulted, _))) =
        (faults_of_first_pass(false), faults_of_first_pass(true))
    else {
        eprintln!("skipped: no /proc/thread-self/stat");
        return;
    };
    eprintln!(
        "first pass over 4096 pages: {lazy} faults lazily (huge pages asked for: {lazy_huge}), \
         {prefaulted} prefaulted"
    );
    if !thp_always() && !lazy_huge {
        // One per page of the ring (the bookkeeping's own growth adds a few).
        assert!(lazy >= 4096, "{lazy}");
    }
    // Only the bookkeeping's growth is left.
    assert!(prefaulted < 256, "{prefaulted}");
}

/// The first pass maps the ring's pages a batch ahead of the writes (`MADV_POPULATE_WRITE`),
/// not all at once: a 64 MiB buffer that has taken 16 chunks has committed well under a MiB,
/// so a session's memory still grows with what it holds, as Perfetto's lazily committed
/// buffers do. (Pages mapped by `madvise` count as the thread's faults too, so the faults
/// bound what was committed: in 4 KiB pages. A ring that asked for huge pages commits 2 MiB a
/// fault, and then at most one huge page beyond the writes' batch.)
#[test]
fn a_fresh_buffer_commits_its_pages_only_a_batch_ahead_of_its_writes() {
    const CHUNK: usize = 4096;
    let payload = vec![0u8; CHUNK];
    let Some(before) = minor_faults() else {
        eprintln!("skipped: no /proc/thread-self/stat");
        return;
    };
    let mut buf = TraceBuffer::new(64 << 20, FillPolicy::RingBuffer);
    for id in 0..16u32 {
        buf.copy_chunk(&ChunkToCopy {
            producer: 1,
            writer: 1,
            chunk_id: id,
            num_fragments: 0,
            flags: 0,
            payload: &payload,
            complete: true,
        });
    }
    let faults = minor_faults().expect("read before") - before;
    eprintln!("16 chunks into a fresh 64 MiB buffer: {faults} faults");
    assert_eq!(buf.stats().chunks_written, 16);
    if !thp_always() {
        // 16 chunks' pages and one batch of 64 ahead, the bookkeeping's growth: far below
        // the 16 384 pages of the whole ring.
        assert!(faults < 256, "{faults}");
    }
}

/// A buffer whose read-out keeps up (a session streaming into a file) writes into the pages it
/// wrote before: once everything in the ring was read, the next chunk goes to the ring's start
/// again, so 16 MiB through a fresh 64 MiB buffer, read every 64 chunks, maps about 64 chunks'
/// pages and a batch, not the 4 096 pages a pass over 16 MiB of fresh ring would. Every packet
/// is read once, none is counted lost.
#[test]
fn a_buffer_read_as_fast_as_it_is_written_stays_in_the_pages_it_mapped() {
    const CHUNK: usize = 4096;
    const ROUNDS: u32 = 64;
    const PER_ROUND: u32 = 64;
    let mut payload = Vec::new();
    while payload.len() + 10 <= CHUNK {
        payload.extend_from_slice(&[9, 0x08, 0x01, 0x10, 0x02, 0x18, 0x03, 0x20, 0x04, 0x28]);
    }
    payload.resize(CHUNK, 0);
    let fragments = (CHUNK / 10) as u16;
    let mut buf = TraceBuffer::new(64 << 20, FillPolicy::RingBuffer);
    let Some(before) = minor_faults() else {
        eprintln!("skipped: no /proc/thread-self/stat");
        return;
    };
    let mut read = 0u64;
    for round in 0..ROUNDS {
        for i in 0..PER_ROUND {
            buf.copy_chunk(&ChunkToCopy {
                producer: 1,
                writer: 1,
                chunk_id: round * PER_ROUND + i,
                num_fragments: fragments,
                flags: 0,
                payload: &payload,
                complete: true,
            });
        }
        buf.read_packets(false, |_, frags| {
            assert_eq!(frags.concat().len(), 9);
            read += 1;
        });
    }
    let faults = minor_faults().expect("read before") - before;
    eprintln!("16 MiB read as written through a fresh 64 MiB buffer: {faults} faults");
    assert_eq!(read, u64::from(ROUNDS * PER_ROUND) * u64::from(fragments));
    assert_eq!(buf.losses().total(), 0);
    assert_eq!(buf.stats().chunks_overwritten, 0);
    if !thp_always() {
        assert!(faults < 1024, "{faults}");
    }
}

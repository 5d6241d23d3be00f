//! Real threads: several producers and one service thread over one buffer, thousands of chunks,
//! every chunk counted exactly once; and a hostile thread scribbling over the buffer while the
//! service works.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tachyon_abi::{
    encode_fragment_header, AbiError, ChunkHeader, Fragment, OwnedSmb, PageLayout, PageSize,
};

const PRODUCERS: u16 = 4;
const CHUNKS_PER_PRODUCER: u32 = if cfg!(miri) { 20 } else { 2500 };
const PAGES: usize = 8;

/// Packet `k` of chunk `chunk_id` of `writer`: a few bytes that say where they come from.
fn packet(writer: u16, chunk_id: u32, k: u16) -> Vec<u8> {
    let len = 3 + (chunk_id as usize + usize::from(k)) % 29;
    (0..len)
        .map(|i| (usize::from(writer) * 31 + chunk_id as usize * 7 + usize::from(k) * 3 + i) as u8)
        .collect()
}

fn packets_in(chunk_id: u32) -> u16 {
    1 + (chunk_id % 5) as u16
}

/// Producer: writes its chunks with ids 0..n, `packets_in(id)` packets each, counting each
/// packet before writing it and inflating the count after the last one (padding with an empty
/// packet), like Perfetto's TraceWriter.
fn produce(smb: &OwnedSmb, writer: u16) {
    let abi = smb.producer();
    let layouts = PageLayout::PARTITIONED;
    let mut page = usize::from(writer) % PAGES;
    let deadline = Instant::now() + Duration::from_secs(60);
    for chunk_id in 0..CHUNKS_PER_PRODUCER {
        let layout = layouts[(usize::from(writer) + chunk_id as usize) % layouts.len()];
        let mut chunk = loop {
            match abi.try_acquire_any_chunk_for_writing(
                page,
                layout,
                ChunkHeader::new(writer, chunk_id),
            ) {
                Ok(chunk) => break chunk,
                Err(
                    AbiError::NoFreeChunk | AbiError::PageNotPartitioned | AbiError::Contention,
                ) => {
                    page = (page + 1) % PAGES;
                    assert!(Instant::now() < deadline, "producer {writer} starved");
                    thread::yield_now();
                }
                Err(e) => panic!("producer {writer}: {e}"),
            }
        };
        let mut at = 0;
        for k in 0..packets_in(chunk_id) {
            chunk.increment_packet_count().unwrap();
            let data = packet(writer, chunk_id, k);
            chunk
                .write_payload(at, &encode_fragment_header(data.len() as u32).unwrap())
                .unwrap();
            chunk.write_payload(at + 4, &data).unwrap();
            at += 4 + data.len();
        }
        chunk.increment_packet_count().unwrap();
        chunk.write_payload(at, &[0]).unwrap();
        abi.release_chunk_as_complete(chunk).unwrap();
    }
}

/// Checks the fragments of a chunk of `writer`/`chunk_id`: all `expected` packets, then the
/// empty padding packet if `padded`.
fn check_packets(frags: &[Fragment<'_>], writer: u16, chunk_id: u32, expected: usize) {
    for (k, f) in frags.iter().enumerate().take(expected) {
        assert_eq!(
            *f,
            Fragment::Data(&packet(writer, chunk_id, k as u16)),
            "w{writer} c{chunk_id} p{k}"
        );
    }
    if frags.len() > expected {
        assert_eq!(frags[expected], Fragment::Data(b""));
        assert_eq!(frags.len(), expected + 1);
    }
}

#[test]
fn producers_and_a_reader_count_every_chunk_once() {
    let smb = Arc::new(OwnedSmb::new(PAGES * 4096, PageSize::Kib4).unwrap());
    let producers: Vec<_> = (1..=PRODUCERS)
        .map(|w| {
            let smb = smb.clone();
            thread::spawn(move || produce(&smb, w))
        })
        .collect();

    let service = smb.service();
    let total = usize::from(PRODUCERS) * CHUNKS_PER_PRODUCER as usize;
    let mut seen = vec![vec![false; CHUNKS_PER_PRODUCER as usize]; usize::from(PRODUCERS) + 1];
    let mut read = 0;
    let mut scraped = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut round = 0u64;
    while read < total {
        assert!(
            Instant::now() < deadline,
            "reader stalled at {read}/{total}"
        );
        round += 1;
        for page in 0..PAGES {
            for idx in 0..14 {
                // Every few rounds, scrape instead: honest chunks must always parse.
                if round % 4 == 0 {
                    if let Ok(Some(copy)) = service.scrape_chunk(page, idx) {
                        let h = copy.header();
                        let frags: Vec<_> = copy.fragments().collect::<Result<_, _>>().unwrap();
                        let expected = usize::from(packets_in(h.chunk_id));
                        if copy.is_complete() {
                            assert_eq!(frags.len(), expected + 1);
                        }
                        check_packets(&frags, h.writer_id, h.chunk_id, expected);
                        scraped += 1;
                    }
                }
                let chunk = match service.try_acquire_chunk_for_reading(page, idx) {
                    Ok(chunk) => chunk,
                    Err(
                        AbiError::UnexpectedState { .. }
                        | AbiError::PageNotPartitioned
                        | AbiError::ChunkOutOfRange { .. }
                        | AbiError::Contention,
                    ) => continue,
                    Err(e) => panic!("reader: {e}"),
                };
                let copy = chunk.copy().unwrap();
                service.release_chunk_as_free(chunk).unwrap();
                let h = copy.header();
                let frags: Vec<_> = copy.fragments().collect::<Result<_, _>>().unwrap();
                let expected = usize::from(packets_in(h.chunk_id));
                assert_eq!(frags.len(), expected + 1);
                check_packets(&frags, h.writer_id, h.chunk_id, expected);
                let slot = &mut seen[usize::from(h.writer_id)][h.chunk_id as usize];
                assert!(
                    !*slot,
                    "chunk {} of writer {} read twice",
                    h.chunk_id, h.writer_id
                );
                *slot = true;
                read += 1;
            }
        }
    }
    for p in producers {
        p.join().unwrap();
    }
    assert!(seen[1..].iter().all(|w| w.iter().all(|&s| s)));
    for page in 0..PAGES {
        assert!(
            smb.producer().is_page_free(page).unwrap(),
            "page {page} not returned"
        );
    }
    eprintln!("read {read} chunks, scraped {scraped}");
}

/// A hostile "producer" thread overwrites page headers and chunk bytes with random values while
/// the service keeps acquiring, copying, parsing, scraping and freeing: it must only ever get
/// errors, never panic.
#[test]
fn hostile_writer_cannot_crash_the_service() {
    let smb = Arc::new(OwnedSmb::new(4 * 8192, PageSize::Kib8).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let hostile = {
        let (smb, stop) = (smb.clone(), stop.clone());
        thread::spawn(move || {
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            let words = smb.words();
            while !stop.load(Ordering::Relaxed) {
                // xorshift
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let target = (x >> 32) as usize;
                let value = x as u32;
                let idx = if target % 3 == 0 {
                    // A page header: mostly plausible layouts and states.
                    (target % 4) * 2048
                } else {
                    target % words.len()
                };
                let value = if target % 3 == 0 {
                    value & 0x7FFF_FFFF
                } else {
                    value
                };
                words[idx].store(value, Ordering::Relaxed);
            }
        })
    };
    let service = smb.service();
    let mut ok = 0u64;
    let mut errors = 0u64;
    let iterations = if cfg!(miri) { 10 } else { 20_000 };
    for i in 0..iterations {
        let page = i % 4;
        for idx in 0..14 {
            match service.try_acquire_chunk_for_reading(page, idx) {
                Ok(chunk) => {
                    match chunk.copy() {
                        Ok(copy) => {
                            for f in copy.fragments() {
                                if f.is_err() {
                                    errors += 1;
                                }
                            }
                            ok += 1;
                        }
                        Err(_) => errors += 1,
                    }
                    if service.release_chunk_as_free(chunk).is_err() {
                        errors += 1;
                    }
                }
                Err(_) => errors += 1,
            }
            match service.scrape_chunk(page, idx) {
                Ok(Some(copy)) => {
                    let _ = copy.fragments().count();
                }
                Ok(None) => {}
                Err(_) => errors += 1,
            }
        }
        if let Ok(all) = service.try_acquire_all_chunks_for_reading(page) {
            for chunk in all {
                let _ = chunk.copy();
                let _ = service.release_chunk_as_free(chunk);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    hostile.join().unwrap();
    eprintln!("hostile: {ok} chunks copied, {errors} errors");
}

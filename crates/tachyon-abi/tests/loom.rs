//! Loom models of the chunk hand-off protocol.
//!
//! Run with `.ci/loom.sh`, i.e.
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p tachyon-abi --test loom --release`.
//!
//! Each chunk has a *ghost* cell next to the buffer (a `loom::cell::UnsafeCell` holding who
//! owns the chunk). Whoever acquires a chunk through the ABI writes the ghost cell; loom fails
//! the model if two threads touch it without a happens-before edge between them, and the
//! asserts fail if the ghost state disagrees with the transition. So the models check both that
//! no chunk is ever owned twice and that the page-word orderings really publish the chunk's
//! contents.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use tachyon_abi::{
    encode_fragment_header, AbiError, ChunkHeader, Fragment, Fragments, OwnedSmb, PageLayout,
    PageSize, ServiceView, SharedMemoryAbi,
};

/// Ghost ownership of one chunk, mirrored by the threads that hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ghost {
    Free,
    Writing(u16),
    Complete(u16),
    Reading(u16),
}

struct Model {
    smb: OwnedSmb,
    ghosts: Vec<UnsafeCell<Ghost>>,
}

impl Model {
    fn new(num_chunks: usize) -> Arc<Model> {
        Arc::new(Model {
            smb: OwnedSmb::new(4096, PageSize::Kib4).unwrap(),
            ghosts: (0..num_chunks)
                .map(|_| UnsafeCell::new(Ghost::Free))
                .collect(),
        })
    }

    fn ghost_transition(&self, chunk_idx: usize, from: Ghost, to: Ghost) {
        self.ghosts[chunk_idx].with_mut(|g| {
            // SAFETY: the chunk's ABI state says this thread owns it; loom checks that claim.
            let g = unsafe { &mut *g };
            assert_eq!(*g, from, "chunk {chunk_idx} ghost state");
            *g = to;
        });
    }
}

/// Producer: take any chunk of page 0 (partitioning it with `layout` if free), write one
/// packet carrying `writer_id`, complete it.
fn produce_one(
    model: &Model,
    producer: SharedMemoryAbi<'_>,
    layout: PageLayout,
    writer_id: u16,
    chunk_id: u32,
) {
    let mut chunk = loop {
        match producer.try_acquire_any_chunk_for_writing(
            0,
            layout,
            ChunkHeader::new(writer_id, chunk_id),
        ) {
            Ok(chunk) => break chunk,
            Err(AbiError::NoFreeChunk | AbiError::PageNotPartitioned) => thread::yield_now(),
            Err(e) => panic!("producer: {e}"),
        }
    };
    let idx = chunk.chunk_idx();
    model.ghost_transition(idx, Ghost::Free, Ghost::Writing(writer_id));
    chunk.increment_packet_count().unwrap();
    chunk.write_payload(0, &[1, writer_id as u8]).unwrap();
    model.ghost_transition(idx, Ghost::Writing(writer_id), Ghost::Complete(writer_id));
    producer.release_chunk_as_complete(chunk).unwrap();
}

/// Service: scan page 0 until `expected` chunks have been read; returns `(writer, chunk_id)` of
/// each, in read order.
fn consume(
    model: &Model,
    service: ServiceView<'_>,
    num_chunks: usize,
    expected: usize,
) -> Vec<(u16, u32)> {
    let mut read = Vec::new();
    while read.len() < expected {
        let mut progressed = false;
        for idx in 0..num_chunks {
            let chunk = match service.try_acquire_chunk_for_reading(0, idx) {
                Ok(chunk) => chunk,
                Err(
                    AbiError::UnexpectedState { .. }
                    | AbiError::PageNotPartitioned
                    | AbiError::ChunkOutOfRange { .. },
                ) => continue,
                Err(e) => panic!("service: {e}"),
            };
            // Read the header and the one packet rather than `copy()` the whole chunk: every
            // word loaded is a loom branch, and a 4 KiB chunk has a thousand of them (the
            // scraping model below covers `copy`).
            let header = chunk.header();
            let writer = header.writer_id;
            model.ghost_transition(idx, Ghost::Complete(writer), Ghost::Reading(writer));
            let mut payload = [0; 2];
            chunk.read_payload(0, &mut payload).unwrap();
            let frags: Vec<_> = Fragments::new(&payload, header.packets.count())
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(frags, [Fragment::Data(&[writer as u8])]);
            read.push((writer, header.chunk_id));
            model.ghost_transition(idx, Ghost::Reading(writer), Ghost::Free);
            service.release_chunk_as_free(chunk).unwrap();
            progressed = true;
        }
        if !progressed {
            thread::yield_now();
        }
    }
    read
}

/// Two producers race for the two chunks of a Div2 page while the service reads and frees
/// them: each chunk is owned by one side at a time and each completed chunk is read once.
#[test]
fn two_producers_one_reader() {
    loom::model(|| {
        let model = Model::new(2);
        let producers: Vec<_> = (1..=2u16)
            .map(|writer| {
                let model = model.clone();
                thread::spawn(move || {
                    produce_one(&model, model.smb.producer(), PageLayout::Div2, writer, 0)
                })
            })
            .collect();
        let mut read = consume(&model, model.smb.service(), 2, 2);
        for p in producers {
            p.join().unwrap();
        }
        read.sort_unstable();
        assert_eq!(read, [(1, 0), (2, 0)]);
        // Both chunks freed: the page went back to unpartitioned.
        assert!(model.smb.producer().is_page_free(0).unwrap());
    });
}

/// One producer writes three chunks through a one-chunk page, so every chunk after the first
/// needs the service to free the page (bitmap back to 0) and the producer to partition it
/// again. Every chunk id must be read exactly once, in order.
#[test]
fn page_reuse_after_free() {
    loom::model(|| {
        let model = Model::new(1);
        let producer = {
            let model = model.clone();
            thread::spawn(move || {
                for chunk_id in 0..3 {
                    produce_one(&model, model.smb.producer(), PageLayout::Div1, 1, chunk_id);
                }
            })
        };
        let read = consume(&model, model.smb.service(), 1, 3);
        producer.join().unwrap();
        assert_eq!(read, [(1, 0), (1, 1), (1, 2)]);
    });
}

/// Scraping: the service copies a chunk the producer is still writing. The producer counts a
/// packet before writing it and inflates the count once it is finished, so whenever a scrape
/// sees a count of 2, packet 0 must be there in full.
///
/// The scraper runs in a spawned thread and looks twice without yielding; the producer is the
/// main thread. That shape matters for loom: its exploration reorders an access only against the
/// *last* dependent access to the same atomic, and `yield_now` stops a polling thread from
/// re-reading values it saw before yielding, so a yielding poller that starts first would never
/// be shown a stale payload. (Checked: weakening the count's `Release` store to `Relaxed` makes
/// this model fail.)
#[test]
fn scrape_sees_every_counted_packet() {
    loom::model(|| {
        let smb = Arc::new(OwnedSmb::new(4096, PageSize::Kib4).unwrap());
        let scraper = {
            let smb = smb.clone();
            thread::spawn(move || {
                let service = smb.service();
                for _ in 0..2 {
                    let copy = match service.scrape_chunk(0, 0) {
                        Ok(Some(copy)) => copy,
                        Ok(None) | Err(AbiError::PageNotPartitioned) => continue,
                        Err(e) => panic!("scrape: {e}"),
                    };
                    assert_eq!(copy.header().writer_id, 7);
                    assert_eq!(copy.header().chunk_id, 42);
                    let frags: Vec<_> = copy.fragments().collect::<Result<_, _>>().unwrap();
                    if copy.is_complete() {
                        assert_eq!(frags, [Fragment::Data(b"pkt0"), Fragment::Data(b"")]);
                    } else {
                        assert_eq!(frags, [Fragment::Data(b"pkt0")]);
                    }
                }
            })
        };
        let abi = smb.producer();
        // Div14 keeps the chunk at 71 words, so copying it stays within loom's branch budget.
        let mut chunk = abi
            .try_acquire_any_chunk_for_writing(0, PageLayout::Div14, ChunkHeader::new(7, 42))
            .unwrap();
        chunk.increment_packet_count().unwrap();
        chunk
            .write_payload(0, &encode_fragment_header(4).unwrap())
            .unwrap();
        chunk.write_payload(4, b"pkt0").unwrap();
        chunk.increment_packet_count().unwrap(); // inflation: packet 0 is finished
        chunk.write_payload(8, &[0]).unwrap(); // the padding packet
        abi.release_chunk_as_complete(chunk).unwrap();
        scraper.join().unwrap();
        // Once the producer is done the chunk is complete and readable in full.
        let service = smb.service();
        let chunk = service.try_acquire_chunk_for_reading(0, 0).unwrap();
        let copy = chunk.copy().unwrap();
        assert_eq!(copy.fragments().count(), 2);
        service.release_chunk_as_free(chunk).unwrap();
    });
}

//! Property tests: the service view over arbitrary bytes never panics, and whatever it hands out
//! lies inside the buffer; a random sequence of operations follows the state machine exactly.
#![cfg(not(loom))]

use std::sync::atomic::Ordering;

use proptest::prelude::*;
use tachyon_abi::{
    AbiError, ChunkHeader, ChunkState, Fragment, Fragments, HeaderBitmap, OwnedSmb, PageLayout,
    PageSize, MAX_CHUNKS_PER_PAGE,
};

fn page_size() -> impl Strategy<Value = PageSize> {
    prop::sample::select(PageSize::ALL.to_vec())
}

/// A page header bitmap: often well-formed (so the chunk paths get exercised), sometimes
/// partly or wholly random.
fn bitmap() -> impl Strategy<Value = u32> {
    prop_oneof![
        any::<u32>(),
        (0u32..8, any::<u32>()).prop_map(|(layout, states)| layout << 28 | (states & 0x0FFF_FFFF)),
        (1u32..6, any::<u32>()).prop_map(|(layout, states)| {
            let n = [0, 1, 2, 4, 7, 14][layout as usize];
            let mask = if n == 14 {
                0x0FFF_FFFF
            } else {
                (1u32 << (2 * n)) - 1
            };
            layout << 28 | (states & mask)
        }),
    ]
}

/// Bytes for chunk headers and payloads, biased towards small varints, continuation bytes and
/// the drop sentinel so that fragment parsing goes beyond the first byte.
fn byte() -> impl Strategy<Value = u8> {
    prop_oneof![any::<u8>(), 0u8..8, Just(0x80), Just(0xFF), Just(0x7F)]
}

/// The same distribution as [`byte`], drawn from a seed: a buffer is up to 96 KiB, too many
/// values to draw one by one through proptest.
fn fill_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let r = (x >> 24) as u32;
            match r % 5 {
                0 => (r >> 8) as u8,
                1 => (r >> 8) as u8 % 8,
                2 => 0x80,
                3 => 0xFF,
                _ => 0x7F,
            }
        })
        .collect()
}

fn smb_contents() -> impl Strategy<Value = (PageSize, usize, Vec<u32>, u64)> {
    (page_size(), 1usize..4).prop_flat_map(|(page, pages)| {
        (
            Just(page),
            Just(pages),
            prop::collection::vec(bitmap(), pages),
            any::<u64>(),
        )
    })
}

fn fill(page: PageSize, pages: usize, bitmaps: &[u32], seed: u64) -> OwnedSmb {
    let smb = OwnedSmb::new(page.bytes() * pages, page).unwrap();
    let bytes = fill_bytes(seed, smb.size());
    for (w, b) in smb.words().iter().zip(bytes.chunks_exact(4)) {
        w.store(
            u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Ordering::Relaxed,
        );
    }
    for (p, &bm) in bitmaps.iter().enumerate() {
        smb.words()[p * page.bytes() / 4].store(bm, Ordering::Relaxed);
    }
    smb
}

/// Checks every fragment slice lies within `payload`.
fn check_fragments(payload: &[u8], fragments: Fragments<'_>) {
    let range = payload.as_ptr_range();
    for f in fragments {
        if let Ok(Fragment::Data(d)) = f {
            let r = d.as_ptr_range();
            assert!(range.start <= r.start && r.end <= range.end);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever the producer wrote, every service operation returns, never panics, and every
    /// chunk range, copy and fragment lies inside the buffer.
    #[test]
    fn service_view_never_panics_on_random_memory((page, pages, bitmaps, seed) in smb_contents()) {
        let smb = fill(page, pages, &bitmaps, seed);
        let s = smb.service();
        for p in 0..=pages {
            let _ = s.page_header(p);
            let layout = s.page_layout(p);
            let page_start = p * page.bytes();
            for c in 0..=MAX_CHUNKS_PER_PAGE + 1 {
                if let Ok(r) = s.chunk_range(p, c) {
                    let layout = layout.unwrap();
                    prop_assert!(c < layout.num_chunks());
                    prop_assert!(r.start >= page_start + 8);
                    prop_assert!(r.end <= page_start + page.bytes());
                    prop_assert!(r.end <= s.size());
                    prop_assert_eq!(r.len(), page.chunk_size(layout));
                }
                if let Ok(Some(copy)) = s.scrape_chunk(p, c) {
                    prop_assert_eq!(copy.payload().len(), s.chunk_range(p, c).unwrap().len() - 8);
                    check_fragments(copy.payload(), copy.fragments());
                }
                if let Ok(chunk) = s.try_acquire_chunk_for_reading(p, c) {
                    prop_assert!(chunk.size() <= page.bytes() - 8);
                    if let Ok(copy) = chunk.copy() {
                        prop_assert!(copy.header().validate(copy.payload().len()).is_ok());
                        check_fragments(copy.payload(), copy.fragments());
                    }
                    let mut small = [0u8; 16];
                    let _ = chunk.copy_into(&mut small);
                    let _ = chunk.read_payload(chunk.payload_size() - 3, &mut small[..3]);
                    prop_assert!(s.release_chunk_as_free(chunk).is_ok());
                }
            }
            if let Ok(all) = s.try_acquire_all_chunks_for_reading(p) {
                for chunk in all {
                    let _ = chunk.copy();
                    prop_assert!(s.release_chunk_as_free(chunk).is_ok());
                }
            }
        }
        // The producer view copes with the same garbage.
        let prod = smb.producer();
        for p in 0..=pages {
            let _ = prod.free_chunks(p);
            let _ = prod.is_page_complete(p);
            let header = ChunkHeader::new(1, 0);
            if let Ok(chunk) = prod.try_acquire_any_chunk_for_writing(p, PageLayout::Div4, header) {
                prop_assert!(prod.release_chunk_as_complete(chunk).is_ok());
            }
        }
    }

    /// The fragment parser on any payload and count.
    #[test]
    fn fragments_never_panic(
        payload in prop::collection::vec(byte(), 0..600),
        count in any::<u16>(),
    ) {
        let mut n = 0usize;
        let mut end = 0;
        let mut errors = 0;
        let mut it = Fragments::new(&payload, count);
        for f in it.by_ref() {
            n += 1;
            match f {
                Ok(Fragment::Data(d)) => {
                    let start = d.as_ptr() as usize - payload.as_ptr() as usize;
                    prop_assert!(start >= end && start + d.len() <= payload.len());
                    end = start + d.len();
                }
                Ok(Fragment::Dropped) => {}
                Err(_) => errors += 1,
            }
        }
        prop_assert!(n <= usize::from(count));
        prop_assert!(errors <= 1);
        prop_assert!(it.offset() <= payload.len());
        prop_assert!(it.next().is_none());
    }

    /// Decoding any 8 bytes as headers and encoding them back is the identity.
    #[test]
    fn header_roundtrip(bytes in any::<[u8; 8]>()) {
        let chunk = ChunkHeader::from_bytes(bytes);
        prop_assert_eq!(chunk.to_bytes(), bytes);
        let page = tachyon_abi::PageHeader::from_bytes(bytes);
        prop_assert_eq!(page.to_bytes(), bytes);
        let _ = HeaderBitmap(page.header_bitmap.0).validate();
    }
}

// === model-based: a random sequence of operations against a reference state machine ===

#[derive(Clone, Debug)]
enum Op {
    Partition(usize, PageLayout),
    AcquireWrite(usize, usize),
    AcquireAny(usize, PageLayout),
    Complete(usize),
    AcquireRead(usize, usize),
    AcquireAll(usize),
    Free(usize),
    Scrape(usize, usize),
}

fn layout() -> impl Strategy<Value = PageLayout> {
    prop::sample::select(PageLayout::PARTITIONED.to_vec())
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..3, layout()).prop_map(|(p, l)| Op::Partition(p, l)),
        (0usize..3, 0usize..15).prop_map(|(p, c)| Op::AcquireWrite(p, c)),
        (0usize..3, layout()).prop_map(|(p, l)| Op::AcquireAny(p, l)),
        any::<usize>().prop_map(Op::Complete),
        (0usize..3, 0usize..15).prop_map(|(p, c)| Op::AcquireRead(p, c)),
        (0usize..3).prop_map(Op::AcquireAll),
        any::<usize>().prop_map(Op::Free),
        (0usize..3, 0usize..15).prop_map(|(p, c)| Op::Scrape(p, c)),
    ]
}

/// Reference model of one page: its layout and chunk states.
#[derive(Clone, Debug, PartialEq)]
struct PageModel {
    layout: PageLayout,
    states: Vec<ChunkState>,
}

impl PageModel {
    fn free() -> Self {
        PageModel {
            layout: PageLayout::NotPartitioned,
            states: Vec::new(),
        }
    }

    fn partitioned(layout: PageLayout) -> Self {
        PageModel {
            layout,
            states: vec![ChunkState::Free; layout.num_chunks()],
        }
    }

    fn position(&self, state: ChunkState) -> Option<usize> {
        self.states.iter().position(|s| *s == state)
    }

    fn bitmap(&self) -> u32 {
        let mut b = HeaderBitmap::partitioned(self.layout);
        for (i, s) in self.states.iter().enumerate() {
            b = b.with_chunk_state(i, *s);
        }
        b.0
    }

    fn after_free(&mut self) {
        if self.states.iter().all(|s| *s == ChunkState::Free) {
            *self = PageModel::free();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn operations_follow_the_state_machine(ops in prop::collection::vec(op(), 1..80)) {
        let smb = OwnedSmb::new(3 * 4096, PageSize::Kib4).unwrap();
        let (p, s) = (smb.producer(), smb.service());
        let mut pages = vec![PageModel::free(); 3];
        let mut writing = Vec::new();
        let mut reading = Vec::new();
        let mut next_id = 0u32;
        for op in ops {
            match op {
                Op::Partition(pg, layout) => {
                    let free = pages[pg].layout == PageLayout::NotPartitioned;
                    prop_assert_eq!(p.try_partition_page(pg, layout).unwrap(), free);
                    if free {
                        pages[pg] = PageModel::partitioned(layout);
                    }
                }
                Op::AcquireWrite(pg, c) => {
                    next_id += 1;
                    let got = p.try_acquire_chunk_for_writing(pg, c, ChunkHeader::new(1, next_id));
                    let model = &mut pages[pg];
                    match model.states.get(c) {
                        Some(ChunkState::Free) => {
                            let chunk = got.unwrap();
                            prop_assert_eq!(chunk.header().chunk_id, next_id);
                            model.states[c] = ChunkState::BeingWritten;
                            writing.push(chunk);
                        }
                        Some(&found) => prop_assert_eq!(
                            got.unwrap_err(),
                            AbiError::UnexpectedState { expected: ChunkState::Free, found }
                        ),
                        None if model.layout == PageLayout::NotPartitioned => {
                            prop_assert_eq!(got.unwrap_err(), AbiError::PageNotPartitioned)
                        }
                        None => {
                            let out_of_range = matches!(got, Err(AbiError::ChunkOutOfRange { .. }));
                            prop_assert!(out_of_range);
                        }
                    }
                }
                Op::AcquireAny(pg, layout) => {
                    next_id += 1;
                    let header = ChunkHeader::new(2, next_id);
                    let got = p.try_acquire_any_chunk_for_writing(pg, layout, header);
                    let model = &mut pages[pg];
                    if model.layout == PageLayout::NotPartitioned {
                        *model = PageModel::partitioned(layout);
                    }
                    match model.position(ChunkState::Free) {
                        Some(i) => {
                            let chunk = got.unwrap();
                            prop_assert_eq!(chunk.chunk_idx(), i);
                            prop_assert_eq!(chunk.layout(), model.layout);
                            model.states[i] = ChunkState::BeingWritten;
                            writing.push(chunk);
                        }
                        None => prop_assert_eq!(got.unwrap_err(), AbiError::NoFreeChunk),
                    }
                }
                Op::Complete(k) => {
                    if !writing.is_empty() {
                        let chunk = writing.swap_remove(k % writing.len());
                        let (pg, c) = (chunk.page_idx(), chunk.chunk_idx());
                        p.release_chunk_as_complete(chunk).unwrap();
                        pages[pg].states[c] = ChunkState::Complete;
                    }
                }
                Op::AcquireRead(pg, c) => {
                    let got = s.try_acquire_chunk_for_reading(pg, c);
                    let model = &mut pages[pg];
                    match model.states.get(c) {
                        Some(ChunkState::Complete) => {
                            reading.push(got.unwrap());
                            model.states[c] = ChunkState::BeingRead;
                        }
                        Some(&found) => prop_assert_eq!(
                            got.unwrap_err(),
                            AbiError::UnexpectedState { expected: ChunkState::Complete, found }
                        ),
                        None => prop_assert!(got.is_err()),
                    }
                }
                Op::AcquireAll(pg) => {
                    let got = s.try_acquire_all_chunks_for_reading(pg);
                    let model = &mut pages[pg];
                    if model.layout == PageLayout::NotPartitioned {
                        prop_assert_eq!(got.unwrap_err(), AbiError::PageNotPartitioned);
                    } else if let Some(i) = model.position(ChunkState::BeingWritten) {
                        let err = AbiError::ChunkBeingWritten { chunk_idx: i };
                        prop_assert_eq!(got.unwrap_err(), err);
                    } else {
                        let taken: Vec<_> = got.unwrap().collect();
                        let want: Vec<usize> = (0..model.states.len())
                            .filter(|&i| model.states[i] == ChunkState::Complete)
                            .collect();
                        let taken_idx: Vec<_> = taken.iter().map(|c| c.chunk_idx()).collect();
                        prop_assert_eq!(taken_idx, want.clone());
                        for i in want {
                            model.states[i] = ChunkState::BeingRead;
                        }
                        reading.extend(taken);
                    }
                }
                Op::Free(k) => {
                    if !reading.is_empty() {
                        let chunk = reading.swap_remove(k % reading.len());
                        let (pg, c) = (chunk.page_idx(), chunk.chunk_idx());
                        s.release_chunk_as_free(chunk).unwrap();
                        pages[pg].states[c] = ChunkState::Free;
                        pages[pg].after_free();
                    }
                }
                Op::Scrape(pg, c) => {
                    let got = s.scrape_chunk(pg, c);
                    match pages[pg].states.get(c) {
                        // No packets were written, so only complete chunks come back.
                        Some(ChunkState::Complete) => {
                            let copy = got.unwrap().unwrap();
                            prop_assert!(copy.is_complete());
                        }
                        Some(_) => prop_assert_eq!(got.unwrap(), None),
                        None => prop_assert!(got.is_err()),
                    }
                }
            }
            for (pg, model) in pages.iter().enumerate() {
                prop_assert_eq!(p.page_bitmap(pg).unwrap().0, model.bitmap(), "page {}", pg);
                prop_assert!(s.page_bitmap(pg).is_ok());
            }
        }
        // Drain: everything completes, is read once, and every page ends free.
        for chunk in writing.drain(..) {
            p.release_chunk_as_complete(chunk).unwrap();
        }
        for chunk in reading.drain(..) {
            s.release_chunk_as_free(chunk).unwrap();
        }
        for pg in 0..3 {
            for chunk in s.try_acquire_all_chunks_for_reading(pg).into_iter().flatten() {
                s.release_chunk_as_free(chunk).unwrap();
            }
            let bitmap = p.page_bitmap(pg).unwrap();
            prop_assert!(bitmap == HeaderBitmap::FREE || bitmap.used_chunks() == 0);
        }
    }
}

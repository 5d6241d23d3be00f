//! Every chunk transition, allowed and forbidden, on both views; the bytes they leave in memory;
//! and what happens when the peer breaks the protocol in between.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicU32, Ordering};

use tachyon_abi::{
    encode_fragment_header, AbiError, ChunkFlags, ChunkHeader, ChunkState, Fragment, HeaderBitmap,
    OwnedSmb, Packets, PageLayout, PageSize, ServiceView, SharedMemoryAbi, MAX_PACKET_COUNT,
};

fn smb(pages: usize) -> OwnedSmb {
    OwnedSmb::new(pages * 4096, PageSize::Kib4).unwrap()
}

/// The buffer's bytes `range`, read back through the words.
fn bytes(smb: &OwnedSmb, range: std::ops::Range<usize>) -> Vec<u8> {
    let all: Vec<u8> = smb
        .words()
        .iter()
        .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
        .collect();
    all[range].to_vec()
}

fn set_word(smb: &OwnedSmb, byte_offset: usize, value: u32) {
    smb.words()[byte_offset / 4].store(value, Ordering::Relaxed);
}

fn word(smb: &OwnedSmb, byte_offset: usize) -> u32 {
    smb.words()[byte_offset / 4].load(Ordering::Relaxed)
}

fn unexpected(expected: ChunkState, found: ChunkState) -> AbiError {
    AbiError::UnexpectedState { expected, found }
}

// === geometry ===

#[test]
fn buffer_geometry_is_checked() {
    for page in PageSize::ALL {
        let smb = OwnedSmb::new(4 * page.bytes(), page).unwrap();
        assert_eq!(smb.size(), 4 * page.bytes());
        assert_eq!(smb.producer().num_pages(), 4);
        assert_eq!(smb.service().num_pages(), 4);
        assert_eq!(
            smb.words().as_ptr() as usize % 4096,
            0,
            "owned buffers are page aligned"
        );
    }
    for (size, page) in [
        (0, PageSize::Kib4),
        (6144, PageSize::Kib4),
        (16384, PageSize::Kib32),
    ] {
        assert_eq!(
            OwnedSmb::new(size, page).unwrap_err(),
            AbiError::InvalidBufferSize {
                size,
                page_size: page.bytes()
            }
        );
    }
    let too_big = 32 * 1024 * 1024 + 32 * 1024;
    assert!(matches!(
        OwnedSmb::new(too_big, PageSize::Kib32),
        Err(AbiError::InvalidBufferSize { .. })
    ));
    assert!(OwnedSmb::new(32 * 1024 * 1024, PageSize::Kib32).is_ok());
    // The slice constructors apply the same rules.
    let words: Vec<AtomicU32> = (0..1536).map(|_| AtomicU32::new(0)).collect();
    assert!(matches!(
        SharedMemoryAbi::new(&words, PageSize::Kib4),
        Err(AbiError::InvalidBufferSize { size: 6144, .. })
    ));
    assert!(ServiceView::new(&words[..1024], PageSize::Kib4).is_ok());
}

#[test]
fn raw_parts_constructors() {
    let words: Box<[AtomicU32]> = (0..2048).map(|_| AtomicU32::new(0)).collect();
    let ptr = words.as_ptr().cast::<u8>().cast_mut();
    // SAFETY: `words` outlives both views and is only accessed atomically through them.
    let producer = unsafe { SharedMemoryAbi::from_raw_parts(ptr, 8192, PageSize::Kib4) }.unwrap();
    // SAFETY: as above.
    let service = unsafe { ServiceView::from_raw_parts(ptr, 8192, PageSize::Kib4) }.unwrap();
    let chunk = producer
        .try_acquire_any_chunk_for_writing(1, PageLayout::Div1, ChunkHeader::new(3, 9))
        .unwrap();
    producer.release_chunk_as_complete(chunk).unwrap();
    let read = service.try_acquire_chunk_for_reading(1, 0).unwrap();
    assert_eq!(read.header(), ChunkHeader::new(3, 9));
    service.release_chunk_as_free(read).unwrap();
    assert_eq!(words[1024].load(Ordering::Relaxed), 0);

    // SAFETY: the pointer is rejected before any access.
    let misaligned =
        unsafe { SharedMemoryAbi::from_raw_parts(ptr.wrapping_add(1), 4096, PageSize::Kib4) };
    assert!(matches!(misaligned, Err(AbiError::MisalignedBuffer { .. })));
    // SAFETY: the null pointer is rejected before any access.
    let null = unsafe { ServiceView::from_raw_parts(std::ptr::null_mut(), 4096, PageSize::Kib4) };
    assert_eq!(null.unwrap_err(), AbiError::MisalignedBuffer { addr: 0 });
}

#[test]
fn chunk_ranges_stay_inside_their_page() {
    for page in PageSize::ALL {
        let smb = OwnedSmb::new(3 * page.bytes(), page).unwrap();
        let (producer, service) = (smb.producer(), smb.service());
        for layout in PageLayout::PARTITIONED {
            for p in 0..3 {
                assert!(producer.try_partition_page(p, layout).unwrap());
                let page_start = p * page.bytes();
                let mut prev_end = page_start + 8;
                for c in 0..layout.num_chunks() {
                    let r = service.chunk_range(p, c).unwrap();
                    assert_eq!(
                        r.start, prev_end,
                        "chunks are back to back after the header"
                    );
                    assert_eq!(r.len(), page.chunk_size(layout));
                    assert_eq!(r.start % 4, 0);
                    assert!(r.end <= page_start + page.bytes());
                    prev_end = r.end;
                }
                assert_eq!(
                    service.chunk_range(p, layout.num_chunks()),
                    Err(AbiError::ChunkOutOfRange {
                        chunk_idx: layout.num_chunks(),
                        num_chunks: layout.num_chunks()
                    })
                );
                set_word(&smb, page_start, 0);
            }
        }
        assert_eq!(service.chunk_range(0, 0), Err(AbiError::PageNotPartitioned));
        assert_eq!(
            service.chunk_range(3, 0),
            Err(AbiError::PageOutOfRange {
                page_idx: 3,
                num_pages: 3
            })
        );
    }
}

// === partitioning ===

#[test]
fn partition_only_a_free_page() {
    let smb = smb(2);
    let p = smb.producer();
    assert!(p.is_page_free(0).unwrap());
    assert_eq!(
        p.chunk_state(0, 0).unwrap_err(),
        AbiError::PageNotPartitioned
    );
    assert!(p.try_partition_page(0, PageLayout::Div4).unwrap());
    assert_eq!(word(&smb, 0), 0x3000_0000);
    assert!(!p.is_page_free(0).unwrap());
    assert_eq!(p.free_chunks(0).unwrap(), 0b1111);
    // Already partitioned: not again, not even with the same layout.
    assert!(!p.try_partition_page(0, PageLayout::Div4).unwrap());
    assert!(!p.try_partition_page(0, PageLayout::Div1).unwrap());
    assert_eq!(word(&smb, 0), 0x3000_0000);
    assert_eq!(
        p.try_partition_page(1, PageLayout::NotPartitioned),
        Err(AbiError::InvalidLayout { bits: 0 })
    );
    assert_eq!(
        p.try_partition_page(2, PageLayout::Div1),
        Err(AbiError::PageOutOfRange {
            page_idx: 2,
            num_pages: 2
        })
    );
}

// === Free -> BeingWritten (producer) ===

#[test]
fn acquire_for_writing_writes_the_header() {
    let smb = smb(1);
    let p = smb.producer();
    assert!(p.try_partition_page(0, PageLayout::Div4).unwrap());
    let header = ChunkHeader {
        chunk_id: 0x0102_0304,
        writer_id: 7,
        packets: Packets::new(1, ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK).unwrap(),
    };
    let chunk = p.try_acquire_chunk_for_writing(0, 2, header).unwrap();
    assert_eq!(
        (chunk.page_idx(), chunk.chunk_idx(), chunk.layout()),
        (0, 2, PageLayout::Div4)
    );
    assert_eq!(chunk.size(), 1020);
    assert_eq!(chunk.payload_size(), 1012);
    assert_eq!(p.chunk_state(0, 2).unwrap(), ChunkState::BeingWritten);
    // Div4 = 3 in bits 28..31, chunk 2 BeingWritten (1) in bits 4..6.
    assert_eq!(word(&smb, 0), 0x3000_0010);
    // Chunk 2 starts at 8 + 2 * 1020 = 2048.
    assert_eq!(
        bytes(&smb, 2048..2056),
        [0x04, 0x03, 0x02, 0x01, 0x07, 0x00, 0x01, 0x04]
    );
    assert_eq!(chunk.header(), header);
    p.release_chunk_as_complete(chunk).unwrap();
}

#[test]
fn acquire_for_writing_is_refused_unless_free() {
    let smb = smb(1);
    let (p, s) = (smb.producer(), smb.service());
    let h = ChunkHeader::new(1, 0);
    assert_eq!(
        p.try_acquire_chunk_for_writing(0, 0, h).unwrap_err(),
        AbiError::PageNotPartitioned
    );
    assert!(p.try_partition_page(0, PageLayout::Div2).unwrap());
    assert_eq!(
        p.try_acquire_chunk_for_writing(0, 2, h).unwrap_err(),
        AbiError::ChunkOutOfRange {
            chunk_idx: 2,
            num_chunks: 2
        }
    );
    assert_eq!(
        p.try_acquire_chunk_for_writing(0, 99, h).unwrap_err(),
        AbiError::ChunkOutOfRange {
            chunk_idx: 99,
            num_chunks: 2
        }
    );

    let writing = p.try_acquire_chunk_for_writing(0, 0, h).unwrap();
    assert_eq!(
        p.try_acquire_chunk_for_writing(0, 0, h).unwrap_err(),
        unexpected(ChunkState::Free, ChunkState::BeingWritten)
    );
    p.release_chunk_as_complete(writing).unwrap();
    assert_eq!(
        p.try_acquire_chunk_for_writing(0, 0, h).unwrap_err(),
        unexpected(ChunkState::Free, ChunkState::Complete)
    );
    let reading = s.try_acquire_chunk_for_reading(0, 0).unwrap();
    assert_eq!(
        p.try_acquire_chunk_for_writing(0, 0, h).unwrap_err(),
        unexpected(ChunkState::Free, ChunkState::BeingRead)
    );
    s.release_chunk_as_free(reading).unwrap();
    // Freeing the only used chunk unpartitioned the page.
    assert_eq!(word(&smb, 0), 0);
    assert_eq!(
        p.try_acquire_chunk_for_writing(0, 0, h).unwrap_err(),
        AbiError::PageNotPartitioned
    );
}

#[test]
fn acquire_any_partitions_then_fills_the_page() {
    let smb = smb(1);
    let p = smb.producer();
    let mut chunks = Vec::new();
    for i in 0..7 {
        let c = p
            .try_acquire_any_chunk_for_writing(0, PageLayout::Div7, ChunkHeader::new(1, i))
            .unwrap();
        assert_eq!(c.chunk_idx(), i as usize);
        assert_eq!(c.size(), 584);
        chunks.push(c);
    }
    assert_eq!(
        p.try_acquire_any_chunk_for_writing(0, PageLayout::Div7, ChunkHeader::new(1, 7))
            .unwrap_err(),
        AbiError::NoFreeChunk
    );
    // A partitioned page keeps its layout whatever the caller asks for.
    for c in chunks {
        p.release_chunk_as_complete(c).unwrap();
    }
    assert!(p.is_page_complete(0).unwrap());
    assert_eq!(
        p.try_acquire_any_chunk_for_writing(0, PageLayout::Div1, ChunkHeader::new(1, 8))
            .unwrap_err(),
        AbiError::NoFreeChunk
    );
}

// === BeingWritten -> Complete (producer) ===

#[test]
fn complete_a_chunk() {
    let smb = smb(1);
    let p = smb.producer();
    let a = p
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div2, ChunkHeader::new(1, 0))
        .unwrap();
    let b = p
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div2, ChunkHeader::new(1, 1))
        .unwrap();
    let after = p.release_chunk_as_complete(a).unwrap();
    assert_eq!(after, HeaderBitmap(0x2000_0007)); // chunk 0 Complete (3), chunk 1 BeingWritten (1)
    assert!(!after.is_complete());
    let after = p.release_chunk_as_complete(b).unwrap();
    assert_eq!(after, HeaderBitmap(0x2000_000F));
    assert!(after.is_complete());
}

#[test]
fn complete_fails_if_the_state_was_changed_behind_the_producer() {
    let smb = smb(1);
    let p = smb.producer();
    let chunk = p
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div2, ChunkHeader::new(1, 0))
        .unwrap();
    // The peer marks chunk 0 Complete itself.
    set_word(&smb, 0, 0x2000_0003);
    assert_eq!(
        p.release_chunk_as_complete(chunk).unwrap_err(),
        unexpected(ChunkState::BeingWritten, ChunkState::Complete)
    );
    let chunk = p
        .try_acquire_chunk_for_writing(0, 1, ChunkHeader::new(1, 1))
        .unwrap();
    // The peer re-partitions the page.
    set_word(&smb, 0, 0x3000_0000);
    assert_eq!(
        p.release_chunk_as_complete(chunk).unwrap_err(),
        AbiError::LayoutChanged {
            expected: PageLayout::Div2,
            found_bits: 3
        }
    );
    let chunk = p
        .try_acquire_chunk_for_writing(0, 0, ChunkHeader::new(1, 2))
        .unwrap();
    // The peer writes garbage.
    set_word(&smb, 0, 0x6000_0001);
    assert_eq!(
        p.release_chunk_as_complete(chunk).unwrap_err(),
        AbiError::InvalidLayout { bits: 6 }
    );
}

#[test]
fn chunks_of_another_buffer_are_refused() {
    let (a, b) = (smb(1), smb(1));
    let chunk = a
        .producer()
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, ChunkHeader::new(1, 0))
        .unwrap();
    assert!(b
        .producer()
        .try_partition_page(0, PageLayout::Div1)
        .unwrap());
    assert_eq!(
        b.producer().release_chunk_as_complete(chunk).unwrap_err(),
        AbiError::ForeignChunk
    );
    assert_eq!(
        a.producer().chunk_state(0, 0).unwrap(),
        ChunkState::BeingWritten
    );

    let chunk = a
        .producer()
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, ChunkHeader::new(1, 0))
        .unwrap_err();
    assert_eq!(chunk, AbiError::NoFreeChunk);
    set_word(&a, 0, 0x1000_0003);
    let read = a.service().try_acquire_chunk_for_reading(0, 0).unwrap();
    assert_eq!(
        b.service().release_chunk_as_free(read).unwrap_err(),
        AbiError::ForeignChunk
    );
}

// === Complete -> BeingRead (service) ===

#[test]
fn acquire_for_reading_only_complete_chunks() {
    let smb = smb(1);
    let (p, s) = (smb.producer(), smb.service());
    assert_eq!(
        s.try_acquire_chunk_for_reading(0, 0).unwrap_err(),
        AbiError::PageNotPartitioned
    );
    assert!(p.try_partition_page(0, PageLayout::Div14).unwrap());
    assert_eq!(
        s.try_acquire_chunk_for_reading(0, 3).unwrap_err(),
        unexpected(ChunkState::Complete, ChunkState::Free)
    );
    assert_eq!(
        s.try_acquire_chunk_for_reading(0, 14).unwrap_err(),
        AbiError::ChunkOutOfRange {
            chunk_idx: 14,
            num_chunks: 14
        }
    );
    let chunk = p
        .try_acquire_chunk_for_writing(0, 3, ChunkHeader::new(2, 5))
        .unwrap();
    assert_eq!(
        s.try_acquire_chunk_for_reading(0, 3).unwrap_err(),
        unexpected(ChunkState::Complete, ChunkState::BeingWritten)
    );
    p.release_chunk_as_complete(chunk).unwrap();
    let read = s.try_acquire_chunk_for_reading(0, 3).unwrap();
    // Div14 = 5, chunk 3 BeingRead (2) in bits 6..8.
    assert_eq!(word(&smb, 0), 0x5000_0080);
    assert_eq!(
        s.try_acquire_chunk_for_reading(0, 3).unwrap_err(),
        unexpected(ChunkState::Complete, ChunkState::BeingRead)
    );
    assert_eq!(
        (read.page_idx(), read.chunk_idx(), read.size()),
        (0, 3, 292)
    );
    s.release_chunk_as_free(read).unwrap();
}

// === BeingRead -> Free (service) ===

#[test]
fn free_zeroes_the_header_and_unpartitions_the_last_chunk() {
    let smb = smb(1);
    let (p, s) = (smb.producer(), smb.service());
    let mut a = p
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div2, ChunkHeader::new(4, 10))
        .unwrap();
    let b = p
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div2, ChunkHeader::new(4, 11))
        .unwrap();
    a.increment_packet_count().unwrap();
    p.release_chunk_as_complete(a).unwrap();
    p.release_chunk_as_complete(b).unwrap();

    let ra = s.try_acquire_chunk_for_reading(0, 0).unwrap();
    assert_eq!(ra.header().packets.count(), 1);
    let after = s.release_chunk_as_free(ra).unwrap();
    // Chunk 0 Free, chunk 1 still Complete: the page keeps its layout.
    assert_eq!(after, HeaderBitmap(0x2000_000C));
    assert_eq!(bytes(&smb, 8..16), [0; 8], "freed chunk header is zeroed");

    let rb = s.try_acquire_chunk_for_reading(0, 1).unwrap();
    assert_eq!(s.release_chunk_as_free(rb).unwrap(), HeaderBitmap::FREE);
    assert_eq!(word(&smb, 0), 0);
}

#[test]
fn free_fails_if_the_producer_broke_the_protocol() {
    let smb = smb(1);
    let (p, s) = (smb.producer(), smb.service());
    for i in 0..2 {
        let c = p
            .try_acquire_any_chunk_for_writing(0, PageLayout::Div2, ChunkHeader::new(1, i))
            .unwrap();
        p.release_chunk_as_complete(c).unwrap();
    }
    let read = s.try_acquire_chunk_for_reading(0, 0).unwrap();
    // The producer flips chunk 0 back to BeingWritten while the service holds it.
    set_word(&smb, 0, 0x2000_000D);
    assert_eq!(
        s.release_chunk_as_free(read).unwrap_err(),
        unexpected(ChunkState::BeingRead, ChunkState::BeingWritten)
    );
    set_word(&smb, 0, 0x2000_000F);
    let read = s.try_acquire_chunk_for_reading(0, 1).unwrap();
    set_word(&smb, 0, 0x4000_0000);
    assert_eq!(
        s.release_chunk_as_free(read).unwrap_err(),
        AbiError::LayoutChanged {
            expected: PageLayout::Div2,
            found_bits: 4
        }
    );
    set_word(&smb, 0, 0x2000_000F);
    let read = s.try_acquire_chunk_for_reading(0, 0).unwrap();
    set_word(&smb, 0, 0x8000_0000 | 0x2000_000E);
    assert_eq!(
        s.release_chunk_as_free(read).unwrap_err(),
        AbiError::ReservedBitSet {
            bitmap: 0xA000_000E
        }
    );
}

// === the producer cannot make the service's transitions and vice versa ===

#[test]
fn each_side_only_makes_its_own_transitions() {
    // The producer view has no way to take a Complete chunk or free one; the service view has
    // no way to take a Free chunk or complete one. What remains to check: the operations that
    // exist refuse chunks in the other side's states.
    let smb = smb(1);
    let (p, s) = (smb.producer(), smb.service());
    assert!(p.try_partition_page(0, PageLayout::Div4).unwrap());
    // Service cannot take Free or BeingWritten chunks.
    assert_eq!(
        s.try_acquire_chunk_for_reading(0, 0).unwrap_err(),
        unexpected(ChunkState::Complete, ChunkState::Free)
    );
    let c = p
        .try_acquire_chunk_for_writing(0, 0, ChunkHeader::new(1, 0))
        .unwrap();
    assert!(s.try_acquire_chunk_for_reading(0, 0).is_err());
    assert!(matches!(
        s.try_acquire_all_chunks_for_reading(0),
        Err(AbiError::ChunkBeingWritten { chunk_idx: 0 })
    ));
    p.release_chunk_as_complete(c).unwrap();
    // Producer cannot take Complete or BeingRead chunks.
    assert!(p
        .try_acquire_chunk_for_writing(0, 0, ChunkHeader::new(1, 1))
        .is_err());
    let r = s.try_acquire_chunk_for_reading(0, 0).unwrap();
    assert!(p
        .try_acquire_chunk_for_writing(0, 0, ChunkHeader::new(1, 1))
        .is_err());
    s.release_chunk_as_free(r).unwrap();
}

// === acquire all for reading ===

#[test]
fn acquire_all_for_reading() {
    let smb = smb(1);
    let (p, s) = (smb.producer(), smb.service());
    assert_eq!(
        s.try_acquire_all_chunks_for_reading(0).unwrap_err(),
        AbiError::PageNotPartitioned
    );
    assert!(p.try_partition_page(0, PageLayout::Div4).unwrap());
    // Chunks 0 and 2 complete, 1 being read by someone, 3 free.
    for i in [0, 1, 2] {
        let c = p
            .try_acquire_chunk_for_writing(0, i, ChunkHeader::new(1, i as u32))
            .unwrap();
        p.release_chunk_as_complete(c).unwrap();
    }
    let held = s.try_acquire_chunk_for_reading(0, 1).unwrap();
    let taken: Vec<_> = s.try_acquire_all_chunks_for_reading(0).unwrap().collect();
    assert_eq!(
        taken.iter().map(|c| c.chunk_idx()).collect::<Vec<_>>(),
        [0, 2]
    );
    // 0, 1, 2 BeingRead (2), 3 Free.
    assert_eq!(word(&smb, 0), 0x3000_002A);
    for c in taken {
        assert_eq!(c.header().chunk_id, c.chunk_idx() as u32);
        s.release_chunk_as_free(c).unwrap();
    }
    assert_eq!(s.release_chunk_as_free(held).unwrap(), HeaderBitmap::FREE);
    // Nothing complete: succeeds with no chunks.
    assert!(p.try_partition_page(0, PageLayout::Div1).unwrap());
    assert_eq!(s.try_acquire_all_chunks_for_reading(0).unwrap().count(), 0);
}

// === packets, flags, payload ===

#[test]
fn packet_count_and_flags() {
    let smb = smb(1);
    let p = smb.producer();
    let mut c = p
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, ChunkHeader::new(9, 1))
        .unwrap();
    for n in 1..=5 {
        assert_eq!(c.increment_packet_count().unwrap(), n);
    }
    c.set_flags(ChunkFlags(3));
    // count 5, flags 3 = 0x0C05 in bytes 6..8 of the chunk (buffer offset 8).
    assert_eq!(bytes(&smb, 8..16), [1, 0, 0, 0, 9, 0, 0x05, 0x0C]);
    c.set_flags(ChunkFlags::CHUNK_NEEDS_PATCHING);
    assert_eq!(c.packets().flags(), ChunkFlags(7));
    c.clear_needs_patching();
    assert_eq!(c.packets(), Packets::new(5, ChunkFlags(3)).unwrap());
    assert_eq!(
        c.header().writer_id,
        9,
        "the writer id survives packet updates"
    );
    for _ in 5..MAX_PACKET_COUNT {
        c.increment_packet_count().unwrap();
    }
    assert_eq!(c.packets().count(), 1023);
    assert_eq!(
        c.increment_packet_count().unwrap_err(),
        AbiError::PacketCountOverflow
    );
    assert_eq!(c.packets().count(), 1023);
    assert_eq!(c.packets().flags(), ChunkFlags(3));
    p.release_chunk_as_complete(c).unwrap();
}

/// A run of packets counted with one store: the count grows by `n`, the flags stay, and a run
/// that would pass 1023 changes nothing.
#[test]
fn packet_count_grows_by_a_run() {
    let smb = smb(1);
    let p = smb.producer();
    let mut c = p
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, ChunkHeader::new(9, 1))
        .unwrap();
    c.set_flags(ChunkFlags(3));
    assert_eq!(c.add_packet_count(1).unwrap(), 1);
    assert_eq!(c.add_packet_count(0).unwrap(), 1);
    assert_eq!(c.add_packet_count(1000).unwrap(), 1001);
    assert_eq!(
        c.add_packet_count(23).unwrap_err(),
        AbiError::PacketCountOverflow
    );
    assert_eq!(c.packets(), Packets::new(1001, ChunkFlags(3)).unwrap());
    assert_eq!(c.add_packet_count(22).unwrap(), MAX_PACKET_COUNT);
    assert_eq!(c.packets().flags(), ChunkFlags(3));
    assert_eq!(c.header().writer_id, 9);
    p.release_chunk_as_complete(c).unwrap();
}

#[test]
fn payload_reads_and_writes_at_any_offset() {
    let smb = smb(1);
    let p = smb.producer();
    let mut c = p
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div14, ChunkHeader::new(1, 0))
        .unwrap();
    let n = c.payload_size();
    assert_eq!(n, 284);
    let data: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
    // Write in odd pieces at odd offsets.
    let mut at = 0;
    for len in [1, 2, 3, 5, 7, 11, 13, 17].iter().cycle() {
        let end = (at + len).min(n);
        c.write_payload(at, &data[at..end]).unwrap();
        at = end;
        if at == n {
            break;
        }
    }
    let mut back = vec![0; n];
    c.read_payload(0, &mut back).unwrap();
    assert_eq!(back, data);
    let mut mid = [0; 5];
    c.read_payload(3, &mut mid).unwrap();
    assert_eq!(mid, data[3..8]);
    assert_eq!(
        c.write_payload(n - 1, &[0, 0]).unwrap_err(),
        AbiError::PayloadOutOfBounds {
            offset: n - 1,
            len: 2,
            payload_size: n
        }
    );
    assert!(c.write_payload(usize::MAX, &[0]).is_err());
    assert!(c.read_payload(n + 1, &mut []).is_err());
    c.write_payload(n, &[]).unwrap();
    // Chunk 0 payload starts at buffer offset 16.
    assert_eq!(bytes(&smb, 16..16 + n), data);
    assert_eq!(
        bytes(&smb, 16 + n..20 + n),
        [0; 4],
        "the next chunk is untouched"
    );

    // In-place writes through the raw pointer land in the same bytes.
    let ptr = c.payload_ptr();
    // SAFETY: the chunk is BeingWritten and held here; nothing in this test reads the payload
    // concurrently, and the write is within `payload_size`.
    unsafe { ptr.add(n - 1).write(0xAB) };
    let mut last = [0];
    c.read_payload(n - 1, &mut last).unwrap();
    assert_eq!(last, [0xAB]);
    p.release_chunk_as_complete(c).unwrap();

    let s = smb.service();
    let r = s.try_acquire_chunk_for_reading(0, 0).unwrap();
    let mut dst = vec![0; n - 1];
    assert_eq!(
        r.copy_into(&mut dst).unwrap_err(),
        AbiError::DestinationTooSmall {
            needed: n,
            got: n - 1
        }
    );
    let mut dst = vec![0; n + 10];
    assert_eq!(r.copy_into(&mut dst).unwrap(), ChunkHeader::new(1, 0));
    assert_eq!(dst[..n - 1], data[..n - 1]);
    assert_eq!(dst[n - 1], 0xAB);
    s.release_chunk_as_free(r).unwrap();
}

// === copying and scraping ===

fn write_packet(chunk: &mut tachyon_abi::Chunk<'_>, at: &mut usize, data: &[u8]) {
    chunk.increment_packet_count().unwrap();
    chunk
        .write_payload(*at, &encode_fragment_header(data.len() as u32).unwrap())
        .unwrap();
    chunk.write_payload(*at + 4, data).unwrap();
    *at += 4 + data.len();
}

#[test]
fn copy_validates_the_header() {
    let smb = smb(1);
    let (p, s) = (smb.producer(), smb.service());
    let mut c = p
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, ChunkHeader::new(1, 0))
        .unwrap();
    let mut at = 0;
    write_packet(&mut c, &mut at, b"hello");
    p.release_chunk_as_complete(c).unwrap();
    let r = s.try_acquire_chunk_for_reading(0, 0).unwrap();
    let copy = r.copy().unwrap();
    assert!(copy.is_complete());
    assert_eq!((copy.page_idx(), copy.chunk_idx()), (0, 0));
    assert_eq!(copy.payload().len(), 4080);
    assert_eq!(
        copy.fragments().collect::<Vec<_>>(),
        [Ok(Fragment::Data(b"hello"))]
    );

    // The producer rewrites the header while the chunk is BeingRead: the copy is rejected.
    set_word(&smb, 12, 0); // writer id 0
    assert_eq!(
        r.copy().unwrap_err(),
        AbiError::InvalidWriterId { writer_id: 0 }
    );
    set_word(&smb, 12, 1 | (0x3FF << 16)); // 1023 packets in a 4080-byte payload: possible
    assert!(r.copy().is_ok());
    set_word(&smb, 12, 1 | (0x2000 << 16)); // flag 8: unknown
    assert_eq!(
        r.copy().unwrap_err(),
        AbiError::UnknownChunkFlags { flags: 8 }
    );
    set_word(&smb, 12, 1 | (0x0400 << 16)); // FIRST_CONTINUES without packets
    assert_eq!(
        r.copy().unwrap_err(),
        AbiError::ContinuationWithoutPackets { flags: 1 }
    );
    s.release_chunk_as_free(r).unwrap();
}

#[test]
fn packet_count_larger_than_the_payload_is_rejected() {
    // A Div14 chunk of a 4 KiB page has 284 payload bytes, so at most 284 fragments.
    let smb = smb(1);
    let (p, s) = (smb.producer(), smb.service());
    let mut c = p
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div14, ChunkHeader::new(1, 0))
        .unwrap();
    for _ in 0..285 {
        c.increment_packet_count().unwrap();
    }
    p.release_chunk_as_complete(c).unwrap();
    let r = s.try_acquire_chunk_for_reading(0, 0).unwrap();
    assert_eq!(
        r.copy().unwrap_err(),
        AbiError::PacketCountTooLarge {
            count: 285,
            payload_size: 284
        }
    );
    s.release_chunk_as_free(r).unwrap();
}

#[test]
fn scraping_leaves_states_alone_and_skips_the_open_packet() {
    let smb = smb(1);
    let (p, s) = (smb.producer(), smb.service());
    assert_eq!(
        s.scrape_chunk(0, 0).unwrap_err(),
        AbiError::PageNotPartitioned
    );
    let mut c = p
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div2, ChunkHeader::new(3, 8))
        .unwrap();
    assert_eq!(s.scrape_chunk(0, 1).unwrap(), None, "free chunk");
    assert_eq!(s.scrape_chunk(0, 0).unwrap(), None, "no packet yet");
    let mut at = 0;
    write_packet(&mut c, &mut at, b"one");
    assert_eq!(
        s.scrape_chunk(0, 0).unwrap(),
        None,
        "one packet, maybe unfinished"
    );
    // Count inflation: packet one is finished, so count it again.
    c.increment_packet_count().unwrap();
    let copy = s.scrape_chunk(0, 0).unwrap().unwrap();
    assert!(!copy.is_complete());
    assert_eq!(copy.header().packets.count(), 2);
    assert_eq!(
        copy.fragments().collect::<Vec<_>>(),
        [Ok(Fragment::Data(b"one"))]
    );
    assert_eq!(
        p.chunk_state(0, 0).unwrap(),
        ChunkState::BeingWritten,
        "scraping changes nothing"
    );

    // The writer pads the inflated count with an empty packet and completes the chunk.
    c.write_payload(at, &[0]).unwrap();
    p.release_chunk_as_complete(c).unwrap();
    let copy = s.scrape_chunk(0, 0).unwrap().unwrap();
    assert!(copy.is_complete());
    assert_eq!(
        copy.fragments().collect::<Vec<_>>(),
        [Ok(Fragment::Data(b"one")), Ok(Fragment::Data(b""))]
    );
    assert_eq!(p.chunk_state(0, 0).unwrap(), ChunkState::Complete);

    let r = s.try_acquire_chunk_for_reading(0, 0).unwrap();
    assert_eq!(
        s.scrape_chunk(0, 0).unwrap(),
        None,
        "chunks being read are the service's own"
    );
    s.release_chunk_as_free(r).unwrap();
}

#[test]
fn dropped_packet_sentinel_reaches_the_service() {
    let smb = smb(1);
    let (p, s) = (smb.producer(), smb.service());
    let mut c = p
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, ChunkHeader::new(1, 0))
        .unwrap();
    let mut at = 0;
    write_packet(&mut c, &mut at, b"kept");
    c.increment_packet_count().unwrap();
    c.write_payload(at, &tachyon_abi::DROP_PACKET_FRAGMENT_HEADER)
        .unwrap();
    p.release_chunk_as_complete(c).unwrap();
    let r = s.try_acquire_chunk_for_reading(0, 0).unwrap();
    let copy = r.copy().unwrap();
    s.release_chunk_as_free(r).unwrap();
    assert_eq!(
        copy.fragments().collect::<Vec<_>>(),
        [Ok(Fragment::Data(b"kept")), Ok(Fragment::Dropped)]
    );
}

#[test]
fn service_view_reports_invalid_page_headers() {
    let smb = smb(4);
    let s = smb.service();
    set_word(&smb, 0, 0x6000_0000);
    set_word(&smb, 4096, 0x8000_0000);
    set_word(&smb, 8192, 0x0000_0003);
    set_word(&smb, 12288, 0x1000_000C);
    assert_eq!(
        s.page_layout(0).unwrap_err(),
        AbiError::InvalidLayout { bits: 6 }
    );
    assert_eq!(
        s.page_bitmap(1).unwrap_err(),
        AbiError::ReservedBitSet {
            bitmap: 0x8000_0000
        }
    );
    assert_eq!(
        s.page_layout(2).unwrap_err(),
        AbiError::StateWithoutLayout { bitmap: 3 }
    );
    assert_eq!(
        s.page_layout(3).unwrap_err(),
        AbiError::StateBeyondLayout {
            bitmap: 0x1000_000C
        }
    );
    for page in 0..4 {
        assert!(s.try_acquire_chunk_for_reading(page, 0).is_err());
        assert!(s.try_acquire_all_chunks_for_reading(page).is_err());
        assert!(s.scrape_chunk(page, 0).is_err());
        assert!(s.chunk_range(page, 0).is_err());
    }
    // The raw header is still there to log.
    assert_eq!(
        s.page_header(0).unwrap().header_bitmap,
        HeaderBitmap(0x6000_0000)
    );
    assert_eq!(
        s.page_header(4).unwrap_err(),
        AbiError::PageOutOfRange {
            page_idx: 4,
            num_pages: 4
        }
    );
}

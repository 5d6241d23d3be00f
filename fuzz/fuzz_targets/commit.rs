//! Commit validation against a hostile producer, through the real memfd mapping: the fuzzer
//! writes the whole shared memory buffer (page headers, chunk headers, fragments) and then the
//! `CommitDataRequest`s. The service decodes each request as untrusted, applies it
//! (`apply_commit`), sometimes scrapes, and reads the buffers out through the validator. Nothing
//! may panic, every chunk the service took is returned, and no chunk is left held by the service.
#![no_main]

use std::os::unix::fs::FileExt;

use libfuzzer_sys::fuzz_target;
use tachyon_abi::{ChunkState, PageSize};
use tachyon_ipc::commit::decode_commit;
use tachyon_ipc::shm::SharedMemory;
use tachyon_service::{
    apply_commit, scrape, CommitStats, FillPolicy, PacketWriter, ProducerIdentity, ProducerState,
    TraceBuffer,
};

const SMB_SIZE: usize = 4 * 4096;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (smb_bytes, requests) = data.split_at(data.len().min(SMB_SIZE));
    let shm = SharedMemory::create("tachyon-fuzz", SMB_SIZE).expect("memfd");
    // The producer's writes, through the descriptor (the mapping sees them).
    let file = std::fs::File::from(shm.fd().try_clone_to_owned().expect("dup"));
    file.write_all_at(smb_bytes, 0).expect("pwrite");
    let view = shm.service_view(PageSize::Kib4).expect("valid geometry");
    let being_read = |view: &tachyon_abi::ServiceView<'_>| {
        let mut held = Vec::new();
        for page in 0..view.num_pages() {
            let bitmap = view.page_header(page).expect("in range").header_bitmap;
            for chunk in 0..bitmap.num_chunks() {
                if bitmap.chunk_state(chunk) == Some(ChunkState::BeingRead) {
                    held.push((page, chunk));
                }
            }
        }
        held
    };
    // The producer may have written chunks as BeingRead itself; the service must add none.
    let held_before = being_read(&view);

    let mut buffers = vec![
        TraceBuffer::new(8192, FillPolicy::RingBuffer),
        TraceBuffer::new(8192, FillPolicy::Discard),
    ];
    let mut producer = ProducerState::new(1, vec![0, 1]);
    let mut stats = CommitStats::default();
    let mut writer = PacketWriter::new();
    let mut out = Vec::new();
    // Requests are length-prefixed (one byte) in the rest of the input.
    let mut rest = requests;
    while let Some((&len, tail)) = rest.split_first() {
        let take = tail.len().min(usize::from(len));
        let (req, tail) = tail.split_at(take);
        rest = tail;
        if let Ok(decoded) = decode_commit(req) {
            apply_commit(&view, &mut producer, &decoded.request, &mut buffers, &mut stats);
        }
        if len & 0x80 != 0 {
            scrape(&view, &mut producer, &mut buffers, &mut stats);
        }
        for b in buffers.iter_mut() {
            b.read_packets(len & 0x40 != 0, |info, fragments| {
                writer.write_packet(info, fragments, ProducerIdentity { pid: 1, uid: 1 }, &mut out);
            });
        }
        out.clear();
    }
    // Every chunk the service acquired for reading went back to the producer.
    for held in being_read(&view) {
        assert!(held_before.contains(&held), "chunk {held:?} left BeingRead");
    }
});

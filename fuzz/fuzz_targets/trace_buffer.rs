//! The central trace buffer and the read-out validator against arbitrary producer input: the
//! fuzzer's bytes are a script of commits (chunk ids, flags, fragment counts, payloads — all
//! attacker-chosen), patches, scrapes and reads. Nothing may panic, and the packet accounting
//! must stay consistent: what is read plus what is counted lost never exceeds what the chunks
//! could hold.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tachyon_service::{
    validate_packet, ChunkToCopy, FillPolicy, PacketWriter, Patch, ProducerIdentity, TraceBuffer,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let policy = if mode & 1 == 0 {
        FillPolicy::RingBuffer
    } else {
        FillPolicy::Discard
    };
    let mut buf = TraceBuffer::new(4096 << (mode >> 1 & 3), policy);
    let mut writer = PacketWriter::new();
    let mut out = Vec::new();
    let mut max_packets = 0u64;
    let mut read = 0u64;
    while rest.len() >= 8 {
        let (op, tail) = rest.split_at(8);
        rest = tail;
        let writer_id = u16::from_le_bytes([op[1], op[2]]) % 4 + 1;
        let chunk_id = u32::from_le_bytes([op[3], op[4], 0, 0]) % 64;
        match op[0] % 5 {
            0 | 1 => {
                let len = (op[5] as usize * 17).min(rest.len());
                let (payload, tail) = rest.split_at(len);
                rest = tail;
                let num_fragments = (op[6] % 40) as u16;
                max_packets += num_fragments as u64;
                let chunk = ChunkToCopy {
                    producer: 1,
                    writer: writer_id,
                    chunk_id,
                    num_fragments,
                    flags: op[7] & 7,
                    payload,
                    complete: op[0] % 5 == 0,
                };
                // A commit, or a scrape (of a finished chunk too).
                if op[7] & 8 == 0 {
                    buf.copy_chunk(&chunk);
                } else {
                    buf.copy_scraped_chunk(&chunk);
                }
            }
            2 => {
                let offset = u16::from_le_bytes([op[5], op[6]]) as u32;
                buf.try_patch_chunk(
                    1,
                    writer_id,
                    chunk_id,
                    &[Patch {
                        offset,
                        data: [op[7], 1, 2, 3],
                    }],
                    op[7] & 1 == 1,
                );
            }
            _ => {
                buf.read_packets(op[0] % 5 == 4, |info, fragments| {
                    read += 1;
                    let packet: Vec<u8> = fragments.concat();
                    let _ = validate_packet(&packet);
                    writer.write_packet(
                        info,
                        fragments,
                        ProducerIdentity { pid: 1, uid: 2 },
                        &mut out,
                    );
                });
            }
        }
    }
    buf.read_packets(true, |info, fragments| {
        read += 1;
        writer.write_packet(
            info,
            fragments,
            ProducerIdentity { pid: 1, uid: 2 },
            &mut out,
        );
    });
    assert!(
        read + buf.losses().total() <= max_packets,
        "more packets accounted than committed"
    );
});

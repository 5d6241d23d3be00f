//! The read-out of small packets: what the service spends per event to take packets out of a
//! central buffer, check them (reserved fields, well-formedness) and write them as `Trace.packet`
//! records with their trusted fields (`TraceBuffer::read_packets` + `PacketWriter`, as
//! `ServiceCore::drain` does), beside a memcpy of the same chunk bytes in the same run.
//!
//! The packets are a zone's end as the SDK writes it: a 2-byte timestamp delta, a
//! `track_event { type: TYPE_SLICE_END }` and `sequence_flags`, 9 bytes behind a 1-byte fragment
//! header; 4 KiB chunks; 8 sequences.
//!
//! - `readout/events/{memcpy,small_packets}`: per event (criterion's elements/s).
//! - `readout/bytes/{memcpy,small_packets}`: the same, as bytes/s of chunk payload read.
//!
//! Times are the bench thread's CPU time (`support/cpu_time.rs`; `TACHYON_BENCH_WALL=1` for
//! wall time). Run: `cargo bench -p tachyon-service --bench readout`.

use std::hint::black_box;

#[path = "support/cpu_time.rs"]
mod cpu_time;

use criterion::measurement::{Measurement, WallTime};
use criterion::{BatchSize, Criterion, Throughput};
use tachyon_service::{ChunkToCopy, FillPolicy, PacketWriter, ProducerIdentity, TraceBuffer};

const CHUNK: usize = 4096 - 8;
const CHUNKS: usize = 256;
const WRITERS: u16 = 8;

/// A zone end: timestamp 8 (2 bytes), track_event 11 { type 9 = 2 }, sequence_flags 13 = 2.
const PACKET: [u8; 9] = [0x40, 0x85, 0x01, 0x5a, 0x02, 0x48, 0x02, 0x68, 0x02];

/// One chunk payload full of zone ends, and how many.
fn chunk() -> (Vec<u8>, u16) {
    let mut payload = Vec::with_capacity(CHUNK);
    let mut n = 0u16;
    while payload.len() + 1 + PACKET.len() <= CHUNK && n < 1023 {
        payload.push(PACKET.len() as u8);
        payload.extend_from_slice(&PACKET);
        n += 1;
    }
    payload.resize(CHUNK, 0);
    (payload, n)
}

fn filled(payload: &[u8], n: u16) -> TraceBuffer {
    let mut buf = TraceBuffer::new(CHUNKS * CHUNK * 2, FillPolicy::RingBuffer);
    for i in 0..CHUNKS {
        buf.copy_chunk(&ChunkToCopy {
            producer: 1,
            writer: (i % WRITERS as usize) as u16 + 1,
            chunk_id: (i / WRITERS as usize) as u32,
            num_fragments: n,
            flags: 0,
            payload,
            complete: true,
        });
    }
    buf
}

fn bench<M: Measurement>(c: &mut Criterion<M>) {
    let (payload, n) = chunk();
    let events = CHUNKS as u64 * n as u64;
    let identity = ProducerIdentity {
        pid: 4242,
        uid: 1000,
    };
    for (group, throughput) in [
        ("readout/events", Throughput::Elements(events)),
        ("readout/bytes", Throughput::Bytes((CHUNKS * CHUNK) as u64)),
    ] {
        let mut g = c.benchmark_group(group);
        g.throughput(throughput);
        g.sample_size(20);
        let mut out = Vec::with_capacity(CHUNKS * CHUNK * 4);
        g.bench_function("memcpy", |b| {
            b.iter(|| {
                out.clear();
                for _ in 0..CHUNKS {
                    out.extend_from_slice(black_box(&payload));
                }
                black_box(&mut out);
            })
        });
        let mut writer = PacketWriter::new();
        g.bench_function("small_packets", |b| {
            b.iter_batched_ref(
                || filled(&payload, n),
                |buf| {
                    out.clear();
                    buf.read_packets(true, |info, fragments| {
                        writer.write_packet(info, fragments, identity, &mut out);
                    });
                    black_box(&mut out);
                },
                BatchSize::LargeInput,
            )
        });
        g.finish();
    }
}

fn main() {
    if cpu_time::wall() {
        bench(&mut Criterion::<WallTime>::default().configure_from_args());
    } else {
        bench(
            &mut Criterion::default()
                .with_measurement(cpu_time::CpuTime)
                .configure_from_args(),
        );
    }
    Criterion::default().configure_from_args().final_summary();
}

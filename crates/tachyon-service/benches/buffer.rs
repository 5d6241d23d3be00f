//! The central buffer, shaped like Perfetto's `trace_buffer_benchmark.cc`: 4 KiB chunks holding
//! 5–15 packets of 50–500 bytes, a 64 MiB buffer. Reported as bytes/s beside `buffer/memcpy`,
//! which copies the same bytes into a 64 MiB ring in the same run.
//!
//! - `buffer/write/single_writer`: one sequence.
//! - `buffer/write/many_writers`: 1000 sequences, round robin.
//! - `buffer/write/small_packets`: one sequence of chunks full of zone ends as the SDK writes
//!   them (9-byte packets behind 1-byte fragment headers, about 400 a chunk), the service's
//!   usual load: the per-fragment work on arrival shows here.
//! - `buffer/read`: read every packet back out of a full buffer (reassembly included).
//!
//! Times are the bench thread's CPU time (`support/cpu_time.rs`; `TACHYON_BENCH_WALL=1` for
//! wall time). Run: `cargo bench -p tachyon-service --bench buffer`.

use std::hint::black_box;

#[path = "support/cpu_time.rs"]
mod cpu_time;

use criterion::measurement::{Measurement, WallTime};
use criterion::{Criterion, Throughput};
use tachyon_service::{ChunkToCopy, FillPolicy, TraceBuffer};

const CHUNK: usize = 4096 - 8; // a Div1 chunk of a 4 KiB page: payload after the header
const BUFFER: usize = 64 << 20;
const TEMPLATES: usize = 64;

/// Chunk payloads with 5–15 packets of 50–500 bytes each (deterministic pseudo-random).
fn templates() -> Vec<(Vec<u8>, u16)> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    (0..TEMPLATES)
        .map(|_| {
            let mut payload = Vec::with_capacity(CHUNK);
            let packets = 5 + rand(11) as u16;
            let mut n = 0;
            for _ in 0..packets {
                let size = 50 + rand(451) as usize;
                if payload.len() + 4 + size > CHUNK {
                    break;
                }
                let s = size as u32;
                payload.extend_from_slice(&[
                    (s as u8 & 0x7f) | 0x80,
                    ((s >> 7) as u8 & 0x7f) | 0x80,
                    ((s >> 14) as u8 & 0x7f) | 0x80,
                    (s >> 21) as u8,
                ]);
                payload.extend((0..size).map(|i| (i as u8) | 1));
                n += 1;
            }
            payload.resize(CHUNK, 0);
            (payload, n)
        })
        .collect()
}

fn write_chunks(buf: &mut TraceBuffer, t: &[(Vec<u8>, u16)], writers: u16, chunks: usize) {
    let mut ids = vec![0u32; writers as usize];
    for i in 0..chunks {
        let w = (i % writers as usize) as u16;
        let (payload, n) = &t[i % t.len()];
        buf.copy_chunk(&ChunkToCopy {
            producer: 1,
            writer: w + 1,
            chunk_id: ids[w as usize],
            num_fragments: *n,
            flags: 0,
            payload,
            complete: true,
        });
        ids[w as usize] += 1;
    }
}

fn bench<M: Measurement>(c: &mut Criterion<M>) {
    let t = templates();
    let per_iter = 1024; // chunks per iteration: 4 MiB
    let bytes = (per_iter * CHUNK) as u64;
    let mut group = c.benchmark_group("buffer");
    group.throughput(Throughput::Bytes(bytes));
    group.sample_size(20);

    let mut ring = vec![0u8; BUFFER];
    let mut pos = 0;
    group.bench_function("memcpy", |b| {
        b.iter(|| {
            for i in 0..per_iter {
                if pos + CHUNK > ring.len() {
                    pos = 0;
                }
                ring[pos..pos + CHUNK].copy_from_slice(&t[i % t.len()].0);
                pos += CHUNK;
            }
            black_box(&mut ring);
        })
    });

    let mut buf = TraceBuffer::new(BUFFER, FillPolicy::RingBuffer);
    let mut next_id = 0u32;
    group.bench_function("write/single_writer", |b| {
        b.iter(|| {
            for i in 0..per_iter {
                let (payload, n) = &t[i % t.len()];
                buf.copy_chunk(&ChunkToCopy {
                    producer: 1,
                    writer: 1,
                    chunk_id: next_id,
                    num_fragments: *n,
                    flags: 0,
                    payload,
                    complete: true,
                });
                next_id = next_id.wrapping_add(1);
            }
        })
    });

    let mut buf = TraceBuffer::new(BUFFER, FillPolicy::RingBuffer);
    let mut next = vec![0u32; 1000];
    let mut k = 0usize;
    group.bench_function("write/many_writers", |b| {
        b.iter(|| {
            for i in 0..per_iter {
                let w = k % 1000;
                k += 1;
                let (payload, n) = &t[i % t.len()];
                buf.copy_chunk(&ChunkToCopy {
                    producer: 1,
                    writer: w as u16 + 1,
                    chunk_id: next[w],
                    num_fragments: *n,
                    flags: 0,
                    payload,
                    complete: true,
                });
                next[w] = next[w].wrapping_add(1);
            }
        })
    });

    // A zone end (as in `benches/readout.rs`): 9 bytes behind a 1-byte fragment header.
    let zone_end = [0x40u8, 0x85, 0x01, 0x5a, 0x02, 0x48, 0x02, 0x68, 0x02];
    let mut small = Vec::with_capacity(CHUNK);
    let mut small_n = 0u16;
    while small.len() + 1 + zone_end.len() <= CHUNK {
        small.push(zone_end.len() as u8);
        small.extend_from_slice(&zone_end);
        small_n += 1;
    }
    small.resize(CHUNK, 0);
    let mut buf = TraceBuffer::new(BUFFER, FillPolicy::RingBuffer);
    let mut next_id = 0u32;
    group.bench_function("write/small_packets", |b| {
        b.iter(|| {
            for _ in 0..per_iter {
                buf.copy_chunk(&ChunkToCopy {
                    producer: 1,
                    writer: 1,
                    chunk_id: next_id,
                    num_fragments: small_n,
                    flags: 0,
                    payload: &small,
                    complete: true,
                });
                next_id = next_id.wrapping_add(1);
            }
        })
    });
    drop(buf);

    group.bench_function("read", |b| {
        b.iter_batched_ref(
            || {
                let mut buf = TraceBuffer::new(BUFFER, FillPolicy::RingBuffer);
                write_chunks(&mut buf, &t, 8, per_iter);
                buf
            },
            |buf| {
                let mut sum = 0usize;
                buf.read_packets(true, |_, frags| {
                    sum += frags.iter().map(|f| f.len()).sum::<usize>()
                });
                black_box(sum);
            },
            criterion::BatchSize::LargeInput,
        )
    });
    group.finish();
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

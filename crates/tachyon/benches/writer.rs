//! The cost of one small trace packet through a `TraceWriter` into a shared memory chunk, beside
//! the floor it is measured against, in the same run:
//!
//! - `writer/packet`: a TracePacket with a timestamp and a TrackEvent {type, track_uuid,
//!   name_iid}: 21 bytes plus its 4-byte fragment header, written with the generated writers
//!   through `TraceWriter::write_packet` into a 4 KiB chunk. A consumer thread frees chunks as
//!   they are committed (acquire for reading + free, no copy), so the 4 MiB buffer never fills
//!   and the cost of switching chunks (one commit per ~160 packets) is included. The consumer
//!   polls the commit channel (every 50 µs), so a commit never has to wake it.
//! - `writer/packet_thread_local`: the same through `SmbArbiter::with_thread_writer`.
//! - `writer/packet_blocking_consumer`: the same with a consumer blocked in
//!   `CommitReceiver::recv`: every commit then pays a futex wake-up on the writing thread.
//! - `writer/protozero_only`: the same packet encoded by protozero into a plain 64-byte slice
//!   (`StaticBuffered`): the encoding cost alone, without chunks, counts or commits.
//! - `writer/speed_of_light`: the same 25 bytes stored with one unchecked copy at a moving
//!   position in a 4 KiB buffer: no encoding, no bounds checks, no bookkeeping.
//! - `writer/two_timestamps`: two `Instant::now()` calls, what a zone's begin and end cost in
//!   clock reads alone.
//!
//! Run: `cargo bench -p tachyon --bench writer`.
//!
//! With `TACHYON_WRITER_CALLGRIND=N` the bench skips criterion and writes N packets through a
//! `TraceWriter` (polling consumer, as `writer/packet`) in `writer_packets`, then encodes N with
//! protozero alone (as `writer/protozero_only`) in `protozero_packets`: run it under callgrind
//! and divide each function's inclusive instruction count by N (command in the crate README).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use tachyon::backend::{
    commit_channel, ArbiterConfig, CommitRequest, OwnedSmb, PageSize, SmbArbiter, TraceWriter,
};
use tachyon_protos::{track_event, TracePacket};

const TRACK_UUID: u64 = 0x5ff1_2345_6789;

#[inline(always)]
fn fill(p: &mut TracePacket<'_>, ts: u64) {
    p.set_timestamp(ts);
    let mut e = p.set_track_event();
    e.set_type(track_event::Type::SliceBegin);
    e.set_track_uuid(black_box(TRACK_UUID));
    e.set_name_iid(black_box(7));
}

/// One `writer/packet` iteration.
#[inline(always)]
fn write_one(writer: &mut TraceWriter, ts: &mut u64) {
    *ts += 1234;
    writer.write_packet(|p| fill(p, black_box(*ts)));
}

/// One `writer/protozero_only` iteration.
#[inline(always)]
fn encode_one(slot: &mut [u8; 64], ts: &mut u64) -> usize {
    *ts += 1234;
    let mut buf = protozero::StaticBuffered::new(black_box(&mut slot[..]));
    {
        let mut p: TracePacket<'_> = buf.root();
        fill(&mut p, black_box(*ts));
    }
    buf.written()
}

/// The bytes `writer/packet` puts in the chunk for timestamp `ts`: fragment header + packet.
fn packet_bytes(ts: u64) -> Vec<u8> {
    let mut buf = protozero::HeapBuffered::new();
    {
        let mut p: TracePacket<'_> = buf.root();
        fill(&mut p, ts);
    }
    let body = buf.serialize().unwrap();
    let mut out = tachyon_abi::encode_fragment_header(body.len() as u32)
        .unwrap()
        .to_vec();
    out.extend_from_slice(&body);
    out
}

/// A consumer thread that frees committed chunks; polls the channel unless `blocking`.
struct Consumer {
    arbiter: Arc<SmbArbiter>,
    thread: std::thread::JoinHandle<()>,
}

impl Consumer {
    fn start(blocking: bool) -> Consumer {
        let smb = Arc::new(OwnedSmb::new(4 << 20, PageSize::Kib4).unwrap());
        let (sink, commits) = commit_channel();
        // SAFETY: the consumer only touches chunks it acquired for reading.
        let arbiter = unsafe { SmbArbiter::new(Arc::clone(&smb), ArbiterConfig::default(), sink) };
        let thread = std::thread::spawn(move || {
            let view = smb.service();
            let free = |req: CommitRequest| {
                for mv in req.chunks_to_move {
                    let chunk = view
                        .try_acquire_chunk_for_reading(mv.page as usize, mv.chunk as usize)
                        .unwrap();
                    view.release_chunk_as_free(chunk).unwrap();
                }
            };
            if blocking {
                while let Some(req) = commits.recv() {
                    free(req);
                }
            } else {
                loop {
                    match commits.try_recv() {
                        Ok(Some(req)) => free(req),
                        Ok(None) => std::thread::sleep(Duration::from_micros(50)),
                        Err(_) => break,
                    }
                }
            }
        });
        Consumer { arbiter, thread }
    }

    fn finish(self) {
        self.arbiter.drop_thread_writers();
        drop(self.arbiter);
        self.thread.join().unwrap();
    }
}

fn bench(c: &mut Criterion) {
    let consumer = Consumer::start(false);
    let arbiter = Arc::clone(&consumer.arbiter);
    let mut g = c.benchmark_group("writer");
    g.throughput(Throughput::Elements(1));

    let mut writer = arbiter.create_trace_writer(0).unwrap();
    let mut ts = 1_700_000_000_000u64;
    g.bench_function("packet", |b| b.iter(|| write_one(&mut writer, &mut ts)));
    assert_eq!(writer.packets_dropped(), 0, "the service kept up");

    g.bench_function("packet_thread_local", |b| {
        b.iter(|| arbiter.with_thread_writer(0, |w| write_one(w, &mut ts)))
    });

    let mut slot = [0u8; 64];
    g.bench_function("protozero_only", |b| {
        b.iter(|| black_box(encode_one(&mut slot, &mut ts)))
    });

    let bytes = packet_bytes(ts);
    assert_eq!(bytes.len(), 25, "{bytes:02x?}");
    let mut chunk = vec![0u8; 4096];
    let mut pos = 0usize;
    g.bench_function("speed_of_light", |b| {
        b.iter(|| {
            if pos + 32 > chunk.len() {
                pos = 0;
            }
            let src = black_box(&bytes[..]);
            // SAFETY: `pos + 32 <= chunk.len()` (checked above) and `src` is 25 bytes, from
            // another allocation.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), chunk.as_mut_ptr().add(pos), 25) };
            pos += 25;
            black_box(&mut chunk);
        })
    });

    g.bench_function("two_timestamps", |b| {
        b.iter(|| {
            let a = Instant::now();
            let b = Instant::now();
            black_box((a, b))
        })
    });

    drop(writer);
    drop(arbiter);
    consumer.finish();

    let consumer = Consumer::start(true);
    let mut writer = consumer.arbiter.create_trace_writer(0).unwrap();
    g.bench_function("packet_blocking_consumer", |b| {
        b.iter(|| write_one(&mut writer, &mut ts))
    });
    drop(writer);
    consumer.finish();
    g.finish();
}

/// `n` packets through `writer`, for callgrind.
#[inline(never)]
fn writer_packets(writer: &mut TraceWriter, n: u64, ts: &mut u64) {
    for _ in 0..n {
        write_one(writer, ts);
    }
}

/// `n` packets encoded by protozero alone, for callgrind.
#[inline(never)]
fn protozero_packets(n: u64, ts: &mut u64) {
    let mut slot = [0u8; 64];
    for _ in 0..n {
        black_box(encode_one(&mut slot, ts));
    }
}

/// The `TACHYON_WRITER_CALLGRIND=N` mode (see the module docs).
fn instruction_counts(n: u64) {
    let consumer = Consumer::start(false);
    let mut writer = consumer.arbiter.create_trace_writer(0).unwrap();
    let mut ts = 1_700_000_000_000u64;
    // The first packet takes the first chunk: setup, not per-packet cost.
    write_one(&mut writer, &mut ts);
    writer_packets(&mut writer, n, &mut ts);
    assert_eq!(writer.packets_dropped(), 0, "the service kept up");
    protozero_packets(n, &mut ts);
    drop(writer);
    consumer.finish();
    println!(
        "{n} packets in writer_packets and in protozero_packets: divide their inclusive Ir by {n}"
    );
}

criterion_group!(benches, bench);

fn main() {
    if let Some(n) = std::env::var("TACHYON_WRITER_CALLGRIND")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        instruction_counts(n);
        return;
    }
    // What `criterion_main!(benches)` expands to.
    benches();
    Criterion::default().configure_from_args().final_summary();
}

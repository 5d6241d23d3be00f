//! Import throughput of a large trace, beside a baseline that only decodes it, in one run; and
//! peak memory per slice.
//!
//! The trace is shaped like what the C++ SDK and Tachyon's SDK write: 8 threads, each its own
//! sequence starting with SEQ_INCREMENTAL_STATE_CLEARED, a thread track descriptor, interned
//! names, categories and annotation names, and a ClockSnapshot tying the sequence-scoped
//! incremental clock 64 to BOOTTIME; then slices nested up to 3 deep whose begins carry an
//! interned name and category and two debug annotations (an int and a string), timestamps as
//! deltas on clock 64.
//!
//! By default the trace is written by Tachyon's SDK itself (`tachyon::zone!` with two
//! arguments, on 8 threads, into an in-memory session); `TACHYON_BENCH_SOURCE=generator` writes
//! the same shape with the generated writers instead (no SDK involved, and no source locations:
//! the SDK's slices also carry their file, function and line, three more args per slice).
//!
//! `TACHYON_BENCH_EVENTS` sets the number of TrackEvents (default 1 000 000; the target
//! is 10 000 000, which takes about 10× the time and memory). `TACHYON_BENCH_REPORT_ONLY=1`
//! prints the one timed import (throughput, memory) and skips criterion.
//!
//! Run: `cargo bench -p tachyon-processor --bench import`.
//!
//! * `import/decode_only`: walks every packet with the generated views and visits every field
//!   the importer reads (the floor: what decoding alone costs);
//! * `import/decode_lazy`: the same walk with the importer's own decoders (`lazy.rs`: what
//!   the import reads its per-event packets with);
//! * `import/full`: `TraceProcessor::from_bytes`, i.e. tokenize, sort, parse and copy into
//!   SQLite.
//!
//! * `query/<name>/{columnar,sqlite}`: queries Perfetto's users run (slices by name with
//!   duration aggregates, one track's slices in a time range, args of the slices with a name)
//!   over the loaded trace, as it is stored (`columnar`: the virtual tables) beside the same
//!   rows copied into plain SQLite tables in the same run (`sqlite`: how the processor stored
//!   them before, with its index on `arg_set_id`).
//!
//! Before criterion runs, one timed import prints events/s, the args per slice, and the peak
//! RSS growth (Linux: `VmHWM` after resetting it through `/proc/self/clear_refs`), divided by
//! the slice count. Beside the wall-clock times it prints the CPU time the bench thread spent
//! in each (Linux: `/proc/thread-self/schedstat`; decoding and importing run on that thread):
//! on a machine shared with other work, wall-clock time includes waiting for a CPU, and the
//! ratio of CPU times is the steadier comparison.

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use protozero::decoder::{FieldValue, ProtoDecoder};
use protozero::wire::{encode_varint, MAX_VARINT_SIZE};
use protozero::HeapBuffered;
use tachyon_processor::{Options, TraceProcessor, Value};
use tachyon_protos::{track_event, TracePacket, TracePacketView};

const THREADS: u64 = 8;

fn push_packet(trace: &mut Vec<u8>, fill: impl FnOnce(&mut TracePacket<'_>)) {
    let mut buf = HeapBuffered::new();
    {
        let mut p: TracePacket<'_> = buf.root();
        fill(&mut p);
    }
    let bytes = buf.serialize().expect("packet fits");
    // Trace.packet (field 1, length-delimited) with a minimal length varint, as the service
    // writes it.
    let mut len = [0u8; MAX_VARINT_SIZE];
    let n = encode_varint(bytes.len() as u64, &mut len);
    trace.push(0x0a);
    trace.extend_from_slice(&len[..n]);
    trace.extend_from_slice(&bytes);
}

/// About `events` TrackEvents (rounded to whole begin/end pairs per thread).
fn sdk_shaped_trace(events: u64) -> Vec<u8> {
    let mut t = Vec::with_capacity(events as usize * 40);
    let per_thread = events / THREADS / 2; // begin/end pairs
    for thread in 0..THREADS {
        let seq = thread as u32 + 1;
        let uuid = 1000 + thread;
        push_packet(&mut t, |p| {
            p.set_trusted_packet_sequence_id(seq);
            p.set_sequence_flags(1);
            p.set_timestamp(1_000_000);
            let mut d = p.set_track_descriptor();
            d.set_uuid(uuid);
            let mut th = d.set_thread();
            th.set_pid(1);
            th.set_tid(100 + thread as i64);
            th.set_thread_name(&format!("worker-{thread}"));
        });
        push_packet(&mut t, |p| {
            p.set_trusted_packet_sequence_id(seq);
            let mut defaults = p.set_trace_packet_defaults();
            defaults.set_timestamp_clock_id(64);
            defaults.set_track_event_defaults().set_track_uuid(uuid);
        });
        push_packet(&mut t, |p| {
            p.set_trusted_packet_sequence_id(seq);
            let mut cs = p.set_clock_snapshot();
            let mut boot = cs.add_clocks();
            boot.set_clock_id(6);
            boot.set_timestamp(1_000_000);
            drop(boot);
            let mut inc = cs.add_clocks();
            inc.set_clock_id(64);
            inc.set_timestamp(1_000_000);
            inc.set_is_incremental(true);
        });
        push_packet(&mut t, |p| {
            p.set_trusted_packet_sequence_id(seq);
            p.set_sequence_flags(2);
            let mut i = p.set_interned_data();
            for n in 1..=50u64 {
                let mut e = i.add_event_names();
                e.set_iid(n);
                e.set_name(&format!("zone_{n}"));
            }
            for n in 1..=3u64 {
                let mut c = i.add_event_categories();
                c.set_iid(n);
                c.set_name(&format!("cat{n}"));
            }
            let mut a = i.add_debug_annotation_names();
            a.set_iid(1);
            a.set_name("count");
            drop(a);
            let mut a = i.add_debug_annotation_names();
            a.set_iid(2);
            a.set_name("job");
        });
        // Pairs nested 0..3 deep: begin, begin, begin, end, end, end, …
        let mut open = 0u32;
        let mut pairs_left = per_thread;
        let mut i = 0u64;
        while pairs_left > 0 || open > 0 {
            let begin = open == 0 || (open < 3 && pairs_left > 0 && i % 2 == 0);
            i += 1;
            push_packet(&mut t, |p| {
                p.set_trusted_packet_sequence_id(seq);
                p.set_sequence_flags(2);
                p.set_timestamp(37 + i % 13); // delta on clock 64
                let mut e = p.set_track_event();
                if begin {
                    e.set_type(track_event::Type::SliceBegin);
                    e.set_name_iid(1 + i % 50);
                    e.add_category_iids(1 + i % 3);
                    let mut a = e.add_debug_annotations();
                    a.set_name_iid(1);
                    a.set_int_value(i as i64);
                    drop(a);
                    let mut a = e.add_debug_annotations();
                    a.set_name_iid(2);
                    a.set_string_value(&format!("job-{}", i % 100));
                } else {
                    e.set_type(track_event::Type::SliceEnd);
                }
            });
            if begin {
                open += 1;
                pairs_left -= 1;
            } else {
                open -= 1;
            }
        }
    }
    t
}

/// The baseline: decode every packet and every field the importer looks at, import nothing.
fn decode_only(trace: &[u8]) -> u64 {
    let mut sum = 0u64;
    let mut dec = ProtoDecoder::new(trace);
    while let Ok(Some(f)) = dec.read_field() {
        let FieldValue::Bytes(bytes) = f.value() else {
            continue;
        };
        let p = TracePacketView::decode(bytes).expect("well-formed packet");
        sum = sum
            .wrapping_add(p.timestamp())
            .wrapping_add(p.timestamp_clock_id() as u64)
            .wrapping_add(p.trusted_packet_sequence_id() as u64)
            .wrapping_add(p.sequence_flags() as u64)
            .wrapping_add(p.previous_packet_dropped() as u64);
        if p.has_interned_data() {
            let i = p.interned_data().expect("interned data");
            for n in i.event_names() {
                let n = n.expect("name");
                sum = sum.wrapping_add(n.iid() + n.name_bytes().len() as u64);
            }
        }
        if p.has_track_event() {
            let e = p.track_event().expect("event");
            sum = sum
                .wrapping_add(e.type_raw() as u64)
                .wrapping_add(e.track_uuid())
                .wrapping_add(e.name_iid())
                .wrapping_add(e.name_bytes().len() as u64)
                .wrapping_add(e.counter_value() as u64);
            for c in e.category_iids() {
                sum = sum.wrapping_add(c.expect("category"));
            }
            for f in e.flow_ids() {
                sum = sum.wrapping_add(f.expect("flow"));
            }
            for a in e.debug_annotations() {
                let a = a.expect("annotation");
                sum = sum
                    .wrapping_add(a.name_iid())
                    .wrapping_add(a.int_value() as u64)
                    .wrapping_add(a.string_value_bytes().len() as u64);
            }
        }
    }
    sum
}

/// (VmRSS, VmHWM) in bytes, from /proc/self/status (None elsewhere).
fn rss() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// The CPU time the calling thread has run, in seconds (None where the kernel does not say).
fn thread_cpu_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 / 1e9)
}

fn report(trace: &[u8], events: u64) {
    let mb = trace.len() as f64 / 1e6;
    let cpu0 = thread_cpu_s();
    let t0 = Instant::now();
    black_box(decode_only(trace));
    let decode_s = t0.elapsed().as_secs_f64();
    let decode_cpu = thread_cpu_s().zip(cpu0).map(|(b, a)| b - a);

    // The same walk with the importer's own decoders (`lazy.rs`), which the import uses
    // instead of the generated views for its per-event messages.
    let cpu0 = thread_cpu_s();
    let t0 = Instant::now();
    black_box(tachyon_processor::lazy_decode_walk(black_box(trace)));
    let lazy_s = t0.elapsed().as_secs_f64();
    let lazy_cpu = thread_cpu_s().zip(cpu0).map(|(b, a)| b - a);

    // Reset the peak-RSS mark so VmHWM measures this import only.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = rss();
    let cpu0 = thread_cpu_s();
    let t0 = Instant::now();
    let tp = TraceProcessor::from_bytes(trace, &Options::default()).expect("imports");
    let import_s = t0.elapsed().as_secs_f64();
    let import_cpu = thread_cpu_s().zip(cpu0).map(|(b, a)| b - a);
    let after = rss();
    let count = |sql: &str| match &tp.query(sql).expect("query").rows[0][0] {
        Value::Integer(n) => *n as u64,
        _ => 0,
    };
    let slices = count("SELECT count(*) FROM slice");
    // What a slice carries decides its memory: debug annotations and, in an SDK-written trace,
    // the source location (file, function, line) are args.
    let args = count("SELECT count(*) FROM args");
    println!(
        "trace: {events} TrackEvents, {slices} slices, {args} args ({:.1} per slice), \
         {mb:.1} MB\n\
         decode only: {decode_s:.3} s = {:.1} MB/s, {:.2} M events/s\n\
         full import: {import_s:.3} s = {:.1} MB/s, {:.2} M events/s ({:.1}x decode)",
        args as f64 / slices.max(1) as f64,
        mb / decode_s,
        events as f64 / decode_s / 1e6,
        mb / import_s,
        events as f64 / import_s / 1e6,
        import_s / decode_s,
    );
    if let (Some(d), Some(i)) = (decode_cpu, import_cpu) {
        println!(
            "CPU time: decode only {d:.3} s = {:.2} M events/s, full import {i:.3} s = \
             {:.2} M events/s ({:.1}x decode)",
            events as f64 / d / 1e6,
            events as f64 / i / 1e6,
            i / d,
        );
    }
    println!(
        "decode with the importer's decoders: {lazy_s:.3} s = {:.1} MB/s, {:.2} M events/s",
        mb / lazy_s,
        events as f64 / lazy_s / 1e6,
    );
    if let (Some(l), Some(i)) = (lazy_cpu, import_cpu) {
        println!(
            "CPU time: importer's decoders {l:.3} s = {:.1} MB/s, {:.2} M events/s; full import \
             {:.1}x that",
            mb / l,
            events as f64 / l / 1e6,
            i / l,
        );
    }
    if let (true, Some((rss0, _)), Some((rss1, hwm))) = (reset, before, after) {
        println!(
            "memory: peak RSS +{:.0} MB during import ({:.0} bytes/slice), +{:.0} MB retained \
             by the loaded database ({:.0} bytes/slice)",
            (hwm - rss0) as f64 / 1e6,
            (hwm - rss0) as f64 / slices.max(1) as f64,
            rss1.saturating_sub(rss0) as f64 / 1e6,
            rss1.saturating_sub(rss0) as f64 / slices.max(1) as f64,
        );
    }
    drop(tp);
}

/// About `events` TrackEvents written by the SDK: 8 threads, zones nested 3 deep, each begin
/// with an int and a string argument.
fn sdk_written_trace(events: u64) -> Vec<u8> {
    let per_thread = events / THREADS / 2;
    tachyon::start(tachyon::Config {
        output: None,
        // Everything must fit: no ring-buffer overwrite, so the event count is exact.
        buffer_size: (events as usize * 24).clamp(8 << 20, 15 << 30),
        fill_policy: tachyon::FillPolicy::Discard,
        on_full: tachyon::BufferExhaustedPolicy::Stall {
            timeout: std::time::Duration::from_secs(10),
        },
        ..tachyon::Config::default()
    })
    .expect("start the SDK session");
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let names = ["frame", "layout", "paint"];
                let mut i = 0;
                while i < per_thread {
                    let _a = tachyon::zone!("bench", "frame", n = i, kind = names[0]);
                    let _b = tachyon::zone!("bench", "layout", n = i + 1, kind = names[1]);
                    let _c = tachyon::zone!("bench", "paint", n = t, kind = names[2]);
                    i += 3;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer thread");
    }
    let report = tachyon::shutdown().expect("stop").expect("session");
    assert_eq!(
        report.writers.packets_dropped, 0,
        "the bench trace lost events"
    );
    report.trace
}

fn bench(c: &mut Criterion) {
    let events: u64 = std::env::var("TACHYON_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let trace = if std::env::var("TACHYON_BENCH_SOURCE").is_ok_and(|v| v == "generator") {
        sdk_shaped_trace(events)
    } else {
        sdk_written_trace(events)
    };
    report(&trace, events);
    if std::env::var("TACHYON_BENCH_REPORT_ONLY").is_ok_and(|v| v == "1") {
        return;
    }

    let mut group = c.benchmark_group("import");
    group.throughput(Throughput::Bytes(trace.len() as u64));
    group.sample_size(10);
    group.bench_function("decode_only", |b| b.iter(|| decode_only(black_box(&trace))));
    group.bench_function("decode_lazy", |b| {
        b.iter(|| tachyon_processor::lazy_decode_walk(black_box(&trace)))
    });
    group.bench_function("full", |b| {
        b.iter(|| {
            TraceProcessor::from_bytes(black_box(&trace), &Options::default()).expect("imports")
        })
    });
    group.finish();

    // Queries, over the virtual tables and over a plain SQLite copy of the same rows.
    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).expect("imports");
    tp.query(
        "CREATE TABLE slice_sqlite AS SELECT * FROM __intrinsic_slice; \
         CREATE TABLE args_sqlite AS SELECT * FROM __intrinsic_args; \
         CREATE INDEX args_sqlite_set ON args_sqlite(arg_set_id);",
    )
    .expect("copy");
    let int = |sql: &str| match &tp.query(sql).expect("query").rows[0][0] {
        Value::Integer(n) => *n,
        _ => 0,
    };
    // The track with the most slices (a worker thread's zones), and the middle tenth of its
    // slices in time (a time span: the thread may have been descheduled for long stretches).
    let track = int("SELECT track_id FROM slice GROUP BY track_id ORDER BY count(*) DESC LIMIT 1");
    let n = int(&format!(
        "SELECT count(*) FROM slice WHERE track_id = {track}"
    ));
    let nth_ts = |k: i64| {
        int(&format!(
            "SELECT ts FROM slice WHERE track_id = {track} ORDER BY ts LIMIT 1 OFFSET {k}"
        ))
    };
    let (from, to) = (nth_ts(n * 45 / 100), nth_ts(n * 55 / 100));
    let queries = [
        (
            "by_name",
            "SELECT name, count(*), sum(dur), avg(dur), max(dur) FROM {slice} \
             GROUP BY name ORDER BY sum(dur) DESC"
                .to_owned(),
        ),
        (
            "track_range",
            format!(
                "SELECT ts, dur, name FROM {{slice}} \
                 WHERE track_id = {track} AND ts BETWEEN {from} AND {to} ORDER BY ts"
            ),
        ),
        (
            "args_of_name",
            "SELECT a.key, count(*), sum(a.int_value) FROM {slice} s \
             JOIN {args} a USING (arg_set_id) WHERE s.name = 'paint' GROUP BY a.key"
                .to_owned(),
        ),
    ];
    let mut group = c.benchmark_group("query");
    group.sample_size(10);
    for (name, sql) in &queries {
        let run = |slice: &str, args: &str| {
            let sql = sql.replace("{slice}", slice).replace("{args}", args);
            tp.query(&sql).expect("query").rows
        };
        assert_eq!(
            run("__intrinsic_slice", "__intrinsic_args"),
            run("slice_sqlite", "args_sqlite"),
            "{name}: both storages give the same rows"
        );
        for (storage, slice, args) in [
            ("columnar", "__intrinsic_slice", "__intrinsic_args"),
            ("sqlite", "slice_sqlite", "args_sqlite"),
        ] {
            let sql = sql.replace("{slice}", slice).replace("{args}", args);
            let rows = tp.query(&sql).expect("query").rows;
            assert!(!rows.is_empty(), "{name} returns rows: {sql}");
            group.bench_function(format!("{name}/{storage}"), |b| {
                b.iter(|| tp.query(black_box(&sql)).expect("query"))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Decoding a trace-shaped buffer (100 000 TracePackets with TrackEvents, as Tachyon writes
//! them) with tachyon-protos' generated views versus prost's generated structs, beside a
//! `memcpy` of the same bytes, in one criterion run.
//!
//! Both decoders visit the same fields (timestamp, sequence id, event type, track, name iid,
//! categories, debug annotations) and fold them into a checksum, which must agree.
//!
//! Run: `cargo bench -p tachyon-protos-bench --bench decode`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use prost::Message as _;
use tachyon_protos::TraceView;
use tachyon_protos_bench::{prost_protos, trace_shaped_input};

const PACKETS: usize = 100_000;

/// Walks the trace with the generated zero-copy views.
fn checksum_views(bytes: &[u8]) -> u64 {
    let trace = TraceView::decode(bytes).expect("well-formed trace");
    let mut sum = 0u64;
    for packet in trace.packet() {
        let packet = packet.expect("well-formed packet");
        sum = sum.wrapping_add(packet.timestamp());
        sum = sum.wrapping_add(packet.trusted_packet_sequence_id() as u64);
        if packet.has_track_event() {
            let event = packet.track_event().expect("well-formed event");
            sum = sum.wrapping_add(event.r#type_raw() as u64);
            sum = sum.wrapping_add(event.track_uuid());
            sum = sum.wrapping_add(event.name_iid());
            for iid in event.category_iids() {
                sum = sum.wrapping_add(iid.expect("well-formed iid"));
            }
            for annotation in event.debug_annotations() {
                let annotation = annotation.expect("well-formed annotation");
                sum = sum.wrapping_add(annotation.name_iid());
                sum = sum.wrapping_add(annotation.int_value() as u64);
                sum = sum.wrapping_add(annotation.string_value_bytes().len() as u64);
            }
        }
    }
    sum
}

/// Decodes the trace into prost's owned structs, then walks them.
fn checksum_prost(bytes: &[u8]) -> u64 {
    use prost_protos::{debug_annotation, trace_packet, track_event};
    let trace = prost_protos::Trace::decode(bytes).expect("well-formed trace");
    let mut sum = 0u64;
    for packet in &trace.packet {
        sum = sum.wrapping_add(packet.timestamp.unwrap_or(0));
        if let Some(trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(id)) =
            packet.optional_trusted_packet_sequence_id
        {
            sum = sum.wrapping_add(id as u64);
        }
        if let Some(trace_packet::Data::TrackEvent(event)) = &packet.data {
            sum = sum.wrapping_add(event.r#type.unwrap_or(0) as u64);
            sum = sum.wrapping_add(event.track_uuid.unwrap_or(0));
            if let Some(track_event::NameField::NameIid(iid)) = event.name_field {
                sum = sum.wrapping_add(iid);
            }
            for iid in &event.category_iids {
                sum = sum.wrapping_add(*iid);
            }
            for annotation in &event.debug_annotations {
                if let Some(debug_annotation::NameField::NameIid(iid)) = annotation.name_field {
                    sum = sum.wrapping_add(iid);
                }
                match &annotation.value {
                    Some(debug_annotation::Value::IntValue(v)) => sum = sum.wrapping_add(*v as u64),
                    Some(debug_annotation::Value::StringValue(s)) => {
                        sum = sum.wrapping_add(s.len() as u64)
                    }
                    _ => {}
                }
            }
        }
    }
    sum
}

fn bench(c: &mut Criterion) {
    let bytes = trace_shaped_input(PACKETS);
    let expected = checksum_prost(&bytes);
    assert_eq!(
        checksum_views(&bytes),
        expected,
        "both decoders see the same trace"
    );

    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.sample_size(20);
    group.bench_function("protozero_views", |b| {
        b.iter(|| checksum_views(black_box(&bytes)))
    });
    group.bench_function("prost", |b| b.iter(|| checksum_prost(black_box(&bytes))));
    let mut dst = vec![0u8; bytes.len()];
    group.bench_function("memcpy", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&bytes));
            black_box(&mut dst);
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

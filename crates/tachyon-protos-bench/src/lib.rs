//! Benchmark support (unpublished): prost's structs for the same `.proto` files that
//! `tachyon-protos` generates ProtoZero code from, and a trace-shaped input built with them.
//!
//! The benchmark itself is `benches/decode.rs`:
//! `cargo bench -p tachyon-protos-bench --bench decode`.
#![forbid(unsafe_code)]

/// prost's structs for `perfetto.protos`, generated at build time by prost-build.
#[allow(missing_docs, clippy::all, unreachable_pub)]
pub mod prost_protos {
    include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));
}

use prost::Message as _;
use prost_protos::{
    debug_annotation, trace_packet, track_event, DebugAnnotation, Trace, TracePacket, TrackEvent,
};

/// A trace of `n` packets shaped like what Tachyon writes: every packet has a timestamp, a
/// sequence id and a TrackEvent (begin/end slices with interned names and categories, a
/// track uuid, and on begins two debug annotations).
pub fn trace_shaped_input(n: usize) -> Vec<u8> {
    let mut trace = Trace::default();
    for i in 0..n as u64 {
        let begin = i % 2 == 0;
        let mut event = TrackEvent {
            r#type: Some(if begin {
                track_event::Type::SliceBegin
            } else {
                track_event::Type::SliceEnd
            } as i32),
            track_uuid: Some(1000 + i % 8),
            category_iids: vec![1 + i % 3],
            ..Default::default()
        };
        if begin {
            event.name_field = Some(track_event::NameField::NameIid(1 + i % 50));
            event.debug_annotations = vec![
                DebugAnnotation {
                    name_field: Some(debug_annotation::NameField::NameIid(1)),
                    value: Some(debug_annotation::Value::IntValue(i as i64)),
                    ..Default::default()
                },
                DebugAnnotation {
                    name_field: Some(debug_annotation::NameField::NameIid(2)),
                    value: Some(debug_annotation::Value::StringValue(format!(
                        "job-{}",
                        i % 100
                    ))),
                    ..Default::default()
                },
            ];
        }
        trace.packet.push(TracePacket {
            timestamp: Some(1_000_000 + i * 37),
            optional_trusted_packet_sequence_id: Some(
                trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(
                    1 + (i % 4) as u32,
                ),
            ),
            sequence_flags: Some(2),
            data: Some(trace_packet::Data::TrackEvent(event)),
            ..Default::default()
        });
    }
    trace.encode_to_vec()
}

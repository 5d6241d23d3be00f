//! `zone_stats` (what `tachyon stats` prints) counts every zone: a slice that began and ended,
//! also on the same nanosecond (`dur = 0`), but not instants or slices that never ended.

mod common;

use common::text_trace;
use tachyon_processor::{Options, TraceProcessor, Value};

#[test]
fn zero_length_zones_are_zones_and_instants_are_not() {
    let trace = text_trace(
        r#"
        packet { trusted_packet_sequence_id: 1 timestamp: 10 track_event { track_uuid: 1 type: TYPE_SLICE_BEGIN name: "z" } }
        packet { trusted_packet_sequence_id: 1 timestamp: 10 track_event { track_uuid: 1 type: TYPE_SLICE_END } }
        packet { trusted_packet_sequence_id: 1 timestamp: 20 track_event { track_uuid: 1 type: TYPE_SLICE_BEGIN name: "z" } }
        packet { trusted_packet_sequence_id: 1 timestamp: 25 track_event { track_uuid: 1 type: TYPE_SLICE_END } }
        packet { trusted_packet_sequence_id: 1 timestamp: 30 track_event { track_uuid: 1 type: TYPE_INSTANT name: "z" } }
        packet { trusted_packet_sequence_id: 1 timestamp: 40 track_event { track_uuid: 1 name: "x" legacy_event { phase: 88 duration_us: 0 } } }
        packet { trusted_packet_sequence_id: 1 timestamp: 50 track_event { track_uuid: 1 type: TYPE_SLICE_BEGIN name: "z" } }
        "#,
    );
    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
    let zones = tp.zone_stats().unwrap();
    let z = zones.iter().find(|z| z.name == "z").expect("zone z");
    assert_eq!((z.count, z.total_ns, z.min_ns, z.max_ns), (2, 5, 0, 5));
    let x = zones
        .iter()
        .find(|z| z.name == "x")
        .expect("complete event x");
    assert_eq!((x.count, x.total_ns), (1, 0));
    // The slice table holds all five, the instant and the unfinished one included.
    let r = tp.query("SELECT count(*) FROM slice").unwrap();
    assert_eq!(r.rows[0][0], Value::Integer(5));
}

//! Hostile inputs found by hand and by the fuzz targets (`fuzz/fuzz_targets/import*.rs`): each
//! must import (with the problem counted in `stats`) or be refused with an error, never panic.

mod common;

use common::text_trace;
use tachyon_processor::{Options, SortMode, TraceProcessor};

/// Imports `bytes` in both sorting modes, runs the queries `tachyon stats` runs and returns the
/// non-zero stats of the full-sort import as (name, value).
fn import(bytes: &[u8]) -> Vec<(String, i64)> {
    let mut stats = Vec::new();
    for sort in [SortMode::Windowed, SortMode::Full] {
        let tp = TraceProcessor::from_bytes(bytes, &Options::with_sort(sort)).expect("imports");
        tp.zone_stats().expect("zone stats");
        tp.query("SELECT count(*), total(dur) FROM slice")
            .expect("slice");
        let r = tp
            .query("SELECT name, value FROM stats WHERE value != 0 ORDER BY name")
            .expect("stats");
        stats = r
            .rows
            .into_iter()
            .map(|row| match (&row[0], &row[1]) {
                (tachyon_processor::Value::Text(n), tachyon_processor::Value::Integer(v)) => {
                    (n.clone(), *v)
                }
                other => panic!("{other:?}"),
            })
            .collect();
    }
    stats
}

fn has(stats: &[(String, i64)], name: &str) -> bool {
    stats.iter().any(|(n, v)| n == name && *v > 0)
}

/// One packet holding an empty ClockSnapshot (`0a 02 32 00`) used to index an empty series.
#[test]
fn empty_clock_snapshot() {
    let stats = import(&[0x0a, 0x02, 0x32, 0x00]);
    assert!(has(&stats, "invalid_clock_snapshots"), "{stats:?}");
}

/// Snapshots that contradict each other (a clock going back, a clock twice, a value whose
/// unit overflows), and a timestamp on a clock no snapshot links to the trace clock.
#[test]
fn inconsistent_clock_snapshots_and_clocks_without_a_path() {
    let stats = import(&text_trace(
        r#"
        packet { clock_snapshot { clocks { clock_id: 6 timestamp: 1000 } clocks { clock_id: 3 timestamp: 10 } } }
        packet { clock_snapshot { clocks { clock_id: 6 timestamp: 900 } clocks { clock_id: 3 timestamp: 20 } } }
        packet { clock_snapshot { clocks { clock_id: 3 timestamp: 1 } clocks { clock_id: 3 timestamp: 2 } } }
        packet { clock_snapshot { clocks { clock_id: 6 timestamp: 18446744073709551615 unit_multiplier_ns: 1000 } clocks { clock_id: 200 timestamp: 1 } } }
        packet { clock_snapshot { clocks { clock_id: 300 timestamp: 5 } clocks { clock_id: 301 timestamp: 6 } } }
        packet { trusted_packet_sequence_id: 1 incremental_state_cleared: true timestamp: 7 timestamp_clock_id: 300
                 track_event { type: TYPE_INSTANT name: "lost" } }
        packet { trusted_packet_sequence_id: 1 timestamp: 7 timestamp_clock_id: 99
                 track_event { type: TYPE_INSTANT name: "lost too" } }
        packet { trusted_packet_sequence_id: 1 timestamp: 15 timestamp_clock_id: 3
                 track_event { type: TYPE_INSTANT name: "kept" } }
        "#,
    ));
    assert!(has(&stats, "invalid_clock_snapshots"), "{stats:?}");
    assert!(has(&stats, "clock_sync_failure"), "{stats:?}");
}

/// Tracks whose parents form a loop, or name a track never described; an event on each.
#[test]
fn track_descriptor_cycles_and_dangling_parents() {
    let stats = import(&text_trace(
        r#"
        packet { trusted_packet_sequence_id: 1 track_descriptor { uuid: 1 parent_uuid: 2 } }
        packet { trusted_packet_sequence_id: 1 track_descriptor { uuid: 2 parent_uuid: 1 } }
        packet { trusted_packet_sequence_id: 1 track_descriptor { uuid: 3 parent_uuid: 3 } }
        packet { trusted_packet_sequence_id: 1 track_descriptor { uuid: 4 parent_uuid: 77 } }
        packet { trusted_packet_sequence_id: 1 timestamp: 10 track_event { track_uuid: 1 type: TYPE_SLICE_BEGIN name: "a" } }
        packet { trusted_packet_sequence_id: 1 timestamp: 11 track_event { track_uuid: 3 type: TYPE_INSTANT name: "b" } }
        packet { trusted_packet_sequence_id: 1 timestamp: 12 track_event { track_uuid: 4 type: TYPE_INSTANT name: "c" } }
        packet { trusted_packet_sequence_id: 1 timestamp: 13 track_event { track_uuid: 1 type: TYPE_SLICE_END } }
        "#,
    ));
    assert!(has(&stats, "track_event_track_hierarchy_loop"), "{stats:?}");
    assert!(has(&stats, "track_hierarchy_missing_uuid"), "{stats:?}");
}

/// Interned ids that were never defined, and ones at the ends of the u64 range.
#[test]
fn iids_out_of_range() {
    let stats = import(&text_trace(
        r#"
        packet { trusted_packet_sequence_id: 1 incremental_state_cleared: true
                 interned_data { event_names { iid: 18446744073709551615 name: "max" } } }
        packet { trusted_packet_sequence_id: 1 sequence_flags: 2 timestamp: 10
                 track_event { type: TYPE_INSTANT name_iid: 18446744073709551615 category_iids: 0 category_iids: 9
                               debug_annotations { name_iid: 5 int_value: 1 }
                               debug_annotations { name: "s" string_value_iid: 3 }
                               source_location_iid: 12 } }
        packet { trusted_packet_sequence_id: 1 sequence_flags: 2 timestamp: 11
                 track_event { type: TYPE_INSTANT name_iid: 0 legacy_event { name_iid: 4 phase: 73 } } }
        "#,
    ));
    assert!(has(&stats, "interned_data_tokenizer_errors"), "{stats:?}");
}

/// Durations and timestamps at the ends of i64: a complete event lasting i64::MAX µs, slices
/// whose durations sum past i64::MAX (the zone statistics saturate), negative timestamps.
#[test]
fn huge_and_negative_durations() {
    let stats = import(&text_trace(
        r#"
        packet { trusted_packet_sequence_id: 1 timestamp: 1
                 track_event { track_uuid: 5 name: "x" legacy_event { phase: 88 duration_us: 9223372036854775807 } } }
        packet { trusted_packet_sequence_id: 1 timestamp: 2
                 track_event { track_uuid: 6 name: "z" type: TYPE_SLICE_BEGIN } }
        packet { trusted_packet_sequence_id: 1 timestamp: 9223372036854775807
                 track_event { track_uuid: 6 type: TYPE_SLICE_END } }
        packet { trusted_packet_sequence_id: 1 timestamp: 3
                 track_event { track_uuid: 7 name: "z" type: TYPE_SLICE_BEGIN } }
        packet { trusted_packet_sequence_id: 1 timestamp: 9223372036854775806
                 track_event { track_uuid: 7 type: TYPE_SLICE_END } }
        packet { trusted_packet_sequence_id: 1 timestamp: 18446744073709551615
                 track_event { track_uuid: 7 name: "negative" type: TYPE_INSTANT } }
        packet { trusted_packet_sequence_id: 1
                 track_event { track_uuid: 7 name: "negative us" type: TYPE_INSTANT timestamp_absolute_us: -5 } }
        "#,
    ));
    assert!(has(&stats, "track_event_invalid_timestamp"), "{stats:?}");
    let tp = TraceProcessor::from_bytes(
        &text_trace(
            r#"
            packet { trusted_packet_sequence_id: 1 timestamp: 2 track_event { track_uuid: 6 name: "z" type: TYPE_SLICE_BEGIN } }
            packet { trusted_packet_sequence_id: 1 timestamp: 9223372036854775807 track_event { track_uuid: 6 type: TYPE_SLICE_END } }
            packet { trusted_packet_sequence_id: 1 timestamp: 3 track_event { track_uuid: 7 name: "z" type: TYPE_SLICE_BEGIN } }
            packet { trusted_packet_sequence_id: 1 timestamp: 9223372036854775806 track_event { track_uuid: 7 type: TYPE_SLICE_END } }
            "#,
        ),
        &Options::default(),
    )
    .unwrap();
    let zones = tp.zone_stats().unwrap();
    assert_eq!(zones[0].count, 2);
    assert_eq!(zones[0].total_ns, i64::MAX, "saturated");
}

/// Debug annotations nested far deeper than the import follows (10 000 levels of dicts, and
/// of legacy NestedValue arrays), written as raw bytes.
#[test]
fn deeply_nested_annotations() {
    fn varint(out: &mut Vec<u8>, mut n: u64) {
        while n >= 0x80 {
            out.push(n as u8 | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
    }
    fn field(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
        varint(out, ((number as u64) << 3) | 2);
        varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }
    // DebugAnnotation: name = 10, int_value = 4, nested_value = 8, dict_entries = 11.
    let mut dict = vec![0x20, 0x01]; // int_value: 1
    for _ in 0..10_000 {
        let mut outer = Vec::new();
        field(&mut outer, 10, b"d");
        field(&mut outer, 11, &dict);
        dict = outer;
    }
    // NestedValue: nested_type = 1 (ARRAY = 2), array_values = 4, int_value = 5.
    let mut nested = vec![0x28, 0x01];
    for _ in 0..10_000 {
        let mut outer = vec![0x08, 0x02];
        field(&mut outer, 4, &nested);
        nested = outer;
    }
    let mut annotation_b = Vec::new();
    field(&mut annotation_b, 10, b"b");
    field(&mut annotation_b, 8, &nested);
    // TrackEvent: type = 9 (TYPE_INSTANT = 3), name = 23, debug_annotations = 4.
    let mut event = vec![0x48, 0x03];
    field(&mut event, 23, b"deep");
    field(&mut event, 4, &dict);
    field(&mut event, 4, &annotation_b);
    // TracePacket: trusted_packet_sequence_id = 10, timestamp = 8, track_event = 11.
    let mut packet = vec![0x50, 0x01, 0x40, 0x01];
    field(&mut packet, 11, &event);
    let mut trace = Vec::new();
    field(&mut trace, 1, &packet);
    let stats = import(&trace);
    assert!(has(&stats, "track_event_tokenizer_errors"), "{stats:?}");
}

/// More flow ids on one event than an event can carry: the rest are counted, not silently
/// dropped.
#[test]
fn flow_id_limits_are_counted() {
    let ids: String = (1..=70_000u64).map(|i| format!("flow_ids: {i} ")).collect();
    let stats = import(&text_trace(&format!(
        r#"packet {{ trusted_packet_sequence_id: 1 timestamp: 1
               track_event {{ type: TYPE_INSTANT name: "many" {ids} }} }}
           packet {{ trusted_packet_sequence_id: 1 timestamp: 2
               track_event {{ type: TYPE_INSTANT name: "end" terminating_flow_ids: 1 terminating_flow_ids: 69999 }} }}"#
    )));
    assert!(
        stats
            .iter()
            .any(|(n, v)| n == "flow_ids_dropped" && *v == 70_000 - 65_535),
        "{stats:?}"
    );
    assert!(has(&stats, "flow_end_without_start"), "{stats:?}");
}

/// StreamingProfilePackets at the edges: before any ThreadDescriptor, with deltas that overflow
/// either way, more callstacks than deltas, unknown callstacks; and end events whose args
/// collide with their begin's in every shape (arrays continuing past i64 indices, malformed
/// indices, JSON that does not parse or nests too deep). The merged args must import without a
/// panic; their values are checked by the corpus cases and the diff tests, not here.
#[test]
fn streaming_profiles_and_merged_args_at_the_edges() {
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000)).replace('"', "\\\"");
    let stats = import(&text_trace(&format!(
        r#"
        packet {{ trusted_packet_sequence_id: 1
          streaming_profile_packet {{ callstack_iid: 1 timestamp_delta_us: 5 }} }}
        packet {{ trusted_packet_sequence_id: 1 incremental_state_cleared: true
          thread_descriptor {{ pid: 1 tid: 2 reference_timestamp_us: 9223372036854775807 }} }}
        packet {{ trusted_packet_sequence_id: 1
          streaming_profile_packet {{ callstack_iid: 1 callstack_iid: 2
            timestamp_delta_us: 9223372036854775807 }} }}
        packet {{ trusted_packet_sequence_id: 1
          thread_descriptor {{ pid: 1 tid: 2 reference_timestamp_us: 10 }} }}
        packet {{ trusted_packet_sequence_id: 1
          streaming_profile_packet {{ callstack_iid: 7 timestamp_delta_us: -9223372036854775808
            timestamp_delta_us: -1 }} }}
        packet {{ trusted_packet_sequence_id: 2 timestamp: 10 incremental_state_cleared: true
          track_descriptor {{ uuid: 1 thread {{ pid: 1 tid: 3 }} }} }}
        packet {{ trusted_packet_sequence_id: 2 timestamp: 20
          track_event {{ type: TYPE_SLICE_BEGIN track_uuid: 1 name: "s"
            debug_annotations {{ name: "a[18446744073709551615]" int_value: 1 }}
            debug_annotations {{ name: "b[" int_value: 1 }}
            debug_annotations {{ name: "j" legacy_json_value: "[1, [2]]" }} }} }}
        packet {{ trusted_packet_sequence_id: 2 timestamp: 30
          track_event {{ type: TYPE_SLICE_END track_uuid: 1
            debug_annotations {{ name: "a[18446744073709551615]" int_value: 2 }}
            debug_annotations {{ name: "b[" int_value: 2 }}
            debug_annotations {{ name: "j" legacy_json_value: "[3, [4]" }}
            debug_annotations {{ name: "j" legacy_json_value: "{deep}" }}
            debug_annotations {{ name: "j" legacy_json_value: "[5]" }} }} }}
        "#
    )));
    assert!(
        has(&stats, "streaming_profile_invalid_timestamp"),
        "{stats:?}"
    );
    assert!(has(&stats, "stackprofile_parser_error"), "{stats:?}");
}

/// A trace file cut at every byte (a truncated length, tag or payload, or a packet whose
/// length runs past the file's end) and read from the file a few bytes at a time gives what
/// the same bytes give in memory: the same stats (`trace_truncated` among them) and slices.
#[test]
fn truncated_files_streamed_in_windows() {
    let full = text_trace(
        r#"
        packet { trusted_packet_sequence_id: 1 timestamp: 10
                 track_event { type: TYPE_SLICE_BEGIN name: "a" } }
        packet { trusted_packet_sequence_id: 1 timestamp: 20
                 track_event { type: TYPE_SLICE_END } }
        packet { trusted_packet_sequence_id: 2 timestamp: 15
                 track_event { type: TYPE_INSTANT name: "b"
                               debug_annotations { name: "k" int_value: 7 } } }
        "#,
    );
    let file = std::env::temp_dir().join(format!("tachyon-hostile-{}.pftrace", std::process::id()));
    let dump = |tp: &TraceProcessor| {
        let q = "SELECT (SELECT group_concat(name || '=' || value) FROM stats WHERE value != 0), \
                 (SELECT group_concat(ts || ':' || dur || ':' || name) FROM slice)";
        format!("{:?}", tp.query(q).expect("query").rows)
    };
    for cut in 1..=full.len() {
        let bytes = &full[..cut];
        std::fs::write(&file, bytes).unwrap();
        let in_memory = TraceProcessor::from_bytes(bytes, &Options::default()).expect("imports");
        for window in [1, 3, 64] {
            let streamed =
                TraceProcessor::open_windowed(&file, &Options::default(), window, &mut |_| {})
                    .expect("imports");
            assert_eq!(
                dump(&streamed),
                dump(&in_memory),
                "cut at {cut}, window {window}"
            );
        }
    }
    std::fs::remove_file(&file).unwrap();
}

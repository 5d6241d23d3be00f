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

/// The statistics against a plain computation over the slice table's rows (every zone held in
/// memory, children summed by parent), on randomly nested zones over several tracks, some
/// unnamed, some of zero length, some never ended.
#[test]
fn statistics_match_a_plain_computation_over_random_nesting() {
    use std::collections::HashMap;
    use std::fmt::Write;

    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut text = String::new();
    for track in 1..=3u64 {
        let mut ts = 0u64;
        let mut depth = 0u32;
        for _ in 0..400 {
            ts += next(3);
            let begin = depth == 0 || (depth < 6 && next(2) == 0);
            if begin {
                let name = match next(5) {
                    0 => String::new(),
                    k => format!(" name: \"n{k}\""),
                };
                writeln!(
                    text,
                    "packet {{ trusted_packet_sequence_id: 1 timestamp: {ts} track_event {{ track_uuid: {track} type: TYPE_SLICE_BEGIN{name} }} }}"
                )
                .unwrap();
                depth += 1;
            } else {
                writeln!(
                    text,
                    "packet {{ trusted_packet_sequence_id: 1 timestamp: {ts} track_event {{ track_uuid: {track} type: TYPE_SLICE_END }} }}"
                )
                .unwrap();
                depth -= 1;
            }
        }
    }
    let trace = text_trace(&text);
    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();

    let rows = tp
        .query(
            "SELECT id, parent_id, name, dur FROM slice WHERE dur > 0 \
             OR (dur = 0 AND id IN (SELECT slice_id FROM __intrinsic_zero_length_zone))",
        )
        .unwrap()
        .rows;
    let int = |v: &Value| match v {
        Value::Integer(i) => Some(*i),
        _ => None,
    };
    let mut children: HashMap<i64, i64> = HashMap::new();
    for r in &rows {
        if let Some(p) = int(&r[1]) {
            *children.entry(p).or_default() += int(&r[3]).unwrap();
        }
    }
    let mut by_name: HashMap<String, (Vec<i64>, i64)> = HashMap::new();
    for r in &rows {
        let name = match &r[2] {
            Value::Text(s) => s.clone(),
            _ => "<unnamed>".to_owned(),
        };
        let id = int(&r[0]).unwrap();
        let dur = int(&r[3]).unwrap();
        let e = by_name.entry(name).or_default();
        e.0.push(dur);
        e.1 += (dur - children.get(&id).copied().unwrap_or(0)).max(0);
    }
    assert!(by_name.len() >= 4, "names: {:?}", by_name.keys());
    assert!(by_name.contains_key("<unnamed>"));

    let zones = tp.zone_stats().unwrap();
    assert_eq!(zones.len(), by_name.len());
    for z in &zones {
        let (durs, self_ns) = by_name.get_mut(&z.name).expect("a name the table has");
        durs.sort_unstable();
        let n = durs.len();
        let rank = |p: f64| durs[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        assert_eq!(z.count, n as u64, "{}", z.name);
        assert_eq!(z.total_ns, durs.iter().sum::<i64>(), "{}", z.name);
        assert_eq!(z.self_ns, *self_ns, "{}", z.name);
        assert_eq!((z.min_ns, z.max_ns), (durs[0], durs[n - 1]), "{}", z.name);
        assert_eq!(
            (z.median_ns, z.p99_ns),
            (rank(0.5), rank(0.99)),
            "{}",
            z.name
        );
    }
    assert!(
        zones.iter().any(|z| z.self_ns < z.total_ns),
        "some zones have children"
    );
    // Sorted by total time, longest first.
    assert!(zones.windows(2).all(|w| w[0].total_ns >= w[1].total_ns));
}

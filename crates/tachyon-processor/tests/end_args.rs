//! A slice end's debug annotations merge into its own slice's args, the one it closes, when
//! slices nest and other tracks' slices interleave (the parser finds where the slice's args
//! start beside it on its track's stack).

mod common;

use common::text_trace;
use tachyon_processor::{Options, TraceProcessor, Value};

#[test]
fn an_end_merges_its_args_into_the_slice_it_closes() {
    let trace = text_trace(
        r#"
        packet { trusted_packet_sequence_id: 1 timestamp: 10 track_event { track_uuid: 1 type: TYPE_SLICE_BEGIN name: "outer" debug_annotations { name: "a" int_value: 1 } } }
        packet { trusted_packet_sequence_id: 2 timestamp: 11 track_event { track_uuid: 2 type: TYPE_SLICE_BEGIN name: "other" debug_annotations { name: "o" int_value: 7 } } }
        packet { trusted_packet_sequence_id: 1 timestamp: 12 track_event { track_uuid: 1 type: TYPE_SLICE_BEGIN name: "inner" debug_annotations { name: "b" int_value: 2 } } }
        packet { trusted_packet_sequence_id: 1 timestamp: 13 track_event { track_uuid: 1 type: TYPE_SLICE_BEGIN name: "bare" } }
        packet { trusted_packet_sequence_id: 1 timestamp: 14 track_event { track_uuid: 1 type: TYPE_SLICE_END debug_annotations { name: "e" int_value: 5 } } }
        packet { trusted_packet_sequence_id: 1 timestamp: 15 track_event { track_uuid: 1 type: TYPE_SLICE_END debug_annotations { name: "c" int_value: 3 } debug_annotations { name: "b" int_value: 20 } } }
        packet { trusted_packet_sequence_id: 2 timestamp: 16 track_event { track_uuid: 2 type: TYPE_SLICE_END } }
        packet { trusted_packet_sequence_id: 1 timestamp: 17 track_event { track_uuid: 1 type: TYPE_SLICE_END debug_annotations { name: "d" int_value: 4 } } }
        "#,
    );
    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
    let r = tp
        .query(
            "SELECT s.name, a.key, a.int_value FROM slice s JOIN args a USING (arg_set_id) \
             ORDER BY s.name, a.id",
        )
        .unwrap();
    let got: Vec<(String, String, i64)> = r
        .rows
        .iter()
        .map(|row| match (&row[0], &row[1], &row[2]) {
            (Value::Text(n), Value::Text(k), Value::Integer(v)) => (n.clone(), k.clone(), *v),
            other => panic!("unexpected row {other:?}"),
        })
        .collect();
    let want = [
        // A slice without begin args takes its end's as its own set.
        ("bare", "debug.e", 5),
        // A key the slice has is updated in place; a new one is appended.
        ("inner", "debug.b", 20),
        ("inner", "debug.c", 3),
        ("other", "debug.o", 7),
        ("outer", "debug.a", 1),
        ("outer", "debug.d", 4),
    ];
    let want: Vec<(String, String, i64)> = want
        .iter()
        .map(|&(n, k, v)| (n.to_owned(), k.to_owned(), v))
        .collect();
    assert_eq!(got, want);
}

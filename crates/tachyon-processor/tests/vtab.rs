//! The slice and args tables are virtual tables that filter by `id`, `ts` ranges, `track_id`,
//! `name`, `arg_set_id` and `key` themselves. Every such query must give what SQLite gives on
//! a plain copy of the same rows (`CREATE TABLE … AS SELECT *`), which is the oracle here.

mod common;

use common::text_trace;
use tachyon_processor::{Options, TraceProcessor};

/// Three tracks, slices nested two deep, each begin with two annotations (one shared by many
/// slices, one distinct), names repeating.
fn trace() -> Vec<u8> {
    let mut t = String::new();
    for track in 1..=3u64 {
        for i in 0..20u64 {
            let ts = 100 + i * 10 + track;
            let name = ["a", "b", "c", "d"][(i % 4) as usize];
            t += &format!(
                "packet {{ trusted_packet_sequence_id: 1 timestamp: {ts} track_event {{ \
                 track_uuid: {track} type: TYPE_SLICE_BEGIN name: \"{name}\" \
                 debug_annotations {{ name: \"shared\" int_value: 7 }} \
                 debug_annotations {{ name: \"i\" int_value: {i} }} }} }}\n"
            );
            if i % 2 == 1 {
                for end in [ts + 3, ts + 4] {
                    t += &format!(
                        "packet {{ trusted_packet_sequence_id: 1 timestamp: {end} track_event {{ \
                         track_uuid: {track} type: TYPE_SLICE_END }} }}\n"
                    );
                }
            }
        }
    }
    text_trace(&t)
}

#[test]
fn filtered_scans_agree_with_sqlite_on_a_copy() {
    let tp = TraceProcessor::from_bytes(&trace(), &Options::default()).unwrap();
    tp.query("CREATE TEMP TABLE slice_copy AS SELECT * FROM __intrinsic_slice")
        .unwrap();
    tp.query("CREATE TEMP TABLE args_copy AS SELECT * FROM __intrinsic_args")
        .unwrap();
    let slices = tp.query("SELECT count(*) FROM slice_copy").unwrap();
    assert_eq!(slices.rows[0][0], tachyon_processor::Value::Integer(60));

    let slice_filters = [
        "id = 5",
        "id = '5'",
        "id = 5.0",
        "id = 5.5",
        "id = -1",
        "id = 1000",
        "id IN (1, 3, 59)",
        "ts > 150",
        "ts >= 151 AND ts < 171",
        "ts <= 120",
        "ts > 130.5 AND ts <= 160",
        "ts BETWEEN 101 AND 103",
        "track_id = 1",
        "track_id = 2 AND ts > 150",
        "track_id = 99",
        "track_id = 1 AND ts BETWEEN 120 AND 160",
        "track_id = 1 AND ts BETWEEN 120 AND 160 AND ts > 0",
        "name = 'b'",
        "name = 'B'",
        "name = 'B' COLLATE NOCASE",
        "name = 'nope'",
        "name = 'c' AND track_id = 0 AND ts < 200",
        "depth = 1 AND parent_id IS NOT NULL",
    ];
    for w in slice_filters {
        let q = |table: &str| {
            tp.query(&format!("SELECT * FROM {table} WHERE {w} ORDER BY id"))
                .unwrap()
                .rows
        };
        assert_eq!(q("__intrinsic_slice"), q("slice_copy"), "WHERE {w}");
    }

    // As before the tables were virtual, a row's rowid is its id.
    assert_eq!(
        tp.query("SELECT rowid, id FROM __intrinsic_slice WHERE rowid = 7")
            .unwrap()
            .rows,
        tp.query("SELECT id, id FROM slice_copy WHERE id = 7")
            .unwrap()
            .rows
    );

    let args_filters = [
        "arg_set_id = 3",
        "arg_set_id = '3'",
        "arg_set_id = 1000",
        "id = 10",
        "key = 'debug.shared'",
        "key = 'debug.i' AND arg_set_id = 4",
        "key = 'nope'",
        "int_value = 7",
    ];
    for w in args_filters {
        let q = |table: &str| {
            tp.query(&format!("SELECT * FROM {table} WHERE {w} ORDER BY id"))
                .unwrap()
                .rows
        };
        assert_eq!(q("__intrinsic_args"), q("args_copy"), "WHERE {w}");
    }

    // Joins that use the lookups: parents by id, args by set, and time order without a sort.
    let joins = [
        "SELECT s.id, p.name FROM {s} s JOIN {s} p ON s.parent_id = p.id ORDER BY s.id",
        "SELECT s.id, a.key, a.int_value FROM {s} s JOIN {a} a USING (arg_set_id) \
         WHERE s.name = 'a' ORDER BY s.id, a.id",
        "SELECT id, ts FROM {s} ORDER BY ts, id",
        "SELECT id FROM {s} ORDER BY id DESC LIMIT 3",
        "SELECT ts, dur, name FROM {s} WHERE track_id = 1 AND ts BETWEEN 120 AND 160 \
         ORDER BY ts",
        "SELECT min(ts), max(ts) FROM {s} WHERE track_id = 2",
    ];
    for sql in joins {
        let q = |s: &str, a: &str| {
            tp.query(&sql.replace("{s}", s).replace("{a}", a))
                .unwrap()
                .rows
        };
        assert_eq!(
            q("__intrinsic_slice", "__intrinsic_args"),
            q("slice_copy", "args_copy"),
            "{sql}"
        );
    }

    // extract_arg reads the same deduplicated arg sets.
    let r = tp
        .query(
            "SELECT count(*) FROM slice_copy WHERE extract_arg(arg_set_id, 'debug.shared') = 7 \
             AND extract_arg(arg_set_id, 'debug.i') = \
             (SELECT int_value FROM args_copy a WHERE a.arg_set_id = slice_copy.arg_set_id \
              AND a.key = 'debug.i')",
        )
        .unwrap();
    assert_eq!(r.rows[0][0], tachyon_processor::Value::Integer(60));
}

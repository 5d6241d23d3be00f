//! The full sort's merge (events of each sequence kept encoded in runs, merged by a tournament
//! tree) gives the same tables, row for row, as a stable sort of the plain events: the path
//! every event takes when the trace is imported in windowed mode without the service's
//! read-buffer events (nothing is extracted early, everything is sorted at the end).
//!
//! The traces are random: sequences interleaved in chunks, packets that go back in time,
//! timestamps shared between sequences, incremental-state resets that give interned ids new
//! meanings, slice ends with args, instants and flows.

use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};
use tachyon_processor::{Options, SortMode, TraceProcessor, Value};

fn trace_descriptor() -> MessageDescriptor {
    let protos = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tachyon-protos/protos");
    let fds = protox::compile([protos.join("perfetto/trace/trace.proto")], [&protos]).unwrap();
    DescriptorPool::from_file_descriptor_set(fds)
        .unwrap()
        .get_message_by_name("perfetto.protos.Trace")
        .unwrap()
}

fn xorshift(mut s: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s % n
    }
}

/// Interned data of generation `gen` on a sequence: the same iids name different things in
/// each generation.
fn interned(gen: u64) -> String {
    let mut s = String::from("interned_data {");
    for iid in 1..=4 {
        s += &format!(" event_names {{ iid: {iid} name: \"ev{iid}_g{gen}\" }}");
    }
    for iid in 1..=2 {
        s += &format!(" event_categories {{ iid: {iid} name: \"cat{iid}_g{gen}\" }}");
    }
    for iid in 1..=2 {
        s += &format!(" debug_annotation_names {{ iid: {iid} name: \"arg{iid}_g{gen}\" }}");
    }
    s += " }";
    s
}

fn random_trace(rnd: &mut impl FnMut(u64) -> u64) -> String {
    let nseq = 1 + rnd(4);
    let mut out = String::new();
    let mut clock = vec![100i64; nseq as usize];
    let mut gen = vec![0u64; nseq as usize];
    let mut open = vec![0u32; nseq as usize];
    for s in 0..nseq {
        let seq = s + 1;
        out += &format!(
            "packet {{ trusted_packet_sequence_id: {seq} timestamp: 1 sequence_flags: 1 \
             track_descriptor {{ uuid: {} thread {{ pid: 1 tid: {} }} }} }}\n",
            100 + seq,
            10 + seq
        );
        out += &format!(
            "packet {{ trusted_packet_sequence_id: {seq} timestamp: 1 {} }}\n",
            interned(0)
        );
    }
    let chunks = 1 + rnd(12);
    for _ in 0..chunks {
        let s = rnd(nseq) as usize;
        let seq = s as u64 + 1;
        for _ in 0..1 + rnd(15) {
            let ts = match rnd(10) {
                // Back in time: a new run of the sequence.
                0 => (clock[s] - rnd(30) as i64).max(2),
                // Small steps over a small range: equal timestamps within and across
                // sequences.
                _ => clock[s] + rnd(3) as i64,
            };
            clock[s] = clock[s].max(ts);
            if rnd(25) == 0 {
                // A reset: interned ids mean something else from here on.
                gen[s] += 1;
                out += &format!(
                    "packet {{ trusted_packet_sequence_id: {seq} timestamp: {ts} \
                     sequence_flags: 1 {} }}\n",
                    interned(gen[s])
                );
                continue;
            }
            let args: String = (0..rnd(3))
                .map(|_| {
                    format!(
                        " debug_annotations {{ name_iid: {} int_value: {} }}",
                        1 + rnd(2),
                        rnd(5)
                    )
                })
                .collect();
            let flows = if rnd(6) == 0 {
                format!(" flow_ids: {}", 1 + rnd(4))
            } else {
                String::new()
            };
            let body = match rnd(5) {
                0 | 1 => {
                    open[s] += 1;
                    format!(
                        "type: TYPE_SLICE_BEGIN name_iid: {} category_iids: {}{args}{flows}",
                        1 + rnd(4),
                        1 + rnd(2)
                    )
                }
                2 if open[s] > 0 => {
                    open[s] -= 1;
                    format!("type: TYPE_SLICE_END{args}")
                }
                _ => format!("type: TYPE_INSTANT name_iid: {}{args}{flows}", 1 + rnd(4)),
            };
            out += &format!(
                "packet {{ trusted_packet_sequence_id: {seq} timestamp: {ts} sequence_flags: 2 \
                 track_event {{ track_uuid: {} {body} }} }}\n",
                100 + seq
            );
        }
    }
    out
}

fn rows(tp: &TraceProcessor, sql: &str) -> Vec<Vec<Value>> {
    tp.query(sql).unwrap().rows
}

#[test]
fn the_merge_of_runs_gives_the_tables_of_a_stable_sort() {
    let desc = trace_descriptor();
    let mut rnd = xorshift(0x6a09_e667_f3bc_c908);
    let queries = [
        "SELECT * FROM slice ORDER BY id",
        "SELECT * FROM args ORDER BY id",
        "SELECT * FROM flow ORDER BY id",
        "SELECT * FROM track ORDER BY id",
        "SELECT * FROM thread ORDER BY utid",
        "SELECT name, idx, severity, source, value FROM stats ORDER BY name, idx",
    ];
    let mut slices = 0;
    for case in 0..60 {
        let text = random_trace(&mut rnd);
        let msg = DynamicMessage::parse_text_format(desc.clone(), &text).unwrap();
        let bytes = prost::Message::encode_to_vec(&msg);
        let merged = TraceProcessor::from_bytes(&bytes, &Options::default()).unwrap();
        let sorted =
            TraceProcessor::from_bytes(&bytes, &Options::with_sort(SortMode::Windowed)).unwrap();
        for q in queries {
            assert_eq!(
                rows(&merged, q),
                rows(&sorted, q),
                "case {case}, {q}, trace:\n{text}"
            );
        }
        slices += rows(&merged, "SELECT id FROM slice").len();
    }
    // The traces are not empty.
    assert!(slices > 500, "{slices} slices");
}

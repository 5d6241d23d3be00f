//! Heap profile import against a model: random cumulative dumps (each split over random
//! `continued` packets, each re-interning its strings, frames and stacks, under the same ids as
//! heapprofd and Tachyon's allocator do) must import into `heap_profile_allocation` rows whose
//! sums per stack equal the last dump's totals, with one `heap_profile` row per dump and no
//! error stat. (Ids that change between dumps get Perfetto's correction semantics, which do not
//! keep this sum; `testdata/heap_profile` covers them against Perfetto's own processor.)

use proptest::prelude::*;
use protozero::wire::{encode_varint, MAX_VARINT_SIZE};
use protozero::HeapBuffered;
use tachyon_processor::{Options, TraceProcessor, Value};
use tachyon_protos::TracePacket;

fn push_packet(trace: &mut Vec<u8>, fill: impl FnOnce(&mut TracePacket<'_>)) {
    let mut buf = HeapBuffered::new();
    {
        let mut p: TracePacket<'_> = buf.root();
        fill(&mut p);
    }
    let bytes = buf.serialize().expect("packet fits");
    let mut len = [0u8; MAX_VARINT_SIZE];
    let n = encode_varint(bytes.len() as u64, &mut len);
    trace.push(0x0a);
    trace.extend_from_slice(&len[..n]);
    trace.extend_from_slice(&bytes);
}

/// (allocated, freed, allocs, frees).
type Totals = (u64, u64, u64, u64);

/// Per dump, per stack: increments of the totals.
type Dumps = Vec<Vec<Totals>>;

fn dumps() -> impl Strategy<Value = (usize, Dumps, Vec<usize>)> {
    (1usize..5).prop_flat_map(|stacks| {
        (
            Just(stacks),
            prop::collection::vec(
                prop::collection::vec((0u64..1000, 0u64..1000, 0u64..5, 0u64..5), stacks..=stacks),
                1..6,
            ),
            prop::collection::vec(1usize..4, 6),
        )
    })
}

fn encode(stacks: usize, dumps: &Dumps, splits: &[usize]) -> (Vec<u8>, Vec<Totals>) {
    let mut trace = Vec::new();
    push_packet(&mut trace, |p| {
        p.set_trusted_packet_sequence_id(1);
        let mut cs = p.set_clock_snapshot();
        {
            let mut c = cs.add_clocks();
            c.set_clock_id(6);
            c.set_timestamp(1_000_000);
        }
        let mut c = cs.add_clocks();
        c.set_clock_id(4);
        c.set_timestamp(1_000_000);
    });
    let mut totals: Vec<Totals> = vec![(0, 0, 0, 0); stacks];
    let mut index = 0u64;
    for (d, incs) in dumps.iter().enumerate() {
        for (t, i) in totals.iter_mut().zip(incs) {
            // Frees never exceed allocations: freed grows by at most what is live.
            let alloc = t.0 + i.0;
            let freed = (t.1 + i.1).min(alloc);
            let allocs = t.2 + i.2;
            let frees = (t.3 + i.3).min(allocs);
            *t = (alloc, freed, allocs, frees);
        }
        // Interned again in every dump (a reader forgets them after each), same ids.
        let base = 10;
        let parts = splits[d % splits.len()].min(stacks);
        let per = stacks.div_ceil(parts);
        let ts = 2_000_000 + 1000 * d as u64;
        for part in 0..parts {
            let last = part + 1 == parts;
            push_packet(&mut trace, |p| {
                p.set_trusted_packet_sequence_id(1);
                p.set_timestamp(ts);
                let mut pp = p.set_profile_packet();
                if part == 0 {
                    {
                        let mut s = pp.add_strings();
                        s.set_iid(base);
                        s.set_str(b"");
                    }
                    {
                        let mut s = pp.add_strings();
                        s.set_iid(base + 1);
                        s.set_str(b"libx.so");
                    }
                    for k in 0..stacks as u64 {
                        let mut s = pp.add_strings();
                        s.set_iid(base + 2 + k);
                        s.set_str(format!("f{k}").as_bytes());
                    }
                    {
                        let mut m = pp.add_mappings();
                        m.set_iid(base);
                        m.set_build_id(base);
                        m.add_path_string_ids(base + 1);
                    }
                    for k in 0..stacks as u64 {
                        let mut f = pp.add_frames();
                        f.set_iid(base + k);
                        f.set_function_name_id(base + 2 + k);
                        f.set_mapping_id(base);
                        f.set_rel_pc(16 * k);
                    }
                    for k in 0..stacks as u64 {
                        let mut c = pp.add_callstacks();
                        c.set_iid(base + k);
                        c.add_frame_ids(base + k);
                    }
                }
                let mut dump = pp.add_process_dumps();
                dump.set_pid(7);
                dump.set_heap_name("h");
                dump.set_timestamp(ts);
                for (k, t) in totals.iter().enumerate().skip(part * per).take(per) {
                    let mut s = dump.add_samples();
                    s.set_callstack_id(base + k as u64);
                    s.set_self_allocated(t.0);
                    s.set_self_freed(t.1);
                    s.set_alloc_count(t.2);
                    s.set_free_count(t.3);
                }
                drop(dump);
                if !last {
                    pp.set_continued(true);
                }
                pp.set_index(index);
            });
            index += 1;
        }
    }
    (trace, totals)
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Integer(i) => *i,
        Value::Null => 0,
        other => panic!("{other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn rows_sum_to_the_last_dump((stacks, dumps, splits) in dumps()) {
        let (trace, totals) = encode(stacks, &dumps, &splits);
        let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
        for (k, t) in totals.iter().enumerate() {
            let r = tp.query(&format!(
                "SELECT sum(CASE WHEN a.size > 0 THEN a.size END), sum(CASE WHEN a.size < 0 THEN a.size END), \
                   sum(CASE WHEN a.count > 0 THEN a.count END), sum(CASE WHEN a.count < 0 THEN a.count END) \
                 FROM heap_profile_allocation a JOIN stack_profile_callsite c ON a.callsite_id = c.id \
                 JOIN stack_profile_frame f ON c.frame_id = f.id WHERE f.name = 'f{k}'"
            )).unwrap();
            let row: Vec<i64> = r.rows[0].iter().map(int).collect();
            prop_assert_eq!(row, vec![t.0 as i64, -(t.1 as i64), t.2 as i64, -(t.3 as i64)]);
        }
        let profiles = int(&tp.query("SELECT count(*) FROM heap_profile").unwrap().rows[0][0]);
        prop_assert_eq!(profiles, dumps.len() as i64);
        let errors = tp.query(
            "SELECT name FROM stats WHERE value != 0 AND severity IN ('error', 'data_loss')"
        ).unwrap().rows;
        prop_assert!(errors.is_empty(), "{:?}", errors);
    }
}

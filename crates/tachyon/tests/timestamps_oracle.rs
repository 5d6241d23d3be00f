//! Tachyon's processor gives the same timestamps as Perfetto's `trace_processor_shell` on a
//! trace of Tachyon's SDK (skipped when the tool is absent). Every thread writes its own clock
//! snapshots (its own series), each read with its own error, so the two processors agree to
//! the nanosecond only if they choose the same series for each conversion.

use tachyon::Config;
use tachyon_processor::{Options, TraceProcessor};

mod oracle;

#[test]
fn sdk_timestamps_match_perfetto() {
    tachyon::start(Config::in_memory()).unwrap();
    let workers: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                for k in 0..200u64 {
                    let _z = tachyon::zone!("oracle zone", t = t, k = k);
                    tachyon::counter!("oracle counter", k);
                    if k % 50 == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                }
            })
        })
        .collect();
    for k in 0..100u64 {
        let _z = tachyon::zone!("oracle main");
        tachyon::instant!("oracle instant", k = k);
    }
    for w in workers {
        w.join().unwrap();
    }
    let trace = tachyon::shutdown().unwrap().unwrap().trace;
    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
    let slices = "SELECT ts, dur, name FROM slice ORDER BY ts, name, dur";
    let counters = "SELECT ts, CAST(value AS INT) FROM counter ORDER BY ts, value";
    let (ours_s, ours_c) = (
        oracle::our_rows(&tp, slices),
        oracle::our_rows(&tp, counters),
    );
    assert_eq!(ours_s.len(), 4 * 200 + 2 * 100, "{:?}", &ours_s[..3]);
    assert_eq!(ours_c.len(), 4 * 200);
    if let Some(theirs) = oracle::perfetto_rows(&trace, slices) {
        same(&ours_s, &theirs, "slices");
    }
    if let Some(theirs) = oracle::perfetto_rows(&trace, counters) {
        same(&ours_c, &theirs, "counters");
    }
}

/// The two lists are equal; if not, says where they first differ (they are long).
fn same(ours: &[String], theirs: &[String], what: &str) {
    let first = ours.iter().zip(theirs).position(|(a, b)| a != b);
    assert!(
        first.is_none() && ours.len() == theirs.len(),
        "{what}: {} rows against Perfetto's {}; first difference at row {first:?}: {:?} vs {:?}",
        ours.len(),
        theirs.len(),
        first.map(|i| &ours[i]),
        first.map(|i| &theirs[i]),
    );
}

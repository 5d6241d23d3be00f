//! `Config::compress` (`TACHYON_COMPRESS=1`): the trace holds `compressed_packets` (zlib, as
//! Perfetto's `COMPRESSION_TYPE_DEFLATE` writes them), the trace processor reads the same
//! events out of it as out of the plain trace, and it is smaller. Streamed or written at stop.

use tachyon::Config;
use tachyon_processor::{Options, TraceProcessor, Value};
use tachyon_protos::TraceView;

const ZONES: u64 = 20_000;

/// Runs one session (the SDK has one per process: the cases run in turn in one test) and
/// returns its trace.
fn record(compress: bool, stream: bool, dir: &std::path::Path) -> Vec<u8> {
    let path = dir.join(format!("c{}{}.pftrace", compress as u8, stream as u8));
    tachyon::start(Config {
        output: Some(path.clone()),
        compress,
        stream,
        flush_period: stream.then(|| std::time::Duration::from_millis(50)),
        ..Config::in_memory()
    })
    .unwrap();
    std::thread::Builder::new()
        .name("compressed".into())
        .spawn(|| {
            for k in 0..ZONES {
                let _z = tachyon::zone!("c", "zone", k = k);
                if k % 5_000 == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(60));
                }
            }
        })
        .unwrap()
        .join()
        .unwrap();
    tachyon::shutdown().unwrap().unwrap();
    std::fs::read(&path).unwrap()
}

fn compressed_packets(trace: &[u8]) -> usize {
    TraceView::decode(trace)
        .unwrap()
        .packet()
        .filter(|p| p.as_ref().unwrap().has_compressed_packets())
        .count()
}

fn zones(trace: &[u8]) -> Vec<Vec<Value>> {
    let tp = TraceProcessor::from_bytes(trace, &Options::default()).unwrap();
    let loss = tp.data_loss().unwrap();
    assert!(loss.is_empty(), "{loss:#?}");
    tp.query("SELECT count(*), sum(dur >= 0) FROM slice WHERE name = 'zone'")
        .unwrap()
        .rows
}

#[test]
fn a_compressed_trace_holds_the_same_events_in_fewer_bytes() {
    let dir = std::env::temp_dir().join(format!("tachyon-compress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let all = vec![vec![
        Value::Integer(ZONES as i64),
        Value::Integer(ZONES as i64),
    ]];
    for stream in [false, true] {
        let plain = record(false, stream, &dir);
        let small = record(true, stream, &dir);
        assert_eq!(compressed_packets(&plain), 0);
        assert!(compressed_packets(&small) > 0);
        assert_eq!(zones(&plain), all, "stream {stream}");
        assert_eq!(zones(&small), all, "stream {stream}");
        // Two events (begin, end) per zone; the figure the README quotes
        // (`cargo test -p tachyon --test compress -- --nocapture`).
        let per_event = |t: &[u8]| t.len() as f64 / (2 * ZONES) as f64;
        eprintln!(
            "stream {stream}: {:.2} bytes per event plain, {:.2} with DEFLATE",
            per_event(&plain),
            per_event(&small)
        );
        assert!(
            small.len() * 2 < plain.len(),
            "stream {stream}: {} bytes compressed, {} plain",
            small.len(),
            plain.len()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

//! Fuzzes the trace processor's import with raw bytes, in *both* sorting modes for every
//! input, so that no byte of the input decides which code path is explored (the `import`
//! target alternates the mode on the first byte, which a valid trace always has as 0x0a).
//! Checks what must hold whatever the input: the import ends in a trace or an error, never a
//! panic; the tables answer queries; no slice has a duration below -1 (not ended).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tachyon_processor::{Options, SortMode, TraceProcessor, Value};

fuzz_target!(|data: &[u8]| {
    for sort in [SortMode::Full, SortMode::Windowed] {
        let mut options = Options::with_sort(sort);
        options.max_inflated_bytes = 64 << 20;
        let Ok(tp) = TraceProcessor::from_bytes(data, &options) else {
            continue;
        };
        let r = tp
            .query("SELECT count(*) FROM slice WHERE dur < -1")
            .expect("slice is queryable");
        assert_eq!(r.rows[0][0], Value::Integer(0), "a slice with dur < -1");
        tp.query("SELECT extract_arg(arg_set_id, 'debug.x') FROM slice")
            .expect("extract_arg works");
        tp.zone_stats().expect("zone stats");
        tp.data_loss().expect("data loss");
    }
});

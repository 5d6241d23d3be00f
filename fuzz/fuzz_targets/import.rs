//! Fuzzes the trace processor's import: any bytes must import (or be refused with an error)
//! without panicking, in both sorting modes, and the resulting database must answer queries.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tachyon_processor::{Options, SortMode, TraceProcessor};

fuzz_target!(|data: &[u8]| {
    // Alternate the sorting mode on the first byte so both paths are explored.
    let sort = if data.first().is_some_and(|b| b & 1 == 1) {
        SortMode::Windowed
    } else {
        SortMode::Full
    };
    if let Ok(tp) = TraceProcessor::from_bytes(data, &Options::with_sort(sort)) {
        tp.query("SELECT count(*), total(dur) FROM slice").expect("slice is queryable");
        tp.query("SELECT extract_arg(arg_set_id, 'debug.x') FROM slice").expect("extract_arg works");
        let _ = tp.zone_stats().expect("zone stats");
        // Call stacks and samples: the views over the stack tables must not fail or loop.
        let _ = tachyon_processor::profiles::cpu_profile(&tp).expect("cpu profile");
        let _ = tachyon_processor::profiles::zone_callstacks(&tp).expect("zone callstacks");
    }
});

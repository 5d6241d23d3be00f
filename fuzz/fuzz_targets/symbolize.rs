//! Fuzzes the symbolizer's reading of a trace: any bytes give the trace's binaries and frames
//! or an error, never a panic, and with no binary named and the trace's paths off, nothing is
//! read and nothing is symbolized.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tachyon_symbolize::{collect_frames, symbolize, Options};

fuzz_target!(|data: &[u8]| {
    let _ = collect_frames(data);
    let opts = Options {
        binaries: Vec::new(),
        search_dirs: Vec::new(),
        trace_paths: false,
    };
    if let Ok(out) = symbolize(data, &opts) {
        assert!(out.packets.is_empty());
        assert!(out.modules.iter().all(|m| m.file.is_none()));
    }
});

//! Differential fuzzing of the trace processor's hand-written decoders for its per-event
//! messages (`TracePacket`, `TrackEvent`, `DebugAnnotation`, in `lazy.rs`) against the
//! generated views: the input is read as each of the three messages, and every field the
//! importer takes from the lazy decoders must be what the view says, including whether the
//! message is malformed at all.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(difference) = tachyon_processor::lazy_decoders_agree_with_views(data) {
        panic!("the lazy decoders and the views disagree: {difference}");
    }
});

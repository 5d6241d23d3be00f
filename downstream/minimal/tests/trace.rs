//! Without default features the instrumentation compiles to nothing, and the session still
//! writes a valid trace.

use tachyon_protos::TraceView;

#[test]
fn the_session_runs_and_the_zone_is_compiled_out() {
    assert!(!tachyon::COMPILED_IN);
    let out = std::env::temp_dir().join(format!("downstream-minimal-{}.pftrace", std::process::id()));
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_downstream-minimal"))
        .env("TACHYON_OUT", &out)
        .env("TACHYON_PRODUCER_SOCK", "")
        .status()
        .unwrap();
    assert!(status.success());
    let bytes = std::fs::read(&out).expect("the trace file");
    assert!(TraceView::decode(&bytes).expect("a Trace").packet().filter(|p| p.is_ok()).count() > 0);
    assert!(!bytes.windows(b"hello zone".len()).any(|w| w == b"hello zone"));
    let _ = std::fs::remove_file(out);
}

//! Without default features the instrumentation compiles to nothing and the program runs: with
//! no backend compiled in (`default-features = false` alone) it runs untraced and says why; with
//! the in-process backend (`--features in-process`) the session writes a valid trace.

use tachyon_protos::TraceView;

#[test]
fn the_program_runs_and_the_zone_is_compiled_out() {
    assert!(!tachyon::COMPILED_IN);
    let out = std::env::temp_dir().join(format!("downstream-minimal-{}.pftrace", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_downstream-minimal"))
        .env("TACHYON_OUT", &out)
        .env("TACHYON_PRODUCER_SOCK", "")
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stdout, b"hello, world\n");
    if cfg!(feature = "in-process") {
        let bytes = std::fs::read(&out).expect("the trace file");
        assert!(TraceView::decode(&bytes).expect("a Trace").packet().filter(|p| p.is_ok()).count() > 0);
        assert!(!bytes.windows(b"hello zone".len()).any(|w| w == b"hello zone"));
        let _ = std::fs::remove_file(out);
    } else {
        assert!(!out.exists(), "no backend, no trace");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(stderr.contains("`in-process`"), "{stderr}");
    }
}

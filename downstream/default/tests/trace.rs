//! The program traces: its trace holds the zone.

use tachyon_protos::TraceView;

#[test]
fn the_hello_world_records_its_zone() {
    let out = std::env::temp_dir().join(format!("downstream-default-{}.pftrace", std::process::id()));
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_downstream-default"))
        .env("TACHYON_OUT", &out)
        .env("TACHYON_PRODUCER_SOCK", "")
        .status()
        .unwrap();
    assert!(status.success());
    let bytes = std::fs::read(&out).expect("the trace file");
    let packets = TraceView::decode(&bytes).expect("a Trace").packet().filter(|p| p.is_ok()).count();
    assert!(packets > 2, "{packets} packets");
    assert!(
        bytes.windows(b"hello zone".len()).any(|w| w == b"hello zone"),
        "the zone's name is interned in the trace"
    );
    let _ = std::fs::remove_file(out);
}

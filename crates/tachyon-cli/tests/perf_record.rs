//! `tachyon record` with a Perfetto config asking for `linux.perf`: the daemon samples the
//! program it runs (found by its command line) and the processor reads the samples into
//! `perf_sample` with their call stacks.

mod common;

use common::{clean_command, int, tmp_dir};
use tachyon_processor::{Options, TraceProcessor};

fn perf_allowed() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .is_some_and(|p| p <= 2)
}

/// The program starts its threads right after its exec, while the probe may be opening the
/// main thread's events: threads that inherit none get their own at the next rescan.
#[test]
fn record_samples_the_program_named_by_its_command_line() {
    if !perf_allowed() {
        eprintln!("skipped: perf_event_paranoid forbids sampling");
        return;
    }
    let dir = tmp_dir("perf-record");
    let exe = env!("CARGO_BIN_EXE_tachyon");
    let cfg = dir.join("perf.cfg");
    std::fs::write(
        &cfg,
        format!(
            r#"
duration_ms: 20000
buffers {{ size_kb: 8192 fill_policy: DISCARD }}
data_sources {{ config {{ name: "linux.process_stats" }} }}
data_sources {{
  config {{
    name: "linux.perf"
    perf_event_config {{
      timebase {{ frequency: 500 counter: SW_CPU_CLOCK }}
      callstack_sampling {{ scope {{ target_cmdline: "{exe}" }} }}
      ring_buffer_read_period_ms: 50
    }}
  }}
}}
"#
        ),
    )
    .unwrap();
    let out = dir.join("t.pftrace");
    let output = clean_command(exe)
        .arg("record")
        .arg("--consumer-socket")
        .arg(dir.join("none.sock"))
        .arg("-c")
        .arg(&cfg)
        .arg("-o")
        .arg(&out)
        .args(["--", exe, "demo", "--seconds", "1.5", "--threads", "2"])
        .output()
        .expect("run tachyon record");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("\"linux.perf\""), "{stderr}");
    assert!(!stderr.contains("perf_event_config"), "acted on: {stderr}");

    let tp = TraceProcessor::from_bytes(&std::fs::read(&out).unwrap(), &Options::default())
        .expect("read the trace");
    let samples = int(&tp, "SELECT count(*) FROM perf_sample");
    assert!(samples >= 10, "{samples} samples\n{stderr}");
    // Every sample has a stack whose frames are in mappings, and the demo's own binary is one.
    assert_eq!(
        int(
            &tp,
            "SELECT count(*) FROM perf_sample s LEFT JOIN stack_profile_callsite c \
             ON c.id = s.callsite_id WHERE c.id IS NULL"
        ),
        0
    );
    assert!(
        int(
            &tp,
            &format!(
                "SELECT count(*) FROM perf_sample s \
                 JOIN stack_profile_callsite c ON c.id = s.callsite_id \
                 JOIN stack_profile_frame f ON f.id = c.frame_id \
                 JOIN stack_profile_mapping m ON m.id = f.mapping WHERE m.name = '{}'",
                std::fs::canonicalize(exe).unwrap().display()
            )
        ) > 0
    );
    // The samples are of the demo's threads: named by linux.process_stats.
    assert!(
        int(
            &tp,
            "SELECT count(*) FROM perf_sample s JOIN thread t USING (utid) \
             WHERE t.tid != 0"
        ) * 10
            >= samples * 9
    );
}

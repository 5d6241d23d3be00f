//! The `tachyon` command as a Unix tool: a closed pipe ends it quietly, errors go to stderr
//! with a non-zero status and no panic report, every subcommand's help has examples.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use protozero::HeapBuffered;
use tachyon_protos::Trace;

fn tachyon() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tachyon"));
    c.env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    c
}

/// A trace of one packet: enough for the processor to open.
fn tiny_trace(name: &str) -> std::path::PathBuf {
    let mut buf = HeapBuffered::new();
    {
        let mut t: Trace<'_> = buf.root();
        let mut p = t.add_packet();
        p.set_trusted_packet_sequence_id(1);
        p.set_timestamp(1000);
    }
    let path = std::env::temp_dir().join(format!(
        "tachyon-unix-{}-{name}.pftrace",
        std::process::id()
    ));
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(&buf.serialize().expect("trace fits")))
        .expect("write the trace");
    path
}

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    let trace = tiny_trace("pipe");
    // Far more output than a pipe holds, so the writes after the reader leaves must fail.
    let sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000) \
               SELECT x, 'padding padding padding' AS p FROM c";
    let mut child = tachyon()
        .args(["query", trace.to_str().unwrap(), sql, "--format", "csv"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tachyon");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert_eq!(first.trim(), "x,p");
    // The reader is gone (as `| head -1` leaves).
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.is_empty(), "stderr: {stderr}");
    assert_eq!(out.status.code(), Some(141), "{:?}", out.status);
    let _ = std::fs::remove_file(trace);
}

#[test]
fn errors_go_to_stderr_with_a_failure_status_and_no_panic() {
    let out = tachyon()
        .args(["stats", "/nonexistent/no-such.pftrace"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("tachyon: error: "), "{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );

    // Bad SQL on a good trace: the same.
    let trace = tiny_trace("badsql");
    let out = tachyon()
        .args(["query", trace.to_str().unwrap(), "SELEC nonsense"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("tachyon: error: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let _ = std::fs::remove_file(trace);
}

#[test]
fn every_subcommand_help_shows_examples() {
    for sub in [
        "demo",
        "query",
        "stats",
        "record",
        "traced",
        "export",
        "capture",
        "symbolize",
    ] {
        let out = tachyon().args([sub, "--help"]).output().unwrap();
        assert!(out.status.success(), "{sub}");
        let help = String::from_utf8_lossy(&out.stdout);
        let examples = help
            .split_once("Examples:")
            .unwrap_or_else(|| panic!("no examples in `tachyon {sub} --help`:\n{help}"))
            .1;
        assert!(
            examples.contains(&format!("tachyon {sub}")),
            "`tachyon {sub} --help` shows no example of itself:\n{help}"
        );
    }
    let out = tachyon().arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("Examples:"));
}

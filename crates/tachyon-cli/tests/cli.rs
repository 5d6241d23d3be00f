//! Runs the built `tachyon` binary on traces written with the generated protozero writers.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use protozero::HeapBuffered;
use tachyon_protos::{track_event, Trace, TracePacket};

/// Appends one `Trace.packet` on sequence 1, written by `fill`.
fn packet(trace: &mut Trace<'_>, fill: impl FnOnce(&mut TracePacket<'_>)) {
    let mut p = trace.add_packet();
    p.set_trusted_packet_sequence_id(1);
    fill(&mut p);
}

fn slice(trace: &mut Trace<'_>, ts: u64, kind: track_event::Type, name: Option<&str>) {
    packet(trace, |p| {
        p.set_timestamp(ts);
        let mut e = p.set_track_event();
        e.set_type(kind);
        e.set_track_uuid(1);
        if let Some(name) = name {
            e.set_name(name);
        }
    });
}

/// Two "frame" zones, each with a nested "draw", on one thread.
fn zones_trace(with_loss: bool) -> Vec<u8> {
    use track_event::Type::{SliceBegin, SliceEnd};
    let mut buf = HeapBuffered::new();
    let mut t: Trace<'_> = buf.root();
    packet(&mut t, |p| {
        let mut d = p.set_track_descriptor();
        d.set_uuid(1);
        let mut th = d.set_thread();
        th.set_pid(10);
        th.set_tid(11);
        th.set_thread_name("main");
    });
    for (start, len) in [(1_000u64, 3_000u64), (10_000, 5_000)] {
        slice(&mut t, start, SliceBegin, Some("frame"));
        slice(&mut t, start + 100, SliceBegin, Some("draw"));
        slice(&mut t, start + 100 + len / 2, SliceEnd, None);
        slice(&mut t, start + len, SliceEnd, None);
    }
    if with_loss {
        packet(&mut t, |p| {
            let mut s = p.set_trace_stats();
            let mut b = s.add_buffer_stats();
            b.set_trace_writer_packet_loss(3);
        });
    }
    drop(t);
    buf.serialize().expect("trace fits")
}

fn write_tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn tachyon(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tachyon"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tachyon");
    {
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "tachyon panicked: {stderr}");
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

const SQL: &str = "SELECT name, dur, depth FROM slice WHERE name = 'draw' ORDER BY ts";

#[test]
fn query_prints_a_table_by_default() {
    let path = write_tmp("query_table.pftrace", &zones_trace(false));
    let out = tachyon(&["query", path.to_str().unwrap(), SQL], None);
    assert!(out.status.success());
    assert_eq!(
        stdout(&out),
        "name  dur   depth\n----  ----  -----\ndraw  1500      1\ndraw  2500      1\n(2 rows)\n"
    );
}

#[test]
fn query_csv_and_json() {
    let path = write_tmp("query_formats.pftrace", &zones_trace(false));
    let p = path.to_str().unwrap();
    let out = tachyon(&["query", p, SQL, "--format", "csv"], None);
    assert!(out.status.success());
    assert_eq!(stdout(&out), "name,dur,depth\ndraw,1500,1\ndraw,2500,1\n");
    let out = tachyon(
        &[
            "query",
            "--format=json",
            p,
            "SELECT tid, name FROM thread WHERE tid = 11",
        ],
        None,
    );
    assert!(out.status.success());
    assert_eq!(stdout(&out), "[\n  {\"tid\": 11, \"name\": \"main\"}\n]\n");
}

#[test]
fn query_from_file_and_from_the_shell() {
    let path = write_tmp("query_shell.pftrace", &zones_trace(false));
    let p = path.to_str().unwrap();
    let sql = write_tmp("query_shell.sql", b"SELECT count(*) AS n FROM slice;");
    let out = tachyon(
        &["query", p, "-f", sql.to_str().unwrap(), "--format", "csv"],
        None,
    );
    assert_eq!(stdout(&out), "n\n4\n");
    let out = tachyon(
        &["query", p, "--format", "csv"],
        Some("SELECT 1 AS x;\nSELECT count(*)\n  AS n FROM slice\n  WHERE name = 'frame';\nSELECT nonsense;\n.quit\nSELECT 2;\n"),
    );
    assert!(out.status.success());
    assert_eq!(stdout(&out), "x\n1\nn\n2\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such column: nonsense"));
}

#[test]
fn stats_prints_zones_and_no_data_lost() {
    let path = write_tmp("stats_clean.pftrace", &zones_trace(false));
    let out = tachyon(&["stats", path.to_str().unwrap()], None);
    assert!(out.status.success());
    let text = stdout(&out);
    let frame = text
        .lines()
        .find(|l| l.starts_with("frame"))
        .expect("frame row");
    let cols: Vec<&str> = frame.split_whitespace().collect();
    // zone, count, total, self, mean, min, median, p99, max (values with units).
    assert_eq!(cols[..3], ["frame", "2", "8.00"]);
    assert!(
        text.find("frame").unwrap() < text.find("draw").unwrap(),
        "sorted by total"
    );
    assert!(text.contains("Data loss: no data lost"), "{text}");
}

#[test]
fn stats_reports_data_loss() {
    let path = write_tmp("stats_loss.pftrace", &zones_trace(true));
    let out = tachyon(&["stats", path.to_str().unwrap()], None);
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(
        text.contains("traced_buf_trace_writer_packet_loss[0] = 3 (data_loss, trace)"),
        "{text}"
    );
    assert!(!text.contains("no data lost"));
}

#[test]
fn bad_input_fails_cleanly() {
    let out = tachyon(&["stats", "/nonexistent/trace.pftrace"], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the trace"));

    let json = write_tmp("bad.json", br#"{"traceEvents": []}"#);
    let out = tachyon(&["query", json.to_str().unwrap(), "SELECT 1"], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a Perfetto trace"));

    let good = write_tmp("bad_sql.pftrace", &zones_trace(false));
    let out = tachyon(&["query", good.to_str().unwrap(), "SELEC 1"], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("syntax error"));

    // A protobuf trace full of garbage still loads: the damage is in `stats`.
    let mut junk = zones_trace(false);
    junk.extend_from_slice(&[0x0a, 0x05, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0a, 0x40, 0x01]);
    let junk = write_tmp("junk.pftrace", &junk);
    let out = tachyon(
        &[
            "query",
            junk.to_str().unwrap(),
            "SELECT name, value FROM stats WHERE value > 0 ORDER BY name",
            "--format",
            "csv",
        ],
        None,
    );
    assert!(out.status.success());
    assert_eq!(
        stdout(&out),
        "name,value\ntrace_packet_malformed,1\ntrace_truncated,1\n"
    );

    let out = tachyon(&["query"], None);
    assert_eq!(out.status.code(), Some(2), "usage error");
}

/// The crash handler's events, as `tachyon::crash` writes them: an instant in category
/// `tachyon.crash` with debug annotations, on the crashing thread's track.
fn crash_trace() -> Vec<u8> {
    let mut bytes = zones_trace(false);
    let mut buf = HeapBuffered::new();
    let mut t: Trace<'_> = buf.root();
    let instant = |t: &mut Trace<'_>, ts: u64, name: &str, args: &[(&str, &str)], ptr: bool| {
        packet(t, |p| {
            p.set_timestamp(ts);
            let mut e = p.set_track_event();
            e.set_type(track_event::Type::Instant);
            e.set_track_uuid(1);
            e.add_categories("tachyon.crash");
            e.set_name(name);
            for (k, v) in args {
                let mut a = e.add_debug_annotations();
                a.set_name(k);
                a.set_string_value(v);
            }
            if ptr {
                let mut a = e.add_debug_annotations();
                a.set_name("address");
                a.set_pointer_value(0);
                drop(a);
                let mut a = e.add_debug_annotations();
                a.set_name("pc");
                a.set_pointer_value(0x5555_1234);
            }
        });
    };
    instant(
        &mut t,
        20_000,
        "panic",
        &[
            ("message", "boom"),
            ("location", "src/main.rs:3:5"),
            (
                "stack",
                "app::f (src/main.rs:3:5)\napp::main (src/main.rs:9:1)",
            ),
        ],
        false,
    );
    instant(
        &mut t,
        21_000,
        "crash: SIGSEGV",
        &[
            ("signal", "SIGSEGV"),
            ("code", "SEGV_MAPERR"),
            ("pc_module", "/bin/app+0x1234"),
        ],
        true,
    );
    drop(t);
    bytes.extend(buf.serialize().expect("trace fits"));
    bytes
}

#[test]
fn stats_names_the_crash_first() {
    let path = write_tmp("stats_crash.pftrace", &crash_trace());
    let out = tachyon(&["stats", path.to_str().unwrap()], None);
    assert!(out.status.success());
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[..8],
        [
            "panic: \"boom\" at src/main.rs:3:5, on thread \"main\" (tid 11)",
            "  call stack:",
            "    app::f (src/main.rs:3:5)",
            "    app::main (src/main.rs:9:1)",
            "crash: SIGSEGV, SEGV_MAPERR at 0x0, on thread \"main\" (tid 11)",
            "  pc: 0x55551234 (/bin/app+0x1234)",
            "  call stack: not recorded",
            "",
        ],
        "{text}"
    );
    assert!(lines[8].starts_with("Zones"), "{text}");
}

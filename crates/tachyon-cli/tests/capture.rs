//! Live capture with real processes on loopback: `tachyon demo` listening (`TACHYON_LISTEN` on
//! an ephemeral port, found through discovery in a private `XDG_RUNTIME_DIR`) and `tachyon
//! capture` receiving its trace; refusals; a hostile program feeding `tachyon capture`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{clean_command, int, tmp_dir};
use tachyon_capture::client::Connection;
use tachyon_capture::protocol::{self, ProtocolError, Status};
use tachyon_capture::registry;
use tachyon_processor::{Options, TraceProcessor, Value};

fn tachyon() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tachyon"))
}

/// A `tachyon` command in `dir`, discovery in `dir/run`.
fn cmd(dir: &Path) -> Command {
    let run = dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let mut c = clean_command(tachyon());
    c.current_dir(dir).env("XDG_RUNTIME_DIR", &run);
    c
}

/// Starts `tachyon demo` listening on an ephemeral loopback port with `env`.
fn spawn_demo(dir: &Path, seconds: &str, env: &[(&str, &str)]) -> Child {
    let mut c = cmd(dir);
    c.args(["demo", "--seconds", seconds, "--threads", "2"])
        .env("TACHYON_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().expect("start tachyon demo")
}

/// The demo's address, from the registry (waits for it to register).
fn discover(dir: &Path, pid: u32) -> SocketAddr {
    let reg = dir.join("run").join("tachyon");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(e) = registry::list(&reg).into_iter().find(|e| e.pid == pid) {
            return SocketAddr::new(e.addr.parse().unwrap(), e.port);
        }
        assert!(Instant::now() < deadline, "pid {pid} never registered");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn finish(child: Child) -> (String, String) {
    let out = child.wait_with_output().unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "failed: {:?}\n{o}\n{e}", out.status);
    assert!(!e.contains("panicked"), "{e}");
    (o, e)
}

fn capture(dir: &Path, pid: u32, out: &Path, extra: &[&str]) -> Output {
    cmd(dir)
        .args([
            "capture",
            "--pid",
            &pid.to_string(),
            "-o",
            out.to_str().unwrap(),
        ])
        .args(extra)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> (String, String) {
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "capture failed: {:?}\n{o}\n{e}",
        out.status
    );
    assert!(!e.contains("panicked"), "{e}");
    (o, e)
}

/// The number after `prefix` in the first line that has it.
fn number_after(text: &str, prefix: &str) -> u64 {
    let at = text
        .find(prefix)
        .unwrap_or_else(|| panic!("no {prefix:?} in:\n{text}"));
    text[at + prefix.len()..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The checks every captured trace passes: it loads, no error or data-loss stat, the
/// process and its threads are described, and no zone lacks its begin.
fn check_trace(path: &Path) -> TraceProcessor {
    let tp = TraceProcessor::open(path, &Options::default()).expect("load the capture");
    let errors = tp
        .query(
            "SELECT name, idx, value FROM stats WHERE severity IN ('error', 'data_loss') AND value != 0",
        )
        .unwrap()
        .rows;
    assert!(errors.is_empty(), "{errors:?}");
    assert!(int(&tp, "SELECT count(*) FROM slice WHERE dur > 0") > 0);
    let names = tp
        .query("SELECT name FROM process WHERE name IS NOT NULL")
        .unwrap()
        .rows;
    assert!(
        names
            .iter()
            .any(|r| r[0] == Value::Text("tachyon-demo".into())),
        "{names:?}"
    );
    assert!(int(&tp, "SELECT count(*) FROM thread WHERE name = 'worker-0'") >= 1);
    // Every slice sits on a described track, and its name was interned in its generation.
    assert_eq!(int(&tp, "SELECT count(*) FROM slice WHERE name IS NULL"), 0);
    // Perfetto's own processor agrees, when it is here.
    let shell = Path::new("/work/shared/tools/trace_processor_shell");
    if shell.exists() {
        let q = path.with_extension("sql");
        std::fs::write(&q, "SELECT count(*) AS n FROM slice WHERE dur > 0;").unwrap();
        let out = Command::new(shell)
            .args(["-q", q.to_str().unwrap(), path.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let n: i64 = text
            .lines()
            .filter_map(|l| l.trim().trim_matches('"').parse().ok())
            .next()
            .unwrap_or_else(|| panic!("{text}"));
        assert_eq!(n, int(&tp, "SELECT count(*) FROM slice WHERE dur > 0"));
    }
    tp
}

#[test]
fn capture_a_demo_from_start_to_exit() {
    let dir = tmp_dir("capture_start_to_exit");
    let demo = spawn_demo(&dir, "1", &[("TACHYON_WAIT_FOR_CAPTURE", "60")]);
    let pid = demo.id();
    let trace = dir.join("c.pftrace");
    let cap = capture(&dir, pid, &trace, &[]);
    let (demo_out, demo_err) = finish(demo);
    let (cap_out, cap_err) = ok(&cap);
    assert!(cap_err.contains("the trace is complete"), "{cap_err}");
    assert!(demo_err.contains("waiting up to"), "{demo_err}");
    // On loopback the frames are uncompressed: on the wire, the records and their headers.
    assert!(
        cap_err.contains("uncompressed frames over loopback"),
        "{cap_err}"
    );
    let raw = number_after(&cap_out, "track events), ");
    let wire = number_after(&cap_out, "uncompressed, ");
    assert!(wire > raw, "{cap_out}");
    // What the program says it sent is what the capture received and wrote.
    let sent = number_after(&demo_out, "live capture): sent ");
    let received = number_after(&cap_out, "received: ");
    assert_eq!(sent, received, "demo:\n{demo_out}\ncapture:\n{cap_out}");
    assert_eq!(number_after(&demo_out, "on the wire) to "), 1);
    let bytes = number_after(&demo_out, " packets, ");
    assert_eq!(std::fs::metadata(&trace).unwrap().len(), bytes);
    let tp = check_trace(&trace);
    // Every job of the workload is in the capture: the program waited for it.
    let jobs = number_after(&demo_out, "workload: ");
    assert_eq!(
        int(
            &tp,
            "SELECT count(*) FROM slice WHERE name = 'job' AND dur > 0"
        ) as u64,
        jobs
    );
    assert!(cap_out.contains("top zones"), "{cap_out}");
    // The program unregistered at exit.
    assert!(registry::list(&dir.join("run").join("tachyon")).is_empty());
}

#[test]
fn on_demand_captures_twice_each_a_complete_trace() {
    let dir = tmp_dir("capture_on_demand");
    let demo = spawn_demo(
        &dir,
        "6",
        &[
            ("TACHYON_ON_DEMAND", "1"),
            ("TACHYON_WAIT_FOR_CAPTURE", "60"),
        ],
    );
    let pid = demo.id();
    let first = dir.join("first.pftrace");
    let second = dir.join("second.pftrace");
    let (o1, e1) = ok(&capture(&dir, pid, &first, &["--seconds", "1"]));
    assert!(e1.contains("on-demand"), "{e1}");
    assert!(e1.contains("the trace is complete"), "{e1}");
    let (o2, _) = ok(&capture(&dir, pid, &second, &["--seconds", "1"]));
    let (demo_out, _) = finish(demo);
    assert_eq!(number_after(&demo_out, "on the wire) to "), 2, "{demo_out}");
    let total = number_after(&demo_out, "live capture): sent ");
    assert_eq!(
        number_after(&o1, "received: ") + number_after(&o2, "received: "),
        total
    );
    for t in [&first, &second] {
        let tp = check_trace(t);
        // Zones still open when the capture stopped have no end in it (the processor leaves
        // them unfinished); none ends without a begin: a zone that began before the capture
        // attached left its end out.
        assert_eq!(
            int(&tp, "SELECT count(*) FROM slice WHERE dur < -1"),
            0,
            "{}",
            t.display()
        );
        // Each capture starts its own trace: descriptors and interned names were re-emitted.
        assert!(int(&tp, "SELECT count(*) FROM slice WHERE name = 'parse'") > 0);
    }
}

#[test]
fn refusals_name_the_reason() {
    let dir = tmp_dir("capture_refusals");
    let demo = spawn_demo(
        &dir,
        "3",
        &[
            ("TACHYON_ON_DEMAND", "1"),
            ("TACHYON_CAPTURE_TOKEN", "s3cret"),
            ("TACHYON_WAIT_FOR_CAPTURE", "60"),
        ],
    );
    let pid = demo.id();
    let addr = discover(&dir, pid);
    // Another protocol version: both versions are named.
    match Connection::connect_with_version(addr, b"s3cret", Duration::from_secs(5), 77) {
        Err(ProtocolError::Refused { status, message }) => {
            assert_eq!(status, Status::VersionMismatch);
            assert!(
                message.contains(&protocol::PROTOCOL_VERSION.to_string()),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    // The program's reply names both, too (read raw).
    {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        protocol::write_request(&mut s, 77, b"").unwrap();
        let mut reply = Vec::new();
        s.read_to_end(&mut reply).unwrap();
        let text = String::from_utf8_lossy(&reply[17..]).into_owned();
        assert!(
            text.contains("versions 1 to 2") && text.contains("version 77"),
            "{text}"
        );
    }
    // A wrong token, through the CLI.
    let out = cmd(&dir)
        .args([
            "capture",
            "--pid",
            &pid.to_string(),
            "--token",
            "nope",
            "-o",
            "x.pftrace",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("token"), "{err}");
    // One capture at a time: the second is told the program is busy.
    let first = Connection::connect(addr, b"s3cret", Duration::from_secs(5)).unwrap();
    assert_eq!(first.hello().pid, pid);
    assert!(first.hello().on_demand);
    // Over loopback the newest version, with uncompressed frames granted.
    assert_eq!(first.version(), protocol::PROTOCOL_VERSION);
    assert_eq!(first.caps(), protocol::CAP_RAW_FRAMES);
    match Connection::connect(addr, b"s3cret", Duration::from_secs(5)) {
        Err(ProtocolError::Refused { status, message }) => {
            assert_eq!(status, Status::Busy);
            assert!(message.contains("busy"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // The first capture still works: it asks for the end of the trace and gets it.
    first.request_stop().unwrap();
    let (mut reader, _w, _) = first.split();
    let mut end = false;
    while let Some(f) = reader.next_frame().unwrap() {
        if f == tachyon_capture::frame::Frame::End {
            end = true;
            break;
        }
    }
    assert!(end);
    let (demo_out, _) = finish(demo);
    assert!(demo_out.contains("capture(s) refused"), "{demo_out}");
}

#[test]
fn a_version_1_capture_gets_lz4_frames_and_a_complete_trace() {
    let dir = tmp_dir("capture_version_1");
    let demo = spawn_demo(
        &dir,
        "2",
        &[
            ("TACHYON_ON_DEMAND", "1"),
            ("TACHYON_WAIT_FOR_CAPTURE", "60"),
        ],
    );
    let addr = discover(&dir, demo.id());
    // A capture as version 1 wrote it: no capabilities in its request.
    let conn = Connection::connect_with_version(addr, b"", Duration::from_secs(5), 1).unwrap();
    assert_eq!((conn.version(), conn.caps()), (1, 0));
    let start = Instant::now();
    let (mut reader, w, _) = conn.split();
    let mut scanner = tachyon_capture::frame::RecordScanner::new();
    let (mut raw_bytes, mut wire_bytes, mut records, mut stop_sent) = (0, 0, 0, false);
    loop {
        if !stop_sent && start.elapsed() > Duration::from_millis(500) {
            (&w).write_all(&[protocol::CMD_STOP]).unwrap();
            stop_sent = true;
        }
        match reader.next_frame().unwrap() {
            Some(tachyon_capture::frame::Frame::Data { raw, wire_len }) => {
                raw_bytes += raw.len();
                wire_bytes += wire_len;
                records += scanner.push(raw).unwrap().1.records;
            }
            Some(tachyon_capture::frame::Frame::End) => break,
            Some(_) => {}
            None => panic!("closed without the end frame"),
        }
    }
    assert!(records > 0);
    assert_eq!(scanner.pending(), 0);
    // LZ4: the wire holds less than the records.
    assert!(wire_bytes < raw_bytes, "{wire_bytes} >= {raw_bytes}");
    drop(w);
    finish(demo);
}

#[test]
fn hostile_clients_do_not_block_or_crash_the_program() {
    let dir = tmp_dir("capture_hostile_client");
    let demo = spawn_demo(
        &dir,
        "2",
        &[
            ("TACHYON_ON_DEMAND", "1"),
            ("TACHYON_WAIT_FOR_CAPTURE", "60"),
        ],
    );
    let pid = demo.id();
    let addr = discover(&dir, pid);
    // Garbage, a half handshake left hanging, a huge token length, many silent peers.
    let mut garbage = std::net::TcpStream::connect(addr).unwrap();
    garbage.write_all(&[0xff; 4096]).unwrap();
    let mut slow = std::net::TcpStream::connect(addr).unwrap();
    slow.write_all(&protocol::MAGIC[..3]).unwrap();
    let mut big = std::net::TcpStream::connect(addr).unwrap();
    let mut req = protocol::MAGIC.to_vec();
    req.extend_from_slice(&protocol::PROTOCOL_VERSION.to_le_bytes());
    req.extend_from_slice(&u16::MAX.to_le_bytes());
    big.write_all(&req).unwrap();
    let silent: Vec<_> = (0..8)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    // A real capture still gets in (once the silent peers time out, at the latest) and
    // receives a complete trace.
    let trace = dir.join("after.pftrace");
    let (o, e) = ok(&capture(&dir, pid, &trace, &["--seconds", "1"]));
    assert!(e.contains("the trace is complete"), "{e}");
    assert!(number_after(&o, "received: ") > 0);
    check_trace(&trace);
    drop((garbage, slow, big, silent));
    let (demo_out, demo_err) = finish(demo);
    assert!(
        demo_out.contains("to 1 capture(s)"),
        "{demo_out}\n{demo_err}"
    );
}

/// A fake program: welcomes the capture, then sends `frames`, then closes.
fn hostile_program(frames: Vec<u8>) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let req = protocol::read_request(&mut s).unwrap();
        let hello = protocol::Hello {
            program: "evil".into(),
            pid: 1,
            host: "h".into(),
            start_unix_ns: 0,
            clock: "c".into(),
            on_demand: false,
        };
        // Uncompressed frames are not granted: one sent anyway breaks the protocol.
        protocol::write_welcome(&mut s, req.version, &hello, 0).unwrap();
        let _ = s.write_all(&frames);
        let _ = s.flush();
        std::thread::sleep(Duration::from_millis(200));
    });
    (addr, t)
}

fn data_frame(payload: &[u8], raw_len: u32) -> Vec<u8> {
    let mut f = vec![tachyon_capture::frame::KIND_DATA];
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(&raw_len.to_le_bytes());
    f.extend_from_slice(payload);
    f
}

#[test]
fn a_hostile_program_cannot_crash_the_capture_or_spoil_its_file() {
    let dir = tmp_dir("capture_hostile_program");
    let good_record = [0x0a, 0x02, 0x40, 0x05];
    let good = tachyon_capture::frame::FrameEncoder::new()
        .data(&good_record)
        .to_vec();
    // An LZ4 bomb (a tiny block declaring 4 GiB), a lying size, a garbage block, records that
    // are not Trace.packet, a record claiming 1 TiB.
    let zeros = lz4_block(&vec![0u8; 1 << 20]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("bomb", data_frame(&zeros, u32::MAX)),
        ("lying size", data_frame(&zeros, 1000)),
        ("garbage block", data_frame(&[0xff; 64], 64)),
        (
            "not records",
            data_frame(&lz4_block(&[0x12, 0x01, 0x00]), 3),
        ),
        (
            "huge record",
            data_frame(&lz4_block(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x1f]), 6),
        ),
        ("unknown kind", vec![42, 0, 0, 0, 0, 0, 0, 0, 0]),
        ("raw frame not granted", {
            let (head, body) = tachyon_capture::frame::FrameEncoder::raw_frames(&good_record)
                .next()
                .unwrap();
            [&head[..], body].concat()
        }),
        ("cut", good[..good.len() - 2].to_vec()),
    ];
    for (name, bad) in cases {
        let mut frames = good.clone();
        frames.extend_from_slice(&bad);
        let (addr, t) = hostile_program(frames);
        let out_path: PathBuf = dir.join(format!("{}.pftrace", name.replace(' ', "_")));
        let out = cmd(&dir)
            .args([
                "capture",
                "-a",
                "127.0.0.1",
                "-p",
                &addr.port().to_string(),
                "-o",
                out_path.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        t.join().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{name}: {err}");
        let mut expected = good_record.to_vec();
        if name == "cut" {
            // A stream cut inside a frame is a loss, not a broken protocol: the file keeps the
            // records before it and states the lost frame (the program sent no status).
            assert!(err.contains("that frame is lost"), "{name}: {err}");
            expected.extend_from_slice(&tachyon_capture::frame::truncation_record(
                &tachyon_capture::frame::AppStatus::default(),
            ));
        } else {
            assert!(err.contains("broke the protocol"), "{name}: {err}");
        }
        // Only the good record (and the loss statement) reached the file.
        assert_eq!(std::fs::read(&out_path).unwrap(), expected, "{name}");
    }
}

fn lz4_block(raw: &[u8]) -> Vec<u8> {
    let mut enc = tachyon_capture::frame::FrameEncoder::new();
    enc.data(raw)[tachyon_capture::frame::HEADER_LEN..].to_vec()
}

#[test]
fn list_shows_listening_programs() {
    let dir = tmp_dir("capture_list");
    let demo = spawn_demo(
        &dir,
        "1",
        &[
            ("TACHYON_ON_DEMAND", "1"),
            ("TACHYON_WAIT_FOR_CAPTURE", "60"),
        ],
    );
    let pid = demo.id();
    let addr = discover(&dir, pid);
    let out = cmd(&dir).args(["capture", "--list"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&pid.to_string()) && text.contains(&addr.port().to_string()),
        "{text}"
    );
    assert!(text.contains("tachyon-demo"), "{text}");
    // Let it go: a capture that stops at once.
    let (_o, _e) = ok(&capture(
        &dir,
        pid,
        &dir.join("l.pftrace"),
        &["--seconds", "0.2"],
    ));
    finish(demo);
}

#[test]
fn list_network_hears_announcements() {
    let dir = tmp_dir("capture_announce");
    // A UDP port of our own on loopback (tests never broadcast).
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let to = format!("127.0.0.1:{port}");
    let demo = spawn_demo(
        &dir,
        "1",
        &[
            ("TACHYON_ON_DEMAND", "1"),
            ("TACHYON_WAIT_FOR_CAPTURE", "60"),
            ("TACHYON_ANNOUNCE", &to),
        ],
    );
    let pid = demo.id();
    let addr = discover(&dir, pid);
    // Another registry (empty): what is listed was heard on the network.
    // Each listing listens for two announcement periods; a loaded machine may delay the
    // program's listener thread past one window, so a few windows are allowed.
    let elsewhere = dir.join("elsewhere");
    let mut text = String::new();
    for _ in 0..5 {
        let out = cmd(&elsewhere)
            .args(["capture", "--list", "--network", "--announce-port"])
            .arg(port.to_string())
            .output()
            .unwrap();
        text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}");
        if text.contains(&pid.to_string()) {
            break;
        }
    }
    let row = text
        .lines()
        .find(|l| l.contains(&pid.to_string()))
        .unwrap_or_else(|| panic!("pid {pid} not heard:\n{text}"));
    assert!(row.contains("tachyon-demo"), "{text}");
    assert!(row.contains(&addr.port().to_string()), "{text}");
    assert!(row.contains("127.0.0.1"), "{text}");
    let (_o, _e) = ok(&capture(
        &dir,
        pid,
        &dir.join("a.pftrace"),
        &["--seconds", "0.2"],
    ));
    finish(demo);
}

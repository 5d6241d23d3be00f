//! Live capture against a real process (the `live_capture` example, built before this test):
//! a capture that stops reading never blocks the program's instrumented threads: the program's
//! buffers fill and lose data, counted in the trace, and the trace stays valid.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tachyon_capture::client::Connection;
use tachyon_capture::frame::{truncation_record, Frame, FrameError, RecordScanner};
use tachyon_capture::registry;
use tachyon_processor::{Options, TraceProcessor, Value};

fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name)
}

fn tmp_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("run")).unwrap();
    dir
}

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

const IPPROTO_TCP: i32 = 6;
const TCP_WINDOW_CLAMP: i32 = 10;

fn set_option(s: &std::net::TcpStream, level: i32, name: i32, size: i32) {
    use std::os::fd::AsRawFd;
    extern "C" {
        fn setsockopt(fd: i32, level: i32, name: i32, value: *const u8, len: u32) -> i32;
    }
    // SAFETY: `fd` is an open socket for the call's duration and `value` points to `len`
    // readable bytes (an i32).
    let r = unsafe { setsockopt(s.as_raw_fd(), level, name, (&size as *const i32).cast(), 4) };
    assert_eq!(r, 0);
}

fn int(tp: &TraceProcessor, sql: &str) -> i64 {
    match tp.query(sql).unwrap().rows.first().map(|r| &r[0]) {
        Some(Value::Integer(n)) => *n,
        other => panic!("{sql}: {other:?}"),
    }
}

#[test]
fn a_stalled_capture_never_blocks_the_program() {
    let dir = tmp_dir("capture_stall");
    let mut cmd = Command::new(example("live_capture"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TACHYON_") {
            cmd.env_remove(k);
        }
    }
    let child = cmd
        .args(["2", "1"])
        .env("XDG_RUNTIME_DIR", dir.join("run"))
        .env("TACHYON_LISTEN", "127.0.0.1:0")
        .env("TACHYON_ON_DEMAND", "1")
        .env("TACHYON_WAIT_FOR_CAPTURE", "60")
        // Small buffers: the stall fills them within the run.
        .env("TACHYON_BUFFER_SIZE", "256K")
        .env("TACHYON_SMB_SIZE", "64K")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = discover(&dir, child.id());
    let conn = Connection::connect(addr, b"", Duration::from_secs(10)).unwrap();
    let (mut reader, w, _) = conn.split();
    // A small receive window (the window clamp), so that the stall reaches the program within
    // the run instead of filling megabytes of kernel buffers first.
    set_option(&w, IPPROTO_TCP, TCP_WINDOW_CLAMP, 4096);
    // The capture reads nothing while the program works: the socket's buffers fill, then the
    // program's. The stall lasts the whole workload (until the worker thread has exited), so
    // a program that blocked on its capture would never get there.
    wait_for_thread(child.id(), "worker-0", true);
    wait_for_thread(child.id(), "worker-0", false);
    // Then it reads all it can, the window open again. (A window shrunk with SO_RCVBUF does
    // not grow back on loopback: the megabytes in the program's socket buffer would trickle
    // in for tens of seconds.) On a loaded machine the program's exit budget may still run
    // out and it cut the connection inside a frame: a legitimate ending, handled below as
    // `tachyon capture` handles it.
    set_option(&w, IPPROTO_TCP, TCP_WINDOW_CLAMP, 8 << 20);
    let mut scanner = RecordScanner::new();
    let mut trace = Vec::new();
    let mut ended = false;
    let mut cut = None;
    let mut last_status = None;
    loop {
        match reader.next_frame() {
            Ok(Some(Frame::Data { raw, .. })) => {
                let (ready, _) = scanner.push(raw).unwrap();
                trace.extend_from_slice(ready);
            }
            Ok(Some(Frame::Status(s))) => last_status = Some(s),
            Ok(Some(Frame::End)) => {
                ended = true;
                break;
            }
            Ok(None) => {
                cut = Some("closed");
                break;
            }
            Err(e @ FrameError::Truncated { .. }) => {
                eprintln!("{e}");
                cut = Some("cut");
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let status = last_status.expect("status frames");
    if let Some(how) = cut {
        eprintln!("the connection was {how} without an end frame");
        // The program's final stats never came: the trace states its last known losses and
        // the torn frame (what `tachyon capture` writes in that case).
        trace.extend_from_slice(&truncation_record(&status));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    if ended {
        assert_eq!(scanner.pending(), 0);
    } else {
        // Only the program's exit budget cuts a capture short, and it says so.
        assert!(
            stderr.contains("did not take the rest of the trace"),
            "no end frame and no budget note\n{stdout}\n{stderr}"
        );
    }
    let zones: i64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("zones "))
        .unwrap()
        .parse()
        .unwrap();
    let path = dir.join("stalled.pftrace");
    std::fs::write(&path, &trace).unwrap();
    let tp = TraceProcessor::open(&path, &Options::default()).unwrap();
    let in_trace = int(&tp, "SELECT count(*) FROM slice WHERE name = 'work'");
    let lost = int(
        &tp,
        "SELECT coalesce(sum(value), 0) FROM stats WHERE severity = 'data_loss'",
    );
    eprintln!("zones {zones}, in the trace {in_trace}, lost {lost}, ended {ended}, {status:?}");
    assert!(in_trace > 0);
    if zones == in_trace {
        // A machine so loaded that the worker did less than the kernel's socket buffers hold
        // (the window clamp keeps the receiver's small, not the sender's): nothing was lost,
        // and the trace must not say otherwise.
        assert_eq!(lost, 0);
        assert_eq!(status.chunks_lost + status.packets_dropped, 0, "{status:?}");
    } else {
        // The threads went on while nothing was read: they did more zones than reached the
        // trace, and the trace says data was lost: the central buffer overwrote what the
        // capture did not take (or the writers dropped when the shared memory buffer filled).
        assert!(zones > in_trace, "zones {zones}, in the trace {in_trace}");
        assert!(lost > 0, "no loss recorded");
        assert!(
            status.chunks_lost + status.packets_dropped > 0,
            "{status:?}"
        );
    }
    // Apart from the losses, the trace is clean.
    let errors = tp
        .query("SELECT name, value FROM stats WHERE severity = 'error' AND value != 0")
        .unwrap()
        .rows;
    assert!(errors.is_empty(), "{errors:?}");
}

/// Waits until process `pid` has (`present`) or no longer has a thread named `name`; panics
/// after a minute (a program that blocks on a stalled capture never finishes its workload).
fn wait_for_thread(pid: u32, name: &str, present: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let found = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|dir| {
                dir.filter_map(Result::ok).any(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == name)
                })
            })
            .unwrap_or(false);
        if found == present {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "thread {name} of {pid}: still {} after 60 s",
            if present { "absent" } else { "running" }
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

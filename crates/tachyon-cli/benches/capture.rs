//! Live capture over loopback: this process records zones with the capture backend
//! (on-demand, an ephemeral port found through discovery) and a real `tachyon capture` process
//! writes the file.
//!
//! 1. Sustained rate: one thread produces zones (two events each) for 2 s at a target rate
//!    (unthrottled first, then fixed rates); each rate is its own capture. Printed per rate:
//!    the rate achieved, events received against events produced (zero loss means equal),
//!    bytes per event on the wire, and the CPU the program's capture threads spent per event
//!    (`tachyon-cap-tx`: LZ4 + socket, the sending thread; `tachyon-cap-svc`: the
//!    service copying chunks and reading them out; `tachyon-drain`: encoding queued events).
//! 2. Criterion, with a capture attached and draining: `capture/client/zone/enabled` beside
//!    `capture/client/baseline/two_timestamps` (the client bench's baseline, same code) in the
//!    same run.
//!
//! `cargo bench -p tachyon-cli --bench capture -- --sample-size 10 --warm-up-time 1
//! --measurement-time 3` (the criterion flags apply to part 2). `TACHYON_CAPTURE_BENCH_RATES`
//! picks part 1's rates, `TACHYON_CAPTURE_BENCH_ZONE_ONLY=1` skips part 1, and
//! `TACHYON_CAPTURE_BENCH_BIN` names the `tachyon` binary that captures (default: this build's).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::Criterion;

/// The `tachyon` binary that captures: this build's, or `TACHYON_CAPTURE_BENCH_BIN` (to run a
/// saved build of the bench against the capture it was built with, beside a newer one, in the
/// same session).
fn tachyon_bin() -> PathBuf {
    std::env::var_os("TACHYON_CAPTURE_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tachyon")))
}

fn spawn_capture(dir: &Path, out: &Path) -> Child {
    Command::new(tachyon_bin())
        .args([
            "capture",
            "--pid",
            &std::process::id().to_string(),
            "-f",
            "--no-summary",
            "-o",
            out.to_str().unwrap(),
        ])
        .env("XDG_RUNTIME_DIR", dir.join("run"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tachyon capture")
}

/// Ctrl-C for the capture: it asks the program to end the trace and waits for its end.
fn stop_capture(c: Child) -> String {
    let _ = Command::new("kill")
        .args(["-INT", &c.id().to_string()])
        .status();
    let out = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn number_after(text: &str, prefix: &str) -> u64 {
    text.find(prefix)
        .and_then(|at| {
            text[at + prefix.len()..]
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or_else(|| panic!("no {prefix:?} in:\n{text}"))
}

/// CPU time (user + system, ns) of this process's threads named `name`.
fn thread_cpu_ns(name: &str) -> u64 {
    let tick_ns = 1_000_000_000 / 100; // USER_HZ
    let mut total = 0;
    let Ok(rd) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    for t in rd.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // Fields after the parenthesized name: state is field 3; utime 14, stime 15.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            if f.len() > 13 {
                let u: u64 = f[11].parse().unwrap_or(0);
                let s: u64 = f[12].parse().unwrap_or(0);
                total += (u + s) * tick_ns;
            }
        }
    }
    total
}

const THREADS: [&str; 3] = ["tachyon-cap-tx", "tachyon-cap-svc", "tachyon-drain"];

fn cpu_all() -> [u64; 3] {
    THREADS.map(thread_cpu_ns)
}

/// One capture: `zones` zones at `rate` events/s (None: as fast as possible).
fn sustained(dir: &Path, rate: Option<f64>, seconds: f64) {
    let out = dir.join("sustained.pftrace");
    let cap = spawn_capture(dir, &out);
    assert!(
        tachyon::wait_for_capture(Duration::from_secs(60)),
        "the capture did not attach"
    );
    // The session's threads start at once; let the first descriptors go out.
    std::thread::sleep(Duration::from_millis(100));
    let before = cpu_all();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut zones = 0u64;
    loop {
        for _ in 0..256 {
            let _z = tachyon::zone!("bench zone");
        }
        zones += 256;
        let now = Instant::now();
        if now >= end {
            break;
        }
        if let Some(r) = rate {
            // Wait until the events made so far (2 per zone) are due at the target rate.
            let due_at = start + Duration::from_secs_f64((zones * 2) as f64 / r);
            while Instant::now() < due_at.min(end) {
                std::hint::spin_loop();
            }
            if Instant::now() >= end {
                break;
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Everything produced reaches the service before its CPU is read.
    std::thread::sleep(Duration::from_millis(300));
    let after = cpu_all();
    let text = stop_capture(cap);
    let events = zones * 2;
    let received = number_after(&text, "packets (");
    let wire = number_after(&text, "uncompressed, ");
    let raw = number_after(&text, "track events), ");
    let per_event = |i: usize| (after[i] - before[i]) as f64 / events as f64;
    println!(
        "capture/sustained target {:>6} M ev/s: produced {:.2} M ev/s ({} events), received {} track events ({}), {:.2} B/event on the wire ({:.2} uncompressed, LZ4 {:.1}%), CPU per event: sender {:.1} ns, service {:.1} ns, drainer {:.1} ns",
        rate.map(|r| format!("{:.1}", r / 1e6)).unwrap_or_else(|| "max".into()),
        events as f64 / elapsed / 1e6,
        events,
        received,
        if received == events {
            "zero loss".to_string()
        } else {
            format!("{} lost", events as i64 - received as i64)
        },
        wire as f64 / events as f64,
        raw as f64 / events as f64,
        100.0 * wire as f64 / raw.max(1) as f64,
        per_event(0),
        per_event(1),
        per_event(2),
    );
}

/// The target rates of part 1: `max` (unthrottled), 10, 5, 2 and 1 M events/s, or those of
/// `TACHYON_CAPTURE_BENCH_RATES` (comma-separated M events/s, `max` for unthrottled), e.g.
/// `max,12,10,8` to look for the highest zero-loss rate.
fn rates() -> Vec<Option<f64>> {
    let Ok(list) = std::env::var("TACHYON_CAPTURE_BENCH_RATES") else {
        return vec![None, Some(10e6), Some(5e6), Some(2e6), Some(1e6)];
    };
    list.split(',')
        .map(|r| match r.trim() {
            "max" => None,
            m => Some(
                m.parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .unwrap_or_else(|| {
                        panic!("TACHYON_CAPTURE_BENCH_RATES: {m:?} is not a rate in M events/s")
                    })
                    * 1e6,
            ),
        })
        .collect()
}

fn main() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench_capture");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("run")).unwrap();
    // Discovery in a private directory of this run (read by this process and the capture).
    std::env::set_var("XDG_RUNTIME_DIR", dir.join("run"));
    tachyon::start(tachyon::Config {
        output: None,
        listen: Some(([127, 0, 0, 1], 0).into()),
        on_demand: true,
        buffer_size: 64 << 20,
        smb_size: 16 << 20,
        ..tachyon::Config::in_memory()
    })
    .expect("start the capture backend");
    tachyon::set_process_name("capture-bench");

    // Part 1 is skipped with TACHYON_CAPTURE_BENCH_ZONE_ONLY=1 (set in the environment).
    if std::env::var_os("TACHYON_CAPTURE_BENCH_ZONE_ONLY").is_none() {
        for rate in rates() {
            sustained(&dir, rate, 2.0);
        }
    }

    // Part 2: the cost of a zone while a capture drains.
    let out = dir.join("criterion.pftrace");
    let cap = spawn_capture(&dir, &out);
    assert!(tachyon::wait_for_capture(Duration::from_secs(60)));
    std::thread::sleep(Duration::from_millis(100));
    let mut c = Criterion::default().configure_from_args();
    {
        let mut g = c.benchmark_group("capture");
        g.bench_function("client/zone/enabled", |b| {
            b.iter(|| {
                let _z = tachyon::zone!("bench zone");
            })
        });
        let clock = tachyon::clock::clock();
        g.bench_function("client/baseline/two_timestamps", |b| {
            b.iter(|| {
                let a = clock.ticks();
                let b = clock.ticks();
                black_box((a, b))
            })
        });
        g.finish();
    }
    let text = stop_capture(cap);
    println!(
        "capture during criterion: {}",
        text.lines()
            .find(|l| l.starts_with("received"))
            .unwrap_or("(no summary)")
    );
    c.final_summary();
    let _ = tachyon::shutdown();
}

//! `tachyon capture`: connects to a program that listens for captures (`TACHYON_LISTEN`),
//! receives its trace as it is recorded and writes it to a file as it arrives (Tracy's
//! `tracy-capture`, Perfetto's format). `--list` shows the programs listening on this machine.
//!
//! The program is untrusted: frames are checked by `tachyon_capture::frame` (lengths, LZ4
//! blocks, whole and well-formed records) before anything reaches the file, at most one frame
//! and one record are held in memory, and a program that breaks the protocol ends the capture
//! with a message (the file keeps the whole records received until then).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, IsTerminal, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tachyon_capture::client::Connection;
use tachyon_capture::frame::{
    truncation_record, AppStatus, Frame, FrameError, FrameReader, RecordScanner,
};
use tachyon_capture::protocol::{ProtocolError, DEFAULT_PORT};
use tachyon_capture::registry;

use crate::load::{load, Sort};
use crate::output::{render, Format};

/// Capture a running program's trace over the network (the program sets TACHYON_LISTEN).
///
/// Examples:
///   TACHYON_LISTEN=127.0.0.1:8110 TACHYON_WAIT_FOR_CAPTURE=10 tachyon demo &
///   tachyon capture -o demo.pftrace
///   tachyon capture --name tachyon-demo -o demo.pftrace --seconds 5
///   tachyon capture --list
///   tachyon capture --list --network     # also programs announcing themselves (TACHYON_ANNOUNCE)
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub(crate) struct Args {
    /// The program's address.
    #[arg(short = 'a', long, default_value = "127.0.0.1", conflicts_with_all = ["pid", "name"])]
    addr: IpAddr,
    /// The program's port (default 8110, Tachyon's own).
    #[arg(short = 'p', long, conflicts_with_all = ["pid", "name"])]
    port: Option<u16>,
    /// Capture the program with this pid, found in the local registry (`--list`).
    #[arg(long, conflicts_with = "name")]
    pid: Option<u32>,
    /// Capture the program with this name, found in the local registry (`--list`).
    #[arg(long)]
    name: Option<String>,
    /// Where the trace is written.
    #[arg(short = 'o', long, required_unless_present = "list")]
    out: Option<PathBuf>,
    /// Stop after this many seconds (default: when the program exits, or Ctrl-C).
    #[arg(short = 's', long, value_parser = parse_seconds)]
    seconds: Option<f64>,
    /// The program's capture token (its TACHYON_CAPTURE_TOKEN; default: this environment's).
    #[arg(long)]
    token: Option<String>,
    /// Overwrite the output file if it exists.
    #[arg(short = 'f', long)]
    force: bool,
    /// List the programs on this machine that accept captures, and exit.
    #[arg(long)]
    list: bool,
    /// With --list: also listen for UDP announcements (programs started with TACHYON_ANNOUNCE,
    /// on this or other machines) for two announcement periods.
    #[arg(long, requires = "list")]
    network: bool,
    /// With --network: the UDP port announcements arrive on.
    #[arg(long, requires = "network", default_value_t = tachyon_capture::announce::ANNOUNCE_PORT)]
    announce_port: u16,
    /// Skip loading the trace for the summary of events and zones (for very large captures).
    #[arg(long)]
    no_summary: bool,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!(
            "{s:?}: expected seconds, more than 0 and at most 86400"
        )),
    }
}

/// How often waiting steps look again.
const POLL: Duration = Duration::from_millis(50);
/// After asking the program to stop, how long to wait for the end of its trace.
const STOP_WAIT: Duration = Duration::from_secs(15);

pub(crate) fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.list {
        return list(args.network.then_some(args.announce_port));
    }
    let out = args
        .out
        .clone()
        .expect("clap requires --out without --list");
    let file = create_output(&out, args.force)?;

    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
            .map_err(|e| format!("installing the signal handler: {e}"))?;
    }
    let conn = match connect(&args, &interrupted)? {
        Some(c) => c,
        None => {
            let _ = std::fs::remove_file(&out);
            return Err("interrupted before a program was captured".into());
        }
    };
    let hello = conn.hello().clone();
    let raw_frames = conn.caps() & tachyon_capture::protocol::CAP_RAW_FRAMES != 0;
    eprintln!(
        "tachyon capture: connected to {} (pid {} on {}, protocol version {}, {}){}; clock: {}",
        hello.program,
        hello.pid,
        hello.host,
        conn.version(),
        if raw_frames {
            "uncompressed frames over loopback"
        } else {
            "LZ4 frames"
        },
        if hello.on_demand {
            ", on-demand: the trace starts now"
        } else {
            ""
        },
        hello.clock
    );
    let (reader, control, _) = conn.split();
    let progress = Arc::new(Progress {
        raw_frames,
        ..Progress::default()
    });
    let reader_thread = {
        let progress = progress.clone();
        std::thread::Builder::new()
            .name("capture-reader".into())
            .spawn(move || receive(reader, file, &progress))?
    };

    let start = Instant::now();
    let limit = args.seconds.map(Duration::from_secs_f64);
    let tty = std::io::stderr().is_terminal();
    let mut last_line = Instant::now();
    let mut stop_sent: Option<Instant> = None;
    let mut why = "the program ended the trace";
    while !reader_thread.is_finished() {
        std::thread::sleep(POLL);
        let want_stop =
            interrupted.load(Ordering::SeqCst) || limit.is_some_and(|l| start.elapsed() >= l);
        if want_stop && stop_sent.is_none() {
            why = if interrupted.load(Ordering::SeqCst) {
                "interrupted"
            } else {
                "--seconds reached"
            };
            // The program ends its session, sends the rest and its final stats, then an end frame.
            let _ = (&control).write_all(&[tachyon_capture::protocol::CMD_STOP]);
            stop_sent = Some(Instant::now());
        }
        if stop_sent.is_some_and(|t| t.elapsed() > STOP_WAIT) {
            eprintln!(
                "\ntachyon capture: the program did not end its trace in {STOP_WAIT:?}; closing"
            );
            let _ = control.shutdown(std::net::Shutdown::Both);
            break;
        }
        if tty && last_line.elapsed() >= Duration::from_millis(250) {
            last_line = Instant::now();
            eprint!("\r\x1b[2K{}", progress.line(start.elapsed()));
        }
    }
    let received = reader_thread
        .join()
        .map_err(|_| "the capture's reader thread panicked")?;
    let elapsed = start.elapsed();
    if tty {
        eprint!("\r\x1b[2K");
    }
    eprintln!("{}", progress.line(elapsed));
    let _ = control.shutdown(std::net::Shutdown::Both);
    let end = received?;
    match &end {
        Ending::Complete => eprintln!("tachyon capture: {why}; the trace is complete"),
        Ending::Closed => eprintln!(
            "tachyon capture: the program closed the connection without ending the trace (it exited, crashed or was cut off); the file holds what arrived, and its last stated losses"
        ),
        Ending::Cut(e) => eprintln!(
            "tachyon capture: {e}: that frame is lost; the file holds the whole records before it, and its stats say the end of the trace is missing (traced_final_flush_failed)"
        ),
        Ending::Broken(e) => eprintln!(
            "tachyon capture: the program broke the protocol ({e}); the file holds the whole records received before"
        ),
    }
    if args.no_summary {
        print_received(&out, &progress);
        return Ok(());
    }
    summarize(&out, &progress)
}

fn create_output(out: &Path, force: bool) -> Result<File, Box<dyn std::error::Error>> {
    let mut o = OpenOptions::new();
    o.write(true);
    if force {
        o.create(true).truncate(true);
    } else {
        o.create_new(true);
    }
    o.open(out).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            format!("{} exists (use -f to overwrite)", out.display()).into()
        } else {
            format!("creating {}: {e}", out.display()).into()
        }
    })
}

fn list(network: Option<u16>) -> Result<(), Box<dyn std::error::Error>> {
    let dir = registry::default_dir();
    let mut entries = registry::list(&dir);
    if let Some(port) = network {
        use tachyon_capture::announce;
        let bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
        let heard = announce::listen(bind, announce::PERIOD * 2)
            .map_err(|e| format!("listening for announcements on UDP {bind}: {e}"))?;
        for a in heard {
            // A local program that also announces itself is listed once (as registered).
            let local = entries.iter().any(|e| {
                e.pid == a.pid
                    && e.port == a.port
                    && (a.addr.is_loopback() || e.addr == a.addr.to_string())
            });
            if !local {
                entries.push(registry::Entry {
                    pid: a.pid,
                    name: a.name,
                    addr: a.addr.to_string(),
                    port: a.port,
                    version: a.version,
                });
            }
        }
    }
    if entries.is_empty() {
        if network.is_some() {
            println!("no program heard on the network either (programs announce themselves with TACHYON_ANNOUNCE=1)");
        }
        println!(
            "no program accepts captures on this machine (registry {}); start one with TACHYON_LISTEN=127.0.0.1:{DEFAULT_PORT}",
            dir.display()
        );
        return Ok(());
    }
    let rows = entries
        .iter()
        .map(|e| {
            use tachyon_processor::Value;
            vec![
                Value::Integer(i64::from(e.pid)),
                Value::Text(e.name.clone()),
                Value::Text(e.addr.clone()),
                Value::Integer(i64::from(e.port)),
                Value::Integer(i64::from(e.version)),
            ]
        })
        .collect();
    let table = tachyon_processor::QueryResult {
        columns: ["pid", "name", "addr", "port", "version"]
            .map(String::from)
            .to_vec(),
        rows,
    };
    print!("{}", render(&table, Format::Table));
    Ok(())
}

/// Waits for the program (in the registry with `--pid`/`--name`, else for its port to accept)
/// and shakes hands. `None` when interrupted first. A refusal is an error at once.
fn connect(
    args: &Args,
    interrupted: &AtomicBool,
) -> Result<Option<Connection>, Box<dyn std::error::Error>> {
    let token = args
        .token
        .clone()
        .or_else(|| std::env::var("TACHYON_CAPTURE_TOKEN").ok())
        .unwrap_or_default();
    let token = token.as_bytes();
    let mut said_waiting = false;
    loop {
        if interrupted.load(Ordering::SeqCst) {
            return Ok(None);
        }
        let target = match (&args.pid, &args.name) {
            (None, None) => Some(SocketAddr::new(
                args.addr,
                args.port.unwrap_or(DEFAULT_PORT),
            )),
            _ => registry::list(&registry::default_dir())
                .into_iter()
                .find(|e| {
                    args.pid.is_none_or(|p| p == e.pid)
                        && args.name.as_ref().is_none_or(|n| *n == e.name)
                })
                .map(|e| {
                    let ip = e
                        .addr
                        .parse::<IpAddr>()
                        .ok()
                        .filter(|ip| !ip.is_unspecified());
                    SocketAddr::new(ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)), e.port)
                }),
        };
        if let Some(addr) = target {
            match Connection::connect(addr, token, Duration::from_secs(1)) {
                Ok(c) => return Ok(Some(c)),
                Err(ProtocolError::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionRefused
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::UnexpectedEof
                    ) => {}
                Err(e) => return Err(format!("{addr}: {e}").into()),
            }
        }
        if !said_waiting {
            said_waiting = true;
            let what = match (&args.pid, &args.name) {
                (Some(p), _) => format!("pid {p}"),
                (_, Some(n)) => format!("a program named {n:?}"),
                _ => format!("{}:{}", args.addr, args.port.unwrap_or(DEFAULT_PORT)),
            };
            eprintln!("tachyon capture: waiting for {what} (Ctrl-C to give up)");
        }
        std::thread::sleep(POLL);
    }
}

/// Counters the reader thread updates and the status line reads.
#[derive(Debug, Default)]
struct Progress {
    wire_bytes: AtomicU64,
    raw_bytes: AtomicU64,
    records: AtomicU64,
    events: AtomicU64,
    loss_marks: AtomicU64,
    app: Mutex<AppStatus>,
    /// The program sends uncompressed frames (negotiated over loopback).
    raw_frames: bool,
}

impl Progress {
    fn line(&self, elapsed: Duration) -> String {
        let s = elapsed.as_secs_f64().max(1e-9);
        let wire = self.wire_bytes.load(Ordering::Relaxed) as f64;
        let raw = self.raw_bytes.load(Ordering::Relaxed) as f64;
        let app = *self.app.lock().unwrap_or_else(|e| e.into_inner());
        format!(
            "{:.1} s, {} events, {} packets, {:.2} MB/s on the wire, {:.2} MB/s uncompressed ({}), losses: {} packets dropped by the writers, {} chunks overwritten, {} loss marks",
            s,
            self.events.load(Ordering::Relaxed),
            self.records.load(Ordering::Relaxed),
            wire / s / 1e6,
            raw / s / 1e6,
            if self.raw_frames {
                "uncompressed frames".to_string()
            } else {
                format!(
                    "LZ4 {:.1}%",
                    if raw > 0.0 { 100.0 * wire / raw } else { 0.0 }
                )
            },
            app.packets_dropped,
            app.chunks_lost,
            self.loss_marks.load(Ordering::Relaxed),
        )
    }
}

/// How the stream ended.
#[derive(Debug)]
enum Ending {
    /// The program's end frame: its final stats are in the file.
    Complete,
    /// The connection closed between frames without one.
    Closed,
    /// The connection closed inside a frame (the program's exit budget ran out while the
    /// capture was behind, or it died).
    Cut(String),
    /// The program broke the protocol.
    Broken(String),
}

/// Reads frames, checks them and writes whole records to the file as they arrive.
fn receive(
    mut reader: FrameReader<TcpStream>,
    file: File,
    progress: &Progress,
) -> Result<Ending, String> {
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut scanner = RecordScanner::new();
    let ending = loop {
        match reader.next_frame() {
            Ok(Some(Frame::Data { raw, wire_len })) => {
                progress
                    .wire_bytes
                    .fetch_add(wire_len as u64, Ordering::Relaxed);
                progress
                    .raw_bytes
                    .fetch_add(raw.len() as u64, Ordering::Relaxed);
                match scanner.push(raw) {
                    Ok((ready, counts)) => {
                        out.write_all(ready)
                            .map_err(|e| format!("writing the trace: {e}"))?;
                        progress
                            .records
                            .fetch_add(counts.records, Ordering::Relaxed);
                        progress
                            .events
                            .fetch_add(counts.track_events, Ordering::Relaxed);
                        progress
                            .loss_marks
                            .fetch_add(counts.loss_marks, Ordering::Relaxed);
                    }
                    Err(e) => break Ending::Broken(e.to_string()),
                }
            }
            Ok(Some(Frame::Status(s))) => {
                *progress.app.lock().unwrap_or_else(|e| e.into_inner()) = s;
            }
            Ok(Some(Frame::End)) => break Ending::Complete,
            Ok(None) => break Ending::Closed,
            Err(FrameError::Io(_)) => break Ending::Closed,
            Err(e @ FrameError::Truncated { .. }) => break Ending::Cut(e.to_string()),
            Err(e) => break Ending::Broken(e.to_string()),
        }
    };
    // Without the end frame the program's final TraceStats never came: the trace states the
    // losses known from its last status frame, and the frame cut short, itself.
    if matches!(ending, Ending::Closed | Ending::Cut(_)) {
        let app = *progress.app.lock().unwrap_or_else(|e| e.into_inner());
        out.write_all(&truncation_record(&app))
            .map_err(|e| format!("writing the trace: {e}"))?;
    }
    out.flush().map_err(|e| format!("writing the trace: {e}"))?;
    Ok(ending)
}

/// The summary after the capture: what the file holds, as `tachyon demo` prints it.
fn print_received(out: &Path, progress: &Progress) {
    let abs = std::fs::canonicalize(out).unwrap_or_else(|_| out.to_path_buf());
    println!("trace: {}", abs.display());
    let app = *progress.app.lock().unwrap_or_else(|e| e.into_inner());
    println!(
        "received: {} packets ({} track events), {} bytes uncompressed, {} bytes on the wire; the program reported {} packets dropped by its writers and {} chunks overwritten",
        progress.records.load(Ordering::Relaxed),
        progress.events.load(Ordering::Relaxed),
        progress.raw_bytes.load(Ordering::Relaxed),
        progress.wire_bytes.load(Ordering::Relaxed),
        app.packets_dropped,
        app.chunks_lost,
    );
}

fn summarize(out: &Path, progress: &Progress) -> Result<(), Box<dyn std::error::Error>> {
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    print_received(out, progress);
    if bytes == 0 {
        println!("the file is empty: nothing was recorded");
        return Ok(());
    }
    let tp = load(out, Sort::Full)?;
    let counts = crate::commands::demo::event_counts(&tp)?;
    let loss = tp.data_loss()?;
    println!(
        "written: {} events in the trace ({} slices, {} instants, {} counter samples; plus {} flows), {bytes} bytes",
        counts.slices + counts.instants + counts.counters,
        counts.slices,
        counts.instants,
        counts.counters,
        counts.flows,
    );
    // Zones open when the capture stopped keep their begin and have no end: Perfetto's
    // processor gives such slices dur = -1 and its UI draws them to the end of the trace as
    // "Did not end"; an end made up at the stop time would be a duration nobody measured.
    let open = match tp
        .query("SELECT count(*) FROM slice WHERE dur = -1")?
        .rows
        .first()
        .map(|r| &r[0])
    {
        Some(tachyon_processor::Value::Integer(n)) => *n,
        _ => 0,
    };
    if open > 0 {
        println!(
            "did not end: {open} zone(s) still open when the capture stopped (begin recorded, end after the capture; dur = -1, shown \"Did not end\" as Perfetto shows them)"
        );
    }
    if loss.is_empty() {
        println!("losses: none (no data_loss or error in the trace's stats)");
    } else {
        println!(
            "losses: {} data_loss/error stat(s) in the trace:",
            loss.len()
        );
        for s in &loss {
            let idx = s.idx.map(|i| format!("[{i}]")).unwrap_or_default();
            println!("  {}{idx} = {} ({})", s.name, s.value, s.severity);
        }
    }
    println!("top zones by total time:");
    print!(
        "{}",
        render(&crate::commands::demo::top_zones(&tp, 5)?, Format::Table)
    );
    Ok(())
}

//! `tachyon record`: a consumer. Starts a session on the daemon from a TraceConfig in Perfetto's
//! text format, waits (for `--time`, the config's `duration_ms`, Ctrl-C, or the end of the
//! program given after `--`), stops it and writes the trace.
//!
//! With a program and no daemon listening, it starts an embedded daemon on private sockets and
//! runs the program with `TACHYON_PRODUCER_SOCK` pointing at it: no set-up for the user.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protozero::HeapBuffered;
use tachyon_protos::{trace_config, TraceConfig, TraceStatsView};
use tachyon_traced::{Consumer, Daemon, DaemonConfig, DaemonHandle};

use crate::trace_config_text::parse_trace_config_and_ignored;

/// Record a trace from the daemon (system mode).
///
/// Examples:
///   tachyon record -c configs/system.pbtxt -o trace.pftrace --time 10s
///   tachyon record -o all.pftrace -- sh -c 'tachyon demo & tachyon demo & wait'
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub(crate) struct Args {
    /// A TraceConfig in Perfetto's text format. Default: one 64 MiB ring buffer with
    /// `track_event` (all categories) and `linux.process_stats`.
    #[arg(short = 'c', long)]
    config: Option<PathBuf>,
    /// Where the trace is written.
    #[arg(short = 'o', long)]
    out: PathBuf,
    /// Stop after this long (e.g. 10s, 500ms, 2m); overrides the config's duration_ms.
    #[arg(short = 't', long, value_parser = parse_duration)]
    time: Option<Duration>,
    /// The consumer socket of a running daemon (default: TACHYON_CONSUMER_SOCK or the standard
    /// path).
    #[arg(long)]
    consumer_socket: Option<PathBuf>,
    /// The producer socket of that daemon, given to the program after `--` (default:
    /// TACHYON_PRODUCER_SOCK or the standard path). Not used with the embedded daemon.
    #[arg(long)]
    producer_socket: Option<PathBuf>,
    /// A program to run and trace; recording stops when it exits, and `tachyon record` exits
    /// with its status.
    #[arg(last = true)]
    program: Vec<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000.0)
    } else {
        (s, 1000.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v * mult_ms <= 86_400_000.0 => {
            Ok(Duration::from_secs_f64(v * mult_ms / 1000.0))
        }
        _ => Err(format!(
            "{s:?}: expected a duration like 10s, 500ms, 2m or 1h"
        )),
    }
}

/// The config used without `-c`.
fn default_config() -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    {
        let mut c: TraceConfig<'_> = buf.root();
        {
            let mut b = c.add_buffers();
            b.set_size_kb(64 * 1024);
            b.set_fill_policy(trace_config::buffer_config::FillPolicy::RingBuffer);
        }
        for name in ["track_event", "linux.process_stats"] {
            let mut ds = c.add_data_sources();
            let mut cfg = ds.set_config();
            cfg.set_name(name);
        }
    }
    buf.serialize().expect("heap buffers do not fail")
}

/// `config` with its `duration_ms` replaced by `time`: a serialized field appended to a message
/// overrides an earlier one (protobuf's last-one-wins rule, which the daemon's decoder follows).
fn with_duration(config: &[u8], time: Duration) -> Vec<u8> {
    let ms = u32::try_from(time.as_millis()).unwrap_or(u32::MAX).max(1);
    let mut buf = HeapBuffered::new();
    buf.root::<TraceConfig<'_>>().set_duration_ms(ms);
    let mut out = config.to_vec();
    out.extend(buf.serialize().expect("heap buffers do not fail"));
    out
}

fn load_config(path: &Path) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the config {}: {e}", path.display()))?;
    let origin = path.display().to_string();
    let (config, ignored) = parse_trace_config_and_ignored(&text, &origin)?;
    // Perfetto's configs carry fields Tachyon does not act on: accepted, and said so.
    for field in ignored {
        eprintln!("tachyon record: warning: {field}: not supported by Tachyon, ignored");
    }
    Ok(config)
}

pub(crate) fn run(args: Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mut config = match &args.config {
        Some(p) => load_config(p)?,
        None => default_config(),
    };
    if let Some(time) = args.time {
        // The daemon stops the session at `duration_ms`: `--time` must be what it sees, or a
        // shorter config duration would win.
        config = with_duration(&config, time);
    }
    // The daemon checks it too; checked here, a bad config is reported before anything starts.
    let session = tachyon_service::SessionConfig::from_trace_config(&config)?;
    warn_unoffered(&session);
    let write_into_file = session.write_into_file;
    let limit = args.time.or(session.duration);

    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
            .map_err(|e| format!("installing the signal handler: {e}"))?;
    }

    let consumer_socket = args
        .consumer_socket
        .clone()
        .unwrap_or_else(tachyon_ipc::paths::consumer_socket);
    // A running daemon is used; with a program to run and none running, an embedded one.
    let (mut consumer, embedded, producer_socket) = match Consumer::connect(&consumer_socket) {
        Ok(c) => (
            c,
            None,
            args.producer_socket
                .clone()
                .unwrap_or_else(tachyon_ipc::paths::producer_socket),
        ),
        Err(e) if args.program.is_empty() => {
            return Err(format!(
                "no tracing daemon at {} ({e}); start one with `tachyon traced`, or give a \
                 program to trace after `--`",
                consumer_socket.display()
            )
            .into())
        }
        Err(_) => {
            let (daemon, dir, consumer) = start_embedded()?;
            let producer = daemon.producer_socket().to_path_buf();
            (consumer, Some((daemon, dir)), producer)
        }
    };

    let output =
        File::create(&args.out).map_err(|e| format!("creating {}: {e}", args.out.display()))?;
    consumer
        .enable_tracing(&config, write_into_file.then_some(&output))
        .map_err(|e| format!("starting the session: {e}"))?;

    let mut child = match args.program.split_first() {
        Some((prog, rest)) => Some(spawn(prog, rest, &producer_socket)?),
        None => None,
    };

    let started = Instant::now();
    let progress = std::io::stderr().is_terminal();
    let mut ended_by_daemon = None;
    let mut last_print = Instant::now() - Duration::from_secs(1);
    let reason = loop {
        if interrupted.load(Ordering::SeqCst) {
            break "interrupted";
        }
        if limit.is_some_and(|l| started.elapsed() >= l) {
            break "time is up";
        }
        if let Some(c) = child.as_mut() {
            if c.try_wait()?.is_some() {
                break "the program exited";
            }
        }
        if let Some(end) = consumer.wait_for_end(Some(Duration::from_millis(100)))? {
            ended_by_daemon = Some(end);
            break "the session ended";
        }
        if progress && last_print.elapsed() >= Duration::from_millis(500) {
            last_print = Instant::now();
            if let Ok(stats) = consumer.trace_stats() {
                print_progress(started.elapsed(), &stats);
            }
        }
    };
    if progress {
        eprintln!();
    }
    let mut program_status = None;
    if let Some(c) = child.as_mut() {
        let status = c.wait()?;
        if !status.success() {
            eprintln!("tachyon record: the program exited with {status}");
        }
        program_status = Some(status);
    }
    let end = match ended_by_daemon {
        Some(end) => end,
        None => {
            consumer.disable_tracing()?;
            consumer
                .wait_for_end(Some(Duration::from_secs(30)))?
                .ok_or("the daemon did not end the session within 30 s")?
        }
    };
    if let Some(err) = end.error {
        eprintln!("tachyon record: the session ended with an error: {err}");
    }
    let bytes = if write_into_file {
        output.metadata().map(|m| m.len()).unwrap_or(0)
    } else {
        let mut w = BufWriter::new(&output);
        let n = consumer.read_buffers(&mut w)?;
        w.flush()?;
        n
    };
    let _ = consumer.free_buffers();
    drop(consumer);
    if let Some((daemon, dir)) = embedded {
        daemon.shutdown();
        // The sockets are gone with the daemon; the directory is ours and empty.
        let _ = std::fs::remove_dir_all(dir);
    }
    eprintln!(
        "tachyon record: {reason}; wrote {} ({bytes} bytes). `tachyon stats {}` shows the zones \
         and any data loss.",
        args.out.display(),
        args.out.display()
    );
    Ok(program_status.map_or(ExitCode::SUCCESS, exit_code))
}

/// The data source that SDK programs register (`tachyon::init`, `tachyon::start` in system
/// mode).
const SDK_DATA_SOURCE: &str = "track_event";

/// Names each data source of the config that no Tachyon producer offers (Perfetto's `linux.ftrace`,
/// `android.heapprofd`, ...). The daemon, as `traced` does, starts a data source only in producers
/// that registered it, so these record nothing (unless a producer registering that name connects
/// during the session); the rest of the config records as asked.
fn warn_unoffered(session: &tachyon_service::SessionConfig) {
    let mut named: Vec<&str> = Vec::new();
    for ds in &session.data_sources {
        let name = ds.name.as_str();
        if name == SDK_DATA_SOURCE
            || tachyon_traced::is_builtin_data_source(name)
            || named.contains(&name)
        {
            continue;
        }
        named.push(name);
        eprintln!(
            "tachyon record: warning: data source \"{name}\": no Tachyon producer offers it, so \
             it records nothing (the daemon offers linux.process_stats, linux.sys_stats and \
             linux.perf, programs built with Tachyon offer {SDK_DATA_SOURCE})"
        );
    }
}

/// The exit code that passes a program's status on, as a shell does: its code, or 128 plus
/// the signal that killed it.
fn exit_code(status: ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(code as u8),
        (None, Some(signal)) => ExitCode::from((128 + signal) as u8),
        (None, None) => ExitCode::FAILURE,
    }
}

/// An embedded daemon on private sockets in a fresh directory (returned, to be removed).
fn start_embedded() -> Result<(DaemonHandle, PathBuf, Consumer), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("tachyon-record-{}", std::process::id()));
    tachyon_ipc::paths::ensure_private_dir(&dir)?;
    let daemon = Daemon::start(DaemonConfig::in_dir(&dir))
        .map_err(|e| format!("starting an embedded daemon in {}: {e}", dir.display()))?;
    let consumer = Consumer::connect(daemon.consumer_socket())
        .map_err(|e| format!("connecting to the embedded daemon: {e}"))?;
    Ok((daemon, dir, consumer))
}

fn spawn(prog: &str, args: &[String], producer_socket: &Path) -> Result<Child, String> {
    std::process::Command::new(prog)
        .args(args)
        .env(tachyon_ipc::paths::PRODUCER_SOCK_ENV, producer_socket)
        .spawn()
        .map_err(|e| format!("running {prog}: {e}"))
}

fn print_progress(elapsed: Duration, stats: &[u8]) {
    let Ok(s) = TraceStatsView::decode(stats) else {
        return;
    };
    let bytes: u64 = s
        .buffer_stats()
        .filter_map(Result::ok)
        .map(|b| b.bytes_written())
        .sum();
    eprint!(
        "\rtachyon record: {:>6.1} s, {:>10} bytes, {} producer(s) connected   ",
        elapsed.as_secs_f64(),
        bytes,
        s.producers_connected()
    );
    let _ = std::io::stderr().flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace_config_text::parse_trace_config;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn time_replaces_the_configs_duration_longer_or_shorter() {
        let text = "duration_ms: 1000\nbuffers { size_kb: 1024 }\n\
                    data_sources { config { name: \"track_event\" } }\n";
        let config = parse_trace_config(text, "test").unwrap();
        for (time, ms) in [
            (Duration::from_secs(6), 6000),
            (Duration::from_millis(300), 300),
        ] {
            let c =
                tachyon_service::SessionConfig::from_trace_config(&with_duration(&config, time))
                    .unwrap();
            assert_eq!(c.duration, Some(Duration::from_millis(ms)));
            assert_eq!(c.buffers.len(), 1, "the rest of the config is kept");
        }
    }

    #[test]
    fn the_default_config_is_a_valid_session() {
        let c = tachyon_service::SessionConfig::from_trace_config(&default_config()).unwrap();
        assert_eq!(c.buffers.len(), 1);
        assert_eq!(c.data_sources.len(), 2);
    }
}

//! `tachyon traced`: the tracing daemon. Producers (processes using the SDK with
//! `TACHYON_PRODUCER_SOCK` set, or finding the default socket) write into shared memory it
//! hands them; consumers (`tachyon record`) start sessions and read traces over the consumer
//! socket. Runs until interrupted (Ctrl-C, SIGTERM).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tachyon_traced::{Daemon, DaemonConfig, DaemonStats};

/// Run the tracing daemon (system mode).
///
/// Default sockets: `$XDG_RUNTIME_DIR/tachyon-{producer,consumer}.sock`, else under
/// `/tmp/tachyon-<uid>/`; `TACHYON_PRODUCER_SOCK` / `TACHYON_CONSUMER_SOCK` move them.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The producer socket (mode 0666: any local process that can reach it may connect; the
    /// default directory is private to this user, so by default only this user's processes).
    #[arg(long)]
    producer_socket: Option<PathBuf>,
    /// The consumer socket (only this user may connect: mode 0600).
    #[arg(long)]
    consumer_socket: Option<PathBuf>,
    /// Map every page of a session's central buffers when the session starts, not on the
    /// first write to each (the whole buffer's memory is held from the start; a session
    /// streaming at a high rate then pays no page faults on its first pass round the buffer).
    #[arg(long)]
    prefault_buffers: bool,
}

pub(crate) fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut config = DaemonConfig::from_env();
    if let Some(p) = args.producer_socket {
        config.producer_socket = p;
    }
    if let Some(c) = args.consumer_socket {
        config.consumer_socket = c;
    }
    config.prefault_buffers = args.prefault_buffers;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .map_err(|e| format!("installing the signal handler: {e}"))?;
    }
    let daemon = Daemon::start(config).map_err(|e| format!("starting the daemon: {e}"))?;
    eprintln!(
        "tachyon traced: producers on {}, consumers on {} (Ctrl-C to stop)",
        daemon.producer_socket().display(),
        daemon.consumer_socket().display()
    );
    // What the daemon refused is logged when it happens (at most once a second), as
    // Perfetto's traced logs it: none of it reaches a trace.
    let mut reported = refusals(&DaemonStats::default());
    let mut last_check = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        if last_check.elapsed() >= Duration::from_secs(1) {
            last_check = Instant::now();
            let now = refusals(&daemon.stats());
            if let Some(line) = refusal_line(&reported, &now) {
                eprintln!("tachyon traced: refused since the last report: {line}");
            }
            reported = now;
        }
    }
    let stats = daemon.stats();
    daemon.shutdown();
    let all = refusals(&stats);
    eprintln!(
        "tachyon traced: stopped after {} session(s), {} producer connection(s), {} commit(s); \
         refused in all: {}",
        stats.sessions_started,
        stats.producers_seen,
        stats.commits,
        refusal_line(&refusals(&DaemonStats::default()), &all).unwrap_or_else(|| "nothing".into())
    );
    Ok(())
}

/// The daemon's counters of refused connections, frames, requests and data, by name.
fn refusals(s: &DaemonStats) -> [(&'static str, u64); 10] {
    [
        ("protocol errors", s.protocol_errors),
        ("frames", s.frames_rejected),
        ("slow peers disconnected", s.slow_peers_disconnected),
        ("requests", s.requests_refused),
        ("producer connections", s.producers_refused),
        ("consumer connections", s.consumers_refused),
        ("chunks", s.chunks_discarded),
        ("patches", s.patches_discarded),
        ("invalid commit entries", s.invalid_commit_entries),
        ("shared memory buffers not created", s.smb_failures),
    ]
}

/// `name n, ...` for the counters that grew from `before` to `now`; None if none did.
fn refusal_line(before: &[(&str, u64); 10], now: &[(&str, u64); 10]) -> Option<String> {
    let grown: Vec<String> = before
        .iter()
        .zip(now)
        .filter(|((_, b), (_, n))| n > b)
        .map(|((_, b), (name, n))| format!("{name} {}", n - b))
        .collect();
    (!grown.is_empty()).then(|| grown.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_counters_that_grew_are_reported() {
        let mut stats = DaemonStats::default();
        stats.frames_rejected = 2;
        stats.chunks_discarded = 5;
        let before = refusals(&stats);
        stats.frames_rejected = 3;
        stats.protocol_errors = 1;
        let now = refusals(&stats);
        assert_eq!(
            refusal_line(&before, &now).as_deref(),
            Some("protocol errors 1, frames 1")
        );
        assert_eq!(refusal_line(&now, &now), None);
    }
}

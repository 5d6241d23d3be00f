//! `tachyon traced`: the tracing daemon. Producers (processes using the SDK with
//! `TACHYON_PRODUCER_SOCK` set, or finding the default socket) write into shared memory it
//! hands them; consumers (`tachyon record`) start sessions and read traces over the consumer
//! socket. Runs until interrupted (Ctrl-C, SIGTERM).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tachyon_traced::{Daemon, DaemonConfig};

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
}

pub(crate) fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut config = DaemonConfig::from_env();
    if let Some(p) = args.producer_socket {
        config.producer_socket = p;
    }
    if let Some(c) = args.consumer_socket {
        config.consumer_socket = c;
    }
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
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
    daemon.shutdown();
    eprintln!("tachyon traced: stopped");
    Ok(())
}

//! The daemon's configuration and the bounds it puts on everything a peer can ask for.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tachyon_ipc::paths;

/// Bounds on what peers may ask of the daemon. Every size or count that arrives on a socket is
/// checked against one of these (or against a limit of `tachyon-ipc`, such as the frame size).
pub mod limits {
    use std::time::Duration;

    /// Default [`DaemonConfig::max_producers`](super::DaemonConfig::max_producers).
    pub const MAX_PRODUCERS: usize = 256;
    /// Default [`DaemonConfig::max_consumers`](super::DaemonConfig::max_consumers).
    pub const MAX_CONSUMERS: usize = 16;
    /// Data sources one producer may register.
    pub const MAX_DATA_SOURCES_PER_PRODUCER: usize = 64;
    /// Bytes of a data source or producer name.
    pub const MAX_NAME_LEN: usize = 256;
    /// Smallest shared memory buffer (a producer's size hint is clamped to this)…
    pub const MIN_SMB_SIZE: usize = 4 * 1024;
    /// …and the largest.
    pub const MAX_SMB_SIZE: usize = tachyon_abi::MAX_SMB_SIZE;
    /// The buffer a producer gets when it gives no size hint.
    pub const DEFAULT_SMB_SIZE: usize = tachyon_abi::DEFAULT_SMB_SIZE;
    /// Central buffers one session may have.
    pub const MAX_BUFFERS_PER_SESSION: usize = 64;
    /// Bytes of all central buffers of one session together.
    pub const MAX_SESSION_BUFFER_BYTES: usize = 1 << 30;
    /// Default [`DaemonConfig::max_buffer_bytes`](super::DaemonConfig::max_buffer_bytes).
    pub const MAX_DAEMON_BUFFER_BYTES: usize = 2 << 30;
    /// Data sources one trace config may name.
    pub const MAX_DATA_SOURCES_PER_SESSION: usize = 256;
    /// Frames of one connection received but not yet handled by the service thread; the
    /// connection's reader waits beyond that, so a flooding peer cannot grow the queue.
    pub const MAX_QUEUED_FRAMES: usize = 32;
    /// Commands queued for a producer that has not opened its command stream yet.
    pub const MAX_QUEUED_COMMANDS: usize = 1024;
    /// Default [`DaemonConfig::write_timeout`](super::DaemonConfig::write_timeout).
    pub const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
}

/// How a daemon is set up. [`DaemonConfig::from_env`] gives the standard sockets,
/// [`DaemonConfig::in_dir`] private ones (tests, `tachyon record`'s embedded daemon).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonConfig {
    /// Path of the producer socket.
    pub producer_socket: PathBuf,
    /// Path of the consumer socket.
    pub consumer_socket: PathBuf,
    /// File mode of the producer socket: 0o666, any local process may produce (its directory
    /// may still restrict who reaches it).
    pub producer_socket_mode: u32,
    /// File mode of the consumer socket: 0o600, only this user may record.
    pub consumer_socket_mode: u32,
    /// Producer connections at once; more are closed on accept (and counted).
    pub max_producers: usize,
    /// Consumer connections at once (each may run one session).
    pub max_consumers: usize,
    /// How long a write to a peer may block. A peer that does not read its replies or commands
    /// for that long is disconnected: it never stalls the daemon for longer.
    pub write_timeout: Duration,
    /// Offer the built-in data sources (`linux.process_stats`, `linux.sys_stats`).
    pub builtin_data_sources: bool,
    /// Bytes of central buffers of all sessions together: a session that would go beyond is
    /// refused, so consumers cannot make the daemon hold more memory than this.
    pub max_buffer_bytes: usize,
    /// Map every page of a session's central buffers when the session is created
    /// (`SessionConfig::prefault_buffers`; `tachyon traced --prefault-buffers`), instead of
    /// page by page as the first pass round each buffer reaches it. Off by default, as Perfetto
    /// commits buffer pages lazily: on, a session's buffers hold their whole memory from the
    /// start, and `EnableTracing` holds the service thread up while they are mapped (about
    /// 40–90 ms for 64 MiB on a loaded 2-core VM), but the read-out and the commits of a
    /// session streaming at a high rate pay no page faults on its first pass.
    pub prefault_buffers: bool,
}

impl DaemonConfig {
    /// The sockets named by `TACHYON_PRODUCER_SOCK` / `TACHYON_CONSUMER_SOCK`, else the
    /// defaults of [`tachyon_ipc::paths`] (the user's runtime directory, or
    /// `/tmp/tachyon-<uid>`).
    pub fn from_env() -> Self {
        Self::with_sockets(paths::producer_socket(), paths::consumer_socket())
    }

    /// Both sockets in `dir`, with their standard file names.
    pub fn in_dir(dir: &Path) -> Self {
        Self::with_sockets(
            dir.join(paths::PRODUCER_SOCK_NAME),
            dir.join(paths::CONSUMER_SOCK_NAME),
        )
    }

    fn with_sockets(producer_socket: PathBuf, consumer_socket: PathBuf) -> Self {
        DaemonConfig {
            producer_socket,
            consumer_socket,
            producer_socket_mode: 0o666,
            consumer_socket_mode: 0o600,
            max_producers: limits::MAX_PRODUCERS,
            max_consumers: limits::MAX_CONSUMERS,
            write_timeout: limits::WRITE_TIMEOUT,
            builtin_data_sources: true,
            max_buffer_bytes: limits::MAX_DAEMON_BUFFER_BYTES,
            prefault_buffers: false,
        }
    }
}

//! The `tachyon traced` daemon as a library: the system-mode tracing service that producers in
//! many processes write into and consumers record from, one trace for all.
//!
//! - **Producers** connect to the producer socket (mode 0666), speak Perfetto's `ProducerPort`
//!   (`tachyon-ipc/PROTOCOL.md`), and get one sealed memfd shared memory buffer each, created
//!   here and passed with `SetupTracing`. Their identity (`trusted_pid`, `trusted_uid`) is the
//!   kernel's `SO_PEERCRED`, never what they say.
//! - **Consumers** connect to the consumer socket (mode 0600) and run one session each: a
//!   Perfetto `TraceConfig` in, a trace out (read back over the socket, or streamed into a file
//!   descriptor they pass). [`Consumer`] is that side, as `tachyon record` uses it.
//! - **Sessions** have Perfetto's semantics (seed 003): several central buffers, `RING_BUFFER`
//!   or `DISCARD`, flushes with acknowledgements and a timeout, periodic flushes, streaming to
//!   a file with a size limit, periodic incremental-state clears, SMB scraping at flush, stop
//!   and producer death, and loss counters in the final `TraceStats`.
//! - **Built-in data sources** `linux.process_stats` and `linux.sys_stats` (`tachyon-probes`)
//!   run inside the daemon as its own producer.
//!
//! Producers are untrusted: every frame, request and shared memory byte is validated, every
//! size bounded ([`limits`]); a producer that breaks the protocol is disconnected, one that
//! lies in its commits has those chunks discarded, both counted ([`DaemonStats`], the
//! session's `TraceStats`), and no producer can reach another's buffers or sessions.
//!
//! ```
//! use tachyon_traced::{Consumer, Daemon, DaemonConfig};
//! # let dir = std::env::temp_dir().join(format!("tachyon-doc-{}", std::process::id()));
//! let daemon = Daemon::start(DaemonConfig::in_dir(&dir))?;
//! let mut consumer = Consumer::connect(daemon.consumer_socket())?;
//! // TraceConfig { buffers { size_kb: 1024 } }: one buffer, no data sources.
//! consumer.enable_tracing(&[0x0a, 0x03, 0x08, 0x80, 0x08], None)?;
//! consumer.disable_tracing()?;
//! assert_eq!(consumer.wait_for_end(None)?.unwrap().error, None);
//! let mut trace = Vec::new();
//! consumer.read_buffers(&mut trace)?; // the final TraceStats packet
//! assert!(!trace.is_empty());
//! daemon.shutdown();
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Threads: one acceptor per socket, one reader per connection, one service thread that owns
//! all state and timers, one probes thread when a built-in data source runs (see the `daemon`
//! and `service` modules' docs).
#![deny(missing_docs)]
// One unsafe block: the built-in probes' `SmbArbiter` (see `builtin.rs`).
#![deny(unsafe_code)]

mod builtin;
mod client;
mod config;
mod daemon;
mod service;
mod wire;

pub use builtin::is_builtin as is_builtin_data_source;
pub use client::{Consumer, SessionEnd};
pub use config::{limits, DaemonConfig};
pub use daemon::{Daemon, DaemonHandle, DaemonStats};

//! The error type.

use std::fmt;

/// What can go wrong (import problems inside a trace are not errors: they are `stats` rows).
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The trace file could not be read.
    Io(std::io::Error),
    /// The input is not a Perfetto protobuf trace.
    NotATrace(String),
    /// A query (or building the database) failed.
    Sql(rusqlite::Error),
    /// A compressed trace inflates to more than the limit (in bytes) set in the import options.
    TooLarge(u64),
    /// The import would need more memory than the limit (the memory available on this machine,
    /// or `Options::memory_limit`): refused before it starts rather than ended by the
    /// out-of-memory killer.
    OutOfMemory {
        /// The trace's size in bytes (decompressed).
        trace_bytes: u64,
        /// The estimated peak memory of the import, in bytes.
        needed: u64,
        /// The limit, in bytes.
        limit: u64,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "cannot read the trace: {e}"),
            Error::NotATrace(why) => write!(f, "not a Perfetto trace: {why}"),
            Error::Sql(e) => write!(f, "{e}"),
            Error::TooLarge(limit) => write!(
                f,
                "the compressed trace inflates to more than {limit} bytes (the import limit)"
            ),
            Error::OutOfMemory {
                trace_bytes,
                needed,
                limit,
            } => write!(
                f,
                "the trace is too large for this machine: importing {:.1} MB of trace needs \
                 about {:.1} MB of memory, and the limit is {:.1} MB (the memory available: \
                 MemAvailable, or the cgroup's memory.max); free memory or import a smaller trace",
                *trace_bytes as f64 / 1e6,
                *needed as f64 / 1e6,
                *limit as f64 / 1e6
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            Error::Sql(e) => Some(e),
            Error::NotATrace(_) | Error::TooLarge(_) | Error::OutOfMemory { .. } => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Error::Sql(e)
    }
}

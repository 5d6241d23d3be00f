//! Starting and stopping the process's tracing: [`init`] (defaults from the environment),
//! [`start`] (a [`Config`]), [`shutdown`].
//!
//! The trace goes through a [`Backend`]:
//!
//! - **In-process**: the service is a thread of this process and the trace is written to a file
//!   (or kept in memory) at [`shutdown`], or at process exit when [`init`] started it.
//! - **System mode** ([`Config::producer_socket`]): a `tachyon traced` daemon owns the trace
//!   (see [`SystemSession`]). The process connects, registers the `track_event` data source and
//!   records while the daemon has a tracing session that wants it, into the shared memory the
//!   daemon hands out; the file is the consumer's (`tachyon record`). The daemon's config
//!   decides the categories and buffers; of the variables below only `TACHYON_SMB_SIZE` (the
//!   size asked for), `TACHYON_ON_FULL` and `TACHYON_CLOCK` apply. If the daemon is absent or
//!   goes away, tracing simply stops: connecting takes at most
//!   [`DAEMON_CONNECT_BUDGET`](crate::backend::DAEMON_CONNECT_BUDGET), no traced thread ever waits on the
//!   socket, and nothing panics.
//!
//! - **Live capture** ([`Config::listen`], `TACHYON_LISTEN`): the process listens for
//!   `tachyon capture` and streams the trace to it as it is recorded, one complete trace per
//!   capture (see [`CaptureServer`] and `docs/capture.md`).
//!
//! [`init`] picks the backend: `TACHYON_DISABLE=1` wins (nothing at all); else with
//! `TACHYON_PRODUCER_SOCK` set, system mode — and if no daemon answers there, one line on stderr
//! and no tracing; else, if the default producer socket (`tachyon_ipc::paths::producer_socket`)
//! exists, system mode when a daemon answers there, in-process otherwise (silently); else
//! in-process. [`start`] uses exactly the backend its [`Config`] names.
//!
//! # Environment variables read by [`init`] / [`Config::from_env`]
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `TACHYON_PRODUCER_SOCK` | system mode: the daemon's producer socket | in-process |
//! | `TACHYON_OUT` | trace file | `trace.pftrace` |
//! | `TACHYON_BUFFER_SIZE` | central buffer size (`64M`, `512K`, `1G`, bytes) | 32 MiB |
//! | `TACHYON_FILL_POLICY` | `ring_buffer` or `discard` | `ring_buffer` |
//! | `TACHYON_SMB_SIZE` | shared memory buffer size (system mode: asked of the daemon) | 4 MiB |
//! | `TACHYON_ON_FULL` | writers when the SMB is full: `drop`, `stall`, `stall_then_drop` | `stall_then_drop` |
//! | `TACHYON_CATEGORIES` | enabled category globs, comma-separated | everything |
//! | `TACHYON_DISABLED_CATEGORIES` | disabled category globs | none |
//! | `TACHYON_CLEAR_PERIOD_MS` | incremental-state clear period | none |
//! | `TACHYON_FLUSH_PERIOD_MS` | periodic flush | none |
//! | `TACHYON_STREAM` | `1`: stream into the file while tracing | off |
//! | `TACHYON_STREAM_PERIOD_MS` | with `TACHYON_STREAM`: write to the file this often (at least 100) | 5000 |
//! | `TACHYON_COMPRESS` | `1`: DEFLATE the trace (`compressed_packets`, as Perfetto's `compression_type: COMPRESSION_TYPE_DEFLATE`; cargo feature `deflate`, else an error naming it) | off |
//! | `TACHYON_PREFAULT` | `1`: map the whole central buffer at start, not page by page on first write (see [`Config::prefault_buffer`]) | off |
//! | `TACHYON_HELPER_SCHED` | `batch`: the drainer thread runs under `SCHED_BATCH`, so its wake-ups never preempt the traced thread (which then encodes more of its own events; see docs/data-path.md) | normal policy |
//! | `TACHYON_DISABLE` | `1`: [`init`] does nothing | off |
//! | `TACHYON_CLOCK` | `boottime`: no TSC (see [`clock`](crate::clock)) | TSC |
//! | `TACHYON_NO_CRASH_HANDLER` | `1`: no crash handler (see [`crash`](crate::crash)) | installed |
//! | `TACHYON_LISTEN` | live capture: listen for `tachyon capture` on `ADDR:PORT` (or `PORT`, loopback) | off |
//! | `TACHYON_CAPTURE_TOKEN` | live capture: the secret a capture must present | none |
//! | `TACHYON_ON_DEMAND` | `1`: live capture records only while a capture is attached | off |
//! | `TACHYON_WAIT_FOR_CAPTURE` | live capture: seconds to wait at start for a capture | no wait |
//! | `TACHYON_ANNOUNCE` | live capture: `1` or `ADDR:PORT`: announce the listener by UDP each second | off |
//! | `TACHYON_MEMORY` | with [`alloc::Tracked`](crate::alloc::Tracked) installed: `off`, `exact`, `sampled:BYTES` | `exact` |
//! | `TACHYON_MEMORY_CALLSTACK` | frames of native stack per recorded allocation (0: zones) | 32 sampled, 0 exact |
//! | `TACHYON_MEMORY_DUMP_MS` | a heap profile this often (and always one at the end) | at the end only |
//! | `TACHYON_CALLSTACK` | call-stack depth on every zone and instant (0–64) | 0 (off) |
//! | `TACHYON_SAMPLING_HZ` | CPU samples per second, with stacks (in-process) | 0 (off) |
//! | `TACHYON_SYMBOLIZE` | `0`: no symbolization at the end (feature `symbolize`) | on |
//! | `TACHYON_CPU_USAGE` | `1`: CPU usage plots every 100 ms ([`Config::cpu_usage`]) | off |
//!
//! Setting any of the live-capture variables selects the capture backend (see
//! [`Config::listen`]); it wins over system mode.
//!
//! A value that does not parse is an error naming the variable, never a silent default.

use std::io;
use std::path::PathBuf;
use std::sync::{Mutex, Once};
use std::time::Duration;

use tachyon_abi::FillPolicy;
#[cfg(feature = "in-process")]
use tachyon_service::{BufferSpec, Compression, DataSourceSpec, SessionConfig};

#[cfg(feature = "in-process")]
use crate::backend::PageSize;
#[cfg(feature = "capture")]
use crate::capture::{CaptureOptions, CaptureReport, CaptureServer};
#[cfg(feature = "in-process")]
use crate::session::{InProcessSession, SessionOptions};
#[cfg(feature = "system")]
use crate::system::{SystemOptions, SystemReport, SystemSession};
#[cfg(any(feature = "in-process", feature = "system"))]
use crate::track_event::global;
#[cfg(feature = "in-process")]
use crate::track_event::global::SessionHandle;
#[cfg(feature = "in-process")]
use crate::track_event::state::{self, Drain};
use crate::track_event::CategoryFilter;
#[cfg(feature = "in-process")]
use crate::writer::ArbiterConfig;
use crate::writer::{ArbiterStats, BufferExhaustedPolicy};

/// How a tracing session is set up.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the trace is written at stop (`None`: kept in memory, returned by [`shutdown`]).
    pub output: Option<PathBuf>,
    /// Central buffer size.
    pub buffer_size: usize,
    /// Ring buffer (keep the newest) or discard (keep the oldest).
    pub fill_policy: FillPolicy,
    /// Shared memory buffer size (what writers fill while the service copies out).
    pub smb_size: usize,
    /// What writers do when the shared memory buffer is full.
    pub on_full: BufferExhaustedPolicy,
    /// Which categories are recorded.
    pub categories: CategoryFilter,
    /// Clear incremental state this often (ring-buffer traces stay decodable after wrapping).
    pub clear_period: Option<Duration>,
    /// Ask writers to commit this often.
    pub flush_period: Option<Duration>,
    /// Stream into `output` while tracing (`write_into_file`).
    pub stream: bool,
    /// With [`stream`](Self::stream): how often the service writes to the file
    /// (`file_write_period_ms`; Perfetto's default 5 s, at least 100 ms).
    pub stream_period: Duration,
    /// Compress the trace (`compression_type: COMPRESSION_TYPE_DEFLATE`; in-process only: in
    /// system mode the daemon's trace config decides). Needs the cargo feature `deflate`:
    /// without it an in-process session asked to compress does not start (an error naming it).
    pub compress: bool,
    /// Map every page of the central buffer when the session starts (`TACHYON_PREFAULT=1`),
    /// so that the service thread takes no page fault on its first pass round the buffer (one
    /// per 4 KiB chunk otherwise, about a third of its CPU time then). Commits the buffer's
    /// whole memory at start; off by default, as Perfetto commits buffer pages lazily.
    /// In-process only (the daemon's buffers are its own).
    pub prefault_buffer: bool,
    /// Timestamps as deltas on the sequence-scoped incremental clock (1–3 bytes per packet);
    /// `false` writes absolute trace-clock timestamps.
    pub incremental_timestamps: bool,
    /// How long [`shutdown`] waits for other threads' writers to flush.
    pub stop_timeout: Duration,
    /// System mode: trace into the `tachyon traced` daemon listening on this producer socket
    /// (`TACHYON_PRODUCER_SOCK`) instead of in-process. The daemon's trace config then decides
    /// the buffers, categories and output; `smb_size` is the size asked for, and `on_full`,
    /// `incremental_timestamps` and `stop_timeout` still apply.
    pub producer_socket: Option<PathBuf>,
    /// Live capture (`TACHYON_LISTEN`): listen for `tachyon capture` on this address and stream
    /// the trace to it (see [`CaptureServer`]); `output` is then unused. The loopback address
    /// unless another is given explicitly; port [`tachyon_capture::protocol::DEFAULT_PORT`]
    /// (and the next ones when taken) by default, 0 for any free port (discovery reports it).
    pub listen: Option<std::net::SocketAddr>,
    /// Live capture: the shared secret a capture must present (`TACHYON_CAPTURE_TOKEN`).
    pub capture_token: Option<String>,
    /// Live capture: record only while a capture is attached, a complete trace per capture
    /// (`TACHYON_ON_DEMAND=1`).
    pub on_demand: bool,
    /// Live capture: wait this long at start for a capture to attach
    /// (`TACHYON_WAIT_FOR_CAPTURE=SECONDS`), so a short program is captured from its start.
    pub wait_for_capture: Option<Duration>,
    /// Live capture: announce the listener by UDP to this address once a second
    /// (`TACHYON_ANNOUNCE=1` for the broadcast address on UDP port 8110, or `ADDR:PORT`), for
    /// `tachyon capture --list --network` on other machines. Off by default.
    pub announce: Option<std::net::SocketAddr>,
    /// Memory profiling, when [`alloc::Tracked`](crate::alloc::Tracked) is the global
    /// allocator (in-process sessions).
    pub memory: crate::alloc::MemoryConfig,
    /// Frames of call stack on every zone and instant (`TACHYON_CALLSTACK`, at most 64; 0:
    /// only on events that ask with `callstack`). See [`callstack`](crate::callstack).
    pub callstack_depth: usize,
    /// CPU samples per second of CPU time per thread, with their call stacks
    /// (`TACHYON_SAMPLING_HZ`; 0: off). In-process sessions only. See
    /// [`sampling`](crate::sampling).
    pub sampling_hz: u32,
    /// With the cargo feature `symbolize`: when the session ends, resolve the call stacks it
    /// recorded (function, file, line) from this process's binaries and append the symbols to
    /// the trace (`TACHYON_SYMBOLIZE=0`: leave that to `tachyon symbolize`). On by default.
    pub symbolize: bool,
    /// Tracy's CPU usage plots: the process's and the whole system's CPU use, sampled from
    /// `/proc` every 100 ms by a `tachyon-cpu` thread (its own packet sequence) while the
    /// session runs (`TACHYON_CPU_USAGE`).
    pub cpu_usage: bool,
}

impl Default for Config {
    /// `trace.pftrace`, a 32 MiB ring buffer, a 4 MiB SMB, stall-then-drop, every category.
    fn default() -> Self {
        Config {
            output: Some(PathBuf::from("trace.pftrace")),
            buffer_size: 32 << 20,
            fill_policy: FillPolicy::RingBuffer,
            smb_size: 4 << 20,
            on_full: BufferExhaustedPolicy::default(),
            categories: CategoryFilter::all(),
            clear_period: None,
            flush_period: None,
            stream: false,
            stream_period: DEFAULT_STREAM_PERIOD,
            compress: false,
            prefault_buffer: false,
            incremental_timestamps: true,
            stop_timeout: Duration::from_millis(500),
            producer_socket: None,
            listen: None,
            capture_token: None,
            on_demand: false,
            wait_for_capture: None,
            announce: None,
            memory: crate::alloc::MemoryConfig::default(),
            callstack_depth: 0,
            sampling_hz: 0,
            symbolize: true,
            cpu_usage: false,
        }
    }
}

/// A bad setting (an environment variable that does not parse, an impossible size).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tachyon: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for io::Error {
    fn from(e: ConfigError) -> Self {
        io::Error::new(io::ErrorKind::InvalidInput, e)
    }
}

impl Config {
    /// The defaults with the trace kept in memory (for tests and tools that handle the bytes).
    pub fn in_memory() -> Self {
        Config {
            output: None,
            ..Config::default()
        }
    }

    /// The defaults, overridden by the `TACHYON_*` environment variables (module docs).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`from_env`](Self::from_env) over any variable source.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut c = Config::default();
        // Empty means unset, as for `tachyon_ipc::paths::producer_socket`.
        if let Some(v) = var(PRODUCER_SOCK_ENV).filter(|v| !v.is_empty()) {
            c.producer_socket = Some(PathBuf::from(v));
        }
        if let Some(v) = var("TACHYON_OUT") {
            if v.is_empty() {
                return Err(ConfigError("TACHYON_OUT is empty".into()));
            }
            c.output = Some(PathBuf::from(v));
        }
        if let Some(v) = var("TACHYON_BUFFER_SIZE") {
            c.buffer_size = parse_size("TACHYON_BUFFER_SIZE", &v)?;
        }
        if let Some(v) = var("TACHYON_SMB_SIZE") {
            c.smb_size = parse_size("TACHYON_SMB_SIZE", &v)?;
        }
        if let Some(v) = var("TACHYON_FILL_POLICY") {
            c.fill_policy = match v.to_ascii_lowercase().as_str() {
                "ring_buffer" | "ring" => FillPolicy::RingBuffer,
                "discard" => FillPolicy::Discard,
                _ => {
                    return Err(ConfigError(format!(
                        "TACHYON_FILL_POLICY={v:?}: expected ring_buffer or discard"
                    )))
                }
            };
        }
        if let Some(v) = var("TACHYON_ON_FULL") {
            c.on_full = match v.to_ascii_lowercase().as_str() {
                "drop" => BufferExhaustedPolicy::Drop,
                "stall" => BufferExhaustedPolicy::Stall {
                    timeout: crate::backend::DEFAULT_STALL_TIMEOUT,
                },
                "stall_then_drop" => BufferExhaustedPolicy::default(),
                _ => {
                    return Err(ConfigError(format!(
                        "TACHYON_ON_FULL={v:?}: expected drop, stall or stall_then_drop"
                    )))
                }
            };
        }
        let list = |name: &str| -> Vec<String> {
            var(name)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let enabled = list("TACHYON_CATEGORIES");
        let disabled = list("TACHYON_DISABLED_CATEGORIES");
        if !enabled.is_empty() || !disabled.is_empty() {
            let e: Vec<&str> = enabled.iter().map(String::as_str).collect();
            let mut d: Vec<&str> = disabled.iter().map(String::as_str).collect();
            // Naming enabled categories means "only these".
            if !e.is_empty() && d.is_empty() {
                d.push("*");
            }
            c.categories = CategoryFilter::new(&e, &d);
        }
        if let Some(v) = var("TACHYON_CLEAR_PERIOD_MS") {
            c.clear_period = Some(parse_ms("TACHYON_CLEAR_PERIOD_MS", &v)?);
        }
        if let Some(v) = var("TACHYON_FLUSH_PERIOD_MS") {
            c.flush_period = Some(parse_ms("TACHYON_FLUSH_PERIOD_MS", &v)?);
        }
        if let Some(v) = var("TACHYON_CALLSTACK") {
            c.callstack_depth = match v.trim().parse::<usize>() {
                Ok(d) if d <= crate::callstack::MAX_DEPTH => d,
                _ => {
                    return Err(ConfigError(format!(
                        "TACHYON_CALLSTACK={v:?}: expected a depth from 0 to {}",
                        crate::callstack::MAX_DEPTH
                    )))
                }
            };
        }
        if let Some(v) = var("TACHYON_SAMPLING_HZ") {
            c.sampling_hz = v.trim().parse().map_err(|_| {
                ConfigError(format!(
                    "TACHYON_SAMPLING_HZ={v:?}: expected samples per second (0: off)"
                ))
            })?;
        }
        if let Some(v) = var("TACHYON_SYMBOLIZE") {
            c.symbolize = parse_flag("TACHYON_SYMBOLIZE", &v)?;
        }
        if let Some(v) = var("TACHYON_CPU_USAGE") {
            c.cpu_usage = parse_flag("TACHYON_CPU_USAGE", &v)?;
        }
        if let Some(v) = var("TACHYON_STREAM") {
            c.stream = parse_flag("TACHYON_STREAM", &v)?;
        }
        if let Some(v) = var("TACHYON_STREAM_PERIOD_MS") {
            c.stream_period = parse_ms("TACHYON_STREAM_PERIOD_MS", &v)?;
        }
        if let Some(v) = var("TACHYON_MEMORY") {
            c.memory.mode = crate::alloc::MemoryMode::parse(&v).map_err(ConfigError)?;
        }
        if let Some(v) = var("TACHYON_MEMORY_CALLSTACK") {
            c.memory.callstack_depth =
                Some(crate::alloc::parse_stack_depth(&v).map_err(ConfigError)?);
        }
        if let Some(v) = var("TACHYON_MEMORY_DUMP_MS") {
            c.memory.dump_period = Some(parse_ms("TACHYON_MEMORY_DUMP_MS", &v)?);
        }
        if let Some(v) = var("TACHYON_COMPRESS") {
            c.compress = parse_flag("TACHYON_COMPRESS", &v)?;
        }
        if let Some(v) = var("TACHYON_PREFAULT") {
            c.prefault_buffer = parse_flag("TACHYON_PREFAULT", &v)?;
        }
        c.read_capture_vars(&var)?;
        Ok(c)
    }

    #[cfg(feature = "in-process")]
    fn session_config(&self) -> SessionConfig {
        SessionConfig {
            buffers: vec![BufferSpec {
                size_bytes: self.buffer_size,
                policy: self.fill_policy,
            }],
            data_sources: vec![DataSourceSpec::new("track_event", 0)],
            flush_period: self.flush_period,
            flush_timeout: self.stop_timeout,
            write_into_file: self.stream && self.output.is_some(),
            file_write_period: self
                .stream_period
                .max(tachyon_service::MIN_FILE_WRITE_PERIOD),
            output_path: self.output.clone(),
            incremental_state_clear_period: self.clear_period,
            compression: if self.compress {
                Compression::Deflate
            } else {
                Compression::None
            },
            prefault_buffers: self.prefault_buffer,
            ..SessionConfig::default()
        }
    }
}

/// How often a streamed trace is written by default: Perfetto's `file_write_period_ms` default
/// (the service's `DEFAULT_FILE_WRITE_PERIOD`, named here so that `Config` needs no service).
const DEFAULT_STREAM_PERIOD: Duration = Duration::from_secs(5);

/// The variable naming the daemon's producer socket (system mode).
#[cfg(feature = "system")]
const PRODUCER_SOCK_ENV: &str = tachyon_ipc::paths::PRODUCER_SOCK_ENV;
/// The variable naming the daemon's producer socket: read without the `system` feature too, so
/// that a program built without it says why it does not trace into the daemon.
#[cfg(not(feature = "system"))]
const PRODUCER_SOCK_ENV: &str = "TACHYON_PRODUCER_SOCK";

/// The error for a backend this build of the crate leaves out (its cargo `feature`).
#[cfg(any(
    not(feature = "system"),
    not(feature = "capture"),
    not(feature = "in-process"),
    not(feature = "deflate")
))]
fn not_built(what: &str, feature: &str) -> String {
    format!(
        "{what} needs the `tachyon` crate's cargo feature `{feature}`, which this program was built without"
    )
}

#[cfg(not(feature = "capture"))]
impl Config {
    /// Without the `capture` feature, a live-capture variable is an error naming the feature
    /// (a program that was asked to stream its trace says why it cannot).
    fn read_capture_vars(
        &mut self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        for name in [
            "TACHYON_LISTEN",
            "TACHYON_CAPTURE_TOKEN",
            "TACHYON_WAIT_FOR_CAPTURE",
        ] {
            if var(name).is_some_and(|v| !v.trim().is_empty()) {
                return Err(ConfigError(not_built(
                    &format!("{name} (live capture)"),
                    "capture",
                )));
            }
        }
        if let Some(v) = var("TACHYON_ON_DEMAND") {
            if parse_flag("TACHYON_ON_DEMAND", &v)? {
                return Err(ConfigError(not_built(
                    "TACHYON_ON_DEMAND (live capture)",
                    "capture",
                )));
            }
        }
        // `TACHYON_ANNOUNCE=0` asks for nothing; anything else asks for live capture.
        if let Some(v) = var("TACHYON_ANNOUNCE").filter(|v| !v.trim().is_empty()) {
            if parse_flag("TACHYON_ANNOUNCE", v.trim()) != Ok(false) {
                return Err(ConfigError(not_built(
                    "TACHYON_ANNOUNCE (live capture)",
                    "capture",
                )));
            }
        }
        Ok(())
    }
}

#[cfg(feature = "capture")]
impl Config {
    /// The live-capture variables (module docs). Any of them selects the capture backend.
    fn read_capture_vars(
        &mut self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        use std::net::{IpAddr, Ipv4Addr, SocketAddr};
        let loopback = |port| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        if let Some(v) = var("TACHYON_LISTEN").filter(|v| !v.trim().is_empty()) {
            let v = v.trim();
            let addr = if let Ok(a) = v.parse::<SocketAddr>() {
                a
            } else if let Ok(p) = v.parse::<u16>() {
                loopback(p)
            } else if parse_flag("TACHYON_LISTEN", v) == Ok(true) {
                loopback(tachyon_capture::protocol::DEFAULT_PORT)
            } else {
                return Err(ConfigError(format!(
                    "TACHYON_LISTEN={v:?}: expected ADDR:PORT (e.g. 127.0.0.1:8110), a port, or 1"
                )));
            };
            self.listen = Some(addr);
        }
        if let Some(v) = var("TACHYON_CAPTURE_TOKEN").filter(|v| !v.is_empty()) {
            if v.len() > tachyon_capture::protocol::MAX_TOKEN {
                return Err(ConfigError(format!(
                    "TACHYON_CAPTURE_TOKEN is longer than {} bytes",
                    tachyon_capture::protocol::MAX_TOKEN
                )));
            }
            self.capture_token = Some(v);
        }
        if let Some(v) = var("TACHYON_ON_DEMAND") {
            self.on_demand = parse_flag("TACHYON_ON_DEMAND", &v)?;
        }
        if let Some(v) = var("TACHYON_WAIT_FOR_CAPTURE") {
            let secs = v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 86_400.0)
                .ok_or_else(|| {
                    ConfigError(format!(
                        "TACHYON_WAIT_FOR_CAPTURE={v:?}: expected seconds (0 to 86400)"
                    ))
                })?;
            self.wait_for_capture = Some(Duration::from_secs_f64(secs));
        }
        if let Some(v) = var("TACHYON_ANNOUNCE").filter(|v| !v.trim().is_empty()) {
            let v = v.trim();
            self.announce = if let Ok(a) = v.parse::<SocketAddr>() {
                Some(a)
            } else {
                match parse_flag("TACHYON_ANNOUNCE", v) {
                    Ok(true) => Some(SocketAddr::new(
                        IpAddr::V4(Ipv4Addr::BROADCAST),
                        tachyon_capture::announce::ANNOUNCE_PORT,
                    )),
                    Ok(false) => None,
                    Err(_) => {
                        return Err(ConfigError(format!(
                            "TACHYON_ANNOUNCE={v:?}: expected 1, 0 or ADDR:PORT (e.g. 192.168.1.255:8110)"
                        )))
                    }
                }
            };
        }
        let wants_capture = self.on_demand
            || self.wait_for_capture.is_some()
            || self.capture_token.is_some()
            || self.announce.is_some();
        if self.listen.is_none() && wants_capture {
            self.listen = Some(loopback(tachyon_capture::protocol::DEFAULT_PORT));
        }
        Ok(())
    }

    fn capture_options(&self, listen: std::net::SocketAddr) -> CaptureOptions {
        CaptureOptions {
            listen,
            token: self.capture_token.as_ref().map(|t| t.as_bytes().to_vec()),
            on_demand: self.on_demand,
            buffer_size: self.buffer_size,
            smb_size: self.smb_size,
            on_full: self.on_full,
            categories: self.categories.clone(),
            clear_period: self.clear_period,
            incremental_timestamps: self.incremental_timestamps,
            stop_timeout: self.stop_timeout,
            announce: self.announce,
        }
    }
}

fn parse_flag(name: &str, v: &str) -> Result<bool, ConfigError> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(ConfigError(format!("{name}={v:?}: expected 1 or 0"))),
    }
}

fn parse_ms(name: &str, v: &str) -> Result<Duration, ConfigError> {
    v.trim()
        .parse::<u64>()
        .ok()
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| ConfigError(format!("{name}={v:?}: expected milliseconds > 0")))
}

/// `123`, `64K`, `32M`, `1G` (optionally with `iB`/`B`), binary units.
pub(crate) fn parse_size(name: &str, v: &str) -> Result<usize, ConfigError> {
    let s = v.trim();
    let lower = s.to_ascii_lowercase();
    let digits = lower.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &lower[digits.len()..];
    let mult: u64 = match unit {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => 0,
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n > 0 && n <= (16u64 << 30))
        .map(|n| n as usize)
        .ok_or_else(|| {
            ConfigError(format!(
                "{name}={v:?}: expected a size like 65536, 512K, 32M or 1G (at most 16G)"
            ))
        })
}

/// Where a session's trace goes.
#[derive(Debug)]
pub enum Backend {
    /// The service runs as a thread of this process (cargo feature `in-process`).
    #[cfg(feature = "in-process")]
    InProcess(InProcessSession),
    /// A `tachyon traced` daemon owns the trace; this process writes into its shared memory
    /// (system mode; cargo feature `system`).
    #[cfg(feature = "system")]
    System(SystemSession),
    /// Live capture: the trace streams to `tachyon capture` over TCP ([`Config::listen`];
    /// cargo feature `capture`).
    #[cfg(feature = "capture")]
    Capture(CaptureServer),
}

impl Backend {
    fn start(config: &Config) -> io::Result<Backend> {
        #[cfg(feature = "capture")]
        if let Some(listen) = config.listen {
            return CaptureServer::start(config.capture_options(listen)).map(Backend::Capture);
        }
        #[cfg(not(feature = "capture"))]
        if config.listen.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                not_built("live capture (Config::listen)", "capture"),
            ));
        }
        #[cfg(not(feature = "system"))]
        if config.producer_socket.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                not_built("system mode (Config::producer_socket)", "system"),
            ));
        }
        #[cfg(feature = "system")]
        if let Some(socket) = &config.producer_socket {
            let options = SystemOptions {
                socket: socket.clone(),
                smb_size_hint: config.smb_size,
                on_full: config.on_full,
                incremental_timestamps: config.incremental_timestamps,
                stop_timeout: config.stop_timeout,
                producer_name: global::process_name(),
            };
            return SystemSession::connect(options).map(Backend::System);
        }
        #[cfg(not(feature = "in-process"))]
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            not_built(
                "in-process tracing (a config without a producer socket)",
                "in-process",
            ),
        ));
        #[cfg(all(feature = "in-process", not(feature = "deflate")))]
        if config.compress {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                not_built(
                    "a compressed trace (TACHYON_COMPRESS, Config::compress)",
                    "deflate",
                ),
            ));
        }
        #[cfg(feature = "in-process")]
        let options = SessionOptions {
            smb_size: config.smb_size,
            page_size: PageSize::Kib4,
            arbiter: ArbiterConfig {
                buffer_exhausted_policy: config.on_full,
                ..ArbiterConfig::default()
            },
        };
        #[cfg(feature = "in-process")]
        {
            let session = InProcessSession::start_with_clear_hook(
                config.session_config(),
                options,
                Box::new(global::clear_incremental_state),
            )?;
            // The drainer copies what it commits into the central buffer itself.
            if let Some(pump) = session.commit_pump() {
                state::set_after_pass(Some(std::sync::Arc::new(move || {
                    pump.apply_waiting();
                })));
            }
            Ok(Backend::InProcess(session))
        }
    }
}

// Without `in-process`, `output` and `symbolize` have no session to act on.
#[cfg_attr(not(feature = "in-process"), allow(dead_code))]
struct Active {
    backend: Backend,
    output: Option<PathBuf>,
    /// Started by [`init`]: write the trace at process exit.
    at_exit: bool,
    /// Symbolize the call stacks when the session ends ([`Config::symbolize`]).
    symbolize: bool,
}

static ACTIVE: Mutex<Option<Active>> = Mutex::new(None);

fn active() -> std::sync::MutexGuard<'static, Option<Active>> {
    ACTIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// What [`shutdown`] found.
#[derive(Debug)]
pub struct Report {
    /// The trace file, if the session wrote one.
    pub path: Option<PathBuf>,
    /// The trace bytes, when kept in memory ([`Config::in_memory`]).
    pub trace: Vec<u8>,
    /// Size of the trace written.
    pub bytes: u64,
    /// The writers' counters: chunks committed, packets dropped when the shared memory buffer
    /// was full, stalls.
    pub writers: ArbiterStats,
    /// Threads whose writer had not flushed when the session stopped (idle threads): the
    /// packets in their last chunk are not in the trace (in system mode the daemon scrapes
    /// them).
    pub writers_still_active: usize,
    /// System mode: what the connection to the daemon did (`path` is `None` and `bytes` 0 then:
    /// the trace is the daemon's and its consumer's). Cargo feature `system`.
    #[cfg(feature = "system")]
    pub system: Option<SystemReport>,
    /// Live capture: what was sent to captures (`path` is `None` then). Cargo feature `capture`.
    #[cfg(feature = "capture")]
    pub capture: Option<CaptureReport>,
    /// What memory tracking saw (`None` unless [`alloc::Tracked`](crate::alloc::Tracked) is
    /// the global allocator and [`Config::memory`] was on).
    pub memory: Option<crate::alloc::MemorySummary>,
}

impl std::fmt::Display for Report {
    /// One line: `wrote FILE (N bytes, D packets dropped)`, or what went to the daemon.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dropped = self.writers.packets_dropped;
        #[cfg(feature = "capture")]
        if let Some(c) = &self.capture {
            return write!(
                f,
                "sent {} packets ({} bytes, {} on the wire) to {} capture(s), {dropped} packets dropped",
                c.records_sent, c.bytes_sent, c.wire_bytes, c.captures
            );
        }
        #[cfg(feature = "system")]
        if let Some(s) = &self.system {
            write!(
                    f,
                    "traced into the daemon at {} ({} tracing session(s), {} chunks committed, {dropped} packets dropped",
                    s.socket.display(),
                    s.data_sources_started,
                    self.writers.chunks_committed,
                )?;
            if s.daemon_lost {
                write!(
                    f,
                    "; the daemon went away and tracing stopped then, {} commits lost",
                    s.commits_dropped
                )?;
            }
            return f.write_str(")");
        }
        match &self.path {
            Some(p) => write!(
                f,
                "wrote {} ({} bytes, {dropped} packets dropped)",
                p.display(),
                self.bytes
            ),
            None => write!(
                f,
                "kept the trace in memory ({} bytes, {dropped} packets dropped)",
                self.bytes
            ),
        }
    }
}

/// Starts tracing with [`Config::from_env`]: into a `tachyon traced` daemon when
/// `TACHYON_PRODUCER_SOCK` is set or the default producer socket has one listening, else
/// in-process with the trace written to `TACHYON_OUT` (default `trace.pftrace`) at
/// [`shutdown`] or when the process exits (module docs). `TACHYON_DISABLE=1` makes it do
/// nothing. An error if a session is already running or a variable does not parse; a daemon
/// that does not answer is not an error (tracing is off, and with `TACHYON_PRODUCER_SOCK` set a
/// line on stderr says why).
pub fn init() -> io::Result<()> {
    if std::env::var("TACHYON_DISABLE").is_ok_and(|v| parse_flag("TACHYON_DISABLE", &v) == Ok(true))
    {
        return Ok(());
    }
    let config = Config::from_env()?;
    if config.listen.is_some() {
        return start_inner(config, true);
    }
    if let Some(socket) = config.producer_socket.clone() {
        return match start_inner(config, true) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                eprintln!(
                    "tachyon: no tracing: cannot trace into the daemon at {} ({PRODUCER_SOCK_ENV}): {e}",
                    socket.display(),
                );
                Ok(())
            }
            other => other,
        };
    }
    #[cfg(feature = "system")]
    let default = tachyon_ipc::paths::producer_socket();
    #[cfg(feature = "system")]
    if is_socket(&default) {
        let system = Config {
            producer_socket: Some(default),
            ..config.clone()
        };
        match start_inner(system, true) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {}
            other => return other,
        }
    }
    #[cfg(feature = "in-process")]
    return start_inner(config, true);
    // Without the in-process backend a program traces only into a daemon or to a capture:
    // with neither asked for, it runs untraced.
    #[cfg(not(feature = "in-process"))]
    {
        if std::env::var_os("TACHYON_OUT").is_some() {
            eprintln!(
                "tachyon: no tracing: TACHYON_OUT asks for {}",
                not_built("in-process tracing", "in-process")
            );
        }
        drop(config);
        Ok(())
    }
}

#[cfg(feature = "system")]
fn is_socket(path: &std::path::Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// Starts tracing with `config` (no process-exit hook: call [`shutdown`]).
pub fn start(config: Config) -> io::Result<()> {
    start_inner(config, false)
}

// Without the `system` and `capture` features the in-process backend is the only one.
#[allow(irrefutable_let_patterns)]
fn start_inner(config: Config, at_exit: bool) -> io::Result<()> {
    let mut slot = active();
    if slot.is_some() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "tachyon: a tracing session is already running",
        ));
    }
    // Calibrate the clock before the first event pays for it.
    let _ = crate::clock::clock();
    let backend = Backend::start(&config)?;
    // In system mode the daemon starts and stops sessions (the command thread installs them).
    #[cfg(feature = "in-process")]
    if let Backend::InProcess(session) = &backend {
        let handle = SessionHandle {
            session: global::next_session_number(),
            arbiter: session.arbiter().clone(),
            target_buffer: 0,
            incremental_timestamps: config.incremental_timestamps,
        };
        global::install(handle, config.categories.clone());
        crate::alloc::start_session(&config.memory);
        crate::callstack::set_default_depth(config.callstack_depth);
        if config.sampling_hz != 0 {
            if let Err(e) = crate::sampling::start(config.sampling_hz) {
                eprintln!("tachyon: {e}; tracing goes on without CPU samples");
            }
        }
    }
    #[cfg(feature = "capture")]
    let waiter = match &backend {
        Backend::Capture(server) => Some(server.waiter()),
        _ => None,
    };
    // The CPU usage plots and the program's information (`cpu_usage.rs`).
    crate::cpu_usage::session_started(config.cpu_usage);
    *slot = Some(Active {
        backend,
        output: config.output.clone(),
        at_exit,
        symbolize: config.symbolize,
    });
    if at_exit {
        register_at_exit();
    }
    // The crash handler saves sessions that have somewhere to save to (a live capture's trace
    // is the capture's).
    if config.listen.is_none() && (config.output.is_some() || config.producer_socket.is_some()) {
        crate::crash::arm(config.stop_timeout);
    }
    drop(slot);
    #[cfg(feature = "capture")]
    if let (Some(w), Some(wait)) = (waiter, config.wait_for_capture) {
        eprintln!(
            "tachyon: waiting up to {:.1} s for a capture on {} (tachyon capture -a {} -p {} -o FILE)",
            wait.as_secs_f64(),
            w.addr(),
            w.addr().ip(),
            w.addr().port()
        );
        if !w.wait(wait) {
            eprintln!("tachyon: no capture attached; running on");
        }
    }
    Ok(())
}

/// The live-capture backend's waiter, when that backend runs.
#[cfg(feature = "capture")]
pub(crate) fn capture_waiter() -> Option<crate::capture::CaptureWaiter> {
    match active().as_ref().map(|a| &a.backend) {
        Some(Backend::Capture(server)) => Some(server.waiter()),
        _ => None,
    }
}

/// Whether a session is running.
pub fn is_active() -> bool {
    active().is_some()
}

/// Stops tracing: nothing is recorded from now on, this thread's writer flushes, other
/// threads' writers flush at their next event or when they exit (waiting up to
/// [`Config::stop_timeout`]), then every callsite reads disabled and the trace is written.
/// In system mode the commits still queued are sent and the connection to the daemon is
/// closed (the daemon writes the trace; the report says what was sent). `Ok(None)` if no
/// session was running.
// Without the `system` and `capture` features the in-process backend is the only one.
#[allow(clippy::infallible_destructuring_match)]
pub fn shutdown() -> io::Result<Option<Report>> {
    // Held until the end: a session started while this one drains would otherwise have its
    // callsites disabled below.
    let mut slot = active();
    let Some(active) = slot.take() else {
        return Ok(None);
    };
    crate::crash::disarm();
    match active.backend {
        #[cfg(feature = "in-process")]
        Backend::InProcess(session) => {
            stop_in_process(session, active.output, active.symbolize, slot)
        }
        #[cfg(feature = "system")]
        Backend::System(system) => {
            let stop = system.stop();
            drop(slot);
            Ok(Some(Report {
                path: None,
                trace: Vec::new(),
                bytes: 0,
                writers: stop.writers,
                writers_still_active: stop.writers_still_active,
                system: Some(stop.report),
                #[cfg(feature = "capture")]
                capture: None,
                memory: None,
            }))
        }
        #[cfg(feature = "capture")]
        Backend::Capture(server) => {
            let stop = server.stop();
            drop(slot);
            if stop.report.never_captured {
                eprintln!("tachyon: no capture attached while the program ran: its trace was not sent anywhere");
            }
            if stop.report.exit_send_timed_out {
                eprintln!(
                    "tachyon: the capture did not take the rest of the trace within {} s; it was cut off",
                    crate::capture::EXIT_SEND_BUDGET.as_secs()
                );
            }
            Ok(Some(Report {
                path: None,
                trace: Vec::new(),
                bytes: stop.report.bytes_sent,
                writers: stop.writers,
                writers_still_active: stop.writers_still_active,
                #[cfg(feature = "system")]
                system: None,
                capture: Some(stop.report),
                memory: None,
            }))
        }
    }
}

/// The end of [`shutdown`] for an in-process session (`slot` still held).
#[cfg(feature = "in-process")]
fn stop_in_process(
    session: InProcessSession,
    output: Option<PathBuf>,
    symbolize: bool,
    slot: std::sync::MutexGuard<'static, Option<Active>>,
) -> io::Result<Option<Report>> {
    // The session ends first and the callsites are disabled only once it has stopped: a thread
    // still tracing must reach its state (through an enabled callsite, which takes the slow
    // path once in an ended session) to drop, and so flush, its writer. Disabled callsites
    // would leave it holding the writer, and the stop would wait out its timeout.
    // Events still queued on threads go to the buffer first. Then the writers of threads that
    // are not tracing right now encode what they queued meanwhile (into this session's writer:
    // `ThreadState::drain_queue`), flush and drop, so the stop does not wait for their next event. A
    // thread busy with an event then drops its writer at its next one, as before the queues.
    // Memory tracking writes its last counters and heap profile into the session first.
    let memory = crate::alloc::stop_session();
    // The sampler writes its last samples while the session still takes them.
    let _ = crate::sampling::stop();
    crate::callstack::set_default_depth(0);
    state::drain_all(Drain::FlushAll);
    global::end_session();
    state::release_thread_writer();
    state::drain_all(Drain::Release);
    state::set_after_pass(None);
    let stop = session.stop();
    global::disable_callsites();
    drop(slot);
    let mut stop = stop?;
    if symbolize {
        crate::callstack::symbolize_at_end(output.as_deref(), &mut stop.trace);
    }
    let bytes = match &output {
        Some(p) => std::fs::metadata(p).map(|m| m.len()).unwrap_or(0),
        None => stop.trace.len() as u64,
    };
    Ok(Some(Report {
        path: output,
        trace: stop.trace,
        bytes,
        writers: stop.arbiter,
        writers_still_active: stop.writers_still_active,
        #[cfg(feature = "system")]
        system: None,
        #[cfg(feature = "capture")]
        capture: None,
        memory,
    }))
}

fn register_at_exit() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        extern "C" {
            fn atexit(cb: extern "C" fn()) -> i32;
        }
        // SAFETY: `at_exit` is a plain `extern "C" fn` that lives for the whole program and
        // never unwinds (it catches panics).
        unsafe {
            atexit(at_exit);
        }
    });
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let started_by_init = active().as_ref().is_some_and(|a| a.at_exit);
        if !started_by_init {
            return;
        }
        match shutdown() {
            Ok(Some(r)) => {
                if let Some(p) = &r.path {
                    eprintln!(
                        "tachyon: trace written to {} ({} bytes)",
                        p.display(),
                        r.bytes
                    );
                }
            }
            Ok(None) => {}
            Err(e) => eprintln!("tachyon: writing the trace failed: {e}"),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_or_name_the_variable() {
        assert_eq!(parse_size("X", "65536"), Ok(65536));
        assert_eq!(parse_size("X", "64K"), Ok(64 << 10));
        assert_eq!(parse_size("X", "32MiB"), Ok(32 << 20));
        assert_eq!(parse_size("X", "1g"), Ok(1 << 30));
        let e = parse_size("TACHYON_BUFFER_SIZE", "lots").unwrap_err();
        assert!(e.0.contains("TACHYON_BUFFER_SIZE"), "{e}");
        assert!(parse_size("X", "0").is_err());
        assert!(parse_size("X", "99999999999G").is_err());
    }

    #[test]
    fn env_overrides_defaults_and_rejects_garbage() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c = Config::from_vars(vars(&[
            ("TACHYON_OUT", "x.pftrace"),
            ("TACHYON_BUFFER_SIZE", "8M"),
            ("TACHYON_FILL_POLICY", "discard"),
            ("TACHYON_CATEGORIES", "net,io*"),
            ("TACHYON_CLEAR_PERIOD_MS", "250"),
            ("TACHYON_STREAM_PERIOD_MS", "100"),
            ("TACHYON_PRODUCER_SOCK", "/run/t.sock"),
            ("TACHYON_PREFAULT", "1"),
        ]))
        .unwrap();
        assert_eq!(c.stream_period, Duration::from_millis(100));
        assert!(c.prefault_buffer && c.session_config().prefault_buffers);
        assert!(!Config::default().session_config().prefault_buffers);
        assert_eq!(
            Config::default().stream_period,
            tachyon_service::DEFAULT_FILE_WRITE_PERIOD
        );
        assert_eq!(c.producer_socket, Some(PathBuf::from("/run/t.sock")));
        let unset = Config::from_vars(vars(&[("TACHYON_PRODUCER_SOCK", "")])).unwrap();
        assert_eq!(unset.producer_socket, None);
        assert_eq!(c.output, Some(PathBuf::from("x.pftrace")));
        assert_eq!(c.buffer_size, 8 << 20);
        assert_eq!(c.fill_policy, FillPolicy::Discard);
        assert_eq!(c.clear_period, Some(Duration::from_millis(250)));
        assert!(c.categories.is_enabled(Some("io.disk"), &[]));
        assert!(!c.categories.is_enabled(Some("gpu"), &[]));
        let e = Config::from_vars(vars(&[("TACHYON_FILL_POLICY", "circular")])).unwrap_err();
        assert!(e.0.contains("TACHYON_FILL_POLICY"), "{e}");
        let e = Config::from_vars(vars(&[("TACHYON_CLEAR_PERIOD_MS", "-1")])).unwrap_err();
        assert!(e.0.contains("TACHYON_CLEAR_PERIOD_MS"), "{e}");
    }

    #[cfg(not(feature = "capture"))]
    #[test]
    fn capture_variables_name_the_missing_feature() {
        for (k, v) in [
            ("TACHYON_LISTEN", "9000"),
            ("TACHYON_CAPTURE_TOKEN", "t"),
            ("TACHYON_WAIT_FOR_CAPTURE", "1"),
            ("TACHYON_ON_DEMAND", "1"),
        ] {
            let e = Config::from_vars(|n| (n == k).then(|| v.to_string())).unwrap_err();
            assert!(e.0.contains(k) && e.0.contains("`capture`"), "{e}");
        }
        let c = Config::from_vars(|n| (n == "TACHYON_ON_DEMAND").then(|| "0".to_string()));
        assert_eq!(c.unwrap().listen, None);
    }

    #[cfg(not(feature = "system"))]
    #[test]
    fn a_producer_socket_names_the_missing_feature() {
        let config = Config {
            producer_socket: Some(PathBuf::from("/nonexistent/tachyon.sock")),
            ..Config::in_memory()
        };
        let e = start(config).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("`system`"), "{e}");
        assert!(!is_active());
    }

    #[cfg(feature = "capture")]
    #[test]
    fn capture_variables_parse_or_name_the_variable() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c = Config::from_vars(vars(&[("TACHYON_LISTEN", "0.0.0.0:9000")])).unwrap();
        assert_eq!(c.listen, Some("0.0.0.0:9000".parse().unwrap()));
        assert!(!c.on_demand);
        let c = Config::from_vars(vars(&[("TACHYON_LISTEN", "9001")])).unwrap();
        assert_eq!(c.listen, Some("127.0.0.1:9001".parse().unwrap()));
        // On-demand alone listens on loopback at the default port.
        let c = Config::from_vars(vars(&[
            ("TACHYON_ON_DEMAND", "1"),
            ("TACHYON_WAIT_FOR_CAPTURE", "2.5"),
            ("TACHYON_CAPTURE_TOKEN", "t"),
        ]))
        .unwrap();
        assert_eq!(
            c.listen.unwrap().port(),
            tachyon_capture::protocol::DEFAULT_PORT
        );
        assert!(c.listen.unwrap().ip().is_loopback());
        assert!(c.on_demand);
        assert_eq!(c.wait_for_capture, Some(Duration::from_millis(2500)));
        assert_eq!(c.capture_token.as_deref(), Some("t"));
        for (k, v) in [
            ("TACHYON_LISTEN", "somewhere"),
            ("TACHYON_ON_DEMAND", "maybe"),
            ("TACHYON_WAIT_FOR_CAPTURE", "-1"),
            ("TACHYON_ANNOUNCE", "everyone"),
        ] {
            let e = Config::from_vars(|n: &str| (n == k).then(|| v.to_string())).unwrap_err();
            assert!(e.0.contains(k), "{e}");
        }
        assert_eq!(Config::from_vars(vars(&[])).unwrap().listen, None);
        // Announcing is opt-in; it implies listening (on loopback unless told otherwise).
        let c = Config::from_vars(vars(&[("TACHYON_ANNOUNCE", "1")])).unwrap();
        assert_eq!(c.announce, Some("255.255.255.255:8110".parse().unwrap()));
        assert!(c.listen.unwrap().ip().is_loopback());
        let c = Config::from_vars(vars(&[("TACHYON_ANNOUNCE", "10.0.0.255:9999")])).unwrap();
        assert_eq!(c.announce, Some("10.0.0.255:9999".parse().unwrap()));
        let c = Config::from_vars(vars(&[("TACHYON_ANNOUNCE", "0")])).unwrap();
        assert_eq!((c.announce, c.listen), (None, None));
        assert_eq!(Config::from_vars(vars(&[])).unwrap().announce, None);
    }

    /// Without the `deflate` feature a compressed trace is refused, naming the feature (before
    /// anything starts).
    #[cfg(all(feature = "in-process", not(feature = "deflate")))]
    #[test]
    fn compression_without_the_deflate_feature_is_refused() {
        let config = Config {
            compress: true,
            ..Config::in_memory()
        };
        let e = Backend::start(&config).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("`deflate`"), "{e}");
    }
}

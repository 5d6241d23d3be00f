//! A tracing session: its configuration (from a Perfetto `TraceConfig`), its central buffers,
//! the producers writing into them, and the output file.
//!
//! [`ServiceCore`] is the synchronous heart: commits and scrapes go in, `Trace.packet` records
//! come out (to memory until the end, or streamed to the file every `file_write_period_ms` with
//! `write_into_file`), and every trace ends with a `TraceStats` packet whose `BufferStats` carry
//! Perfetto's field numbers, so Perfetto's trace processor fills `traced_buf_*` stats from it.
//! The in-process service thread ([`crate::InProcessService`]) and, later, the daemon drive it.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

use protozero::ProtoDecoder;
use tachyon_abi::{CommitRequest, ServiceView};
use tachyon_protos::{trace_config, trace_stats, Trace, TraceConfig, TraceConfigView, TraceStats};

use crate::commit::{apply_commit, scrape_with, CommitStats, ProducerState};
use crate::fast_hash::IdMap;
use crate::readout::{PacketWriter, ProducerIdentity, SERVICE_SEQUENCE_ID};
use crate::trace_buffer::{FillPolicy, ProducerId, TraceBuffer, WriterId};

/// Perfetto's default flush timeout (`kDefaultFlushTimeoutMs`).
pub const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_millis(5000);
/// Perfetto's default `data_source_stop_timeout_ms` (`kDataSourceStopTimeoutMs`).
pub const DEFAULT_DATA_SOURCE_STOP_TIMEOUT: Duration = Duration::from_millis(5000);
/// Perfetto's default `file_write_period_ms`.
pub const DEFAULT_FILE_WRITE_PERIOD: Duration = Duration::from_millis(5000);
/// The shortest `file_write_period_ms` accepted (Perfetto clamps to 100 ms).
pub const MIN_FILE_WRITE_PERIOD: Duration = Duration::from_millis(100);

/// One central buffer's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferSpec {
    /// Size in bytes.
    pub size_bytes: usize,
    /// What happens when it is full.
    pub policy: FillPolicy,
}

/// A data source the session enables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataSourceSpec {
    /// Its name, e.g. `track_event`.
    pub name: String,
    /// The buffer its writers target.
    pub target_buffer: u16,
    /// The encoded `DataSourceConfig`, for the data source to read its own settings.
    pub config: Vec<u8>,
    /// Which producers run it (`producer_name_filter`, `producer_name_regex_filter`).
    pub producer_filter: ProducerFilter,
}

impl DataSourceSpec {
    /// A data source with no producer filter.
    pub fn new(name: impl Into<String>, target_buffer: u16) -> Self {
        DataSourceSpec {
            name: name.into(),
            target_buffer,
            config: Vec::new(),
            producer_filter: ProducerFilter::default(),
        }
    }
}

/// A data source's `producer_name_filter` (exact names) and `producer_name_regex_filter`
/// (patterns, compiled once when the config is read, matched against the whole name as
/// Perfetto's `std::regex_match`). Either list may match; both empty accept every producer.
///
/// Patterns need the `producer-regex` feature (on by default; the daemon has it). Without it a
/// config with patterns is refused with an error saying so, never matched loosely.
#[derive(Clone, Debug, Default)]
pub struct ProducerFilter {
    names: Vec<String>,
    #[cfg(feature = "producer-regex")]
    patterns: Vec<regex::Regex>,
}

impl ProducerFilter {
    /// A filter from the config's lists; an error names the pattern that does not compile.
    #[cfg(feature = "producer-regex")]
    pub fn new(names: Vec<String>, patterns: &[&str]) -> Result<Self, String> {
        let patterns = patterns
            .iter()
            .map(|p| {
                regex::RegexBuilder::new(&format!("^(?:{p})$"))
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| format!("producer_name_regex_filter {p:?}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(ProducerFilter { names, patterns })
    }

    /// A filter from the config's lists; patterns need the `producer-regex` feature.
    #[cfg(not(feature = "producer-regex"))]
    pub fn new(names: Vec<String>, patterns: &[&str]) -> Result<Self, String> {
        match patterns.first() {
            Some(p) => Err(format!(
                "producer_name_regex_filter {p:?}: this build has no regex engine (tachyon-service's \
                 `producer-regex` feature is off)"
            )),
            None => Ok(ProducerFilter { names }),
        }
    }

    /// Whether a producer called `name` runs the data source.
    #[cfg(feature = "producer-regex")]
    pub fn accepts(&self, name: &str) -> bool {
        (self.names.is_empty() && self.patterns.is_empty())
            || self.names.iter().any(|n| n == name)
            || self.patterns.iter().any(|re| re.is_match(name))
    }

    /// Whether a producer called `name` runs the data source.
    #[cfg(not(feature = "producer-regex"))]
    pub fn accepts(&self, name: &str) -> bool {
        self.names.is_empty() || self.names.iter().any(|n| n == name)
    }
}

impl PartialEq for ProducerFilter {
    #[cfg(feature = "producer-regex")]
    fn eq(&self, other: &Self) -> bool {
        self.names == other.names
            && self
                .patterns
                .iter()
                .map(regex::Regex::as_str)
                .eq(other.patterns.iter().map(regex::Regex::as_str))
    }

    #[cfg(not(feature = "producer-regex"))]
    fn eq(&self, other: &Self) -> bool {
        self.names == other.names
    }
}

impl Eq for ProducerFilter {}

/// What a session does, as read from a `TraceConfig`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    /// Central buffers (at least one).
    pub buffers: Vec<BufferSpec>,
    /// Data sources to enable.
    pub data_sources: Vec<DataSourceSpec>,
    /// Stop after this long (`duration_ms`).
    pub duration: Option<Duration>,
    /// Flush all producers this often (`flush_period_ms`).
    pub flush_period: Option<Duration>,
    /// How long a flush waits for producers (`flush_timeout_ms`, default 5 s).
    pub flush_timeout: Duration,
    /// How long stopping waits for data sources that promised to say they stopped
    /// (`data_source_stop_timeout_ms`, default 5 s).
    pub data_source_stop_timeout: Duration,
    /// Stream to the output file while tracing (`write_into_file`).
    pub write_into_file: bool,
    /// How often to stream (`file_write_period_ms`, default 5 s, at least 100 ms).
    pub file_write_period: Duration,
    /// Where to write the trace (`output_path`).
    pub output_path: Option<PathBuf>,
    /// Stop writing when the file reaches this size (`max_file_size_bytes`).
    pub max_file_size_bytes: Option<u64>,
    /// Ask producers to clear incremental state this often
    /// (`incremental_state_config.clear_period_ms`).
    pub incremental_state_clear_period: Option<Duration>,
    /// How the read-out is compressed (`compression_type`).
    pub compression: Compression,
    /// Map every page of the central buffers at the start instead of on first write
    /// ([`TraceBuffer::prefault`]): the first pass round a buffer then takes no page faults on
    /// the service thread, and the buffers' memory is committed at once. Off by default, as in
    /// Perfetto (which commits buffer pages lazily); not a `TraceConfig` field.
    pub prefault_buffers: bool,
    /// The encoded `TraceConfig` this was read from ([`SessionConfig::from_trace_config`]),
    /// written into the trace as its `trace_config` packet; empty for a config built in code,
    /// whose packet is then encoded from the fields above ([`SessionConfig::to_trace_config`]).
    pub trace_config: Vec<u8>,
}

impl Default for SessionConfig {
    /// One 32 MiB ring buffer, the track event data source, written at stop.
    fn default() -> Self {
        SessionConfig {
            buffers: vec![BufferSpec {
                size_bytes: 32 << 20,
                policy: FillPolicy::RingBuffer,
            }],
            data_sources: vec![DataSourceSpec::new("track_event", 0)],
            duration: None,
            flush_period: None,
            flush_timeout: DEFAULT_FLUSH_TIMEOUT,
            data_source_stop_timeout: DEFAULT_DATA_SOURCE_STOP_TIMEOUT,
            write_into_file: false,
            file_write_period: DEFAULT_FILE_WRITE_PERIOD,
            output_path: None,
            max_file_size_bytes: None,
            incremental_state_clear_period: None,
            compression: Compression::None,
            prefault_buffers: false,
            trace_config: Vec::new(),
        }
    }
}

/// How a session compresses its output (Perfetto's `TraceConfig.compression_type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// Plain `Trace.packet` records.
    #[default]
    None,
    /// `COMPRESSION_TYPE_DEFLATE`: batches of records in `compressed_packets` (zlib), see
    /// `compress.rs`. The final `TraceStats` packet stays plain. Needs the `deflate` feature:
    /// without it a session given this writes plain records (and its config says `None`).
    Deflate,
}

/// A `TraceConfig` the session cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid trace config: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

fn ms(v: u32) -> Option<Duration> {
    (v > 0).then(|| Duration::from_millis(v as u64))
}

impl SessionConfig {
    /// Reads an encoded Perfetto `TraceConfig`.
    pub fn from_trace_config(bytes: &[u8]) -> Result<Self, ConfigError> {
        let bad = |e: protozero::DecodeError| ConfigError(e.to_string());
        let cfg = TraceConfigView::decode(bytes).map_err(bad)?;
        let mut buffers = Vec::new();
        for b in cfg.buffers() {
            let b = b.map_err(bad)?;
            let size_kb = b.size_kb();
            if size_kb == 0 {
                return Err(ConfigError("a buffer has size_kb = 0".into()));
            }
            let policy = match b.fill_policy() {
                Some(trace_config::buffer_config::FillPolicy::Discard) => FillPolicy::Discard,
                _ => FillPolicy::RingBuffer,
            };
            buffers.push(BufferSpec {
                size_bytes: size_kb as usize * 1024,
                policy,
            });
        }
        if buffers.is_empty() {
            return Err(ConfigError("no buffers".into()));
        }
        let mut data_sources = Vec::new();
        for ds in cfg.data_sources() {
            let ds = ds.map_err(bad)?;
            let c = ds.config().map_err(bad)?;
            let name = c.name().map_err(bad)?.to_owned();
            let target = c.target_buffer();
            if target as usize >= buffers.len() {
                return Err(ConfigError(format!(
                    "data source {name:?} targets buffer {target}, but there are {} buffers",
                    buffers.len()
                )));
            }
            let names = ds
                .producer_name_filter()
                .map(|n| n.map(str::to_owned))
                .collect::<Result<_, _>>()
                .map_err(bad)?;
            let patterns = ds
                .producer_name_regex_filter()
                .collect::<Result<Vec<_>, _>>()
                .map_err(bad)?;
            let producer_filter = ProducerFilter::new(names, &patterns)
                .map_err(|e| ConfigError(format!("data source {name:?}: {e}")))?;
            data_sources.push(DataSourceSpec {
                name,
                target_buffer: target as u16,
                config: c.bytes().to_vec(),
                producer_filter,
            });
        }
        let clear = if cfg.has_incremental_state_config() {
            ms(cfg
                .incremental_state_config()
                .map_err(bad)?
                .clear_period_ms())
        } else {
            None
        };
        let output_path = if cfg.has_output_path() {
            Some(PathBuf::from(cfg.output_path().map_err(bad)?))
        } else {
            None
        };
        Ok(SessionConfig {
            buffers,
            data_sources,
            duration: ms(cfg.duration_ms()),
            flush_period: ms(cfg.flush_period_ms()),
            flush_timeout: ms(cfg.flush_timeout_ms()).unwrap_or(DEFAULT_FLUSH_TIMEOUT),
            data_source_stop_timeout: ms(cfg.data_source_stop_timeout_ms())
                .unwrap_or(DEFAULT_DATA_SOURCE_STOP_TIMEOUT),
            write_into_file: cfg.write_into_file(),
            file_write_period: ms(cfg.file_write_period_ms())
                .unwrap_or(DEFAULT_FILE_WRITE_PERIOD)
                .max(MIN_FILE_WRITE_PERIOD),
            output_path,
            max_file_size_bytes: (cfg.max_file_size_bytes() > 0).then(|| cfg.max_file_size_bytes()),
            incremental_state_clear_period: clear,
            compression: match cfg.compression_type() {
                Some(trace_config::CompressionType::Deflate) if cfg!(feature = "deflate") => {
                    Compression::Deflate
                }
                Some(trace_config::CompressionType::Deflate) => {
                    return Err(ConfigError(
                        "compression_type COMPRESSION_TYPE_DEFLATE: this build has no DEFLATE \
                         encoder (tachyon-service's `deflate` feature is off)"
                            .into(),
                    ))
                }
                _ => Compression::None,
            },
            prefault_buffers: false,
            trace_config: bytes.to_vec(),
        })
    }

    /// The `TraceConfig` of this session: the one it was read from, else one encoded from its
    /// fields (buffers, data sources with their own configs, periods and limits).
    pub fn to_trace_config(&self) -> Vec<u8> {
        if !self.trace_config.is_empty() {
            return self.trace_config.clone();
        }
        let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
        let mut buf = protozero::HeapBuffered::new();
        {
            let mut c: TraceConfig<'_> = buf.root();
            for b in &self.buffers {
                let mut bc = c.add_buffers();
                bc.set_size_kb(u32::try_from(b.size_bytes / 1024).unwrap_or(u32::MAX));
                bc.set_fill_policy(match b.policy {
                    FillPolicy::RingBuffer => trace_config::buffer_config::FillPolicy::RingBuffer,
                    FillPolicy::Discard => trace_config::buffer_config::FillPolicy::Discard,
                });
            }
            for ds in &self.data_sources {
                let mut d = c.add_data_sources();
                let mut cfg = d.set_config();
                if ds.config.is_empty() {
                    cfg.set_name(&ds.name);
                    cfg.set_target_buffer(u32::from(ds.target_buffer));
                } else {
                    cfg.message().append_raw_proto_bytes(&ds.config);
                }
            }
            if let Some(d) = self.duration {
                c.set_duration_ms(ms(d));
            }
            if let Some(d) = self.flush_period {
                c.set_flush_period_ms(ms(d));
            }
            c.set_flush_timeout_ms(ms(self.flush_timeout));
            c.set_data_source_stop_timeout_ms(ms(self.data_source_stop_timeout));
            if self.write_into_file {
                c.set_write_into_file(true);
                c.set_file_write_period_ms(ms(self.file_write_period));
            }
            if let Some(max) = self.max_file_size_bytes {
                c.set_max_file_size_bytes(max);
            }
            if let Some(d) = self.incremental_state_clear_period {
                c.set_incremental_state_config().set_clear_period_ms(ms(d));
            }
            if self.compression == Compression::Deflate {
                c.set_compression_type(trace_config::CompressionType::Deflate);
            }
        }
        buf.serialize().expect("heap buffers do not fail")
    }
}

/// Session-wide counters reported in the final `TraceStats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Producers connected now.
    pub producers_connected: u32,
    /// Producers ever connected.
    pub producers_seen: u64,
    /// Flushes requested.
    pub flushes_requested: u64,
    /// Flushes every producer acknowledged in time.
    pub flushes_succeeded: u64,
    /// Flushes that timed out.
    pub flushes_failed: u64,
    /// Bytes written to the output.
    pub bytes_written: u64,
    /// Records not written because the file reached `max_file_size_bytes`.
    pub records_dropped_file_full: u64,
    /// The outcome of the flush that ended the session: `None` when the session ended without
    /// one, `Some(false)` when a writer's last data may be missing from the trace.
    pub final_flush_succeeded: Option<bool>,
    /// With [`Compression::Deflate`]: bytes of records that went into compressed packets (what
    /// `bytes_written` would have been for them without compression).
    pub bytes_before_compression: u64,
}

/// Service-wide figures a multi-session service (the daemon) reports in every session's
/// `TraceStats` instead of the session's own producer counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceWideStats {
    /// Producers connected to the service now.
    pub producers_connected: u32,
    /// Producers ever connected.
    pub producers_seen: u64,
    /// Data sources registered now.
    pub data_sources_registered: u32,
    /// Data sources ever registered.
    pub data_sources_seen: u64,
    /// Tracing sessions now.
    pub tracing_sessions: u32,
}

impl ServiceWideStats {
    /// Sets these figures on `ts` (the daemon's `TraceStats`, with or without a session).
    pub fn write_to(&self, ts: &mut TraceStats<'_>) {
        ts.set_producers_connected(self.producers_connected);
        ts.set_producers_seen(self.producers_seen);
        ts.set_data_sources_registered(self.data_sources_registered);
        ts.set_data_sources_seen(self.data_sources_seen);
        ts.set_tracing_sessions(self.tracing_sessions);
    }
}

/// Where records go: memory, or a file.
#[derive(Debug)]
enum Sink {
    Memory(Vec<u8>),
    File(io::BufWriter<File>),
}

impl Sink {
    /// Appends `bytes`; a file is flushed too (streaming means the data is in the file, not in
    /// a userspace buffer).
    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Sink::Memory(v) => v.extend_from_slice(bytes),
            Sink::File(f) => {
                f.write_all(bytes)?;
                f.flush()?;
            }
        }
        Ok(())
    }
}

/// Bytes of records a whole pass ([`ServiceCore::drain`]) into a file stages before it writes
/// them out (a step of [`ServiceCore::drain_some`] stages about 1 MiB).
const STAGE_LIMIT: usize = 4 << 20;

/// Writes the staged records (whole records: compressed first when the session asks, cut to
/// whole records at `max_file_size_bytes`, setting `file_full`) and empties `staged`, keeping
/// its capacity.
fn flush_staged(
    config: &SessionConfig,
    stats: &mut SessionStats,
    sink: &mut Sink,
    staged: &mut Vec<u8>,
    file_full: &mut bool,
) -> io::Result<()> {
    if staged.is_empty() {
        return Ok(());
    }
    #[cfg(feature = "deflate")]
    if config.compression == Compression::Deflate {
        let plain = std::mem::take(staged);
        crate::compress::deflate_records(&plain, staged);
        stats.bytes_before_compression += plain.len() as u64;
    }
    let mut take = staged.len();
    if let Some(max) = config.max_file_size_bytes {
        if stats.bytes_written + take as u64 > max {
            // Keep whole records that fit; the rest is dropped and the session should stop.
            take = fit_records(staged, max.saturating_sub(stats.bytes_written));
            stats.records_dropped_file_full += count_records(&staged[take..]);
            *file_full = true;
        }
    }
    sink.write(&staged[..take])?;
    stats.bytes_written += take as u64;
    staged.clear();
    Ok(())
}

/// How many chunks a step of a streaming read-out ([`ServiceCore::drain_some`]) reads before
/// the service looks at the commits again: about 0.5–1 ms of read-out for 4 KiB chunks of small
/// packets, where a producer's 4 MiB SMB holds 1024 chunks and fills in about 20 ms at 20 M
/// events/s.
pub const STREAM_STEP_CHUNKS: usize = 128;

/// The synchronous service of one session. See the module docs.
#[derive(Debug)]
pub struct ServiceCore {
    config: SessionConfig,
    buffers: Vec<TraceBuffer>,
    producers: HashMap<ProducerId, (ProducerState, ProducerIdentity)>,
    /// Identities of every producer ever connected: packets of a producer that left are still
    /// read out (and attributed) after it is gone.
    identities: IdMap<ProducerId, ProducerIdentity>,
    next_producer: ProducerId,
    packets: PacketWriter,
    commit_stats: CommitStats,
    stats: SessionStats,
    staged: Vec<u8>,
    /// The buffer a [`ServiceCore::drain_some`] pass under way reads next.
    drain_cursor: usize,
    sink: Sink,
    file_full: bool,
    /// The last read and the `TraceStats` packet are written ([`ServiceCore::end`]).
    ended: bool,
    /// The service's own first packets are written (the first [`ServiceCore::drain`]).
    preamble_written: bool,
    service_wide: Option<ServiceWideStats>,
}

impl ServiceCore {
    /// A session writing to `config.output_path` if set, else into memory (see
    /// [`finish`](Self::finish)).
    pub fn new(config: SessionConfig) -> io::Result<Self> {
        Ok(match &config.output_path {
            Some(p) => {
                let file = File::create(p)?;
                Self::with_file(config, file)
            }
            None => Self::in_memory(config),
        })
    }

    /// A session writing to `file` (e.g. a descriptor a consumer passed to the daemon);
    /// `config.output_path` is ignored. Records are appended at the file's current position.
    pub fn with_file(config: SessionConfig, file: File) -> Self {
        Self::with_sink(config, Sink::File(io::BufWriter::new(file)))
    }

    /// A session keeping the trace in memory (taken with [`take_output`](Self::take_output) or
    /// [`finish`](Self::finish)); `config.output_path` is ignored.
    pub fn in_memory(config: SessionConfig) -> Self {
        Self::with_sink(config, Sink::Memory(Vec::new()))
    }

    fn with_sink(
        #[cfg_attr(feature = "deflate", allow(unused_mut))] mut config: SessionConfig,
        sink: Sink,
    ) -> Self {
        // Without an encoder the trace is written plain, and the session's config says so (a
        // `TraceConfig` read with `from_trace_config` is refused before it gets here).
        #[cfg(not(feature = "deflate"))]
        {
            config.compression = Compression::None;
        }
        let buffers = config
            .buffers
            .iter()
            .map(|b| {
                let mut buffer = TraceBuffer::new(b.size_bytes, b.policy);
                if config.prefault_buffers {
                    buffer.prefault();
                }
                buffer
            })
            .collect();
        ServiceCore {
            config,
            buffers,
            producers: HashMap::new(),
            identities: IdMap::default(),
            next_producer: 1,
            packets: PacketWriter::new(),
            commit_stats: CommitStats::default(),
            stats: SessionStats::default(),
            staged: Vec::new(),
            drain_cursor: 0,
            sink,
            file_full: false,
            ended: false,
            preamble_written: false,
            service_wide: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// The central buffers.
    pub fn buffers(&self) -> &[TraceBuffer] {
        &self.buffers
    }

    /// Commit-path counters.
    pub fn commit_stats(&self) -> &CommitStats {
        &self.commit_stats
    }

    /// Session counters.
    pub fn stats(&self) -> &SessionStats {
        &self.stats
    }

    /// Packets rejected at read-out.
    pub fn invalid_packets(&self) -> u64 {
        self.packets.invalid_packets()
    }

    /// Registers a producer, allowed to write to every buffer of the session.
    pub fn add_producer(&mut self, identity: ProducerIdentity) -> ProducerId {
        let id = self.next_producer;
        self.next_producer = self.next_producer.wrapping_add(1).max(1);
        let allowed = (0..self.buffers.len() as u16).collect();
        self.producers
            .insert(id, (ProducerState::new(id, allowed), identity));
        self.identities.insert(id, identity);
        self.stats.producers_connected += 1;
        self.stats.producers_seen += 1;
        id
    }

    /// Forgets a producer (after a last scrape by the caller): what it wrote is read without
    /// waiting for commits that will not come.
    pub fn remove_producer(&mut self, id: ProducerId) {
        if self.producers.remove(&id).is_some() {
            self.stats.producers_connected -= 1;
        }
        for b in &mut self.buffers {
            b.producer_gone(id);
        }
    }

    /// Applies a commit of `producer`, whose SMB is `view`.
    pub fn commit(&mut self, producer: ProducerId, view: &ServiceView<'_>, req: &CommitRequest) {
        match self.producers.get_mut(&producer) {
            Some((state, _)) => {
                apply_commit(view, state, req, &mut self.buffers, &mut self.commit_stats)
            }
            None => self.commit_stats.chunks_discarded += req.chunks_to_move.len() as u64,
        }
    }

    /// Scrapes `producer`'s SMB (on flush, stop or disconnect).
    pub fn scrape(&mut self, producer: ProducerId, view: &ServiceView<'_>) {
        // A writer that never committed goes to buffer 0, as in `commit::scrape`.
        self.scrape_with(producer, view, |_| Some(0));
    }

    /// Scrapes `producer`'s SMB like [`scrape`](Self::scrape), except for writers that never
    /// committed to this session: `unknown_writers(writer)` says which buffer their chunks go
    /// to, or `None` to leave them alone. A service whose producers may serve several sessions
    /// at once uses this so that no session receives another's chunks (a chunk header does not
    /// say its target buffer).
    pub fn scrape_with(
        &mut self,
        producer: ProducerId,
        view: &ServiceView<'_>,
        mut unknown_writers: impl FnMut(WriterId) -> Option<u16>,
    ) {
        if let Some((state, _)) = self.producers.get(&producer) {
            scrape_with(
                view,
                state,
                &mut self.buffers,
                &mut self.commit_stats,
                |writer: WriterId| match state.writer_targets.get(&writer) {
                    Some(target) => Some(*target),
                    None => unknown_writers(writer),
                },
            );
        }
    }

    /// Makes the `TraceStats` of this session report `stats` for the producer, data source and
    /// session counts (a daemon's view of the whole service) instead of the session's own.
    pub fn set_service_wide_stats(&mut self, stats: ServiceWideStats) {
        self.service_wide = Some(stats);
    }

    /// Records the outcome of a flush.
    pub fn record_flush(&mut self, succeeded: bool) {
        self.stats.flushes_requested += 1;
        if succeeded {
            self.stats.flushes_succeeded += 1;
        } else {
            self.stats.flushes_failed += 1;
        }
    }

    /// Records the outcome of the flush that ends the session. The `TraceStats` carry it as
    /// `final_flush_outcome`, which Perfetto's processors turn into the `traced_final_flush_*`
    /// stats: a failed one marks the trace as possibly missing each late writer's last data.
    pub fn record_final_flush(&mut self, succeeded: bool) {
        self.record_flush(succeeded);
        self.stats.final_flush_succeeded = Some(succeeded);
    }

    /// Reads every complete packet out of the buffers into the output (streaming). With `last`,
    /// nothing is left waiting (see [`TraceBuffer::read_packets`]), and each sequence whose last
    /// packets were lost gets an empty packet carrying the loss bits no later packet could (see
    /// [`TraceBuffer::take_trailing_losses`]).
    pub fn drain(&mut self, last: bool) -> io::Result<()> {
        self.write_preamble();
        // A whole pass: one under way by `drain_some` is finished by it.
        self.drain_cursor = 0;
        let ServiceCore {
            config,
            buffers,
            identities,
            packets,
            staged,
            stats,
            sink,
            file_full,
            ..
        } = self;
        let mut identity = IdentityLookup {
            identities,
            cached: None,
        };
        // A whole pass can read a whole buffer (a stop, a flush, a final read behind a
        // read-out that lagged): into a file, the records go out every `STAGE_LIMIT` bytes
        // instead of all at once, so the staging buffer stays that size (reused, its pages
        // mapped once) rather than growing to twice the buffer's size, a page fault per 4 KiB.
        let to_file = matches!(sink, Sink::File(_));
        let mut error = None;
        for buf in buffers.iter_mut() {
            buf.read_packets(last, |info, fragments| {
                packets.write_packet(info, fragments, identity.get(info.producer), staged);
                if to_file && staged.len() >= STAGE_LIMIT && error.is_none() {
                    // Between two packets: `staged` holds whole records.
                    error = flush_staged(config, stats, sink, staged, file_full).err();
                }
            });
            if last {
                for info in buf.take_trailing_losses() {
                    packets.write_packet(info, &[], identity.get(info.producer), staged);
                }
            }
        }
        if let Some(e) = error {
            return Err(e);
        }
        self.flush_staged()
    }

    /// One step of a streaming read-out ([`drain`](Self::drain) without `last`, made in
    /// steps): reads on from where the previous step stopped until `max_chunks` chunks are
    /// read, writes the records to the output, and returns whether the pass is complete (every
    /// sequence of every buffer reached). A service that streams calls it until it returns
    /// true, applying the commits that arrived between the calls, so that no producer waits
    /// for the read-out of a whole period to get its chunks back.
    pub fn drain_some(&mut self, max_chunks: usize) -> io::Result<bool> {
        self.write_preamble();
        let ServiceCore {
            buffers,
            identities,
            packets,
            staged,
            drain_cursor,
            ..
        } = self;
        let mut identity = IdentityLookup {
            identities,
            cached: None,
        };
        let mut complete = true;
        while let Some(buf) = buffers.get_mut(*drain_cursor) {
            let done = buf.read_some_packets(max_chunks, |info, fragments| {
                packets.write_packet(info, fragments, identity.get(info.producer), staged);
            });
            if !done {
                complete = false;
                break;
            }
            *drain_cursor += 1;
        }
        if complete {
            *drain_cursor = 0;
        }
        self.flush_staged()?;
        Ok(complete)
    }

    fn write_preamble(&mut self) {
        if !self.preamble_written {
            self.preamble_written = true;
            let preamble = self.preamble_packets();
            self.staged.extend_from_slice(&preamble);
        }
    }

    fn flush_staged(&mut self) -> io::Result<()> {
        flush_staged(
            &self.config,
            &mut self.stats,
            &mut self.sink,
            &mut self.staged,
            &mut self.file_full,
        )
    }

    /// Whether the output reached `max_file_size_bytes` (the session should stop).
    pub fn file_full(&self) -> bool {
        self.file_full
    }

    /// Takes the records written to memory so far (a session without a file); empty for a
    /// session writing to a file. With [`drain`](Self::drain) this reads a trace out
    /// incrementally (the daemon's `ReadBuffers`).
    pub fn take_output(&mut self) -> Vec<u8> {
        match &mut self.sink {
            Sink::Memory(v) => std::mem::take(v),
            Sink::File(_) => Vec::new(),
        }
    }

    /// [`take_output`](Self::take_output), leaving `spare` (emptied) to hold the next records:
    /// a streaming reader that hands back the vectors it is done with keeps writing into
    /// memory already mapped (no page faults, no reallocation as the output grows again). A
    /// session writing to a file returns an empty vector and drops `spare`.
    pub fn take_output_into(&mut self, mut spare: Vec<u8>) -> Vec<u8> {
        match &mut self.sink {
            Sink::Memory(v) => {
                spare.clear();
                std::mem::replace(v, spare)
            }
            Sink::File(_) => Vec::new(),
        }
    }

    /// Ends the output: the last read, then the `TraceStats` packet, then a flush of the file.
    /// Only the first call writes anything; commits after it still reach the buffers but are
    /// never read out.
    pub fn end(&mut self) -> io::Result<()> {
        if self.ended {
            return Ok(());
        }
        self.ended = true;
        self.drain(true)?;
        let stats = self.trace_stats_packet();
        // The stats packet is always written, even past max_file_size_bytes: it is what says
        // that data was dropped.
        self.sink.write(&stats)
    }

    /// The last read, the `TraceStats` packet, and the end of the output. Returns the trace
    /// when it was kept in memory (no `output_path`), else an empty vector.
    pub fn finish(mut self) -> io::Result<Vec<u8>> {
        self.end()?;
        Ok(self.take_output())
    }

    /// The service's own packets at the start of the trace, as Perfetto's service writes them:
    /// a random `trace_uuid` (which names the trace in the UI and ties its files together) and
    /// the session's `trace_config` (shown in the UI's trace info), as `Trace.packet` records.
    fn preamble_packets(&self) -> Vec<u8> {
        use std::hash::BuildHasher;
        let random = || std::collections::hash_map::RandomState::new().hash_one(0u8) as i64;
        let mut buf = protozero::HeapBuffered::new();
        {
            let mut trace: Trace<'_> = buf.root();
            {
                let mut packet = trace.add_packet();
                {
                    let mut uuid = packet.set_trace_uuid();
                    uuid.set_msb(random());
                    uuid.set_lsb(random());
                }
                packet.set_trusted_packet_sequence_id(SERVICE_SEQUENCE_ID);
            }
            let mut packet = trace.add_packet();
            packet
                .set_trace_config()
                .message()
                .append_raw_proto_bytes(&self.config.to_trace_config());
            packet.set_trusted_packet_sequence_id(SERVICE_SEQUENCE_ID);
        }
        buf.serialize().expect("heap buffers do not fail")
    }

    /// A `Trace.packet` record with the session's `TraceStats`.
    pub fn trace_stats_packet(&self) -> Vec<u8> {
        let mut buf = protozero::HeapBuffered::new();
        {
            // Written as a `Trace` with one packet: the bytes are a `Trace.packet` record.
            let mut trace: Trace<'_> = buf.root();
            let mut packet = trace.add_packet();
            self.write_trace_stats(&mut packet.set_trace_stats());
            packet.set_trusted_packet_sequence_id(SERVICE_SEQUENCE_ID);
        }
        buf.serialize().expect("heap buffers do not fail")
    }

    /// The session's `TraceStats` message alone (for progress reports while it runs).
    pub fn trace_stats(&self) -> Vec<u8> {
        let mut buf = protozero::HeapBuffered::new();
        self.write_trace_stats(&mut buf.root());
        buf.serialize().expect("heap buffers do not fail")
    }

    fn write_trace_stats(&self, ts: &mut TraceStats<'_>) {
        for b in &self.buffers {
            let mut bs = ts.add_buffer_stats();
            b.stats().write_to(bs.message());
        }
        // Which buffer each sequence wrote into, so a reader can attribute the losses its
        // packets report (`previous_packet_dropped`) to buffers. Sequences none of whose
        // packets reached the trace have no id to name.
        for (i, b) in self.buffers.iter().enumerate() {
            for (producer, writer) in b.sequences() {
                if let Some(id) = self.packets.existing_sequence_id(producer, writer) {
                    let mut w = ts.add_writer_stats();
                    w.set_sequence_id(id as u64);
                    w.set_buffer(i as u32);
                }
            }
        }
        match self.service_wide {
            None => {
                ts.set_producers_connected(self.stats.producers_connected);
                ts.set_producers_seen(self.stats.producers_seen);
                ts.set_tracing_sessions(1);
            }
            Some(w) => w.write_to(ts),
        }
        ts.set_total_buffers(self.buffers.len() as u32);
        ts.set_chunks_discarded(self.commit_stats.chunks_discarded);
        ts.set_patches_discarded(self.commit_stats.patches_discarded);
        ts.set_invalid_packets(self.packets.invalid_packets());
        ts.set_flushes_requested(self.stats.flushes_requested);
        ts.set_flushes_succeeded(self.stats.flushes_succeeded);
        ts.set_flushes_failed(self.stats.flushes_failed);
        if let Some(ok) = self.stats.final_flush_succeeded {
            ts.set_final_flush_outcome(if ok {
                trace_stats::FinalFlushOutcome::FinalFlushSucceeded
            } else {
                trace_stats::FinalFlushOutcome::FinalFlushFailed
            });
        }
    }
}

/// A producer's identity by id (pid and uid 0 for one never seen), remembering the last one:
/// packets come sequence by sequence, so the last producer's identity is mostly the next one's.
struct IdentityLookup<'a> {
    identities: &'a IdMap<ProducerId, ProducerIdentity>,
    cached: Option<(ProducerId, ProducerIdentity)>,
}

impl IdentityLookup<'_> {
    fn get(&mut self, producer: ProducerId) -> ProducerIdentity {
        match self.cached {
            Some((p, identity)) if p == producer => identity,
            _ => {
                let identity = self
                    .identities
                    .get(&producer)
                    .copied()
                    .unwrap_or(ProducerIdentity { pid: 0, uid: 0 });
                self.cached = Some((producer, identity));
                identity
            }
        }
    }
}

/// How many leading bytes of `records` are whole `Trace.packet` records within `budget`.
fn fit_records(records: &[u8], budget: u64) -> usize {
    let mut decoder = ProtoDecoder::new(records);
    let mut fit = 0;
    while let Ok(Some(_)) = decoder.read_field() {
        if decoder.offset() as u64 > budget {
            break;
        }
        fit = decoder.offset();
    }
    fit
}

/// How many `Trace.packet` records `records` holds (our own output, so well-formed).
fn count_records(records: &[u8]) -> u64 {
    ProtoDecoder::new(records).take_while(Result::is_ok).count() as u64
}

//! Test support: a private daemon per test, trace configs, a fake producer speaking the
//! producer protocol with `tachyon-ipc` and writing chunks with `tachyon_abi::SharedMemoryAbi`
//! directly, and trace decoding.
//!
//! The fake producer writes payload bytes with the ABI's atomic stores (`Chunk::write_payload`),
//! so the daemon scraping the same memory from another thread of this process is race-free;
//! the SDK's `TraceWriter` (plain stores) is never used in-process with the daemon.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use protozero::{HeapBuffered, ProtoDecoder};
use tachyon_abi::{
    encode_fragment_header, Chunk, ChunkHeader, ChunkToMove, CommitRequest, PageLayout, PageSize,
    SharedMemoryAbi,
};
use tachyon_ipc::commit::send_commit;
use tachyon_ipc::rpc::{self, Caller, Replies};
use tachyon_ipc::shm::SharedMemory;
use tachyon_protos::{
    get_async_command_response::{self},
    trace_config, DataSourceDescriptor, GetAsyncCommandResponseView, InitializeConnectionRequest,
    NotifyDataSourceStoppedRequest, RegisterDataSourceRequest, TraceConfig, TracePacket,
    TraceStatsView,
};
use tachyon_traced::{Daemon, DaemonConfig, DaemonHandle};

/// Generous: the machine may be slow and busy.
pub const TIMEOUT: Duration = Duration::from_secs(20);

// === daemon ===

/// A temporary directory removed on drop.
pub struct TestDir(pub PathBuf);

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tachyon-traced-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TestDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A daemon on private sockets, without built-in data sources unless asked.
pub fn daemon(name: &str) -> (TestDir, DaemonHandle) {
    daemon_with(name, |_| {})
}

pub fn daemon_with(name: &str, f: impl FnOnce(&mut DaemonConfig)) -> (TestDir, DaemonHandle) {
    let dir = TestDir::new(name);
    let mut config = DaemonConfig::in_dir(dir.path());
    config.builtin_data_sources = false;
    f(&mut config);
    let d = Daemon::start(config).unwrap();
    (dir, d)
}

/// Polls `f` until it holds.
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// === trace configs ===

/// A `TraceConfig`, field by field.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// (size_kb, discard)
    pub buffers: Vec<(u32, bool)>,
    /// (name, target buffer)
    pub data_sources: Vec<(String, u32)>,
    pub duration_ms: u32,
    pub flush_period_ms: u32,
    pub flush_timeout_ms: u32,
    pub data_source_stop_timeout_ms: u32,
    pub write_into_file: bool,
    pub file_write_period_ms: u32,
    pub max_file_size_bytes: u64,
    pub clear_period_ms: u32,
    /// `producer_name_filter` and `producer_name_regex_filter` of every data source.
    pub producer_name_filter: Vec<String>,
    pub producer_name_regex_filter: Vec<String>,
}

impl Config {
    /// One ring buffer of `size_kb`, data source `name` into it.
    pub fn simple(size_kb: u32, name: &str) -> Config {
        Config {
            buffers: vec![(size_kb, false)],
            data_sources: vec![(name.into(), 0)],
            ..Config::default()
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut buf = HeapBuffered::new();
        {
            let mut c: TraceConfig<'_> = buf.root();
            for (size, discard) in &self.buffers {
                let mut b = c.add_buffers();
                b.set_size_kb(*size);
                b.set_fill_policy(if *discard {
                    trace_config::buffer_config::FillPolicy::Discard
                } else {
                    trace_config::buffer_config::FillPolicy::RingBuffer
                });
            }
            for (name, target) in &self.data_sources {
                let mut ds = c.add_data_sources();
                let mut cfg = ds.set_config();
                cfg.set_name(name);
                cfg.set_target_buffer(*target);
                drop(cfg);
                for n in &self.producer_name_filter {
                    ds.add_producer_name_filter(n);
                }
                for n in &self.producer_name_regex_filter {
                    ds.add_producer_name_regex_filter(n);
                }
            }
            if self.duration_ms > 0 {
                c.set_duration_ms(self.duration_ms);
            }
            if self.flush_period_ms > 0 {
                c.set_flush_period_ms(self.flush_period_ms);
            }
            if self.flush_timeout_ms > 0 {
                c.set_flush_timeout_ms(self.flush_timeout_ms);
            }
            if self.data_source_stop_timeout_ms > 0 {
                c.set_data_source_stop_timeout_ms(self.data_source_stop_timeout_ms);
            }
            if self.write_into_file {
                c.set_write_into_file(true);
            }
            if self.file_write_period_ms > 0 {
                c.set_file_write_period_ms(self.file_write_period_ms);
            }
            if self.max_file_size_bytes > 0 {
                c.set_max_file_size_bytes(self.max_file_size_bytes);
            }
            if self.clear_period_ms > 0 {
                c.set_incremental_state_config()
                    .set_clear_period_ms(self.clear_period_ms);
            }
        }
        buf.serialize().unwrap()
    }
}

// === packets and traces ===

/// A TracePacket with `timestamp = ts` and `padding` bytes of a `for_testing`-free filler
/// (field 8 is all the tests look at; padding goes in an unknown field).
pub fn packet(ts: u64, padding: usize) -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    {
        let mut p: TracePacket<'_> = buf.root();
        p.set_timestamp(ts);
        if padding > 0 {
            p.message().append_bytes(9000, &vec![0xab; padding]);
        }
    }
    buf.serialize().unwrap()
}

/// One packet of a trace, as the tests look at it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    pub timestamp: Option<u64>,
    pub pid: Option<i32>,
    pub uid: Option<i32>,
    pub sequence: Option<u32>,
    pub previous_packet_dropped: u32,
    pub is_stats: bool,
}

/// Splits a trace into its packets. Panics if it is not a well-formed `Trace`.
pub fn packets(trace: &[u8]) -> Vec<Read> {
    let mut out = Vec::new();
    let mut d = ProtoDecoder::new(trace);
    while let Some(f) = d.read_field().expect("a well-formed Trace") {
        assert_eq!(f.id(), 1, "a Trace holds only packets");
        let p = f.as_message();
        for field in p.clone() {
            field.expect("a well-formed TracePacket");
        }
        out.push(Read {
            timestamp: p.find_last_field(8).map(|f| f.as_u64()),
            pid: p.find_last_field(79).map(|f| f.as_i32()),
            uid: p.find_last_field(3).map(|f| f.as_i32()),
            sequence: p.find_last_field(10).map(|f| f.as_u32()),
            previous_packet_dropped: p.find_last_field(42).map_or(0, |f| f.as_u32()),
            is_stats: p.find_field(35).is_some(),
        });
    }
    out
}

/// Timestamps of the producer packets of a trace, in trace order.
pub fn timestamps(trace: &[u8]) -> Vec<u64> {
    packets(trace).iter().filter_map(|p| p.timestamp).collect()
}

/// The last `TraceStats` packet of a trace (encoded `TraceStats`).
pub fn trace_stats(trace: &[u8]) -> Vec<u8> {
    let mut last = None;
    for f in ProtoDecoder::new(trace).map_while(Result::ok) {
        if let Some(ts) = f.as_message().find_field(35) {
            last = Some(ts.as_bytes().to_vec());
        }
    }
    last.expect("the trace ends with TraceStats")
}

/// The counters the tests check, from an encoded `TraceStats`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub producers_connected: u32,
    pub chunks_discarded: u64,
    pub patches_discarded: u64,
    pub invalid_packets: u64,
    pub flushes_requested: u64,
    pub flushes_succeeded: u64,
    pub flushes_failed: u64,
    /// `final_flush_outcome`: 0 unspecified, 1 succeeded, 2 failed.
    pub final_flush_outcome: i32,
    /// Per buffer: (chunks_written, chunks_discarded, chunks_overwritten, abi_violations).
    pub buffers: Vec<(u64, u64, u64, u64)>,
}

pub fn stats(encoded: &[u8]) -> Stats {
    let v = TraceStatsView::decode(encoded).unwrap();
    Stats {
        producers_connected: v.producers_connected(),
        chunks_discarded: v.chunks_discarded(),
        patches_discarded: v.patches_discarded(),
        invalid_packets: v.invalid_packets(),
        flushes_requested: v.flushes_requested(),
        flushes_succeeded: v.flushes_succeeded(),
        flushes_failed: v.flushes_failed(),
        final_flush_outcome: v.final_flush_outcome_raw(),
        buffers: v
            .buffer_stats()
            .map(|b| {
                let b = b.unwrap();
                (
                    b.chunks_written(),
                    b.chunks_discarded(),
                    b.chunks_overwritten(),
                    b.abi_violations(),
                )
            })
            .collect(),
    }
}

pub fn my_uid() -> i32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").unwrap().uid() as i32
}

// === fake producer ===

/// A command the daemon sent.
#[derive(Debug)]
pub enum Cmd {
    Start {
        instance: u64,
        target_buffer: u16,
    },
    Stop {
        instance: u64,
    },
    Flush {
        request_id: u64,
        instances: Vec<u64>,
    },
    Clear {
        instances: Vec<u64>,
    },
}

/// How the fake producer behaves.
#[derive(Clone, Debug)]
pub struct Behaviour {
    /// `InitializeConnection.producer_name`.
    pub name: String,
    pub data_sources: Vec<String>,
    pub smb_size_hint: u32,
    /// Acknowledge flushes right away (after everything committed before).
    pub ack_flushes: bool,
    pub will_notify_on_stop: bool,
    /// Say it stopped when told to stop (only if `will_notify_on_stop`: a producer that
    /// promised and never does is what `data_source_stop_timeout_ms` bounds).
    pub ack_stops: bool,
    pub handles_incremental_state_clear: bool,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            name: "fake".into(),
            data_sources: vec!["test.source".into()],
            smb_size_hint: 64 * 1024,
            ack_flushes: true,
            will_notify_on_stop: true,
            ack_stops: true,
            handles_incremental_state_clear: false,
        }
    }
}

/// A producer in this process: protocol by hand, chunks by hand.
pub struct FakeProducer {
    pub caller: Caller,
    commands: Receiver<Cmd>,
    smb_rx: Receiver<SharedMemory>,
    smb: Option<SharedMemory>,
    pending: VecDeque<Cmd>,
    /// Next chunk id per writer.
    next_chunk: std::collections::HashMap<u16, u32>,
    reader: Option<std::thread::JoinHandle<()>>,
}

fn call(caller: &Caller, replies: &mut Replies, method: &str, args: &[u8]) -> rpc::Reply {
    let id = caller.invoke(method, args, None, false).unwrap();
    loop {
        let r = replies.recv().unwrap().expect("the daemon answers");
        if r.request_id == id {
            return r;
        }
    }
}

impl FakeProducer {
    pub fn connect(socket: &Path, b: Behaviour) -> FakeProducer {
        let (caller, mut replies) = rpc::connect(
            socket,
            "ProducerPort",
            Duration::from_secs(5),
            Duration::from_secs(5),
        )
        .unwrap();
        let mut buf = HeapBuffered::new();
        {
            let mut r: InitializeConnectionRequest<'_> = buf.root();
            r.set_shared_memory_size_hint_bytes(b.smb_size_hint);
            r.set_shared_memory_page_size_hint_bytes(4096);
            r.set_producer_name(&b.name);
        }
        let r = call(
            &caller,
            &mut replies,
            "InitializeConnection",
            &buf.serialize().unwrap(),
        );
        assert!(r.success);
        for name in &b.data_sources {
            let mut buf = HeapBuffered::new();
            {
                let mut r: RegisterDataSourceRequest<'_> = buf.root();
                let mut d: DataSourceDescriptor<'_> = r.set_data_source_descriptor();
                d.set_name(name);
                d.set_will_notify_on_stop(b.will_notify_on_stop);
                d.set_handles_incremental_state_clear(b.handles_incremental_state_clear);
            }
            let r = call(
                &caller,
                &mut replies,
                "RegisterDataSource",
                &buf.serialize().unwrap(),
            );
            assert!(r.success);
        }
        let stream = caller.invoke("GetAsyncCommand", &[], None, false).unwrap();
        let (tx, commands) = mpsc::channel();
        let (smb_tx, smb_rx) = mpsc::channel();
        let reader_caller = caller.clone();
        let reader = std::thread::spawn(move || {
            read_commands(replies, stream, reader_caller, b, tx, smb_tx)
        });
        FakeProducer {
            caller,
            commands,
            smb_rx,
            smb: None,
            pending: VecDeque::new(),
            next_chunk: Default::default(),
            reader: Some(reader),
        }
    }

    /// The next command (of any kind), waiting up to [`TIMEOUT`].
    pub fn next_command(&mut self) -> Cmd {
        if let Some(c) = self.pending.pop_front() {
            return c;
        }
        self.commands
            .recv_timeout(TIMEOUT)
            .expect("a command from the daemon")
    }

    /// Every command received so far and not taken yet, without waiting.
    pub fn received_now(&mut self) -> Vec<Cmd> {
        let mut out: Vec<Cmd> = self.pending.drain(..).collect();
        out.extend(self.commands.try_iter());
        out
    }

    /// Waits for a StartDataSource (keeping other commands for later); returns its instance
    /// id and global target buffer.
    pub fn wait_start(&mut self) -> (u64, u16) {
        let deadline = Instant::now() + TIMEOUT;
        if let Some(i) = self
            .pending
            .iter()
            .position(|c| matches!(c, Cmd::Start { .. }))
        {
            if let Some(Cmd::Start {
                instance,
                target_buffer,
            }) = self.pending.remove(i)
            {
                return (instance, target_buffer);
            }
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.commands.recv_timeout(left).expect("StartDataSource") {
                Cmd::Start {
                    instance,
                    target_buffer,
                } => return (instance, target_buffer),
                other => self.pending.push_back(other),
            }
        }
    }

    /// Waits for a command matching `f`, keeping the others.
    pub fn wait_for(&mut self, what: &str, f: impl Fn(&Cmd) -> bool) -> Cmd {
        if let Some(i) = self.pending.iter().position(&f) {
            return self.pending.remove(i).unwrap();
        }
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let c = self
                .commands
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
            if f(&c) {
                return c;
            }
            self.pending.push_back(c);
        }
    }

    fn smb(&mut self) -> &SharedMemory {
        if self.smb.is_none() {
            self.smb = Some(self.smb_rx.recv_timeout(TIMEOUT).expect("SetupTracing"));
        }
        self.smb.as_ref().unwrap()
    }

    /// Writes `packets` into a new chunk of writer `writer` (next chunk id), completes it
    /// unless `complete` is false (then it stays BeingWritten with its packets finished, count
    /// inflated as the SDK does), and returns (page, chunk).
    pub fn write_chunk(&mut self, writer: u16, packets: &[Vec<u8>], complete: bool) -> (u32, u32) {
        let id = self.next_chunk_id(writer);
        self.write_chunk_with_id(writer, id, packets, complete)
    }

    fn next_chunk_id(&mut self, writer: u16) -> u32 {
        let next = self.next_chunk.entry(writer).or_insert(0);
        let id = *next;
        *next = id.wrapping_add(1);
        id
    }

    pub fn write_chunk_with_id(
        &mut self,
        writer: u16,
        chunk_id: u32,
        packets: &[Vec<u8>],
        complete: bool,
    ) -> (u32, u32) {
        let smb = self.smb();
        let abi = smb.producer_view(PageSize::Kib4).unwrap();
        let mut chunk = acquire_chunk(&abi, ChunkHeader::new(writer, chunk_id));
        let mut off = 0;
        for p in packets {
            chunk.increment_packet_count().unwrap();
            chunk
                .write_payload(off, &encode_fragment_header(p.len() as u32).unwrap())
                .unwrap();
            off += 4;
            chunk.write_payload(off, p).unwrap();
            off += p.len();
        }
        let at = (chunk.page_idx() as u32, chunk.chunk_idx() as u32);
        if complete {
            abi.release_chunk_as_complete(chunk).unwrap();
        } else {
            // Inflated: the last counted "packet" is the unfinished next one.
            chunk.increment_packet_count().unwrap();
        }
        at
    }

    /// Writes raw payload bytes into a new chunk claiming `count` packets (garbage allowed).
    pub fn write_raw_chunk(&mut self, writer: u16, count: u16, payload: &[u8]) -> (u32, u32) {
        let id = self.next_chunk_id(writer);
        let smb = self.smb();
        let abi = smb.producer_view(PageSize::Kib4).unwrap();
        let mut chunk = acquire_chunk(&abi, ChunkHeader::new(writer, id));
        for _ in 0..count {
            chunk.increment_packet_count().unwrap();
        }
        chunk.write_payload(0, payload).unwrap();
        let at = (chunk.page_idx() as u32, chunk.chunk_idx() as u32);
        abi.release_chunk_as_complete(chunk).unwrap();
        at
    }

    /// The state of a chunk of the SMB.
    pub fn chunk_state(&mut self, at: (u32, u32)) -> tachyon_abi::ChunkState {
        let smb = self.smb();
        let abi = smb.producer_view(PageSize::Kib4).unwrap();
        match abi.chunk_state(at.0 as usize, at.1 as usize) {
            // A page whose chunks are all free again goes back to unpartitioned.
            Err(tachyon_abi::AbiError::PageNotPartitioned) => tachyon_abi::ChunkState::Free,
            r => r.unwrap(),
        }
    }

    /// Payload bytes a chunk holds (Div4 of 4 KiB pages).
    pub fn chunk_payload_size() -> usize {
        PageSize::Kib4.chunk_size(PageLayout::Div4) - 8
    }

    /// Sends a CommitData moving the given chunks into `target_buffer`.
    pub fn commit(&self, chunks: &[(u32, u32)], target_buffer: u16) {
        let req = CommitRequest {
            chunks_to_move: chunks
                .iter()
                .map(|&(page, chunk)| ChunkToMove {
                    page,
                    chunk,
                    target_buffer,
                })
                .collect(),
            ..CommitRequest::default()
        };
        self.commit_request(&req);
    }

    pub fn commit_request(&self, req: &CommitRequest) {
        send_commit(&self.caller, req).unwrap();
    }

    /// Hangs up.
    pub fn disconnect(mut self) {
        self.caller.shutdown();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// A free Div4 chunk of the SMB, acquired for writing with `header`.
fn acquire_chunk<'a>(abi: &SharedMemoryAbi<'a>, header: ChunkHeader) -> Chunk<'a> {
    (0..abi.num_pages())
        .find_map(|page| {
            abi.try_acquire_any_chunk_for_writing(page, PageLayout::Div4, header)
                .ok()
        })
        .expect("a free chunk")
}

impl Drop for FakeProducer {
    fn drop(&mut self) {
        self.caller.shutdown();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

fn read_commands(
    mut replies: Replies,
    stream: u64,
    caller: Caller,
    b: Behaviour,
    tx: Sender<Cmd>,
    smb_tx: Sender<SharedMemory>,
) {
    while let Ok(Some(r)) = replies.recv() {
        if r.request_id != stream {
            continue;
        }
        let v = GetAsyncCommandResponseView::decode(&r.payload).unwrap();
        if v.has_setup_tracing() {
            let fd = r.fd.expect("setup_tracing carries the SMB");
            let smb = SharedMemory::map(fd, 4096, tachyon_abi::MAX_SMB_SIZE).unwrap();
            let _ = smb_tx.send(smb);
        } else if v.has_start_data_source() {
            let s = v.start_data_source().unwrap();
            let cfg = s.config().unwrap();
            let _ = tx.send(Cmd::Start {
                instance: s.new_instance_id(),
                target_buffer: cfg.target_buffer() as u16,
            });
        } else if v.has_stop_data_source() {
            let id = v.stop_data_source().unwrap().instance_id();
            if b.will_notify_on_stop && b.ack_stops {
                let mut buf = HeapBuffered::new();
                buf.root::<NotifyDataSourceStoppedRequest<'_>>()
                    .set_data_source_id(id);
                let _ = caller.invoke(
                    "NotifyDataSourceStopped",
                    &buf.serialize().unwrap(),
                    None,
                    true,
                );
            }
            let _ = tx.send(Cmd::Stop { instance: id });
        } else if v.has_flush() {
            let f: get_async_command_response::FlushView<'_> = v.flush().unwrap();
            let request_id = f.request_id();
            if b.ack_flushes {
                let req = CommitRequest {
                    flush_request_id: Some(request_id),
                    ..CommitRequest::default()
                };
                // The test may have hung up already.
                let _ = send_commit(&caller, &req);
            }
            let _ = tx.send(Cmd::Flush {
                request_id,
                instances: f.data_source_ids().collect::<Result<_, _>>().unwrap(),
            });
        } else if v.has_clear_incremental_state() {
            let c = v.clear_incremental_state().unwrap();
            let _ = tx.send(Cmd::Clear {
                instances: c.data_source_ids().collect::<Result<_, _>>().unwrap(),
            });
        }
    }
}

/// Connects to the producer socket and sends raw bytes (for malformed-frame tests).
pub fn raw_producer(socket: &Path) -> std::os::unix::net::UnixStream {
    std::os::unix::net::UnixStream::connect(socket).unwrap()
}

/// An unlinked temporary file for streaming tests (read back with [`read_all`]).
pub fn output_file() -> std::fs::File {
    static N: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "tachyon-traced-out-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let _ = std::fs::remove_file(&path);
    f
}

/// Reads a whole file through a fresh descriptor (its own offset).
pub fn read_all(f: &std::fs::File) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    std::fs::read(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap()
}

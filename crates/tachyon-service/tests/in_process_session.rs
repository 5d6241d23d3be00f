//! The in-process service end to end: a producer writes chunks into an `OwnedSmb` and commits
//! them over the channel; the service streams the trace to a file (`write_into_file`) or keeps
//! it in memory; the result is decoded with the generated views and checked for framing,
//! trusted fields and the final TraceStats.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use tachyon_abi::{ChunkHeader, ChunkToMove, CommitRequest, OwnedSmb, PageLayout, PageSize};
use tachyon_protos::{TracePacketView, TraceView};
use tachyon_service::{InProcessService, ProducerIdentity, SessionConfig};

/// Writes one chunk holding `packets` (each a serialized TracePacket) and returns its commit.
fn commit_packets(
    smb: &OwnedSmb,
    writer: u16,
    chunk_id: u32,
    packets: &[Vec<u8>],
) -> CommitRequest {
    try_commit_packets(smb, writer, chunk_id, packets).expect("a free chunk")
}

/// [`commit_packets`], or `None` when no chunk is free.
fn try_commit_packets(
    smb: &OwnedSmb,
    writer: u16,
    chunk_id: u32,
    packets: &[Vec<u8>],
) -> Option<CommitRequest> {
    let abi = smb.producer();
    let mut chunk = (0..abi.num_pages()).find_map(|p| {
        abi.try_acquire_any_chunk_for_writing(
            p,
            PageLayout::Div1,
            ChunkHeader::new(writer, chunk_id),
        )
        .ok()
    })?;
    let mut off = 0;
    for p in packets {
        chunk.increment_packet_count().unwrap();
        assert!(p.len() < 128);
        chunk.write_payload(off, &[p.len() as u8]).unwrap();
        chunk.write_payload(off + 1, p).unwrap();
        off += 1 + p.len();
    }
    let (page, idx) = (chunk.page_idx() as u32, chunk.chunk_idx() as u32);
    abi.release_chunk_as_complete(chunk).unwrap();
    Some(CommitRequest {
        chunks_to_move: vec![ChunkToMove {
            page,
            chunk: idx,
            target_buffer: 0,
        }],
        ..Default::default()
    })
}

fn packet(ts: u64) -> Vec<u8> {
    let mut buf = protozero::HeapBuffered::new();
    {
        let mut p: tachyon_protos::TracePacket<'_> = buf.root();
        p.set_timestamp(ts);
    }
    buf.serialize().unwrap()
}

/// A service for `config` over a buffer of 64 one-chunk pages, its producer pid 4242 and uid
/// 1000: the buffer, the commit sender and the service.
fn start(config: SessionConfig) -> (Arc<OwnedSmb>, mpsc::Sender<CommitRequest>, InProcessService) {
    let smb = Arc::new(OwnedSmb::new(64 * 4096, PageSize::Kib4).unwrap());
    let (tx, rx) = mpsc::channel();
    let identity = ProducerIdentity {
        pid: 4242,
        uid: 1000,
    };
    let service = InProcessService::start(config, smb.clone(), rx, identity).unwrap();
    (smb, tx, service)
}

/// Writes `packets` into the first chunk that comes free and returns its commit, calling `wait`
/// between tries (chunks come free as the service, or a pump, applies their commits); fails
/// if none does within 20 s.
fn commit_when_free(
    smb: &OwnedSmb,
    chunk_id: u32,
    packets: &[Vec<u8>],
    mut wait: impl FnMut(),
) -> CommitRequest {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(request) = try_commit_packets(smb, 1, chunk_id, packets) {
            return request;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "chunk {chunk_id}: no chunk came free in 20 s"
        );
        wait();
    }
}

/// An in-process service writing `<temp>/<name>-<pid>/trace.pftrace` (every `period`, and at
/// the stop), over a buffer of 64 one-chunk pages.
struct FileSession {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
    smb: Arc<OwnedSmb>,
    tx: mpsc::Sender<CommitRequest>,
    service: InProcessService,
}

fn file_session(name: &str, period: Duration) -> FileSession {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.pftrace");
    let config = SessionConfig {
        write_into_file: true,
        file_write_period: period,
        output_path: Some(path.clone()),
        ..SessionConfig::default()
    };
    let (smb, tx, service) = start(config);
    FileSession {
        dir,
        path,
        smb,
        tx,
        service,
    }
}

/// `n` packets with the timestamps after `*ts`, which moves past them.
fn next_packets(ts: &mut u64, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| {
            *ts += 1;
            packet(*ts)
        })
        .collect()
}

/// The packets after the service's own two at the start of every trace, which are checked:
/// the trace's uuid, then its config.
fn after_preamble<'p, 'b>(packets: &'p [TracePacketView<'b>]) -> &'p [TracePacketView<'b>] {
    assert!(packets.len() >= 2, "the service's uuid and config packets");
    let (uuid, config) = (&packets[0], &packets[1]);
    assert!(uuid.trace_uuid().unwrap().msb() != 0 || uuid.trace_uuid().unwrap().lsb() != 0);
    assert!(config.trace_config().unwrap().buffers().count() >= 1);
    for p in &packets[..2] {
        assert_eq!(
            p.trusted_packet_sequence_id(),
            1,
            "the service's own sequence"
        );
    }
    &packets[2..]
}

fn check_trace(bytes: &[u8], expected_packets: usize) {
    let trace = TraceView::decode(bytes).expect("a well-formed Trace");
    let all: Vec<TracePacketView<'_>> = trace.packet().map(|p| p.unwrap()).collect();
    let packets = after_preamble(&all);
    assert_eq!(
        packets.len(),
        expected_packets + 1,
        "data packets plus the TraceStats packet"
    );
    let mut last_ts = 0;
    for p in &packets[..expected_packets] {
        assert_eq!(p.trusted_pid(), 4242);
        assert_eq!(p.trusted_uid(), 1000);
        assert!(
            p.trusted_packet_sequence_id() >= 2,
            "1 is the service's own sequence"
        );
        assert!(p.timestamp() > last_ts, "in order within the sequence");
        last_ts = p.timestamp();
    }
    let stats = packets.last().unwrap();
    assert_eq!(stats.trusted_packet_sequence_id(), 1);
    let ts = stats.trace_stats().unwrap();
    let bufs: Vec<_> = ts.buffer_stats().map(|b| b.unwrap()).collect();
    assert_eq!(bufs.len(), 1);
    assert_eq!(bufs[0].chunks_written(), bufs[0].chunks_read());
    assert_eq!(bufs[0].chunks_overwritten(), 0);
    assert!(
        bufs[0].has_trace_writer_packet_loss(),
        "zeros are written too"
    );
    // The one sequence, and the buffer it wrote into.
    let writers: Vec<_> = ts.writer_stats().map(|w| w.unwrap()).collect();
    assert_eq!(writers.len(), 1);
    assert_eq!(
        writers[0].sequence_id(),
        packets[0].trusted_packet_sequence_id() as u64
    );
    assert_eq!(writers[0].buffer(), 0);
}

fn run(config: SessionConfig, chunks: u32) -> (Vec<u8>, usize) {
    let (smb, tx, service) = start(config);
    let mut ts = 1;
    for id in 0..chunks {
        let packets = next_packets(&mut ts, 10);
        tx.send(commit_packets(&smb, 1, id, &packets)).unwrap();
        if id % 10 == 9 {
            assert!(service.flush(false, Duration::from_secs(5)));
        }
    }
    drop(tx);
    (service.stop(false).unwrap(), chunks as usize * 10)
}

#[test]
fn in_memory_trace_at_stop() {
    let (bytes, n) = run(SessionConfig::default(), 50);
    check_trace(&bytes, n);
}

#[test]
fn streamed_to_file_while_tracing() {
    let dir = std::env::temp_dir().join(format!("tachyon-session-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.pftrace");
    let config = SessionConfig {
        write_into_file: true,
        file_write_period: Duration::from_millis(100),
        output_path: Some(path.clone()),
        ..SessionConfig::default()
    };
    let (mem, n) = run(config, 200);
    assert!(mem.is_empty(), "a file session returns nothing in memory");
    let bytes = std::fs::read(&path).unwrap();
    check_trace(&bytes, n);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Commits applied through a `CommitPump` from other threads, while the service thread applies
/// some itself and streams every millisecond: every packet in the trace once, in order, and the
/// buffer's 64 chunks reused about five times over (a commit a pump took and dropped would leave
/// its chunk taken: the producer then finds none free, and the test fails at its deadline).
#[test]
#[cfg_attr(miri, ignore = "threads and files; too slow under Miri")]
fn commits_applied_by_pumps_on_other_threads_keep_order_and_free_their_chunks() {
    // Below what a trace config may ask (100 ms): streaming steps between the pumps.
    let session = file_session("tachyon-pump", Duration::from_millis(1));
    let pump = session.service.commit_pump();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let other = {
        let (pump, done) = (pump.clone(), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut applied = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                applied += pump.apply_waiting();
                std::thread::yield_now();
            }
            applied
        })
    };
    const CHUNKS: u32 = 300;
    let mut ts = 1;
    let mut applied_here = 0;
    for id in 0..CHUNKS {
        let packets = next_packets(&mut ts, 10);
        // The chunks come free as their commits are applied, by whichever thread.
        let request = commit_when_free(&session.smb, id, &packets, || {
            applied_here += pump.apply_waiting();
            std::thread::yield_now();
        });
        if id % 50 == 49 {
            // Room for the service thread's streaming steps.
            std::thread::sleep(Duration::from_millis(2));
        }
        session.tx.send(request).unwrap();
        applied_here += pump.apply_waiting();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let applied_there = other.join().unwrap();
    assert!(
        applied_here + applied_there <= CHUNKS as usize,
        "a commit is applied once"
    );
    assert!(
        applied_here + applied_there > 0,
        "the pumps applied commits the service thread had not taken yet"
    );
    drop(session.tx);
    let mem = session.service.stop(false).unwrap();
    assert!(mem.is_empty());
    assert_eq!(
        pump.apply_waiting(),
        0,
        "a pump does nothing once the session stopped"
    );
    check_trace(&std::fs::read(&session.path).unwrap(), CHUNKS as usize * 10);
    std::fs::remove_dir_all(&session.dir).unwrap();
}

#[test]
fn trace_config_is_read() {
    // buffers { size_kb: 1024 fill_policy: DISCARD } data_sources { config { name: "track_event"
    // target_buffer: 0 } } duration_ms: 1500 write_into_file: true file_write_period_ms: 50
    let mut buf = protozero::HeapBuffered::new();
    {
        let mut c: tachyon_protos::TraceConfig<'_> = buf.root();
        {
            let mut b = c.add_buffers();
            b.set_size_kb(1024);
            b.set_fill_policy(tachyon_protos::trace_config::buffer_config::FillPolicy::Discard);
        }
        {
            let mut ds = c.add_data_sources();
            let mut cfg = ds.set_config();
            cfg.set_name("track_event");
            cfg.set_target_buffer(0);
        }
        c.set_duration_ms(1500);
        c.set_write_into_file(true);
        c.set_file_write_period_ms(50);
    }
    let cfg = SessionConfig::from_trace_config(&buf.serialize().unwrap()).unwrap();
    assert_eq!(cfg.buffers[0].size_bytes, 1 << 20);
    assert_eq!(cfg.buffers[0].policy, tachyon_service::FillPolicy::Discard);
    assert_eq!(cfg.data_sources[0].name, "track_event");
    assert_eq!(cfg.duration, Some(Duration::from_millis(1500)));
    assert!(cfg.write_into_file);
    assert_eq!(
        cfg.file_write_period,
        Duration::from_millis(100),
        "clamped to the minimum"
    );

    // A data source targeting a buffer that does not exist is an error, not a crash.
    let mut buf = protozero::HeapBuffered::new();
    {
        let mut c: tachyon_protos::TraceConfig<'_> = buf.root();
        c.add_buffers().set_size_kb(64);
        c.add_data_sources().set_config().set_target_buffer(3);
    }
    assert!(SessionConfig::from_trace_config(&buf.serialize().unwrap()).is_err());
    assert!(SessionConfig::from_trace_config(&[0x0a, 0x05]).is_err());
}

/// The trace's `trace_config` packet: the config the session was read from, verbatim; for a
/// config built in code, an encoding of it that reads back as the same session.
#[test]
fn the_trace_config_packet_says_what_the_session_does() {
    let mut buf = protozero::HeapBuffered::new();
    {
        let mut c: tachyon_protos::TraceConfig<'_> = buf.root();
        c.add_buffers().set_size_kb(2048);
        c.add_data_sources().set_config().set_name("track_event");
        c.set_unique_session_name("kept verbatim");
    }
    let bytes = buf.serialize().unwrap();
    let read = SessionConfig::from_trace_config(&bytes).unwrap();
    assert_eq!(read.to_trace_config(), bytes);

    let built = SessionConfig {
        buffers: vec![
            tachyon_service::BufferSpec {
                size_bytes: 4 << 20,
                policy: tachyon_service::FillPolicy::Discard,
            },
            tachyon_service::BufferSpec {
                size_bytes: 1 << 20,
                policy: tachyon_service::FillPolicy::RingBuffer,
            },
        ],
        data_sources: vec![
            tachyon_service::DataSourceSpec::new("track_event", 1),
            tachyon_service::DataSourceSpec::new("linux.process_stats", 0),
        ],
        duration: Some(Duration::from_secs(3)),
        flush_period: Some(Duration::from_millis(250)),
        write_into_file: true,
        file_write_period: Duration::from_millis(500),
        max_file_size_bytes: Some(1 << 30),
        incremental_state_clear_period: Some(Duration::from_millis(750)),
        ..SessionConfig::default()
    };
    let encoded = built.to_trace_config();
    let back = SessionConfig::from_trace_config(&encoded).unwrap();
    assert_eq!(
        SessionConfig {
            trace_config: Vec::new(),
            data_sources: Vec::new(),
            ..back.clone()
        },
        SessionConfig {
            data_sources: Vec::new(),
            ..built.clone()
        }
    );
    let names: Vec<_> = back
        .data_sources
        .iter()
        .map(|d| (d.name.as_str(), d.target_buffer))
        .collect();
    assert_eq!(names, [("track_event", 1), ("linux.process_stats", 0)]);
}

/// A loss at the very end of a sequence, with no later packet to carry `previous_packet_dropped`,
/// is still in the trace: an empty packet on that sequence carries the loss bits.
#[test]
fn a_loss_at_the_end_of_a_sequence_is_marked() {
    let config = SessionConfig {
        buffers: vec![tachyon_service::BufferSpec {
            size_bytes: 8192,
            policy: tachyon_service::FillPolicy::Discard,
        }],
        ..SessionConfig::default()
    };
    // Three 4 KiB chunks into an 8 KiB DISCARD buffer: the third is refused.
    let (bytes, _) = run(config, 3);
    let trace = TraceView::decode(&bytes).expect("a well-formed Trace");
    let all: Vec<TracePacketView<'_>> = trace.packet().map(|p| p.unwrap()).collect();
    let packets = after_preamble(&all);
    assert_eq!(
        packets.len(),
        20 + 1 + 1,
        "data, the loss marker, TraceStats"
    );
    let marker = &packets[20];
    assert!(!marker.has_timestamp(), "the marker carries no data");
    assert_eq!(
        marker.trusted_packet_sequence_id(),
        packets[0].trusted_packet_sequence_id()
    );
    assert_eq!(marker.trusted_pid(), 4242);
    assert_eq!(
        marker.previous_packet_dropped(),
        1 | 2,
        "DATA_LOSS_PRESENT | READ_GAP"
    );
    let ts = packets[21].trace_stats().unwrap();
    let buf = ts.buffer_stats().next().unwrap().unwrap();
    assert_eq!(buf.chunks_discarded(), 1);
}

#[test]
fn a_streaming_reader_hands_its_vectors_back() {
    // What the live capture's service thread does: read out, take the records, give an
    // emptied vector back for the next read-out. The pieces make the same trace, and each
    // read-out after the first writes into the vector handed back the time before.
    let smb = Arc::new(OwnedSmb::new(64 * 4096, PageSize::Kib4).unwrap());
    let view = smb.service();
    let mut core = tachyon_service::ServiceCore::in_memory(SessionConfig {
        write_into_file: true,
        ..SessionConfig::default()
    });
    let producer = core.add_producer(ProducerIdentity {
        pid: 4242,
        uid: 1000,
    });
    let mut trace = Vec::new();
    let mut spare: Vec<u8> = Vec::with_capacity(64 << 10);
    let mut given_before: Option<*const u8> = None;
    let mut ts = 1;
    for id in 0..20 {
        let packets = next_packets(&mut ts, 10);
        core.commit(producer, &view, &commit_packets(&smb, 1, id, &packets));
        core.drain(false).unwrap();
        let given = spare.as_ptr();
        let records = core.take_output_into(std::mem::take(&mut spare));
        assert!(!records.is_empty());
        if let Some(p) = given_before {
            assert_eq!(records.as_ptr(), p, "read out into the vector handed back");
        }
        given_before = Some(given);
        trace.extend_from_slice(&records);
        spare = records;
    }
    core.end().unwrap();
    trace.extend_from_slice(&core.take_output());
    check_trace(&trace, 200);
}

/// A final read of a whole buffer into a file is written out in parts as it is read (the
/// staging buffer stays a few MiB instead of growing to the read's whole output): the file is
/// the same well-formed trace, every packet in order, whatever the parts' boundaries.
#[test]
#[cfg_attr(miri, ignore = "threads and files; too slow under Miri")]
fn a_large_final_read_into_a_file_is_written_in_parts() {
    // No periodic write during the run: the whole buffer is read at the stop.
    let session = file_session("tachyon-session-large", Duration::from_secs(3600));
    // 1 000 chunks of 400 packets: about 7 MiB of records, more than one part.
    let (chunks, per_chunk) = (1000u32, 400);
    let mut ts = 1;
    for id in 0..chunks {
        let packets = next_packets(&mut ts, per_chunk);
        // The service gives chunks back as it copies them: wait for a free one.
        let request = commit_when_free(&session.smb, id, &packets, || {
            std::thread::sleep(Duration::from_millis(1))
        });
        session.tx.send(request).unwrap();
    }
    drop(session.tx);
    let mem = session.service.stop(false).unwrap();
    assert!(mem.is_empty(), "a file session returns nothing in memory");
    let bytes = std::fs::read(&session.path).unwrap();
    assert!(bytes.len() > 5 << 20, "{} bytes", bytes.len());
    check_trace(&bytes, chunks as usize * per_chunk);
    std::fs::remove_dir_all(&session.dir).unwrap();
}

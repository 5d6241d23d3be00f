//! The in-process session end to end: 8 threads write through thread-local writers, exit, and
//! the session stops; the trace is decoded with the generated views and every packet written is
//! in it exactly once (or counted dropped), in order per sequence, with one sequence per thread.

use std::collections::HashMap;

use tachyon::backend::{InProcessSession, SessionConfig};
use tachyon_protos::{trace_stats, track_event, TraceView};
use tachyon_service::SERVICE_SEQUENCE_ID;

const THREADS: u64 = 8;
const PACKETS: u64 = 5000;

#[test]
fn eight_threads_into_an_in_process_session() {
    let session = InProcessSession::start(SessionConfig::default()).unwrap();
    let arbiter = session.arbiter().clone();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let arbiter = arbiter.clone();
            std::thread::spawn(move || {
                for i in 0..PACKETS {
                    arbiter.with_thread_writer(0, |w| {
                        let mut handle = w.new_trace_packet();
                        let mut p = handle.packet();
                        p.set_timestamp(t * 1_000_000 + i);
                        let mut ev = p.set_track_event();
                        ev.set_type(track_event::Type::Instant);
                        ev.set_track_uuid(t);
                        ev.set_name("tick");
                    });
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let report = session.stop().unwrap();
    assert_eq!(report.writers_still_active, 0);

    let trace = TraceView::decode(&report.trace).unwrap();
    let mut per_sequence: HashMap<u32, Vec<u64>> = HashMap::new();
    let (mut stats_packets, mut uuids, mut configs) = (0, 0, 0);
    for p in trace.packet() {
        let p = p.unwrap();
        if p.has_trace_stats() {
            stats_packets += 1;
            continue;
        }
        // The service's own packets at the start: the trace's uuid and its config.
        if p.has_trace_uuid() || p.has_trace_config() {
            assert_eq!(p.trusted_packet_sequence_id(), SERVICE_SEQUENCE_ID);
            uuids += p.has_trace_uuid() as u32;
            if p.has_trace_config() {
                configs += 1;
                let config = p.trace_config().unwrap();
                assert_eq!(config.buffers().count(), 1);
            }
            continue;
        }
        assert_eq!(p.trusted_pid(), std::process::id() as i32);
        assert_eq!(p.track_event().unwrap().name().unwrap(), "tick");
        per_sequence
            .entry(p.trusted_packet_sequence_id())
            .or_default()
            .push(p.timestamp());
    }
    assert_eq!((stats_packets, uuids, configs), (1, 1, 1));
    assert_eq!(
        final_flush_outcome(&report.trace),
        Some(trace_stats::FinalFlushOutcome::FinalFlushSucceeded)
    );
    assert_eq!(
        per_sequence.len(),
        THREADS as usize,
        "one sequence per thread"
    );
    let mut read = 0;
    for ts in per_sequence.values() {
        assert!(
            ts.windows(2).all(|w| w[0] < w[1]),
            "in order within a sequence"
        );
        let thread = ts[0] / 1_000_000;
        assert!(
            ts.iter().all(|t| t / 1_000_000 == thread),
            "one thread per sequence"
        );
        read += ts.len() as u64;
    }
    assert_eq!(read + report.arbiter.packets_dropped, THREADS * PACKETS);
}

/// `flush_period_ms` with `write_into_file`: a thread writing far less than a chunk still
/// reaches the file while the session runs (without the periodic flush it would only commit
/// when its chunk fills, which these few small packets never do).
#[test]
fn periodic_flush_streams_a_slow_writer() {
    let dir = std::env::temp_dir().join(format!("tachyon-periodic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.pftrace");
    let config = SessionConfig {
        write_into_file: true,
        file_write_period: std::time::Duration::from_millis(100),
        flush_period: Some(std::time::Duration::from_millis(50)),
        output_path: Some(path.clone()),
        ..SessionConfig::default()
    };
    let session = InProcessSession::start(config).unwrap();
    let arbiter = session.arbiter().clone();
    // The writer writes one small packet each time it is told to, and stays alive.
    let (tell, told) = std::sync::mpsc::channel::<bool>();
    let writer = std::thread::spawn(move || {
        let mut i = 0;
        while told.recv() == Ok(true) {
            i += 1;
            arbiter.with_thread_writer(0, |w| w.new_trace_packet().packet().set_timestamp(i));
        }
    });
    let mut seen = 0;
    for _ in 0..200 {
        tell.send(true).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let bytes = std::fs::read(&path).unwrap_or_default();
        seen = protozero::ProtoDecoder::new(&bytes)
            .filter(|f| f.is_ok())
            .count();
        if seen > 0 {
            break;
        }
    }
    // At most 200 packets of ~7 bytes: well under one 4 KiB chunk.
    assert!(seen > 0, "nothing was streamed while the session ran");
    tell.send(false).unwrap();
    writer.join().unwrap();
    session.stop().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The `final_flush_outcome` of the trace's `TraceStats`.
fn final_flush_outcome(trace: &[u8]) -> Option<trace_stats::FinalFlushOutcome> {
    let trace = TraceView::decode(trace).unwrap();
    let mut outcome = None;
    for p in trace.packet() {
        let p = p.unwrap();
        if p.has_trace_stats() {
            outcome = p.trace_stats().unwrap().final_flush_outcome();
        }
    }
    outcome
}

/// A thread that keeps its writer, idle, across the stop: its unfinished chunk never reaches
/// the service (the in-process service does not read chunks a live writer may be writing), and
/// the trace says so: the final flush failed, as Perfetto's `traced_final_flush_failed` reports.
#[test]
fn a_writer_idle_across_the_stop_marks_the_final_flush_failed() {
    let config = SessionConfig {
        flush_timeout: std::time::Duration::from_millis(50),
        ..SessionConfig::default()
    };
    let session = InProcessSession::start(config).unwrap();
    let arbiter = session.arbiter().clone();
    let (wrote_tx, wrote_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let idle = std::thread::spawn(move || {
        let mut w = arbiter.create_trace_writer(0).unwrap();
        {
            let mut handle = w.new_trace_packet();
            let mut p = handle.packet();
            p.set_timestamp(7);
            p.set_track_event().set_name("unfinished");
        }
        wrote_tx.send(()).unwrap();
        // Holds the writer (and its chunk) until the session has stopped.
        release_rx.recv().unwrap();
        drop(w);
    });
    wrote_rx.recv().unwrap();
    let report = session.stop().unwrap();
    release_tx.send(()).unwrap();
    idle.join().unwrap();
    assert_eq!(report.writers_still_active, 1);
    assert_eq!(
        final_flush_outcome(&report.trace),
        Some(trace_stats::FinalFlushOutcome::FinalFlushFailed)
    );
}

//! A session from EnableTracing to FreeBuffers over real sockets and a real memfd SMB: packets
//! committed by producers come back with the kernel's pid and uid of the producer, one
//! sequence per writer, followed by the daemon's TraceStats.

mod support;

use std::time::Duration;

use support::*;
use tachyon_traced::Consumer;

#[test]
fn committed_packets_come_back_with_trusted_pid_and_uid() {
    let (_dir, daemon) = daemon("lifecycle");
    let mut producer = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    consumer
        .enable_tracing(&Config::simple(256, "test.source").encode(), None)
        .unwrap();
    let (_, buffer) = producer.wait_start();
    let chunk = producer.write_chunk(1, &[packet(1, 0), packet(2, 10), packet(3, 0)], true);
    producer.commit(&[chunk], buffer);
    let chunk = producer.write_chunk(1, &[packet(4, 0)], true);
    producer.commit(&[chunk], buffer);

    consumer.disable_tracing().unwrap();
    let end = consumer
        .wait_for_end(Some(TIMEOUT))
        .unwrap()
        .expect("the session ends");
    assert_eq!(end.error, None);
    let mut trace = Vec::new();
    consumer.read_buffers(&mut trace).unwrap();
    let read = packets(&trace);
    let ours: Vec<&Read> = read.iter().filter(|p| p.timestamp.is_some()).collect();
    assert_eq!(
        ours.iter()
            .map(|p| p.timestamp.unwrap())
            .collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    for p in &ours {
        assert_eq!(
            p.pid,
            Some(std::process::id() as i32),
            "trusted_pid is SO_PEERCRED's"
        );
        assert_eq!(p.uid, Some(my_uid()));
        assert_eq!(p.sequence, ours[0].sequence);
    }
    assert!(
        ours[0].sequence.unwrap() > 1,
        "1 is the service's own sequence"
    );
    assert!(
        read.last().unwrap().is_stats,
        "the trace ends with TraceStats"
    );
    let s = stats(&trace_stats(&trace));
    assert_eq!(s.buffers.len(), 1);
    assert_eq!(s.buffers[0].0, 2, "two chunks written");
    assert_eq!(s.chunks_discarded, 0);
    assert!(s.flushes_requested >= 1, "the stop flushes");

    // Nothing more to read; then the session is gone.
    let mut again = Vec::new();
    consumer.read_buffers(&mut again).unwrap();
    assert!(again.is_empty());
    consumer.free_buffers().unwrap();
    assert!(
        consumer.read_buffers(&mut again).is_err(),
        "no session after FreeBuffers"
    );
    let st = daemon.stats();
    assert_eq!(st.producers_connected, 1);
    assert_eq!(st.sessions_started, 1);
    wait_until("the session to be freed", || {
        daemon.stats().sessions_active == 0
    });
}

#[test]
fn two_producers_write_separate_sequences_into_one_trace() {
    let (_dir, daemon) = daemon("two-producers");
    let mut a = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    consumer
        .enable_tracing(&Config::simple(256, "test.source").encode(), None)
        .unwrap();
    // The second producer connects while the session runs: it is started too.
    let mut b = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let (_, buf_a) = a.wait_start();
    let (_, buf_b) = b.wait_start();
    assert_eq!(buf_a, buf_b, "one session, one buffer");
    for i in 0..5u64 {
        let c = a.write_chunk(1, &[packet(100 + i, 0)], true);
        a.commit(&[c], buf_a);
        let c = b.write_chunk(1, &[packet(200 + i, 0)], true);
        b.commit(&[c], buf_b);
    }
    consumer.disable_tracing().unwrap();
    consumer.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
    let mut trace = Vec::new();
    consumer.read_buffers(&mut trace).unwrap();
    let read = packets(&trace);
    let seq_of = |lo: u64| {
        let seqs: Vec<u32> = read
            .iter()
            .filter(|p| p.timestamp.is_some_and(|t| (lo..lo + 100).contains(&t)))
            .map(|p| p.sequence.unwrap())
            .collect();
        assert_eq!(seqs.len(), 5);
        assert!(seqs.iter().all(|s| *s == seqs[0]));
        seqs[0]
    };
    assert_ne!(
        seq_of(100),
        seq_of(200),
        "same writer id, different producers"
    );
    let ts: Vec<u64> = timestamps(&trace);
    let mut a_ts: Vec<u64> = ts.iter().copied().filter(|t| *t < 200).collect();
    let b_ts: Vec<u64> = ts.iter().copied().filter(|t| *t >= 200).collect();
    assert_eq!(a_ts, [100, 101, 102, 103, 104], "per-sequence order");
    assert_eq!(b_ts, [200, 201, 202, 203, 204]);
    a_ts.extend(b_ts);
    assert_eq!(a_ts.len(), 10);
    assert_eq!(stats(&trace_stats(&trace)).producers_connected, 2);
}

#[test]
fn a_bad_config_is_refused_with_a_reason() {
    let (_dir, daemon) = daemon("bad-config");
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    // No buffers.
    let e = consumer
        .enable_tracing(&Config::default().encode(), None)
        .unwrap_err();
    assert!(e.to_string().contains("no buffers"), "{e}");
    // write_into_file without a descriptor.
    let mut c = Config::simple(64, "x");
    c.write_into_file = true;
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    let e = consumer.enable_tracing(&c.encode(), None).unwrap_err();
    assert!(e.to_string().contains("descriptor"), "{e}");
    // Buffers too large in all.
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    let c = Config {
        buffers: vec![(1 << 20, false), (1 << 20, false)],
        ..Config::default()
    };
    let e = consumer.enable_tracing(&c.encode(), None).unwrap_err();
    assert!(e.to_string().contains("at most"), "{e}");
    assert_eq!(daemon.stats().requests_refused, 3);
    // A refused consumer may try again.
    consumer
        .enable_tracing(&Config::simple(64, "x").encode(), None)
        .unwrap();
    consumer.disable_tracing().unwrap();
    consumer.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
}

#[test]
fn duration_ends_the_session_and_a_late_producer_is_stopped() {
    let (_dir, daemon) = daemon("duration");
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    let mut c = Config::simple(64, "test.source");
    c.duration_ms = 300;
    consumer.enable_tracing(&c.encode(), None).unwrap();
    let mut p = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let (instance, buffer) = p.wait_start();
    let chunk = p.write_chunk(3, &[packet(7, 0)], true);
    p.commit(&[chunk], buffer);
    let end = consumer.wait_for_end(Some(TIMEOUT)).unwrap();
    assert_eq!(end, Some(tachyon_traced::SessionEnd { error: None }));
    match p.wait_for("StopDataSource", |c| matches!(c, Cmd::Stop { .. })) {
        Cmd::Stop { instance: i } => assert_eq!(i, instance),
        _ => unreachable!(),
    }
    let mut trace = Vec::new();
    consumer.read_buffers(&mut trace).unwrap();
    assert_eq!(timestamps(&trace), [7]);
}

#[test]
fn a_consumer_hanging_up_frees_its_session_and_stops_its_data_sources() {
    let (_dir, daemon) = daemon("consumer-gone");
    let mut p = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    consumer
        .enable_tracing(&Config::simple(64, "test.source").encode(), None)
        .unwrap();
    let (instance, _) = p.wait_start();
    drop(consumer);
    match p.wait_for("StopDataSource", |c| matches!(c, Cmd::Stop { .. })) {
        Cmd::Stop { instance: i } => assert_eq!(i, instance),
        _ => unreachable!(),
    }
    wait_until("the session to be freed", || {
        daemon.stats().sessions_active == 0
    });
    // The daemon keeps serving.
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    consumer
        .enable_tracing(&Config::simple(64, "test.source").encode(), None)
        .unwrap();
    let (second, _) = p.wait_start();
    assert_ne!(second, instance);
    consumer.disable_tracing().unwrap();
    consumer.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
}

#[test]
fn incremental_state_clears_reach_data_sources_that_handle_them() {
    let (_dir, daemon) = daemon("clear");
    let behaviour = Behaviour {
        handles_incremental_state_clear: true,
        ..Behaviour::default()
    };
    let mut p = FakeProducer::connect(daemon.producer_socket(), behaviour);
    let mut plain = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    let mut c = Config::simple(64, "test.source");
    c.clear_period_ms = 50;
    consumer.enable_tracing(&c.encode(), None).unwrap();
    let (instance, _) = p.wait_start();
    plain.wait_start();
    for _ in 0..2 {
        match p.wait_for("ClearIncrementalState", |c| matches!(c, Cmd::Clear { .. })) {
            Cmd::Clear { instances } => assert_eq!(instances, [instance]),
            _ => unreachable!(),
        }
    }
    consumer.disable_tracing().unwrap();
    consumer.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
    // The producer without `handles_incremental_state_clear` never got one.
    std::thread::sleep(Duration::from_millis(50));
    while let Some(c) = try_command(&mut plain) {
        assert!(!matches!(c, Cmd::Clear { .. }), "{c:?}");
    }
}

/// `producer_name_filter` and `producer_name_regex_filter` pick the producers that run a data
/// source (by `InitializeConnection.producer_name`); a bad pattern is refused.
#[test]
fn producer_name_filters_pick_the_producers() {
    let (_dir, daemon) = daemon("name-filter");
    let named = |name: &str| Behaviour {
        name: name.into(),
        ..Behaviour::default()
    };
    let mut alpha = FakeProducer::connect(daemon.producer_socket(), named("alpha"));
    let mut beta = FakeProducer::connect(daemon.producer_socket(), named("beta"));
    let mut gamma = FakeProducer::connect(daemon.producer_socket(), named("gamma.1"));
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    let config = Config {
        producer_name_filter: vec!["alpha".into()],
        // Whole-name matches: "gamma" alone would not match "gamma.1".
        producer_name_regex_filter: vec![r"gamma\.\d+".into(), "bet".into()],
        ..Config::simple(256, "test.source")
    };
    consumer.enable_tracing(&config.encode(), None).unwrap();
    alpha.wait_start();
    gamma.wait_start();
    // Every started instance acknowledges the flush, so by its end beta would have had its
    // start command too.
    assert!(consumer.flush(TIMEOUT).unwrap());
    let beta_got = beta.received_now();
    assert!(
        !beta_got.iter().any(|c| matches!(c, Cmd::Start { .. })),
        "beta is filtered out: {beta_got:?}"
    );
    consumer.disable_tracing().unwrap();
    consumer.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();

    let bad = Config {
        producer_name_regex_filter: vec!["(unclosed".into()],
        ..Config::simple(256, "test.source")
    };
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    let err = consumer.enable_tracing(&bad.encode(), None).unwrap_err();
    assert!(
        err.to_string().contains("producer_name_regex_filter"),
        "{err}"
    );
}

/// The daemon bounds the memory of all sessions' buffers together: a session that would go
/// beyond is refused with a reason, and fits again once another session has ended.
#[test]
fn buffer_memory_is_bounded_across_sessions() {
    let (_dir, daemon) = daemon_with("buffer-cap", |c| c.max_buffer_bytes = 1 << 20);
    let mut first = Consumer::connect(daemon.consumer_socket()).unwrap();
    first
        .enable_tracing(&Config::simple(768, "x").encode(), None)
        .unwrap();
    let mut second = Consumer::connect(daemon.consumer_socket()).unwrap();
    let e = second
        .enable_tracing(&Config::simple(512, "x").encode(), None)
        .unwrap_err();
    assert!(e.to_string().contains("limit of 1048576 bytes"), "{e}");
    first.disable_tracing().unwrap();
    first.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
    drop(first);
    let mut second = Consumer::connect(daemon.consumer_socket()).unwrap();
    wait_until("the first session's buffers are freed", || {
        second
            .enable_tracing(&Config::simple(512, "x").encode(), None)
            .is_ok()
    });
    second.disable_tracing().unwrap();
    second.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
}

fn try_command(p: &mut FakeProducer) -> Option<Cmd> {
    // Stop is the last command the plain producer gets.
    match p.next_command() {
        Cmd::Stop { .. } => None,
        c => Some(c),
    }
}

#[test]
fn sockets_have_their_modes_and_shutdown_cleans_up() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, daemon) = daemon("shutdown");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(daemon.producer_socket()), 0o666);
    assert_eq!(mode(daemon.consumer_socket()), 0o600);
    // A second daemon on the same sockets is refused while the first lives.
    let e = tachyon_traced::Daemon::start(tachyon_traced::DaemonConfig::in_dir(dir.path()))
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);

    let mut p = FakeProducer::connect(daemon.producer_socket(), Behaviour::default());
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    consumer
        .enable_tracing(&Config::simple(64, "test.source").encode(), None)
        .unwrap();
    p.wait_start();
    let (producer_socket, consumer_socket) = (
        daemon.producer_socket().to_path_buf(),
        daemon.consumer_socket().to_path_buf(),
    );
    daemon.shutdown();
    assert!(!producer_socket.exists() && !consumer_socket.exists());
    // The consumer learns why its session ended.
    let end = consumer.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
    assert!(end.error.unwrap().contains("shut down"));
    // A new daemon can take the same paths.
    let again =
        tachyon_traced::Daemon::start(tachyon_traced::DaemonConfig::in_dir(dir.path())).unwrap();
    again.shutdown();
}

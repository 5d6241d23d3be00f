//! The daemon's built-in data sources (`linux.process_stats`, `linux.sys_stats` of
//! `tachyon-probes`), run as the daemon's own producer with its pid and uid.

mod support;

use protozero::{HeapBuffered, ProtoDecoder};
use support::*;
use tachyon_processor::{Options, TraceProcessor, Value};
use tachyon_protos::TraceConfig;
use tachyon_traced::Consumer;

fn config() -> Vec<u8> {
    let mut buf = HeapBuffered::new();
    {
        let mut c: TraceConfig<'_> = buf.root();
        c.add_buffers().set_size_kb(4096);
        {
            let mut ds = c.add_data_sources();
            ds.set_config().set_name("linux.process_stats");
        }
        {
            let mut ds = c.add_data_sources();
            let mut cfg = ds.set_config();
            cfg.set_name("linux.sys_stats");
            let mut s = cfg.set_sys_stats_config();
            s.set_stat_period_ms(50);
        }
        // A producer data source nobody offers: harmless.
        c.add_data_sources()
            .set_config()
            .set_name("nobody.offers.this");
    }
    buf.serialize().unwrap()
}

#[test]
fn process_and_system_stats_come_from_the_daemon_itself() {
    let (_dir, daemon) = daemon_with("builtin", |c| c.builtin_data_sources = true);
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    consumer.enable_tracing(&config(), None).unwrap();
    // The probes commit after every poll: read while the session runs until a poll came in.
    let mut trace = Vec::new();
    let count = |trace: &[u8]| {
        let (mut trees, mut sys) = (0, 0);
        for f in ProtoDecoder::new(trace).map_while(Result::ok) {
            let p = f.as_message();
            trees += p.find_field(2).is_some() as usize;
            sys += p.find_field(7).is_some() as usize;
        }
        (trees, sys)
    };
    wait_until("a process tree and two sys stats samples", || {
        consumer.read_buffers(&mut trace).unwrap();
        let (trees, sys) = count(&trace);
        trees >= 1 && sys >= 2
    });
    consumer.disable_tracing().unwrap();
    consumer.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
    consumer.read_buffers(&mut trace).unwrap();

    for f in ProtoDecoder::new(&trace).map_while(Result::ok) {
        let p = f.as_message();
        if p.find_field(2).is_some() || p.find_field(7).is_some() {
            assert_eq!(
                p.find_last_field(79).map(|f| f.as_i32()),
                Some(std::process::id() as i32),
                "the daemon's pid"
            );
            assert_eq!(p.find_last_field(3).map(|f| f.as_i32()), Some(my_uid()));
        }
    }
    let (trees, sys) = count(&trace);
    assert!(trees >= 1, "a process tree at start");
    assert!(sys >= 2, "sys stats at start and polled: {sys}");
    assert_eq!(stats(&trace_stats(&trace)).chunks_discarded, 0);

    // Every pid has a name: this process is in the process table.
    let tp = TraceProcessor::from_bytes(&trace, &Options::default()).unwrap();
    let r = tp
        .query(&format!(
            "select count(*) from process where pid = {}",
            std::process::id()
        ))
        .unwrap();
    assert_eq!(r.rows[0][0], Value::Integer(1));
}

/// `clear_period_ms`: `linux.process_stats` writes its whole process tree again at every clear
/// (between clears only what changed), so a ring buffer that overwrote the first tree still
/// names every process.
#[test]
fn process_stats_writes_everything_again_at_each_clear() {
    let (_dir, daemon) = daemon_with("builtin-clear", |c| c.builtin_data_sources = true);
    let mut consumer = Consumer::connect(daemon.consumer_socket()).unwrap();
    let mut buf = HeapBuffered::new();
    {
        let mut c: TraceConfig<'_> = buf.root();
        c.add_buffers().set_size_kb(4096);
        c.add_data_sources()
            .set_config()
            .set_name("linux.process_stats");
        c.set_incremental_state_config().set_clear_period_ms(100);
    }
    consumer
        .enable_tracing(&buf.serialize().unwrap(), None)
        .unwrap();
    // Trees that list pid 1, which never changes: only the first scan and the clears write it.
    let with_init = |trace: &[u8]| {
        ProtoDecoder::new(trace)
            .map_while(Result::ok)
            .filter_map(|f| f.as_message().find_field(2))
            .filter(|tree| {
                tree.as_message()
                    .map_while(Result::ok)
                    .filter(|p| p.id() == 1)
                    .any(|p| p.as_message().find_field(1).map(|f| f.as_i32()) == Some(1))
            })
            .count()
    };
    let mut trace = Vec::new();
    wait_until("three trees with pid 1", || {
        consumer.read_buffers(&mut trace).unwrap();
        with_init(&trace) >= 3
    });
    consumer.disable_tracing().unwrap();
    consumer.wait_for_end(Some(TIMEOUT)).unwrap().unwrap();
}

//! Messages with call stacks (Tracy's `TracyMessageS`): `message!(callstack: N, ...)` and the
//! `warn!`/`info!`… forms carry N frames starting in the function the message is in; a plain
//! message carries none. Read back with Tachyon's processor.

use tachyon::{Config, Level};
use tachyon_processor::{Options, TraceProcessor, Value};

#[inline(never)]
fn logs_with_a_stack() {
    tachyon::message!(callstack: 4, "with a stack");
    std::hint::black_box(());
}

#[inline(never)]
fn warns_with_a_stack(n: u32) {
    tachyon::warn!(callstack: 3, "formatted {n}");
    std::hint::black_box(());
}

fn ints(tp: &TraceProcessor, sql: &str) -> Vec<i64> {
    tp.query(sql)
        .unwrap()
        .rows
        .iter()
        .map(|r| match r[0] {
            Value::Integer(n) => n,
            ref v => panic!("{sql}: {v:?}"),
        })
        .collect()
}

#[test]
fn messages_carry_the_stack_they_ask_for() {
    tachyon::start(Config::in_memory()).expect("start");
    logs_with_a_stack();
    warns_with_a_stack(7);
    tachyon::message!(level: Level::Error, "no stack");
    let report = tachyon::shutdown().expect("shutdown").expect("a session");
    let tp = TraceProcessor::from_bytes(&report.trace, &Options::default()).unwrap();

    let stack_of = |name: &str| {
        ints(
            &tp,
            &format!(
                "SELECT cs.depth FROM slice s \
                 JOIN __intrinsic_track_event_callstacks e ON e.slice_id = s.id \
                 JOIN stack_profile_callsite cs ON cs.id = e.callsite_id WHERE s.name = '{name}'"
            ),
        )
    };
    // The leaf callsite's depth is the number of frames minus one.
    assert_eq!(stack_of("info"), [3]);
    assert_eq!(stack_of("warn"), [2]);
    assert_eq!(
        stack_of("error"),
        Vec::<i64>::new(),
        "a plain message has none"
    );

    // The innermost frame is in the function that logged.
    for (level, f) in [
        ("info", logs_with_a_stack as fn() as usize),
        ("warn", warns_with_a_stack as fn(u32) as usize),
    ] {
        let module = tachyon::callstack::module_of(f as u64).expect("in a module");
        let start = module.rel_pc(f as u64) as i64;
        let leaf = ints(
            &tp,
            &format!(
                "SELECT f.rel_pc FROM slice s \
                 JOIN __intrinsic_track_event_callstacks e ON e.slice_id = s.id \
                 JOIN stack_profile_callsite cs ON cs.id = e.callsite_id \
                 JOIN stack_profile_frame f ON f.id = cs.frame_id WHERE s.name = '{level}'"
            ),
        );
        assert_eq!(leaf.len(), 1);
        assert!(
            leaf[0] > start && leaf[0] < start + 4096,
            "{level}: leaf {:#x}, function at {start:#x}",
            leaf[0]
        );
    }
}

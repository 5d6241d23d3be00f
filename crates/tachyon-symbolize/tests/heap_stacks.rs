//! Heap profiles with native call stacks (the tracking allocator's `ProfilePacket`s): the
//! symbolizer finds their frames (interned inside the profile packets, not in `InternedData`),
//! and the processor's memory summary names the function that leaked.

use tachyon::alloc::{MemoryConfig, MemoryMode, Tracked};

#[global_allocator]
static ALLOC: Tracked<std::alloc::System> = Tracked::new(std::alloc::System);

#[inline(never)]
fn leak_here_for_the_profile() {
    for _ in 0..3 {
        std::hint::black_box(Box::leak(vec![5u8; 3333].into_boxed_slice()));
    }
}

fn record(symbolize_at_end: bool) -> Vec<u8> {
    tachyon::start(tachyon::Config {
        symbolize: symbolize_at_end,
        memory: MemoryConfig {
            mode: MemoryMode::Exact,
            callstack_depth: Some(16),
            ..MemoryConfig::default()
        },
        ..tachyon::Config::in_memory()
    })
    .unwrap();
    leak_here_for_the_profile();
    tachyon::shutdown().unwrap().unwrap().trace
}

#[test]
fn leaks_are_named_by_the_function_that_leaked() {
    let trace = record(false);
    // Offline: the profile's frames are what the symbolizer collects.
    let frames = tachyon_symbolize::collect_frames(&trace).unwrap();
    let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
    let ours = frames
        .iter()
        .find(|(k, _)| k.path == exe.display().to_string())
        .unwrap_or_else(|| panic!("{frames:?}"));
    assert!(!ours.1.is_empty());
    // At the end of the session: the summary's leak is named.
    let trace = record(true);
    let tp = tachyon_processor::TraceProcessor::from_bytes(&trace, &Default::default()).unwrap();
    let report = tp.memory(20).unwrap();
    let global = report
        .iter()
        .find(|r| r.heap_name == "rust.global")
        .unwrap();
    let leak = global
        .top_live
        .iter()
        .find(|s| s.live_bytes == 3 * 3333)
        .unwrap_or_else(|| panic!("{:?}", global.top_live));
    assert!(
        leak.stack
            .iter()
            .any(|f| f.ends_with("leak_here_for_the_profile")),
        "{:?}",
        leak.stack
    );
    // The allocator's own frames are not the leaf: the leaf is the code that asked.
    let leaf = leak.stack.last().unwrap();
    assert!(!leaf.starts_with("tachyon::alloc"), "{:?}", leak.stack);
}

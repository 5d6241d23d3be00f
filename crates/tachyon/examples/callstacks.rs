//! Call stacks on events and CPU samples: zones that record the stack they run in, and a busy
//! loop sampled by the CPU-clock sampler. Writes `callstacks.pftrace`; symbolize it and look:
//!
//! ```text
//! cargo run -p tachyon --example callstacks
//! cargo run -p tachyon-cli -- symbolize callstacks.pftrace callstacks.sym.pftrace
//! cargo run -p tachyon-cli -- stats --samples callstacks.sym.pftrace
//! ```

#[inline(never)]
fn parse_record(i: u64) -> u64 {
    let _zone = tachyon::zone!("parse", callstack: 16);
    std::hint::black_box(i * 3)
}

#[inline(never)]
fn load_file(n: u64) -> u64 {
    tachyon::instant!("open", callstack);
    (0..n).map(parse_record).sum()
}

/// A loop that burns CPU where the sampler can see it.
#[inline(never)]
fn spin(iterations: u64) -> u64 {
    let mut x = 1u64;
    for i in 0..iterations {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

fn main() -> std::io::Result<()> {
    tachyon::start(tachyon::Config {
        output: Some("callstacks.pftrace".into()),
        sampling_hz: 1000,
        ..tachyon::Config::from_env()?
    })?;
    tachyon::set_process_name("callstacks");
    std::hint::black_box(load_file(10));
    std::hint::black_box(spin(50_000_000));
    let report = tachyon::shutdown()?.expect("the session ran");
    println!("{report}");
    Ok(())
}

//! Hello world with one zone: tracing from the environment (`TACHYON_OUT`, default
//! `trace.pftrace`), one zone, shutdown.

fn main() -> std::io::Result<()> {
    tachyon::init()?;
    {
        let _zone = tachyon::zone!("hello zone");
        println!("hello, world");
    }
    if let Some(report) = tachyon::shutdown()? {
        eprintln!("{report}");
    }
    Ok(())
}

//! Flows: arrows between events, across threads. A request is received on the main thread,
//! parsed on a `parser` thread and answered on a `responder` thread; one `Flow` per request
//! starts at the `receive` zone (`flow: f`), passes through `parse` (`flow: f`) and ends at
//! `respond` (`terminating_flow: f`). The Perfetto UI draws the arrows; the `flow` table of
//! `flows.pftrace` holds one row per hop:
//! `cargo run -p tachyon-cli -- query flows.pftrace "SELECT count(*) FROM flow"`.
//!
//! Run: `cargo run -p tachyon --example flows`

use std::sync::mpsc;
use std::thread;

use tachyon::Flow;

struct Request {
    id: u32,
    body: String,
    flow: Flow,
}

fn main() -> std::io::Result<()> {
    tachyon::start(tachyon::Config {
        output: Some("flows.pftrace".into()),
        ..tachyon::Config::from_env()?
    })?;
    tachyon::set_process_name("flows example");

    let (to_parser, parser_rx) = mpsc::channel::<Request>();
    let (to_responder, responder_rx) = mpsc::channel::<(Request, usize)>();

    let parser = thread::Builder::new()
        .name("parser".into())
        .spawn(move || {
            for req in parser_rx {
                let words = {
                    // The flow passes through this zone.
                    let _zone = tachyon::zone!("parse", flow: req.flow, id = req.id);
                    req.body.split_whitespace().count()
                };
                to_responder.send((req, words)).expect("responder alive");
            }
        })?;
    let responder = thread::Builder::new()
        .name("responder".into())
        .spawn(move || {
            for (req, words) in responder_rx {
                // ...and ends here.
                let _zone = tachyon::zone!(
                    "respond",
                    terminating_flow: req.flow,
                    id = req.id,
                    words = words
                );
                std::hint::black_box(format!("request {} had {words} words", req.id));
            }
        })?;

    for id in 0..20u32 {
        let flow = Flow::new();
        // The flow starts here.
        let _zone = tachyon::zone!("receive", flow: flow, id = id);
        let body = "lorem ipsum dolor sit amet ".repeat(1 + id as usize);
        to_parser
            .send(Request { id, body, flow })
            .expect("parser alive");
    }
    drop(to_parser);
    parser.join().expect("parser panicked");
    responder.join().expect("responder panicked");

    // `wrote FILE (N bytes, D packets dropped)`, or, in system mode (TACHYON_PRODUCER_SOCK),
    // what went to the daemon, which has the trace.
    let report = tachyon::shutdown()?.expect("tracing was started above");
    println!("{report}");
    Ok(())
}

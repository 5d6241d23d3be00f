//! `tachyon demo`: traces a multi-threaded workload (see `crate::demo`) into a file, then
//! loads the trace and prints what it holds: events and bytes written, losses, the busiest
//! zones. With `TACHYON_PRODUCER_SOCK` set it traces into that `tachyon traced` daemon instead
//! (system mode) and says what it sent; the trace is then the consumer's (`tachyon record`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tachyon_processor::{QueryResult, TraceProcessor, Value};

use crate::commands::stats::duration;
use crate::demo::{self, Settings, Summary};
use crate::load::{load, Sort};
use crate::output::{render, Format};

/// Run an instrumented producer/worker-pool workload, write its trace and summarize it.
///
/// The `TACHYON_*` environment variables still apply (buffer sizes, categories, ...);
/// `--out` sets where the trace goes. With `TACHYON_PRODUCER_SOCK` set, the demo traces into
/// that `tachyon traced` daemon instead (`--out` is then unused: the trace is the daemon's, e.g.
/// `tachyon record -o all.pftrace -- tachyon demo`).
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Where the trace is written.
    #[arg(long, default_value = "tachyon-demo.pftrace")]
    out: PathBuf,
    /// Worker threads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// How long the producer makes jobs, in seconds (the workers then drain the queue).
    #[arg(long, default_value_t = 2.0, value_parser = parse_seconds)]
    seconds: f64,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err(format!(
            "{s:?}: expected seconds, more than 0 and at most 3600"
        )),
    }
}

pub(crate) fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let config = tachyon::Config {
        output: Some(args.out.clone()),
        // Tracy's CPU usage plots (issue 16).
        cpu_usage: true,
        // The message names the variable; ConfigError's Display would add a second "tachyon:".
        ..tachyon::Config::from_env().map_err(|e| e.0)?
    };
    let out = args.out.display();
    let daemon = config.producer_socket.clone();
    let stacks = config.symbolize && (config.callstack_depth > 0 || config.sampling_hz > 0);
    tachyon::set_process_name("tachyon-demo");
    tachyon::start(config).map_err(|e| match &daemon {
        Some(socket) => format!(
            "no tachyon traced answers at {} (TACHYON_PRODUCER_SOCK): {e}",
            socket.display()
        ),
        None => format!("starting a trace into {out}: {e}"),
    })?;
    println!(
        "tachyon demo: 1 producer, {} worker(s), {} s of jobs",
        args.threads, args.seconds
    );
    let summary = demo::run(Settings {
        threads: usize::from(args.threads),
        duration: Duration::from_secs_f64(args.seconds),
    });
    // Stop tracing even if the workload failed.
    let report = tachyon::shutdown()
        .map_err(|e| format!("writing the trace {out}: {e}"))?
        .ok_or("the tracing session was stopped by someone else")?;
    let summary = summary?;
    print_workload(&summary);
    if let Some(memory) = &report.memory {
        println!("{memory}");
    }
    if let Some(system) = &report.system {
        print_system(&report, system);
        return Ok(());
    }
    if let Some(capture) = &report.capture {
        print_capture(&report, capture);
        return Ok(());
    }

    let path = report.path.as_deref().unwrap_or(&args.out);
    let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    if stacks {
        // Tracy's lazy symbolization: the addresses the session recorded, resolved once each
        // now that it has ended, from this very binary and its libraries.
        match tachyon_symbolize::symbolize_in_place(path, &tachyon_symbolize::Options::default()) {
            Ok(s) => {
                let (n, of) = s
                    .modules
                    .iter()
                    .fold((0, 0), |(n, of), m| (n + m.symbolized, of + m.addresses));
                println!("call stacks: {n} of {of} addresses symbolized");
            }
            Err(e) => eprintln!("tachyon: symbolizing the call stacks failed: {e}"),
        }
    }
    let tp = load(path, Sort::Full)?;
    let counts = event_counts(&tp)?;
    let loss = tp.data_loss()?;

    println!("trace: {}", abs.display());
    println!(
        "written: {} events in the trace ({} slices, {} instants, {} counter samples; plus {} flows), {} bytes",
        counts.slices + counts.instants + counts.counters,
        counts.slices,
        counts.instants,
        counts.counters,
        counts.flows,
        report.bytes
    );
    let w = &report.writers;
    if w.packets_dropped == 0 && report.writers_still_active == 0 && loss.is_empty() {
        println!(
            "losses: none (0 packets dropped by the writers, no data_loss or error in the trace's stats)"
        );
    } else {
        println!(
            "losses: {} packets dropped by the writers ({} episodes), {} thread(s) not flushed, {} data_loss/error stat(s) in the trace:",
            w.packets_dropped,
            w.drop_episodes,
            report.writers_still_active,
            loss.len()
        );
        for s in &loss {
            let idx = s.idx.map(|i| format!("[{i}]")).unwrap_or_default();
            println!("  {}{idx} = {} ({})", s.name, s.value, s.severity);
        }
    }
    println!("top zones by total time (zones on threads; the batches' async slices left out):");
    print!("{}", render(&top_zones(&tp, 5)?, Format::Table));
    println!(
        "open it in https://ui.perfetto.dev or run: tachyon stats {}",
        shell_path(&abs)
    );
    Ok(())
}

/// System mode: the trace is the daemon's, so say what went there instead of reading a file.
fn print_system(report: &tachyon::Report, s: &tachyon::SystemReport) {
    let w = &report.writers;
    println!(
        "traced into the daemon at {} (system mode): {} chunks committed, {} packets dropped by the writers ({} episodes)",
        s.socket.display(),
        w.chunks_committed,
        w.packets_dropped,
        w.drop_episodes
    );
    match s.data_sources_started {
        0 => println!(
            "the daemon ran no tracing session with track events while the demo ran: nothing was recorded (start one with tachyon record)"
        ),
        1 => println!("1 tracing session recorded the demo"),
        n => println!("{n} tracing sessions, one after the other, recorded the demo"),
    }
    if s.daemon_lost {
        println!(
            "the daemon went away during the run: tracing stopped then ({} commits could not be sent)",
            s.commits_dropped
        );
    }
    println!(
        "the trace is written by the consumer (tachyon record -o FILE), not by this process; summarize it with: tachyon stats FILE"
    );
}

/// Live capture (`TACHYON_LISTEN`): the trace went to `tachyon capture`; say what was sent.
fn print_capture(report: &tachyon::Report, c: &tachyon::CaptureReport) {
    let w = &report.writers;
    let addr = c.addr.map(|a| a.to_string()).unwrap_or_default();
    println!(
        "captured over {addr} (live capture): sent {} packets, {} bytes ({} on the wire) to {} capture(s); {} packets dropped by the writers ({} episodes)",
        c.records_sent, c.bytes_sent, c.wire_bytes, c.captures, w.packets_dropped, w.drop_episodes
    );
    if c.refused > 0 {
        println!("{} capture(s) refused", c.refused);
    }
    if c.never_captured {
        println!("no capture attached while the demo ran: nothing was sent (start one with tachyon capture -o FILE)");
    }
    if c.exit_send_timed_out {
        println!("the capture did not take the end of the trace in time: it was cut off");
    }
    println!("the trace is written by the capture (tachyon capture -o FILE), not by this process");
}

fn print_workload(s: &Summary) {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "workload: {} jobs in {} batches in {:.2} s, {:.1} MiB in, {:.1} MiB compressed out, {} cache hits, {} slow jobs, {} cache flushes, {} GC runs",
        s.jobs,
        s.batches,
        s.elapsed.as_secs_f64(),
        mib(s.bytes_in),
        mib(s.bytes_out),
        s.cache_hits,
        s.slow_jobs,
        s.cache_flushes,
        s.gc_runs
    );
}

/// What the trace holds, counted by the trace processor.
#[derive(Debug)]
pub(crate) struct Counts {
    /// Slices with a duration (zones and track slices, ended or not).
    pub(crate) slices: i64,
    /// Slices of zero duration.
    pub(crate) instants: i64,
    /// Rows of `counter`.
    pub(crate) counters: i64,
    /// Rows of `flow`.
    pub(crate) flows: i64,
}

pub(crate) fn event_counts(tp: &TraceProcessor) -> Result<Counts, Box<dyn std::error::Error>> {
    let r = tp.query(
        "SELECT (SELECT count(*) FROM slice WHERE dur != 0), \
                (SELECT count(*) FROM slice WHERE dur = 0), \
                (SELECT count(*) FROM counter), \
                (SELECT count(*) FROM flow)",
    )?;
    let int = |i: usize| match r.rows.first().and_then(|row| row.get(i)) {
        Some(Value::Integer(n)) => *n,
        _ => 0,
    };
    Ok(Counts {
        slices: int(0),
        instants: int(1),
        counters: int(2),
        flows: int(3),
    })
}

/// Per zone name on thread tracks: count, total and mean duration, the `n` largest totals.
/// (`tachyon stats` ranks every slice; here the batches' long, overlapping async slices would
/// push the threads' zones off a five-row table.)
pub(crate) fn top_zones(
    tp: &TraceProcessor,
    n: usize,
) -> Result<QueryResult, Box<dyn std::error::Error>> {
    let r = tp.query(&format!(
        "SELECT coalesce(s.name, '<unnamed>'), count(*), sum(s.dur), avg(s.dur) \
         FROM slice s JOIN thread_track t ON s.track_id = t.id WHERE s.dur > 0 \
         GROUP BY 1 ORDER BY 3 DESC LIMIT {n}"
    ))?;
    let ns = |v: &Value| match v {
        Value::Integer(i) => Value::Text(duration(*i as f64)),
        Value::Real(r) => Value::Text(duration(*r)),
        other => other.clone(),
    };
    Ok(QueryResult {
        columns: ["zone", "count", "total", "mean"]
            .map(String::from)
            .to_vec(),
        rows: r
            .rows
            .iter()
            .map(|row| vec![row[0].clone(), row[1].clone(), ns(&row[2]), ns(&row[3])])
            .collect(),
    })
}

/// The path as a shell word (quoted when it has anything but plain characters).
fn shell_path(p: &Path) -> String {
    let s = p.display().to_string();
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+,:@%".contains(c))
    {
        s
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

//! The workload `tachyon demo` traces: a producer thread makes jobs and sends them over a
//! channel to a pool of workers, which parse, transform and compress them; a metrics thread
//! samples throughput and runs a "GC" over the results log. Everything is real CPU work
//! (tokenizing, hashing, sorting, an LZ77-style compressor, a checksum); the only sleeps pace
//! the producer and the metrics thread.
//!
//! It is instrumented with every part of the API: zones with categories, arguments of every
//! type and a run-time (interned) name, nesting three deep; instants; counters with units
//! (`counter!` and a [`CounterTrack`] per worker); flows from the producer's `enqueue` zone to
//! the worker's `job` zone; a named track (`GC`) and one async track per batch of jobs, whose
//! slice is begun by the producer and ends on whichever worker finishes the batch's last job;
//! std thread names, [`tachyon::set_thread_name`] and [`tachyon::set_process_name`].
//!
//! Tracy's other instruments too: the workers share two [`tachyon::sync::Mutex`]es (the job
//! queue's receiver, held while waiting for a job, so the others wait for it; and the results
//! log, which the GC also takes) and read a [`tachyon::sync::RwLock`]; the producer marks a
//! frame per batch (`frame_mark!`) and its "read input" as a discontinuous frame set; log
//! messages at trace, debug, info and warn levels; a [`Plot`] of finished jobs (a delta
//! counter); zone text and values on each job; the program's information (`app_info!`); the
//! workers' thread names carry a group hint; the metrics thread reports through the `log`
//! crate, whose records the SDK's `log_bridge` records as messages.
//!
//! The caller starts and stops the tracing session; this module only records into it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tachyon::sync::{Mutex, RwLock};
use tachyon::{CounterTrack, Flow, Plot, PlotKind, Track, TrackSlice, Unit};

/// What to run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// Worker threads.
    pub(crate) threads: usize,
    /// How long the producer makes jobs (the workers then drain the queue).
    pub(crate) duration: Duration,
}

/// What the workload did (counted by the workload itself, not read from the trace).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Summary {
    pub(crate) jobs: u64,
    pub(crate) batches: u64,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    pub(crate) cache_hits: u64,
    pub(crate) slow_jobs: u64,
    pub(crate) cache_flushes: u64,
    pub(crate) gc_runs: u64,
    pub(crate) elapsed: Duration,
}

/// Jobs per batch (one async track each).
const BATCH: u64 = 8;
/// Jobs in flight before the producer blocks.
const QUEUE_CAPACITY: usize = 64;
/// Seeds the producer reuses, so that workers' caches hit now and then.
const POPULAR_SEEDS: u64 = 12;
/// A worker clears its cache at this many entries.
const CACHE_CAPACITY: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Text,
    Json,
    Csv,
    Log,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Text, Kind::Json, Kind::Csv, Kind::Log];

    fn name(self) -> &'static str {
        match self {
            Kind::Text => "text",
            Kind::Json => "json",
            Kind::Csv => "csv",
            Kind::Log => "log",
        }
    }

    fn separator(self) -> u8 {
        match self {
            Kind::Text => b' ',
            Kind::Json => b':',
            Kind::Csv => b',',
            Kind::Log => b'|',
        }
    }
}

/// A batch of jobs: its slice on its own async track ends when the last job holding the
/// `Arc` is done, on that worker's thread.
#[derive(Debug)]
struct Batch {
    track: Track,
    id: u64,
    remaining: AtomicU64,
    _slice: TrackSlice,
}

#[derive(Debug)]
struct Job {
    id: u64,
    kind: Kind,
    seed: u64,
    priority: f64,
    data: Vec<u8>,
    flow: Flow,
    batch: Arc<Batch>,
}

/// State shared by all threads.
#[derive(Debug, Default)]
struct Shared {
    queue_depth: AtomicI64,
    jobs_done: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    cache_lookups: AtomicU64,
    cache_hits: AtomicU64,
    slow_jobs: AtomicU64,
    cache_flushes: AtomicU64,
    batches: AtomicU64,
    gc_runs: AtomicU64,
    /// Every job's checksum; the GC thread sorts, dedupes and trims it.
    results: Mutex<Vec<u64>>,
    /// The workers' cache size, read per job (the producer changes it now and then).
    cache_capacity: RwLock<usize>,
    workers_done: AtomicBool,
    /// Workers that have reached the job queue's lock (the producer waits for all of them).
    workers_at_queue: AtomicU64,
}

/// Runs the workload on `settings.threads + 2` threads and waits for all of them.
pub(crate) fn run(settings: Settings) -> Result<Summary, Box<dyn std::error::Error>> {
    let start = Instant::now();
    // `log` records land in the trace too (an error only if another logger is installed).
    let _ = tachyon::log_bridge::init();
    tachyon::app_info!(
        "tachyon demo: {} workers, {:?} of jobs",
        settings.threads,
        settings.duration
    );
    let shared = Arc::new(Shared {
        results: Mutex::new_named("results log", Vec::new()),
        cache_capacity: RwLock::new_named("cache capacity", CACHE_CAPACITY),
        ..Shared::default()
    });
    let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE_CAPACITY);
    let rx = Arc::new(Mutex::new_named("job queue", rx));

    let workers = {
        let _zone = tachyon::zone!("spawn threads", workers = settings.threads);
        let mut workers = Vec::with_capacity(settings.threads);
        for i in 0..settings.threads {
            let (rx, shared) = (Arc::clone(&rx), Arc::clone(&shared));
            workers.push(
                thread::Builder::new()
                    .name(format!("worker-{i}"))
                    .spawn(move || worker(i, &rx, &shared))?,
            );
        }
        workers
    };
    let producer = {
        let shared = Arc::clone(&shared);
        let deadline = start + settings.duration;
        thread::Builder::new()
            .name("producer".into())
            .spawn(move || producer(tx, deadline, settings.threads, &shared))?
    };
    // No std name: the thread names itself on the trace with `tachyon::set_thread_name`.
    let metrics = {
        let shared = Arc::clone(&shared);
        thread::spawn(move || metrics(&shared))
    };

    producer
        .join()
        .map_err(|_| "the producer thread panicked")?;
    for w in workers {
        w.join().map_err(|_| "a worker thread panicked")?;
    }
    shared.workers_done.store(true, Ordering::Relaxed);
    metrics.join().map_err(|_| "the metrics thread panicked")?;
    tachyon::instant!(
        "all threads joined",
        jobs = shared.jobs_done.load(Ordering::Relaxed)
    );

    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Ok(Summary {
        jobs: n(&shared.jobs_done),
        batches: n(&shared.batches),
        bytes_in: n(&shared.bytes_in),
        bytes_out: n(&shared.bytes_out),
        cache_hits: n(&shared.cache_hits),
        slow_jobs: n(&shared.slow_jobs),
        cache_flushes: n(&shared.cache_flushes),
        gc_runs: n(&shared.gc_runs),
        elapsed: start.elapsed(),
    })
}

// === The producer ===

fn producer(tx: SyncSender<Job>, deadline: Instant, workers: usize, shared: &Shared) {
    let mut rng = Rng::new(0x7ac4_9011);
    let mut next_id = 0u64;
    tachyon::info!("producer: making jobs for {workers} workers");
    {
        // The first jobs wait until every worker is at the queue, and a little longer: one
        // worker then holds the queue's lock in `recv` while the others wait for it, so the
        // lock is contended at least once, however the threads happen to be scheduled later.
        let _zone = tachyon::zone!("workers starting");
        let give_up = Instant::now() + Duration::from_secs(2);
        while shared.workers_at_queue.load(Ordering::Relaxed) < workers as u64
            && Instant::now() < give_up
        {
            thread::sleep(Duration::from_millis(1));
        }
        thread::sleep(Duration::from_millis(10));
    }
    while Instant::now() < deadline {
        // A frame per batch: the frames track shows the producer's pace.
        tachyon::frame_mark!();
        let batch_id = shared.batches.fetch_add(1, Ordering::Relaxed);
        tachyon::trace!("batch {batch_id}");
        if batch_id % 16 == 15 {
            // A new cache size for the workers (exclusive hold of the RwLock).
            let mut cap = shared
                .cache_capacity
                .write()
                .unwrap_or_else(|e| e.into_inner());
            *cap = if *cap == CACHE_CAPACITY {
                CACHE_CAPACITY / 2
            } else {
                CACHE_CAPACITY
            };
        }
        let track = Track::new_async(format!("batch {batch_id}"));
        let slice = tachyon::begin!(&track, "batch", batch = batch_id, jobs = BATCH);
        let batch = Arc::new(Batch {
            track,
            id: batch_id,
            remaining: AtomicU64::new(BATCH),
            _slice: slice,
        });
        for _ in 0..BATCH {
            let id = next_id;
            next_id += 1;
            // A quarter of the inputs repeat (the workers' caches catch those); one in 40 of
            // the others is eight times the usual size (the "slow job" instants catch those).
            let seed = if rng.below(4) == 0 {
                1 + rng.below(POPULAR_SEEDS)
            } else {
                rng.next() | (1 << 63)
            };
            let mut shape = Rng::new(seed);
            let kind = Kind::ALL[shape.below(4) as usize];
            let size = (16 << 10) + shape.below(48 << 10) as usize;
            let huge = seed > POPULAR_SEEDS && rng.below(40) == 0;
            let size = if huge { size * 8 } else { size };
            let flow = Flow::new();
            let _enqueue = tachyon::zone!(
                "io",
                "enqueue",
                flow: flow,
                job_id = id,
                kind = kind.name(),
                bytes = size,
                huge = huge,
            );
            if huge {
                tachyon::warn!("job {id}: {size} bytes, eight times the usual");
            }
            let data = {
                let _frame = tachyon::frame!("read input");
                let _zone = tachyon::zone!("io", "read input", bytes = size);
                generate_input(kind, seed, size)
            };
            let job = Job {
                id,
                kind,
                seed,
                priority: rng.below(1000) as f64 / 100.0,
                data,
                flow,
                batch: Arc::clone(&batch),
            };
            // Count before sending: a worker may take the job (and decrement) at once.
            let depth = shared.queue_depth.fetch_add(1, Ordering::Relaxed) + 1;
            tachyon::counter!("queue depth", depth, Unit::Count);
            if tx.send(job).is_err() {
                return; // every worker is gone
            }
        }
        // Pacing: let the queue drain a little when it is deep.
        if shared.queue_depth.load(Ordering::Relaxed) > 2 * workers as i64 {
            let _zone = tachyon::zone!("backoff");
            thread::sleep(Duration::from_millis(1));
        }
    }
    tachyon::frame_mark!();
    tachyon::instant!("producer done", jobs = next_id);
    tachyon::info!("producer done: {next_id} jobs");
}

/// Text-like input: words from a small vocabulary (so it compresses), joined by the kind's
/// separator, a newline every few words. The same seed always gives the same bytes.
fn generate_input(kind: Kind, seed: u64, size: usize) -> Vec<u8> {
    const WORDS: [&[u8]; 16] = [
        b"alpha",
        b"beta",
        b"gamma",
        b"delta",
        b"request",
        b"response",
        b"cache",
        b"miss",
        b"hit",
        b"tachyon",
        b"perfetto",
        b"zone",
        b"counter",
        b"flow",
        b"track",
        b"12345",
    ];
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(size + 16);
    let sep = kind.separator();
    while out.len() < size {
        let r = rng.next();
        out.extend_from_slice(WORDS[(r & 15) as usize]);
        out.push(if (r >> 8) & 7 == 0 { b'\n' } else { sep });
    }
    out.truncate(size);
    out
}

// === The workers ===

fn worker(index: usize, rx: &Mutex<Receiver<Job>>, shared: &Shared) {
    // Workers sort together on the trace (a group hint).
    tachyon::set_thread_name_with_hint(&format!("worker-{index}"), 1);
    let jobs_done = CounterTrack::new(format!("jobs done (worker-{index})"), Unit::Count);
    let finished = Plot::incremental("jobs finished", PlotKind::Number);
    let mut cache: HashMap<u64, (u64, usize)> = HashMap::new();
    let mut mean_ns = 0f64;
    let mut done = 0u64;
    shared.workers_at_queue.fetch_add(1, Ordering::Relaxed);
    loop {
        // Hold the lock only while waiting: one worker waits on the channel, the rest on the
        // mutex.
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => break,
        };
        let Ok(job) = job else { break };
        let depth = shared.queue_depth.fetch_sub(1, Ordering::Relaxed) - 1;
        tachyon::counter!("queue depth", depth, Unit::Count);

        let began = Instant::now();
        let (checksum, out_len) = process(&job, &mut cache, shared);
        let elapsed_ns = began.elapsed().as_nanos() as f64;

        done += 1;
        jobs_done.set(done);
        finished.add(1);
        let total_in = shared
            .bytes_in
            .fetch_add(job.data.len() as u64, Ordering::Relaxed)
            + job.data.len() as u64;
        shared
            .bytes_out
            .fetch_add(out_len as u64, Ordering::Relaxed);
        tachyon::counter!("bytes processed", total_in, Unit::Bytes);
        shared.jobs_done.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut results) = shared.results.lock() {
            results.push(checksum);
        }

        // A job five times slower than this worker's running mean is worth a mark.
        if done > 8 && elapsed_ns > 5.0 * mean_ns {
            shared.slow_jobs.fetch_add(1, Ordering::Relaxed);
            tachyon::instant!(
                "compute",
                "slow job",
                job_id = job.id,
                ms = elapsed_ns / 1e6,
                mean_ms = mean_ns / 1e6,
                bytes = job.data.len(),
            );
        }
        mean_ns = if done == 1 {
            elapsed_ns
        } else {
            0.9 * mean_ns + 0.1 * elapsed_ns
        };

        if job.batch.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            tachyon::instant_on!(
                &job.batch.track,
                "batch done",
                batch = job.batch.id,
                last_job = job.id,
            );
        }
        // Dropping the job drops its `Arc<Batch>`: the last one ends the batch's slice here.
    }
    tachyon::debug!("worker-{index} done after {done} jobs");
}

/// One job: parse, look the input up in the cache, and on a miss transform and compress it.
/// Returns (checksum, compressed size).
fn process(job: &Job, cache: &mut HashMap<u64, (u64, usize)>, shared: &Shared) -> (u64, usize) {
    let job_zone = tachyon::zone!(
        "compute",
        "job",
        terminating_flow: job.flow,
        job_id = job.id,
        kind = job.kind.name(),
        bytes = job.data.len(),
        priority = job.priority,
        repeat = job.seed <= POPULAR_SEEDS,
    );
    // Per-instance data, known only as the job goes: shown as the slice's arguments.
    job_zone.value(job.id);
    let (tokens, input_hash) = {
        let _zone = tachyon::zone!("compute", "parse", bytes = job.data.len());
        parse(&job.data, job.kind.separator())
    };

    let lookups = shared.cache_lookups.fetch_add(1, Ordering::Relaxed) + 1;
    let hit = cache.get(&input_hash).copied();
    let hits = shared.cache_hits.load(Ordering::Relaxed) + u64::from(hit.is_some());
    if hit.is_some() {
        shared.cache_hits.fetch_add(1, Ordering::Relaxed);
    }
    tachyon::counter!(
        "cache hit ratio",
        100.0 * hits as f64 / lookups as f64,
        Unit::Named("%")
    );
    if let Some(result) = hit {
        job_zone.text("cache hit");
        job_zone.color(0x20c020);
        return result;
    }
    job_zone.text("cache miss");

    let digest = {
        // A name made at run time (one per kind): interned like a static one.
        let _zone = tachyon::zone!(
            "compute",
            name: format!("transform {}", job.kind.name()),
            tokens = tokens.len(),
        );
        transform(tokens)
    };
    let (compressed, checksum) = {
        let _zone = tachyon::zone!("compute", "compress", bytes = job.data.len());
        let compressed = compress(&job.data);
        let checksum = {
            let _zone = tachyon::zone!("compute", "checksum", bytes = compressed.len());
            adler32(&compressed)
        };
        (compressed, checksum)
    };
    let result = (u64::from(checksum) ^ digest, compressed.len());

    let capacity = *shared
        .cache_capacity
        .read()
        .unwrap_or_else(|e| e.into_inner());
    if cache.len() >= capacity {
        shared.cache_flushes.fetch_add(1, Ordering::Relaxed);
        tachyon::instant!("cache flush", entries = cache.len(), job_id = job.id);
        tachyon::debug!("cache flush: {} entries", cache.len());
        cache.clear();
    }
    cache.insert(input_hash, result);
    result
}

/// Splits on whitespace and `sep`; returns each token's FNV-1a hash and the hash of the input.
fn parse(data: &[u8], sep: u8) -> (Vec<u64>, u64) {
    let mut tokens = Vec::with_capacity(data.len() / 6);
    let mut whole = Fnv::new();
    let mut token = Fnv::new();
    let mut in_token = false;
    for &b in data {
        whole.write(b);
        if b == sep || b.is_ascii_whitespace() {
            if in_token {
                tokens.push(token.0);
                token = Fnv::new();
                in_token = false;
            }
        } else {
            token.write(b);
            in_token = true;
        }
    }
    if in_token {
        tokens.push(token.0);
    }
    (tokens, whole.0)
}

/// Sorts the token hashes, then folds the distinct ones into a digest.
fn transform(mut tokens: Vec<u64>) -> u64 {
    {
        let _zone = tachyon::zone!("compute", "sort", n = tokens.len());
        tokens.sort_unstable();
    }
    let _zone = tachyon::zone!("compute", "hash", n = tokens.len());
    tokens.dedup();
    tokens
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &t| mix64(h ^ t))
}

/// A small LZ77 compressor (LZ4-like tokens, 4-byte minimum match, a 4096-entry hash table).
fn compress(data: &[u8]) -> Vec<u8> {
    const MIN: usize = 4;
    let mut table = vec![0u32; 4096];
    let mut out = Vec::with_capacity(data.len() / 2);
    let mut literals = 0usize; // start of pending literals
    let mut i = 0usize;
    let flush_literals = |out: &mut Vec<u8>, lit: &[u8]| {
        for chunk in lit.chunks(127) {
            out.push(chunk.len() as u8);
            out.extend_from_slice(chunk);
        }
    };
    while i + MIN <= data.len() {
        let word = u32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
        let slot = (word.wrapping_mul(2_654_435_761) >> 20) as usize;
        let candidate = table[slot] as usize;
        table[slot] = i as u32;
        if candidate < i
            && i - candidate <= u16::MAX as usize
            && data[candidate..candidate + MIN] == data[i..i + MIN]
        {
            let mut len = MIN;
            while i + len < data.len() && len < 127 + MIN && data[candidate + len] == data[i + len]
            {
                len += 1;
            }
            flush_literals(&mut out, &data[literals..i]);
            out.push(0x80 | (len - MIN) as u8);
            out.extend_from_slice(&((i - candidate) as u16).to_le_bytes());
            i += len;
            literals = i;
        } else {
            i += 1;
        }
    }
    flush_literals(&mut out, &data[literals..]);
    out
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += u32::from(x);
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    (b << 16) | a
}

// === The metrics thread ===

/// Samples throughput every 50 ms and runs a "GC" on the `GC` track every 200 ms, until the
/// workers are done.
fn metrics(shared: &Shared) {
    tachyon::set_thread_name("metrics");
    let gc = Track::named("GC");
    let mut last = (Instant::now(), 0u64);
    let mut tick = 0u64;
    while !shared.workers_done.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(50));
        tick += 1;
        let now = Instant::now();
        let jobs = shared.jobs_done.load(Ordering::Relaxed);
        let rate = (jobs - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
        tachyon::counter!("throughput", rate, Unit::Named("jobs/s"));
        last = (now, jobs);
        if tick % 4 == 0 {
            collect(&gc, shared);
            log::info!("metrics: {jobs} jobs done, {rate:.0} jobs/s");
        }
    }
    collect(&gc, shared);
}

/// Sorts and dedupes the results log, keeping the newest 4096 distinct checksums.
fn collect(gc: &Track, shared: &Shared) {
    let generation = shared.gc_runs.fetch_add(1, Ordering::Relaxed);
    let _slice = tachyon::begin!(gc, "gc", "collect", generation = generation);
    let Ok(mut results) = shared.results.lock() else {
        return;
    };
    let before = results.len();
    results.sort_unstable();
    results.dedup();
    let excess = results.len().saturating_sub(4096);
    results.drain(..excess);
    tachyon::instant_on!(
        gc,
        "gc",
        "freed",
        entries = before - results.len(),
        live = results.len(),
    );
}

// === Small helpers ===

struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    #[inline]
    fn write(&mut self, b: u8) {
        self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
}

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(mix64(seed) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_round_trips_in_size_and_shrinks_text() {
        let data = generate_input(Kind::Text, 7, 64 << 10);
        assert_eq!(data.len(), 64 << 10);
        assert_eq!(
            data,
            generate_input(Kind::Text, 7, 64 << 10),
            "deterministic"
        );
        let packed = compress(&data);
        assert!(packed.len() < data.len() / 2, "{} bytes", packed.len());
        assert_eq!(adler32(b"Wikipedia"), 0x11e6_0398);
    }

    #[test]
    fn parse_splits_on_separator_and_whitespace() {
        let (tokens, _) = parse(b"ab,cd\nef,,", b',');
        assert_eq!(tokens.len(), 3);
    }
}

//! A model of a thread's event queue, apart from the SDK: a producer pinned to one CPU writes a
//! 16-byte record after each counter read into a 16 384-record ring and publishes its
//! position; a consumer pinned to another reads behind it in batches of at least 256 records,
//! napping 100 µs after a pass of fewer than 4 096. Printed per variant: the producer's
//! nanoseconds a record, beside the counter read alone measured in the same run (the floor).
//!
//! ```sh
//! cargo bench -p tachyon --bench ring_model
//! ```
//!
//! The variants: `plain`; `flush`, the consumer flushing each line it has read (`clflushopt`,
//! as `queue::give_lines_up` does); `prefetchw`, the producer asking for the lines of the step
//! after next (128 records) for writing, when they are already consumed. On the project's VM
//! the producer runs at the floor in some periods and at about 35 ns a record in others unless
//! the consumer flushes (docs/data-path.md, "The ring's lines given up"). Linux on x86-64 with
//! two CPUs or more; elsewhere it says so and exits.

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod model {
    use std::cell::UnsafeCell;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    const CAP: usize = 16384;
    const RECORDS: usize = 20_000_000;

    #[repr(C, align(16))]
    #[derive(Clone, Copy)]
    struct Rec(u64, u64);

    #[repr(align(64))]
    struct Pad(AtomicUsize);

    #[repr(C, align(64))]
    struct Line([UnsafeCell<Rec>; 4]);

    struct Ring {
        head: Pad,
        tail: Pad,
        done: AtomicBool,
        lines: Box<[Line]>,
    }

    // SAFETY: the producer writes only cells in `tail..head + CAP`, the consumer reads only
    // cells in `head..tail`; `tail` and `head` are published with release stores and read with
    // acquire loads, so each cell's write is ordered before its read and each read before its
    // next write.
    unsafe impl Sync for Ring {}

    impl Ring {
        fn cell(&self, pos: usize) -> *mut Rec {
            let i = pos & (CAP - 1);
            self.lines[i / 4].0[i % 4].get()
        }
    }

    fn pin(cpu: usize) {
        // SAFETY: `set` is a zeroed, then filled, CPU set owned by this frame; the call only
        // reads it and changes the calling thread's affinity.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
        }
    }

    fn ticks() -> u64 {
        // SAFETY: `rdtsc` reads the time-stamp counter; every x86-64 CPU has it.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    /// The producer's ns a record with `flush` on the consumer's side and `prefetchw` on the
    /// producer's.
    fn run(flush: bool, prefetchw: bool) -> f64 {
        let ring = Ring {
            head: Pad(AtomicUsize::new(0)),
            tail: Pad(AtomicUsize::new(0)),
            done: AtomicBool::new(false),
            lines: (0..CAP / 4)
                .map(|_| Line(std::array::from_fn(|_| UnsafeCell::new(Rec(0, 0)))))
                .collect(),
        };
        std::thread::scope(|s| {
            let r = &ring;
            s.spawn(move || {
                pin(1);
                let mut head = 0;
                let mut sum = 0u64;
                loop {
                    let done = r.done.load(Ordering::Acquire);
                    let tail = r.tail.0.load(Ordering::Acquire);
                    if tail - head < 256 && !done {
                        std::thread::sleep(Duration::from_micros(100));
                        continue;
                    }
                    let found = tail - head;
                    while head != tail {
                        let end = tail.min(head + 1024);
                        let start = head;
                        while head != end {
                            // SAFETY: `head < tail`: the producer wrote this cell before its
                            // release store of `tail`, and writes it again only after `head`
                            // passes it.
                            let c = unsafe { *r.cell(head) };
                            sum = sum.wrapping_add(c.0 ^ c.1);
                            head += 1;
                        }
                        if flush {
                            let mut at = start & !3;
                            while at + 4 <= end {
                                // SAFETY: a flush changes no memory; the address is a cell's.
                                unsafe {
                                    std::arch::asm!("clflushopt [{}]", in(reg) r.cell(at), options(nostack, preserves_flags));
                                }
                                at += 4;
                            }
                        }
                        r.head.0.store(head, Ordering::Release);
                    }
                    if done && found == 0 {
                        break;
                    }
                    if found < 4096 {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
                std::hint::black_box(sum);
            });
            pin(0);
            let t = Instant::now();
            let (mut pos, mut limit) = (0usize, 0usize);
            while pos < RECORDS {
                if pos == limit {
                    let room = loop {
                        let room = r.head.0.load(Ordering::Acquire) + CAP - pos;
                        if room > 0 {
                            break room;
                        }
                        std::hint::spin_loop();
                    };
                    if prefetchw && room >= 3 * 128 {
                        let mut at = (pos + 128) & !3;
                        while at < pos + 256 {
                            // SAFETY: a prefetch reads and writes nothing.
                            unsafe {
                                std::arch::asm!("prefetchw [{}]", in(reg) r.cell(at), options(nostack, readonly, preserves_flags));
                            }
                            at += 4;
                        }
                    }
                    limit = pos + room.min(128);
                }
                let ts = ticks();
                // SAFETY: `pos < limit <= head + CAP` and `pos >= tail`: the consumer reads no
                // cell here until `tail` passes it.
                unsafe { r.cell(pos).write(Rec(pos as u64, ts)) };
                pos += 1;
                r.tail.0.store(pos, Ordering::Release);
            }
            let ns = t.elapsed().as_nanos() as f64 / RECORDS as f64;
            r.done.store(true, Ordering::Release);
            ns
        })
    }

    /// The counter read alone, in a loop of the same length.
    fn floor() -> f64 {
        pin(0);
        let t = Instant::now();
        let mut s = 0u64;
        for _ in 0..RECORDS {
            s = s.wrapping_add(ticks());
        }
        std::hint::black_box(s);
        t.elapsed().as_nanos() as f64 / RECORDS as f64
    }

    pub(crate) fn main() {
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            println!("ring_model: needs two CPUs");
            return;
        }
        println!("ring_model: producer ns a record ({RECORDS} records; counter read alone first)");
        println!("  counter read alone: {:.2}", floor());
        for (name, flush, prefetchw) in [
            ("plain", false, false),
            ("flush", true, false),
            ("prefetchw", false, true),
            ("plain", false, false),
        ] {
            println!("  {name}: {:.2}", run(flush, prefetchw));
        }
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    model::main();
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    println!("ring_model: Linux on x86-64 only");
}

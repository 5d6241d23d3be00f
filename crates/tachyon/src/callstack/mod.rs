//! Call stacks: capture on the calling thread, interning into Perfetto's `InternedData`.
//!
//! [`capture`] walks the calling thread's stack with the platform's DWARF unwinder
//! (`unwind.rs`) into a buffer the caller owns: no allocation, no lock of ours, depth capped at
//! [`MAX_DEPTH`]. Events take stacks with `zone!(..., callstack)` / `callstack: N` (and the same
//! on instants), or on every event with `TACHYON_CALLSTACK=N` ([`Config::callstack_depth`],
//! Tracy's `TRACY_CALLSTACK`).
//!
//! The addresses are written raw: each sequence interns its stacks with a
//! [`CallstackInterner`] (`Callstack` → `Frame`s → `Mapping`s with path, build id and load
//! bias from the loader, [`loaded_modules`]), so a repeated stack costs one iid. Function names,
//! files and lines are resolved later and elsewhere (`tachyon-symbolize`: at the end of the
//! session or offline with `tachyon symbolize`), never on the traced thread.
//!
//! The same two pieces serve anything else that records stacks (allocations, crash reports):
//!
//! ```
//! use tachyon::callstack::{capture, CallstackInterner, MAX_DEPTH};
//!
//! let mut frames = [0u64; MAX_DEPTH];
//! let n = capture(&mut frames[..16], 0);
//! assert!(n > 0);
//! let mut interner = CallstackInterner::new();
//! let iid = interner.intern(&frames[..n]);
//! assert_eq!(interner.intern(&frames[..n]), iid, "a repeated stack is one id");
//! ```
//!
//! [`Config::callstack_depth`]: crate::Config::callstack_depth

#[cfg(all(feature = "dwarf-unwind", target_arch = "x86_64", target_os = "linux"))]
pub(crate) mod dwarf;
mod intern;
mod modules;
mod unwind;

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

pub use intern::CallstackInterner;
pub use modules::{gnu_build_id, loaded_modules, module_of, Module};

/// The deepest stack an event records (Tracy caps at 62; deeper requests are cut here).
pub const MAX_DEPTH: usize = 64;

/// Depth of the stack every event records (0: only events that ask for one).
static DEFAULT_DEPTH: AtomicU8 = AtomicU8::new(0);

/// A stack was interned since the last [`symbolize_at_end`]: there is something to symbolize.
static RECORDED: AtomicBool = AtomicBool::new(false);

pub(crate) fn note_recorded() {
    if !RECORDED.load(Ordering::Relaxed) {
        RECORDED.store(true, Ordering::Relaxed);
    }
}

/// The end of a session that recorded stacks: with the feature `symbolize`, the symbols of its
/// frames appended to the trace (the file at `path`, else `trace`), resolved from this
/// process's own binaries (their paths and build ids are the trace's). Without the feature,
/// nothing (`tachyon symbolize` does it later).
#[cfg_attr(not(feature = "symbolize"), allow(unused_variables, clippy::ptr_arg))]
#[cfg(feature = "in-process")]
pub(crate) fn symbolize_at_end(path: Option<&std::path::Path>, trace: &mut Vec<u8>) {
    let recorded = RECORDED.swap(false, Ordering::Relaxed);
    #[cfg(feature = "symbolize")]
    if recorded {
        let opts = tachyon_symbolize::Options::default();
        let result = match path {
            Some(p) => tachyon_symbolize::symbolize_in_place(p, &opts).map(drop),
            None => tachyon_symbolize::symbolize(trace, &opts).map(|s| {
                trace.extend_from_slice(&s.packets);
            }),
        };
        if let Err(e) = result {
            eprintln!("tachyon: symbolizing the call stacks failed: {e}");
        }
    }
}

/// Captures the calling thread's stack into `out`, innermost first, starting at the function
/// that calls `capture` after skipping `skip` frames; at most `out.len()` frames. Returns how
/// many were written. Addresses point into the call instruction of each frame (return
/// addresses minus one; with `dwarf-unwind`, the first frame is the caller's exact pc).
///
/// Allocation-free and lock-free (the platform unwinder, without `dwarf-unwind`, as far as
/// glibc ≥ 2.35 finds unwind tables without a lock). Not async-signal-safe. Inlined: it reads
/// the caller's registers where it is called.
#[inline(always)]
pub fn capture(out: &mut [u64], skip: usize) -> usize {
    let n = out.len().min(MAX_DEPTH);
    if n == 0 {
        return 0;
    }
    #[cfg(all(feature = "dwarf-unwind", target_arch = "x86_64", target_os = "linux"))]
    if let Some(got) = dwarf::walk_from(dwarf::regs(), &mut out[..n], skip) {
        return got;
    }
    unwind::walk(&mut out[..n], skip)
}

/// [`capture`], and an id of the frames it wrote: when two calls on one thread return the same
/// non-zero id, they wrote the same frames (the thread's last walk, kept and found unchanged),
/// so what the caller derived from the first (a hash, an interned id) holds for the second.
/// 0: no such promise (a walk not kept, or the platform unwinder).
///
/// `known`: an id the caller got before (0: none). When the answer is that id again, `out`
/// is left as it is (the caller already derived what it needs from those frames): the copy of
/// the kept frames is skipped.
#[inline(always)]
pub(crate) fn capture_with_id(out: &mut [u64], skip: usize, known: u64) -> (usize, u64) {
    let n = out.len().min(MAX_DEPTH);
    if n == 0 {
        return (0, 0);
    }
    #[cfg(all(feature = "dwarf-unwind", target_arch = "x86_64", target_os = "linux"))]
    if let Some(got) = dwarf::walk_from_id(dwarf::regs(), &mut out[..n], skip, known) {
        return got;
    }
    // The platform unwinder keeps no walk, so there is no id to match.
    let _ = known;
    (unwind::walk(&mut out[..n], skip), 0)
}

/// [`capture`] with the platform unwinder (`_Unwind_Backtrace`) even when the feature
/// `dwarf-unwind` is on: for comparisons.
#[inline(never)]
pub fn capture_with_platform_unwinder(out: &mut [u64], skip: usize) -> usize {
    let n = out.len().min(MAX_DEPTH);
    // This function's own frame is skipped too.
    unwind::walk(&mut out[..n], skip + 1)
}

/// The depth every event records a stack at (`TACHYON_CALLSTACK`), 0 when off.
#[inline(always)]
pub fn default_depth() -> usize {
    DEFAULT_DEPTH.load(Ordering::Relaxed) as usize
}

/// Sets the depth every event records a stack at (0: off), capped at [`MAX_DEPTH`].
pub fn set_default_depth(depth: usize) {
    DEFAULT_DEPTH.store(depth.min(MAX_DEPTH) as u8, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn leaf(out: &mut [u64]) -> usize {
        std::hint::black_box(capture(out, 0))
    }

    #[inline(never)]
    fn middle(out: &mut [u64]) -> usize {
        std::hint::black_box(leaf(out))
    }

    #[cfg_attr(
        miri,
        ignore = "walks the real stack and the loader's module list, which Miri does not model"
    )]
    #[test]
    fn frames_are_in_the_callers_and_capped() {
        let mut buf = [0u64; MAX_DEPTH];
        let n = middle(&mut buf);
        assert!(n >= 3, "{n}");
        let in_fn = |pc: u64, f: usize| pc > f as u64 && pc < f as u64 + 4096;
        assert!(in_fn(buf[0], leaf as *const () as usize), "{:#x}", buf[0]);
        assert!(in_fn(buf[1], middle as *const () as usize), "{:#x}", buf[1]);
        let mut two = [0u64; 2];
        assert_eq!(middle(&mut two), 2);
        assert_eq!(two, buf[..2]);
        assert_eq!(capture(&mut [], 0), 0);
    }

    #[inline(never)]
    fn via_a(out: &mut [u64]) -> usize {
        std::hint::black_box(leaf(out))
    }

    #[inline(never)]
    fn via_b(out: &mut [u64]) -> usize {
        std::hint::black_box(leaf(out))
    }

    /// Repeated walks from the same place (which the last walk's memo answers) and walks that
    /// start from the same registers but return into different callers (which it must not).
    #[cfg_attr(
        miri,
        ignore = "walks the real stack and the loader's module list, which Miri does not model"
    )]
    #[test]
    fn repeated_walks_follow_the_stack() {
        let in_fn = |pc: u64, f: usize| pc > f as u64 && pc < f as u64 + 4096;
        let mut first: Option<Vec<u64>> = None;
        for _ in 0..std::hint::black_box(3) {
            let (mut a, mut b) = ([0u64; MAX_DEPTH], [0u64; MAX_DEPTH]);
            // Twice from one call site: the second walk is answered by the memo, the same.
            let mut runs = [[0u64; MAX_DEPTH]; 2];
            let mut ns = [0usize; 2];
            // An opaque count and index: an unrolled or peeled loop would be two call sites.
            let mut k = 0;
            while std::hint::black_box(k) < 2 {
                let i = std::hint::black_box(k);
                ns[i] = via_a(&mut runs[i]);
                k += 1;
            }
            assert_eq!(runs[0][..ns[0]], runs[1][..ns[1]]);
            let na = via_a(&mut a);
            let nb = via_b(&mut b);
            assert!(in_fn(a[1], via_a as *const () as usize), "{:#x}", a[1]);
            assert!(in_fn(b[1], via_b as *const () as usize), "{:#x}", b[1]);
            let first = first.get_or_insert_with(|| a[..na].to_vec());
            assert_eq!(a[..na], first[..], "the same stack, the same frames");
            // Frame 2: the two call sites in this function; above it, the same callers.
            assert_eq!(a[3..na], b[3..nb], "the same callers above");
        }
    }

    #[inline(never)]
    fn id_leaf(out: &mut [u64]) -> (usize, u64) {
        std::hint::black_box(capture_with_id(out, 0, 0))
    }

    #[inline(never)]
    fn id_via_a(out: &mut [u64]) -> (usize, u64) {
        std::hint::black_box(id_leaf(out))
    }

    #[inline(never)]
    fn id_via_b(out: &mut [u64]) -> (usize, u64) {
        std::hint::black_box(id_leaf(out))
    }

    /// A repeated walk from one call path keeps its id (and its frames); a walk from another
    /// path gets a new id, and so does the first path's next walk after it.
    #[cfg(all(feature = "dwarf-unwind", target_arch = "x86_64", target_os = "linux"))]
    #[cfg_attr(
        miri,
        ignore = "walks the real stack and the loader's module list, which Miri does not model"
    )]
    #[test]
    fn walk_ids_name_the_frames() {
        let (mut a, mut b) = ([0u64; MAX_DEPTH], [0u64; MAX_DEPTH]);
        let mut ids = Vec::new();
        let mut frames: Vec<Vec<u64>> = Vec::new();
        // An opaque trip count: an unrolled loop would make each call a call site of its own.
        for i in 0..std::hint::black_box(6) {
            let (n, id) = if i % 3 == 2 {
                id_via_b(&mut b)
            } else {
                id_via_a(&mut a)
            };
            assert!(n >= 3, "{n}");
            let f = if i % 3 == 2 { &b[..n] } else { &a[..n] };
            frames.push(f.to_vec());
            ids.push(id);
        }
        // a, a (kept walk: same id), b (new), a (new again), a (same), b (new).
        assert_ne!(ids[0], 0);
        assert_eq!(ids[1], ids[0], "{ids:?}");
        assert_eq!(frames[1], frames[0]);
        assert_ne!(ids[2], ids[1], "{ids:?}");
        assert_ne!(frames[2], frames[1]);
        assert_ne!(ids[3], ids[2], "{ids:?}");
        assert_eq!(frames[3], frames[0]);
        assert_eq!(ids[4], ids[3], "{ids:?}");
        assert_ne!(ids[5], ids[4], "{ids:?}");
        // Ids only ever name one set of frames.
        for i in 0..6 {
            for j in 0..6 {
                if ids[i] == ids[j] {
                    assert_eq!(frames[i], frames[j], "{ids:?}");
                }
            }
        }
    }

    #[cfg(all(feature = "dwarf-unwind", target_arch = "x86_64", target_os = "linux"))]
    #[cfg_attr(
        miri,
        ignore = "walks the real stack and the loader's module list, which Miri does not model"
    )]
    #[test]
    fn framehop_agrees_with_the_platform_unwinder() {
        #[inline(never)]
        fn both() -> (Vec<u64>, Vec<u64>) {
            let (mut a, mut b) = ([0u64; 32], [0u64; 32]);
            let n = dwarf::walk_from(dwarf::regs(), &mut a, 0).expect("the stack is known");
            let m = unwind::walk(&mut b, 0);
            (a[..n].to_vec(), b[..m].to_vec())
        }
        let (fh, platform) = both();
        assert!(fh.len() >= 3, "{fh:x?}");
        // Frame 0 is in `both` (an exact pc, a return address); the callers agree.
        assert_eq!(fh.len(), platform.len(), "{fh:x?} vs {platform:x?}");
        assert_eq!(fh[1..], platform[1..]);
        // And on a thread of its own, deeper in the test harness.
        let (fh, platform) = std::thread::spawn(both).join().unwrap();
        assert_eq!(fh[1..], platform[1..]);
    }

    #[cfg(all(
        feature = "dwarf-unwind",
        target_arch = "x86_64",
        target_os = "linux",
        not(miri)
    ))]
    mod rbp_as_register {
        use super::*;

        // A frame as optimized code without frame pointers makes it: it saves the caller's `rbp`
        // (with its unwind rule), uses `rbp` as an ordinary register (here: set to the first
        // argument, as a loop counter would be) and calls `f(out)` with it there. Every function
        // below that uses `rbp` saves that value on the stack, where a walk reads it.
        std::arch::global_asm!(
            ".pushsection .text.tachyon_test_call_with_rbp,\"ax\",@progbits",
            ".globl tachyon_test_call_with_rbp",
            ".type tachyon_test_call_with_rbp,@function",
            "tachyon_test_call_with_rbp:",
            ".cfi_startproc",
            "push rbp",
            ".cfi_def_cfa_offset 16",
            ".cfi_offset rbp, -16",
            "mov rbp, rdi",
            "mov rdi, rdx",
            "call rsi",
            "pop rbp",
            ".cfi_def_cfa_offset 8",
            "ret",
            ".cfi_endproc",
            ".size tachyon_test_call_with_rbp, .-tachyon_test_call_with_rbp",
            ".popsection",
        );

        #[repr(C)]
        #[derive(Clone, Copy)]
        struct IdWalk {
            n: usize,
            id: u64,
            frames: [u64; MAX_DEPTH],
        }

        extern "C" {
            fn tachyon_test_call_with_rbp(
                rbp: u64,
                f: extern "C" fn(*mut IdWalk),
                out: *mut IdWalk,
            );
        }

        #[inline(never)]
        extern "C" fn id_walk_into(out: *mut IdWalk) {
            // SAFETY: the test passes a valid, exclusive `IdWalk` through the trampoline.
            let out = unsafe { &mut *out };
            let (n, id) = capture_with_id(&mut out.frames, 0, 0);
            out.n = n;
            out.id = id;
        }

        /// A caller that keeps a changing value in `rbp` (a loop counter in code without frame
        /// pointers) does not make the kept walk miss: the walk reads the saved `rbp` words but
        /// never computes a frame's address from them, so the kept walk answers (same id, same
        /// frames) whatever they hold.
        #[test]
        fn a_callers_rbp_used_as_a_register_keeps_the_walk() {
            let mut walks: Vec<IdWalk> = Vec::new();
            // An opaque trip count: an unrolled loop would be four call sites.
            for i in 0..std::hint::black_box(4u64) {
                let mut w = IdWalk {
                    n: 0,
                    id: 0,
                    frames: [0; MAX_DEPTH],
                };
                // SAFETY: the trampoline saves and restores `rbp` and calls `id_walk_into(&mut w)`
                // with the C ABI (stack aligned, its unwind rule in `.eh_frame`).
                unsafe {
                    tachyon_test_call_with_rbp(0x5eed_0000 + i * 0x1111, id_walk_into, &mut w);
                }
                walks.push(std::hint::black_box(w));
            }
            let IdWalk { n, id, frames } = walks[0];
            assert!(n >= 3, "{n}");
            let in_fn = |pc: u64, f: usize| pc > f as u64 && pc < f as u64 + 4096;
            assert!(
                in_fn(frames[1], tachyon_test_call_with_rbp as *const () as usize),
                "the walk went through the trampoline: {:#x?}",
                &frames[..n]
            );
            assert_ne!(id, 0, "the walk was kept");
            for w in &walks[1..] {
                assert_eq!(w.id, id, "the kept walk answered");
                assert_eq!(w.frames[..w.n], frames[..n]);
            }
        }
    }

    #[cfg(all(feature = "dwarf-unwind", target_arch = "x86_64", target_os = "linux"))]
    #[cfg_attr(
        miri,
        ignore = "walks the real stack and the loader's module list, which Miri does not model"
    )]
    #[test]
    fn learned_rules_agree_with_framehop_and_the_platform_deep_down() {
        type Walks = (Vec<u64>, Vec<u64>);
        #[inline(never)]
        fn leaf() -> Walks {
            let (mut a, mut b) = ([0u64; MAX_DEPTH], [0u64; MAX_DEPTH]);
            // Twice: the second walk applies the rules the first one learned.
            let _ = dwarf::walk_from(dwarf::regs(), &mut a, 0);
            let n = dwarf::walk_from(dwarf::regs(), &mut a, 0).expect("the stack is known");
            let m = unwind::walk(&mut b, 0);
            (a[..n].to_vec(), b[..m].to_vec())
        }
        // Frames of different shapes: a big frame, a small one, recursion.
        #[inline(never)]
        fn big(n: u32) -> Walks {
            let pad = std::hint::black_box([n as u8; 600]);
            let r = if n == 0 { leaf() } else { small(n - 1) };
            std::hint::black_box(pad);
            r
        }
        #[inline(never)]
        fn small(n: u32) -> Walks {
            let r = if n % 3 == 0 { big(n) } else { small_or_big(n) };
            std::hint::black_box(n);
            r
        }
        #[inline(never)]
        fn small_or_big(n: u32) -> Walks {
            let r = big(std::hint::black_box(n));
            std::hint::black_box(n);
            r
        }
        let (fast, platform) = std::thread::spawn(|| big(30)).join().unwrap();
        assert!(fast.len() >= 40, "{}", fast.len());
        assert_eq!(fast.len(), platform.len(), "{fast:x?} vs {platform:x?}");
        assert_eq!(fast[1..], platform[1..]);
    }

    #[test]
    fn environment_sets_depth_and_rate_and_refuses_garbage() {
        let from = |k: &'static str, v: &'static str| {
            crate::Config::from_vars(move |n| (n == k).then(|| v.to_owned()))
        };
        assert_eq!(from("TACHYON_CALLSTACK", "8").unwrap().callstack_depth, 8);
        assert_eq!(from("TACHYON_SAMPLING_HZ", "997").unwrap().sampling_hz, 997);
        assert!(!from("TACHYON_SYMBOLIZE", "0").unwrap().symbolize);
        for (k, v) in [
            ("TACHYON_CALLSTACK", "65"),
            ("TACHYON_CALLSTACK", "deep"),
            ("TACHYON_SAMPLING_HZ", "-1"),
        ] {
            let e = from(k, v).unwrap_err();
            assert!(e.0.contains(k), "{e}");
        }
    }

    #[cfg_attr(
        miri,
        ignore = "walks the real stack and the loader's module list, which Miri does not model"
    )]
    #[test]
    fn interning_emits_each_thing_once() {
        let mut buf = [0u64; 16];
        let n = middle(&mut buf);
        let mut i = CallstackInterner::new();
        let a = i.intern(&buf[..n]);
        assert!(i.has_pending());
        assert_eq!(i.intern(&buf[..n]), a);
        let b = i.intern(&buf[1..n]);
        assert_ne!(a, b);
        assert_eq!(i.intern(&[]), 0);
        let c = i.intern(&[8]); // in no binary
        assert_ne!(c, 0);
        i.clear();
        assert!(!i.has_pending());
    }
}

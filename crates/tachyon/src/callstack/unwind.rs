//! Stack walking on the calling thread with the platform's DWARF unwinder
//! (`_Unwind_Backtrace`, from the libgcc_s / libunwind every Rust program on Linux links for
//! panics): correct for code built without frame pointers, which is most Rust code (std is
//! built without them). It reads `.eh_frame` through the loader's cache of loaded objects
//! (`_dl_find_object` on glibc ≥ 2.35, lock-free), never allocates and takes no lock of ours.

use std::ffi::c_void;

/// `_Unwind_Reason_Code` values the callback returns.
const URC_NO_REASON: i32 = 0;
const URC_NORMAL_STOP: i32 = 4;

extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(ctx: *mut c_void, arg: *mut c_void) -> i32,
        arg: *mut c_void,
    ) -> i32;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
}

/// Where the callback writes: the caller's buffer, how much of it is used, and how many of the
/// innermost frames are still to be skipped.
struct Walk<'a> {
    out: &'a mut [u64],
    len: usize,
    skip: usize,
}

extern "C" fn on_frame(ctx: *mut c_void, arg: *mut c_void) -> i32 {
    // SAFETY: `arg` is the `&mut Walk` `walk` passed to `_Unwind_Backtrace`, alive and not
    // otherwise borrowed for the whole call, which runs this callback on the same thread.
    let walk = unsafe { &mut *arg.cast::<Walk<'_>>() };
    // SAFETY: `ctx` is the unwinder's context for the frame this callback is called for.
    let ip = unsafe { _Unwind_GetIP(ctx) } as u64;
    if ip == 0 {
        return URC_NORMAL_STOP;
    }
    if walk.skip > 0 {
        walk.skip -= 1;
        return URC_NO_REASON;
    }
    if walk.len >= walk.out.len() {
        return URC_NORMAL_STOP;
    }
    // A return address points after the call; one byte back is inside the call instruction,
    // which is the line and the inlining context the frame was in.
    walk.out[walk.len] = ip - 1;
    walk.len += 1;
    if walk.len == walk.out.len() {
        URC_NORMAL_STOP
    } else {
        URC_NO_REASON
    }
}

/// Fills `out` with the return addresses (minus one) of the calling frames, innermost first,
/// after skipping `skip` frames above `walk`'s own; the number written.
#[inline(never)]
pub(super) fn walk(out: &mut [u64], skip: usize) -> usize {
    if out.is_empty() {
        return 0;
    }
    let mut w = Walk {
        out,
        len: 0,
        // `walk`'s own frame is the first the unwinder reports.
        skip: skip + 1,
    };
    // SAFETY: `on_frame` matches the callback type the unwinder expects and never unwinds (no
    // panics: bounds are checked before indexing); `w` outlives the call.
    unsafe {
        _Unwind_Backtrace(on_frame, (&raw mut w).cast());
    }
    w.len
}

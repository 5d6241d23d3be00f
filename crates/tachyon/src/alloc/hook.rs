//! [`Tracked`]: the `GlobalAlloc` wrapper.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::Ordering;

use super::local::{self, HOOK, OFF};

/// A global allocator that records what `A` does while a session tracks memory (module docs
/// of [`alloc`](crate::alloc)):
///
/// ```no_run
/// #[global_allocator]
/// static A: tachyon::alloc::Tracked<std::alloc::System> =
///     tachyon::alloc::Tracked::new(std::alloc::System);
/// ```
///
/// Without a session it costs one relaxed load per call. It never allocates itself and works
/// before `main`, during thread exit and after the session has stopped.
#[derive(Debug, Default)]
pub struct Tracked<A> {
    inner: A,
}

impl<A> Tracked<A> {
    /// Wraps `inner`.
    pub const fn new(inner: A) -> Self {
        Tracked { inner }
    }

    /// The wrapped allocator.
    pub const fn inner(&self) -> &A {
        &self.inner
    }
}

// SAFETY: every call is forwarded to `inner` with the caller's arguments unchanged and its
// result returned unchanged; the recording around it never touches the blocks (it only
// copies their addresses and sizes into records), so `A`'s guarantees carry over.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Tracked<A> {
    // The mode is read before the inner allocator runs, so that with no session (and in
    // sampled mode, while the countdown has not run out) nothing is left to do after it: the
    // inner call is a tail call and the hook keeps no registers across it. (An allocation that
    // a session's start or stop overtakes is recorded as if it came just before or after.)
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let mode = HOOK.mode();
        if mode == OFF || local::alloc_not_sampled(mode, layout.size()) {
            // SAFETY: the caller's contract, forwarded.
            return unsafe { self.inner.alloc(layout) };
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { alloc_hooked(&self.inner, layout, mode, false) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let mode = HOOK.mode();
        if mode == OFF || local::alloc_not_sampled(mode, layout.size()) {
            // SAFETY: the caller's contract, forwarded.
            return unsafe { self.inner.alloc_zeroed(layout) };
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { alloc_hooked(&self.inner, layout, mode, true) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let mode = HOOK.mode();
        // With no session the test is false too (`free_needs_hook`): sampled mode's test
        // comes first, as the one that filters most frees.
        if local::free_needs_hook(mode, ptr) {
            // SAFETY: the caller's contract, forwarded.
            return unsafe { dealloc_hooked(&self.inner, ptr, layout, mode) };
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let mode = HOOK.mode();
        if mode != OFF {
            // A reallocation is a free and an allocation; the free goes first, for the reason
            // `dealloc` gives.
            local::on_free(mode, ptr, layout.size());
        }
        // SAFETY: the caller's contract, forwarded.
        let q = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if mode != OFF {
            if q.is_null() {
                // Failed: the old block is still the caller's; it is live again (attributed
                // to the current site). The failure itself is counted.
                local::FAILED.fetch_add(1, Ordering::Relaxed);
                local::on_alloc(mode, ptr, layout.size());
            } else {
                local::on_alloc(mode, q, new_size);
            }
        }
        q
    }
}

/// A free the hook looks at further (every free in exact mode; in sampled mode one whose
/// address the table holds or may hold): recorded, then released. In that order: the address
/// cannot be handed out again (and recorded as another thread's allocation) before this free
/// is in the ring. Out of line and ending in the release, so `dealloc` calls nothing on its
/// common path and keeps no registers across a call (both releases are tail calls)
/// (The arguments in the order `dealloc` has them, `inner` standing for `self`: each stays in
/// the register it came in, and the call is a jump.)
#[inline(never)]
unsafe fn dealloc_hooked<A: GlobalAlloc>(inner: &A, ptr: *mut u8, layout: Layout, mode: u32) {
    local::on_free(mode, ptr, layout.size());
    // SAFETY: the caller's contract (of `Tracked::dealloc`), forwarded.
    unsafe { inner.dealloc(ptr, layout) }
}

/// An allocation the hook records (exact mode, a probe, or a sampled allocation whose
/// countdown ran out, [`local::alloc_not_sampled`]): allocated by `inner` (zeroed or not), then
/// recorded. Its arguments are the allocator's own, in registers (no closure on the caller's
/// stack: the shim's common path then needs no stack frame), and the recording is its tail
/// call, so the stack a sample walks goes from [`local::on_alloc_counted`] to the shim.
///
/// # Safety
/// `Tracked::alloc`'s (or `alloc_zeroed`'s) contract for `layout`.
#[inline(never)]
unsafe fn alloc_hooked<A: GlobalAlloc>(
    inner: &A,
    layout: Layout,
    mode: u32,
    zeroed: bool,
) -> *mut u8 {
    if local::countdown_moves_on(mode, layout.size()) {
        // Not sampled after all: nothing to record, and the inner call is a tail call.
        // SAFETY: the caller's contract, forwarded.
        return unsafe {
            if zeroed {
                inner.alloc_zeroed(layout)
            } else {
                inner.alloc(layout)
            }
        };
    }
    // SAFETY: the caller's contract, forwarded.
    let p = unsafe {
        if zeroed {
            inner.alloc_zeroed(layout)
        } else {
            inner.alloc(layout)
        }
    };
    local::on_alloc_counted(mode, p, layout.size())
}

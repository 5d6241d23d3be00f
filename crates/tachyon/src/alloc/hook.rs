//! [`Tracked`]: the `GlobalAlloc` wrapper.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::Ordering;

use super::local::{self, ACTIVE, OFF};

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
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { self.inner.alloc(layout) };
        let mode = ACTIVE.load(Ordering::Relaxed);
        if mode != OFF {
            local::on_alloc(mode, p, layout.size());
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        let mode = ACTIVE.load(Ordering::Relaxed);
        if mode != OFF {
            local::on_alloc(mode, p, layout.size());
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let mode = ACTIVE.load(Ordering::Relaxed);
        if mode != OFF {
            // Before the block is released: its address cannot be reused by another thread
            // (and recorded as a new allocation) before this free is in the ring.
            local::on_free(mode, ptr, layout.size());
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let mode = ACTIVE.load(Ordering::Relaxed);
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

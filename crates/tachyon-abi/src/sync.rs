//! The crate's synchronization primitives: loom's under `cfg(loom)`, the standard library's
//! otherwise (after crossbeam-epoch's `primitive` module).
//!
//! Every atomic access in the crate goes through this module, so the loom models in
//! `tests/loom.rs` exercise exactly the code that ships. Under loom the shared memory buffer is
//! a boxed slice of loom atomics (loom cannot overlay its atomics on raw memory), which is why
//! the rest of the crate addresses the buffer as `&[AtomicU32]` and never by pointer.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, Ordering};
#[cfg(loom)]
pub(crate) use loom::thread::yield_now;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, Ordering};
#[cfg(not(loom))]
pub(crate) use std::thread::yield_now;

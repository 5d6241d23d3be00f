//! Returning the import's freed memory to the operating system.
//!
//! The import's transient buffers (tokenized events, pending args, sort scratch) are freed
//! before the tables are handed to SQL, but glibc keeps freed memory that lies below the top of
//! its heap mapped, so a loaded trace would go on holding it as resident memory: with the
//! import bench (`cargo bench -p tachyon-processor --bench import`, 1 M events), 122 bytes per
//! slice resident after the import instead of the 71 the tables use. `malloc_trim` hands
//! those pages back.
//!
//! With `vtab.rs`, the crate's only module with `unsafe` (one foreign call).
#![allow(unsafe_code)]

/// Returns free heap pages to the operating system (glibc only; elsewhere a no-op).
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointer and only walks glibc's own arenas, under their
    // locks; any thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

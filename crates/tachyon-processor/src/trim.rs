//! Returning the import's freed memory to the operating system.
//!
//! The import's transient buffers (tokenized events, pending args, sort scratch) are freed
//! before the tables are handed to SQL, but glibc keeps freed memory that lies below the top of
//! its heap mapped, so a loaded trace would go on holding it as resident memory: with the
//! import bench (`cargo bench -p tachyon-processor --bench import`, 1 M events), 122 bytes per
//! slice resident after the import instead of the 71 the tables use. `malloc_trim` hands
//! those pages back.
//!
//! glibc also raises its mmap threshold each time a large block it mapped is freed (up to
//! 32 MiB), after which every smaller block comes from its heap: a growing table then moves
//! by copy (old and new both resident) and the freed old copies stay resident as holes below
//! the top of the heap. A process that freed one large buffer before importing (the import
//! bench frees the SDK's 24 MB trace buffer; the CLI its read windows) peaked at about twice
//! the memory: 144 bytes per slice instead of 69-72 with the threshold fixed
//! (`MALLOC_MMAP_THRESHOLD_=131072`, the import bench, 1 M events). [`fix_mmap_threshold`]
//! fixes it at glibc's default before an import, so the large tables are mapped and grow by
//! `mremap`, without a copy.
//!
//! With `vtab.rs`, the crate's only module with `unsafe` (foreign calls).
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

/// glibc's default mmap threshold: blocks from this size up are mapped on their own.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// Fixes glibc's mmap threshold at its default, turning off its dynamic raise (see the module
/// doc); glibc only, elsewhere a no-op. Process-wide, and harmless to call again.
pub(crate) fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` takes no pointer; it sets a parameter of glibc's allocator under its
    // lock, and any thread may call it at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

//! Shared memory buffers: a sealed memfd mapped shared, read and written.
//!
//! The service creates each producer's buffer ([`SharedMemory::create`]): `memfd_create`,
//! `ftruncate` to the size, then seals against shrinking, growing and further sealing, so the
//! producer can neither make the service's loads fault (`SIGBUS` after a truncation) nor grow the
//! file. The producer maps the descriptor it receives ([`SharedMemory::map`]) only after checking
//! those seals and the size, so a hostile service cannot make *it* fault either.
//!
//! This is the only module of the crate with `unsafe` code: the mapping's lifetime.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use tachyon_abi::{PageSize, ServiceView, SharedMemoryAbi};

/// The seals every buffer must carry before the other side maps it.
const REQUIRED_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW);

/// A shared, sealed, mapped memory buffer.
#[derive(Debug)]
pub struct SharedMemory {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory owned by this value; this crate only hands out
// views that access it through atomics (`tachyon_abi`), which are safe to use from any thread.
unsafe impl Send for SharedMemory {}
// SAFETY: as above; `&SharedMemory` only gives atomic views and the descriptor.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// A new zero-filled buffer of `size` bytes (a multiple of the system page size), sealed.
    pub fn create(name: &str, size: usize) -> io::Result<SharedMemory> {
        if size == 0 || size % 4096 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("shared memory size {size} is not a positive multiple of 4096"),
            ));
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, size as u64)?;
        rustix::fs::fcntl_add_seals(&fd, REQUIRED_SEALS | SealFlags::SEAL)?;
        Self::map_checked(fd, size)
    }

    /// Maps a buffer received from the other side, after checking it is sealed against
    /// resizing and that its size is a multiple of 4096 within `min..=max`.
    pub fn map(fd: OwnedFd, min: usize, max: usize) -> io::Result<SharedMemory> {
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("shared memory descriptor cannot be sealed (not a memfd?): {e}"),
            )
        })?;
        if !seals.contains(REQUIRED_SEALS) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "shared memory is not sealed against resizing",
            ));
        }
        let size = rustix::fs::fstat(&fd)?.st_size;
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        if size < min || size > max || size % 4096 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("shared memory of {size} bytes (allowed: {min}..={max}, 4 KiB multiple)"),
            ));
        }
        Self::map_checked(fd, size)
    }

    fn map_checked(fd: OwnedFd, len: usize) -> io::Result<SharedMemory> {
        // SAFETY: a fresh mapping chosen by the kernel (null hint), so it overlaps nothing of
        // ours; `fd` is a memfd of at least `len` bytes that can no longer shrink (sealed, checked
        // by both constructors), so every page of the mapping stays backed.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(SharedMemory { ptr, len, fd })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never: sizes are positive).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The descriptor, to send to the other side.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The producer's view, split in pages of `page_size`.
    pub fn producer_view(
        &self,
        page_size: PageSize,
    ) -> Result<SharedMemoryAbi<'_>, tachyon_abi::AbiError> {
        // SAFETY: the mapping lives as long as `self` (unmapped only in `Drop`) and cannot be
        // truncated (sealed); this process touches it only through the ABI views, which use
        // 4-byte atomics at aligned offsets.
        unsafe { SharedMemoryAbi::from_raw_parts(self.ptr.as_ptr(), self.len, page_size) }
    }

    /// The service's validating view, split in pages of `page_size`.
    pub fn service_view(
        &self,
        page_size: PageSize,
    ) -> Result<ServiceView<'_>, tachyon_abi::AbiError> {
        // SAFETY: as in `producer_view`.
        unsafe { ServiceView::from_raw_parts(self.ptr.as_ptr(), self.len, page_size) }
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + len` is the mapping made in `map_checked`, unmapped only here; the
        // views borrow `self`, so none outlives it.
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_mappings_see_the_same_chunks() {
        let service = SharedMemory::create("tachyon-test", 64 * 1024).unwrap();
        let fd = service.fd().try_clone_to_owned().unwrap();
        let producer = SharedMemory::map(fd, 4096, 1 << 20).unwrap();
        let p = producer.producer_view(PageSize::Kib4).unwrap();
        let s = service.service_view(PageSize::Kib4).unwrap();
        assert_eq!(p.num_pages(), 16);
        assert_eq!(s.num_pages(), 16);
        let layout = tachyon_abi::PageLayout::Div4;
        p.try_partition_page(3, layout).unwrap();
        assert_eq!(s.page_header(3).unwrap().header_bitmap.layout(), Ok(layout));
    }

    #[test]
    fn unsealed_or_odd_sized_descriptors_are_refused() {
        let fd = rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 8192).unwrap();
        let e = SharedMemory::map(fd, 4096, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("sealed"), "{e}");

        let ok = SharedMemory::create("x", 8192).unwrap();
        let fd = ok.fd().try_clone_to_owned().unwrap();
        let e = SharedMemory::map(fd, 16384, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("8192"), "{e}");
        assert!(SharedMemory::create("x", 1000).is_err());
    }

    #[test]
    fn sealed_buffers_cannot_be_truncated_by_the_peer() {
        let m = SharedMemory::create("x", 8192).unwrap();
        assert!(rustix::fs::ftruncate(m.fd(), 4096).is_err());
        assert!(rustix::fs::ftruncate(m.fd(), 1 << 20).is_err());
    }
}

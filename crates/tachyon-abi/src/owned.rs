//! A buffer this process allocates itself: the in-process backend's SMB, and tests.

use core::fmt;

use crate::error::AbiError;
use crate::layout::PageSize;
use crate::producer::SharedMemoryAbi;
use crate::service::ServiceView;
use crate::smb::{Geometry, SmbCore};
use crate::sync::AtomicU32;

/// A zero-initialized (all pages free) shared memory buffer owned by this process, aligned to
/// 4 KiB like a mapping.
///
/// Both views borrow it, so the producer and the service of an in-process session can share one
/// `OwnedSmb` (for instance in an `Arc`) across threads.
pub struct OwnedSmb {
    #[cfg(not(loom))]
    storage: Box<[crate::raw::Block]>,
    #[cfg(loom)]
    storage: Box<[AtomicU32]>,
    geo: Geometry,
}

impl fmt::Debug for OwnedSmb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedSmb")
            .field("size", &self.size())
            .field("page_size", &self.page_size())
            .finish()
    }
}

impl OwnedSmb {
    /// Allocates `size` bytes split in pages of `page_size`.
    ///
    /// Errors: `size` is 0, not a multiple of the page size, or above
    /// [`MAX_SMB_SIZE`](crate::MAX_SMB_SIZE).
    pub fn new(size: usize, page_size: PageSize) -> Result<OwnedSmb, AbiError> {
        let geo = Geometry::new(size, page_size)?;
        #[cfg(not(loom))]
        let storage = crate::raw::Block::zeroed(size / (crate::raw::BLOCK_WORDS * 4));
        #[cfg(loom)]
        let storage = (0..size / 4).map(|_| AtomicU32::new(0)).collect();
        Ok(OwnedSmb { storage, geo })
    }

    /// The buffer as words.
    #[must_use]
    pub fn words(&self) -> &[AtomicU32] {
        #[cfg(not(loom))]
        return crate::raw::Block::as_words(&self.storage);
        #[cfg(loom)]
        return &self.storage;
    }

    /// Size in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.words().len() * 4
    }

    /// Page size.
    #[must_use]
    pub fn page_size(&self) -> PageSize {
        self.geo.page_size()
    }

    /// The producer's view.
    #[must_use]
    pub fn producer(&self) -> SharedMemoryAbi<'_> {
        SharedMemoryAbi::from_core(SmbCore::from_checked(self.words(), self.geo))
    }

    /// The service's view.
    #[must_use]
    pub fn service(&self) -> ServiceView<'_> {
        ServiceView::from_core(SmbCore::from_checked(self.words(), self.geo))
    }
}

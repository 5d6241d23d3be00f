//! The daemon's shared memory buffer as the arbiter's memory.

use std::io;
use std::os::fd::OwnedFd;

use tachyon_abi::{PageSize, SharedMemoryAbi, MAX_SMB_SIZE};
use tachyon_ipc::shm::SharedMemory;

use crate::writer::SmbMemory;

/// The mapping of the memfd the daemon sent with `setup_tracing`, split in pages of
/// `page_size`.
#[derive(Debug)]
pub(crate) struct DaemonSmb {
    memory: SharedMemory,
    page_size: PageSize,
}

impl DaemonSmb {
    /// Maps `fd` after `SharedMemory::map`'s checks (sealed against resizing, 4 KiB..=32 MiB in
    /// 4 KiB multiples) and checks the size is a whole number of pages of `page_size_kb` (0:
    /// 4 KiB).
    pub(crate) fn map(fd: OwnedFd, page_size_kb: u32) -> io::Result<DaemonSmb> {
        let kb = if page_size_kb == 0 { 4 } else { page_size_kb };
        let bytes = (kb as usize).saturating_mul(1024);
        let page_size = PageSize::from_bytes(bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("page size: {e}")))?;
        let memory = SharedMemory::map(fd, page_size.bytes(), MAX_SMB_SIZE)?;
        memory
            .producer_view(page_size)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        Ok(DaemonSmb { memory, page_size })
    }
}

impl SmbMemory for DaemonSmb {
    fn producer_view(&self) -> SharedMemoryAbi<'_> {
        // `map` made this view once already: the size, the page size and the mapping do not
        // change, so neither does the answer.
        self.memory
            .producer_view(self.page_size)
            .expect("checked when the buffer was mapped")
    }
}

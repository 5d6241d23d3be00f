//! Mapping a central buffer's pages ahead of its writes, a batch at a time.
//!
//! The ring is allocated zeroed and the kernel maps its pages lazily, as Perfetto commits its
//! buffers' pages: nothing is committed until a chunk is first copied into a page. Left to
//! itself, that first copy takes a page fault per 4 KiB, in the middle of the copy: the trap,
//! the allocation, the zeroing and the page-table update, one page at a time. Asking the kernel
//! to map the next batch of pages at once (`MADV_POPULATE_WRITE`, Linux 5.14) does the same
//! allocation and zeroing without a trap per page, and still commits memory only as far as the
//! writes have reached (plus one batch).
//!
//! This is the crate's one module with `unsafe` code (the `madvise` call).
#![allow(unsafe_code)]

/// Maps the pages covering `bytes` for writing, without changing a byte of them. Returns false
/// when the kernel does not offer it (then the pages fault in on first write, as without it).
#[cfg(all(target_os = "linux", not(miri)))]
pub(crate) fn populate_for_write(bytes: &mut [u8]) -> bool {
    if bytes.is_empty() {
        return true;
    }
    let page = page_size();
    let start = bytes.as_mut_ptr() as usize;
    let aligned = start & !(page - 1);
    // The last page is the one holding the slice's last byte: rounding up stays inside the
    // mapping the slice lies in (the allocator maps whole pages), as does rounding down.
    let end = (start + bytes.len()).next_multiple_of(page);
    // SAFETY: `[aligned, end)` is made of whole pages each holding at least one byte of
    // `bytes`, so all of it is mapped, in this process. MADV_POPULATE_WRITE only faults the
    // pages in as a write would (breaking copy-on-write sharing, allocating zero pages) and
    // never changes their contents, so no Rust reference to any of it observes a change; the
    // kernel reads no user memory through the pointer. An error leaves the pages as they were.
    let r = unsafe {
        libc::madvise(
            aligned as *mut libc::c_void,
            end - aligned,
            libc::MADV_POPULATE_WRITE,
        )
    };
    r == 0
}

/// Not offered here: the pages fault in on first write.
#[cfg(not(all(target_os = "linux", not(miri))))]
pub(crate) fn populate_for_write(_bytes: &mut [u8]) -> bool {
    false
}

#[cfg(all(target_os = "linux", not(miri)))]
fn page_size() -> usize {
    use std::sync::OnceLock;
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf reads a constant of the system; it takes no pointers.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(n)
            .ok()
            .filter(|n| n.is_power_of_two())
            .unwrap_or(4096)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn populating_keeps_every_byte() {
        let mut v: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        let before = v.clone();
        // Unaligned at both ends: the pages holding the ends are shared with bytes outside.
        let ok = populate_for_write(&mut v[1..900_001]);
        // Linux has had MADV_POPULATE_WRITE since 5.14; Miri and other systems do without.
        assert_eq!(ok, cfg!(all(target_os = "linux", not(miri))));
        assert!(v == before);
        // A fresh zeroed allocation (lazily mapped) stays zero, and is writable after.
        let mut z = vec![0u8; 1 << 20];
        populate_for_write(&mut z[4096..]);
        assert!(z.iter().all(|&b| b == 0));
        z[8192] = 1;
        assert_eq!(z.iter().map(|&b| b as u32).sum::<u32>(), 1);
    }
}

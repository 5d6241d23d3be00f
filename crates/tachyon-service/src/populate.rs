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
//! A prefaulted ring also asks for transparent huge pages ([`advise_huge_pages`]): the kernel
//! then maps it 2 MiB at a time, and its writes and read-out miss the TLB 512 times less often.
//! A lazily mapped ring asks for them only while the kernel has free 2 MiB blocks to spare
//! ([`huge_pages_pay_for`]), so that no fault mid-stream waits for memory to be compacted.
//!
//! This is the crate's one module with `unsafe` code (the `madvise` calls).
#![allow(unsafe_code)]

/// Maps the pages covering `bytes` for writing, without changing a byte of them. Returns false
/// when the kernel does not offer it (then the pages fault in on first write, as without it).
#[cfg(all(target_os = "linux", not(miri)))]
pub(crate) fn populate_for_write(bytes: &mut [u8]) -> bool {
    // MADV_POPULATE_WRITE only faults the pages in as a write would (breaking copy-on-write
    // sharing, allocating zero pages) and never changes their contents.
    bytes.is_empty() || advise_pages(bytes, Advice::PopulateWrite)
}

/// The `madvise` advice this module gives: only kinds that never change a byte as the process
/// sees it.
#[cfg(all(target_os = "linux", not(miri)))]
#[derive(Clone, Copy)]
enum Advice {
    PopulateWrite,
    HugePage,
}

/// `madvise(advice)` over the whole pages holding `bytes`; whether the kernel accepted it.
#[cfg(all(target_os = "linux", not(miri)))]
fn advise_pages(bytes: &mut [u8], advice: Advice) -> bool {
    let advice = match advice {
        Advice::PopulateWrite => libc::MADV_POPULATE_WRITE,
        Advice::HugePage => libc::MADV_HUGEPAGE,
    };
    let page = page_size();
    let start = bytes.as_mut_ptr() as usize;
    let aligned = start & !(page - 1);
    // The last page is the one holding the slice's last byte: rounding up stays inside the
    // mapping the slice lies in (the allocator maps whole pages), as does rounding down.
    let end = (start + bytes.len()).next_multiple_of(page);
    // SAFETY: `[aligned, end)` is made of whole pages each holding at least one byte of
    // `bytes`, so all of it is mapped, in this process. Neither kind of `Advice` changes the
    // pages' contents as the process sees them (see their callers), so no Rust reference to any of it observes a change; the kernel reads no
    // user memory through the pointer. An error leaves the pages as they were.
    let r = unsafe { libc::madvise(aligned as *mut libc::c_void, end - aligned, advice) };
    r == 0
}

/// Not offered here: the pages fault in on first write.
#[cfg(not(all(target_os = "linux", not(miri))))]
pub(crate) fn populate_for_write(_bytes: &mut [u8]) -> bool {
    false
}

/// The size of a transparent huge page on x86-64 and aarch64 with 4 KiB pages (the PMD size).
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// Asks the kernel to back `bytes` with transparent huge pages (`madvise(MADV_HUGEPAGE)`), so
/// that its first write to each 2 MiB-aligned stretch maps one 2 MiB page instead of faulting
/// in 512 pages of 4 KiB one at a time; the pages are still mapped only as writes (or
/// [`populate_for_write`]) reach them. Returns false when the kernel does not offer it (THP
/// compiled out, `never`, or not Linux): then nothing changed.
///
/// Where `/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` (common, and this project's
/// VM), memory gets huge pages only when asked like this; under `always` it gets them anyway.
/// A stretch the kernel cannot find a free 2 MiB page for falls back to 4 KiB pages.
#[cfg(all(target_os = "linux", not(miri)))]
pub(crate) fn advise_huge_pages(bytes: &mut [u8]) -> bool {
    // No whole huge page can fit inside a shorter slice. MADV_HUGEPAGE only sets a flag on
    // the mapping that lets the kernel back it with 2 MiB pages on later faults (or by
    // collapsing its pages in the background, `khugepaged`, which copies their contents).
    bytes.len() >= HUGE_PAGE && advise_pages(bytes, Advice::HugePage)
}

/// Not offered here.
#[cfg(not(all(target_os = "linux", not(miri))))]
pub(crate) fn advise_huge_pages(_bytes: &mut [u8]) -> bool {
    false
}

/// Whether a lazily mapped ring of `len` bytes should ask for huge pages
/// ([`advise_huge_pages`]): only when the kernel has at least twice that much memory free in
/// whole 2 MiB blocks now (`/proc/buddyinfo`). Then each first write to a 2 MiB stretch maps a
/// free huge page, one fault and one zeroing instead of 512 of each (on the project's VM, the
/// client bench's service thread spent about 3 ns an event instead of 6 on a fresh ring's first
/// pass). Without such blocks the kernel would make one on the faulting thread (direct
/// compaction and reclaim under `defrag = madvise`), in the middle of the stream, which cost
/// more than the 4 KiB pages save (12.7-13.2 ns an event against 5.7-8.4 on a VM whose memory
/// was nearly all page cache): then the ring keeps 4 KiB pages.
pub(crate) fn huge_pages_pay_for(len: usize) -> bool {
    if len < HUGE_PAGE {
        return false;
    }
    let Some(page) = page_size_if_known() else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/buddyinfo") else {
        return false;
    };
    let order = (HUGE_PAGE / page).trailing_zeros() as usize;
    let free = free_blocks_of_order(&info, order);
    free.saturating_mul(HUGE_PAGE as u64) >= 2 * len as u64
}

/// Free blocks of `2^order` pages in `/proc/buddyinfo`'s text, every node and zone: each line
/// is `Node N, zone NAME` then the number of free blocks of order 0, 1, 2..., and a free block
/// of order `k >= order` holds `2^(k - order)` of them. Lines it cannot read count nothing.
pub(crate) fn free_blocks_of_order(info: &str, order: usize) -> u64 {
    info.lines()
        .filter_map(|line| line.split_once("zone"))
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(1)
                .enumerate()
                .skip(order)
                .map(|(k, n)| {
                    // A count too large to mean anything, or a column past any kernel's
                    // largest order (a block of 2^32 pages is 16 TiB), counts nothing, so odd
                    // text never argues for huge pages.
                    let n = n.parse::<u64>().unwrap_or(0);
                    let shift = (k - order) as u32;
                    if k >= 32 || n.leading_zeros() < shift {
                        0
                    } else {
                        n << shift
                    }
                })
                .fold(0u64, u64::saturating_add)
        })
        .fold(0u64, u64::saturating_add)
}

#[cfg(all(target_os = "linux", not(miri)))]
fn page_size_if_known() -> Option<usize> {
    Some(page_size())
}

/// Not offered here.
#[cfg(not(all(target_os = "linux", not(miri))))]
fn page_size_if_known() -> Option<usize> {
    None
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
    fn free_huge_blocks_are_counted_from_every_zone_and_larger_order() {
        // Two zones (orders 0 to 10), then a line with a count that is not a number.
        let info = "Node 0, zone      DMA      1      1      0      0      2      1      1      0      1      1      3\n\
                    Node 0, zone    DMA32      7      5      4      3      2      1      0      2      0      4      1\n\
                    Node 0, zone   Normal  11521   8295  17925   7705   3854   2322    925    847    335   1150   1454\n\
                    Node 1, zone   Normal      0      0      0      0      0      0      0      0      0      x      5\n";
        // Order 9: each order-9 block is one, each order-10 block two.
        assert_eq!(
            free_blocks_of_order(info, 9),
            (1 + 2 * 3) + (4 + 2) + (1150 + 2 * 1454) + 2 * 5
        );
        assert_eq!(free_blocks_of_order(info, 10), 3 + 1 + 1454 + 5);
        assert_eq!(free_blocks_of_order("", 9), 0);
        assert_eq!(free_blocks_of_order("garbage\nzone\n", 9), 0);
        // Counts or columns too large to be real count nothing (no saturated "plenty").
        let wide = format!("Node 0, zone Normal {}", "1 ".repeat(80));
        assert_eq!(free_blocks_of_order(&wide, 9), (1 << 23) - 1);
        let big = format!("Node 0, zone Normal 0 0 0 0 0 0 0 0 0 0 {}", u64::MAX);
        assert_eq!(free_blocks_of_order(&big, 9), 0);
        // Never more than a small ring asks for when there is no such file or no huge page.
        assert!(!huge_pages_pay_for(HUGE_PAGE - 1));
    }

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
    /// This thread's minor page faults so far (field 10 of `/proc/thread-self/stat`).
    fn minor_faults() -> Option<u64> {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
        let rest = &stat[stat.rfind(')')? + 1..];
        rest.split_whitespace().nth(7)?.parse().ok()
    }

    /// `VmFlags` and `AnonHugePages` (bytes) of the mapping holding `addr`, from
    /// `/proc/self/smaps`.
    fn mapping_at(addr: usize) -> Option<(String, u64)> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let (mut inside, mut huge) = (false, None);
        for line in smaps.lines() {
            let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
            if let Some((a, b)) = range {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
            if !inside {
                continue;
            }
            if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                huge = kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok();
            } else if let Some(flags) = line.strip_prefix("VmFlags:") {
                return Some((flags.to_owned(), huge? * 1024));
            }
        }
        None
    }

    #[test]
    #[cfg_attr(miri, ignore = "madvise and /proc are not modelled")]
    fn advised_memory_is_flagged_and_faults_in_a_huge_page_at_a_time() {
        const LEN: usize = 16 << 20;
        let mut v = vec![0u8; LEN];
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        let offered = mode.is_ok_and(|m| !m.contains("[never]"));
        let advised = advise_huge_pages(&mut v);
        if !offered || cfg!(not(target_os = "linux")) {
            eprintln!("skipped: no transparent huge pages here (advised: {advised})");
            return;
        }
        assert!(advised, "madvise(MADV_HUGEPAGE) refused");
        let Some((flags, _)) = mapping_at(v.as_ptr() as usize + LEN / 2) else {
            eprintln!("skipped: no /proc/self/smaps");
            return;
        };
        // `hg`: the mapping carries VM_HUGEPAGE.
        assert!(flags.split_whitespace().any(|f| f == "hg"), "{flags}");
        let before = minor_faults().expect("stat");
        for i in (0..LEN).step_by(4096) {
            v[i] = 1;
        }
        let faults = minor_faults().expect("stat") - before;
        let (_, huge) = mapping_at(v.as_ptr() as usize + LEN / 2).expect("smaps");
        eprintln!(
            "16 MiB advised: {faults} faults, {} KiB in huge pages",
            huge >> 10
        );
        assert_eq!(v.iter().map(|&b| b as usize).sum::<usize>(), LEN / 4096);
        if huge == 0 {
            // The kernel found no free 2 MiB page (fragmented memory): 4 KiB pages, as before.
            eprintln!("no huge page given: nothing more to check");
            return;
        }
        // A fault per huge page and per 4 KiB page outside them (the ends that are not 2 MiB
        // aligned), where 4 096 pages fault one by one without the advice.
        let huge = (huge as usize).min(LEN);
        let bound = (LEN - huge) / 4096 + huge / HUGE_PAGE + 64;
        assert!(faults as usize <= bound, "{faults} faults, bound {bound}");
    }
}

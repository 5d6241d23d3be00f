//! The kernel's key strings for the `MeminfoCounters` and `VmstatCounters` enums
//! (`perfetto/common/sys_stats_counters.proto`), indexed by enum value: what a `/proc/meminfo`
//! or `/proc/vmstat` line is called, as in Perfetto's `kMeminfoKeys` and `kVmstatKeys`
//! (`include/perfetto/ext/traced/sys_stats_counters.h`). The daemon's `linux.sys_stats` probe
//! maps lines to enum values with them, and the trace processor names its counter tracks with
//! them, so both ends share one table. Index 0 is the enum's `*_UNSPECIFIED` and never matches
//! a line. Upstream has a few more vmstat keys than our schema copy; they are left out until the
//! enum gains them. Hand-written (not generated).

/// `/proc/meminfo` keys (without the trailing `:`), indexed by `MeminfoCounters`.
pub const MEMINFO_KEYS: [&str; 34] = [
    "",
    "MemTotal",
    "MemFree",
    "MemAvailable",
    "Buffers",
    "Cached",
    "SwapCached",
    "Active",
    "Inactive",
    "Active(anon)",
    "Inactive(anon)",
    "Active(file)",
    "Inactive(file)",
    "Unevictable",
    "Mlocked",
    "SwapTotal",
    "SwapFree",
    "Dirty",
    "Writeback",
    "AnonPages",
    "Mapped",
    "Shmem",
    "Slab",
    "SReclaimable",
    "SUnreclaim",
    "KernelStack",
    "PageTables",
    "CommitLimit",
    "Committed_AS",
    "VmallocTotal",
    "VmallocUsed",
    "VmallocChunk",
    "CmaTotal",
    "CmaFree",
];

/// `/proc/vmstat` keys, indexed by `VmstatCounters`.
pub const VMSTAT_KEYS: [&str; 96] = [
    "",
    "nr_free_pages",
    "nr_alloc_batch",
    "nr_inactive_anon",
    "nr_active_anon",
    "nr_inactive_file",
    "nr_active_file",
    "nr_unevictable",
    "nr_mlock",
    "nr_anon_pages",
    "nr_mapped",
    "nr_file_pages",
    "nr_dirty",
    "nr_writeback",
    "nr_slab_reclaimable",
    "nr_slab_unreclaimable",
    "nr_page_table_pages",
    "nr_kernel_stack",
    "nr_overhead",
    "nr_unstable",
    "nr_bounce",
    "nr_vmscan_write",
    "nr_vmscan_immediate_reclaim",
    "nr_writeback_temp",
    "nr_isolated_anon",
    "nr_isolated_file",
    "nr_shmem",
    "nr_dirtied",
    "nr_written",
    "nr_pages_scanned",
    "workingset_refault",
    "workingset_activate",
    "workingset_nodereclaim",
    "nr_anon_transparent_hugepages",
    "nr_free_cma",
    "nr_swapcache",
    "nr_dirty_threshold",
    "nr_dirty_background_threshold",
    "pgpgin",
    "pgpgout",
    "pgpgoutclean",
    "pswpin",
    "pswpout",
    "pgalloc_dma",
    "pgalloc_normal",
    "pgalloc_movable",
    "pgfree",
    "pgactivate",
    "pgdeactivate",
    "pgfault",
    "pgmajfault",
    "pgrefill_dma",
    "pgrefill_normal",
    "pgrefill_movable",
    "pgsteal_kswapd_dma",
    "pgsteal_kswapd_normal",
    "pgsteal_kswapd_movable",
    "pgsteal_direct_dma",
    "pgsteal_direct_normal",
    "pgsteal_direct_movable",
    "pgscan_kswapd_dma",
    "pgscan_kswapd_normal",
    "pgscan_kswapd_movable",
    "pgscan_direct_dma",
    "pgscan_direct_normal",
    "pgscan_direct_movable",
    "pgscan_direct_throttle",
    "pginodesteal",
    "slabs_scanned",
    "kswapd_inodesteal",
    "kswapd_low_wmark_hit_quickly",
    "kswapd_high_wmark_hit_quickly",
    "pageoutrun",
    "allocstall",
    "pgrotated",
    "drop_pagecache",
    "drop_slab",
    "pgmigrate_success",
    "pgmigrate_fail",
    "compact_migrate_scanned",
    "compact_free_scanned",
    "compact_isolated",
    "compact_stall",
    "compact_fail",
    "compact_success",
    "compact_daemon_wake",
    "unevictable_pgs_culled",
    "unevictable_pgs_scanned",
    "unevictable_pgs_rescued",
    "unevictable_pgs_mlocked",
    "unevictable_pgs_munlocked",
    "unevictable_pgs_cleared",
    "unevictable_pgs_stranded",
    "nr_zspages",
    "nr_ion_heap",
    "nr_gpu_heap",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MeminfoCounters, VmstatCounters};

    #[test]
    fn tables_match_the_enums() {
        assert_eq!(
            MEMINFO_KEYS[MeminfoCounters::MeminfoMemTotal as usize],
            "MemTotal"
        );
        assert_eq!(
            MEMINFO_KEYS[MeminfoCounters::MeminfoCommitedAs as usize],
            "Committed_AS"
        );
        assert_eq!(
            MEMINFO_KEYS[MeminfoCounters::MeminfoCmaFree as usize],
            "CmaFree"
        );
        assert_eq!(
            VMSTAT_KEYS[VmstatCounters::VmstatPgfault as usize],
            "pgfault"
        );
        assert_eq!(
            VMSTAT_KEYS[VmstatCounters::VmstatPgmajfault as usize],
            "pgmajfault"
        );
        assert_eq!(
            VMSTAT_KEYS[VmstatCounters::VmstatNrGpuHeap as usize],
            "nr_gpu_heap"
        );
        // Every index is an enum value, and the enums end where the tables do.
        for (i, _) in MEMINFO_KEYS.iter().enumerate().skip(1) {
            assert!(MeminfoCounters::from_i32(i as i32).is_some());
        }
        for (i, _) in VMSTAT_KEYS.iter().enumerate().skip(1) {
            assert!(VmstatCounters::from_i32(i as i32).is_some());
        }
        assert!(MeminfoCounters::from_i32(MEMINFO_KEYS.len() as i32).is_none());
        assert!(VmstatCounters::from_i32(VMSTAT_KEYS.len() as i32).is_none());
    }
}

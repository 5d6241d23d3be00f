//! Looking up `/proc/meminfo` and `/proc/vmstat` keys in the key tables the probe shares with
//! the trace processor (`tachyon_protos::sys_stats_keys`).

pub(crate) use tachyon_protos::sys_stats_keys::{MEMINFO_KEYS, VMSTAT_KEYS};

/// The enum value of a key in `table`, if known (and not the unspecified 0).
pub(crate) fn lookup(table: &[&str], key: &[u8]) -> Option<u32> {
    table
        .iter()
        .skip(1)
        .position(|k| k.as_bytes() == key)
        .map(|i| i as u32 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tachyon_protos::{MeminfoCounters, VmstatCounters};

    #[test]
    fn lookup_gives_the_enum_values() {
        assert_eq!(
            lookup(&MEMINFO_KEYS, b"MemTotal"),
            Some(MeminfoCounters::MeminfoMemTotal as u32)
        );
        assert_eq!(
            lookup(&MEMINFO_KEYS, b"Committed_AS"),
            Some(MeminfoCounters::MeminfoCommitedAs as u32)
        );
        assert_eq!(
            lookup(&MEMINFO_KEYS, b"CmaFree"),
            Some(MeminfoCounters::MeminfoCmaFree as u32)
        );
        assert_eq!(
            lookup(&VMSTAT_KEYS, b"pgfault"),
            Some(VmstatCounters::VmstatPgfault as u32)
        );
        assert_eq!(
            lookup(&VMSTAT_KEYS, b"nr_gpu_heap"),
            Some(VmstatCounters::VmstatNrGpuHeap as u32)
        );
        assert_eq!(lookup(&MEMINFO_KEYS, b""), None);
        assert_eq!(lookup(&MEMINFO_KEYS, b"Hugepagesize"), None);
        // The tables themselves are tested against the enums beside them (tachyon-protos).
    }
}

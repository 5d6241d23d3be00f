//! The tracker's table of live blocks: address → (size, site), open addressing with linear
//! probing and backward-shift deletion (no tombstones, so a table that sees millions of
//! short-lived blocks never degrades), one multiply to hash. An insert or a remove touches one
//! or two adjacent slots in the common case and never allocates except when the table grows
//! (at half full, doubling).

/// A live block: where, how big, and its site.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Slot {
    /// The block's address; [`EMPTY`] marks a free slot (address 0 is kept aside).
    addr: u64,
    size: u64,
    site: u32,
}

const EMPTY: u64 = 0;

/// Address → (size, site).
#[derive(Debug, Default)]
pub(crate) struct LiveTable {
    slots: Vec<Slot>,
    /// `slots.len() - 1` (a power of two minus one), or 0 before the first insert.
    mask: usize,
    len: usize,
    /// The block at address 0 (a pool may hand out offsets from 0), outside the slots.
    zero: Option<(u64, u32)>,
}

/// Fibonacci hashing of the address without its alignment bits: the top bits of the product
/// index the table.
#[inline(always)]
fn hash(addr: u64) -> u64 {
    ((addr >> 4) ^ (addr >> 24)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl LiveTable {
    /// Blocks in the table.
    pub(crate) fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    #[inline(always)]
    fn home(&self, addr: u64) -> usize {
        // `mask + 1` is a power of two: its bit count is the shift.
        let bits = (self.mask + 1).trailing_zeros();
        (hash(addr) >> (64 - bits).min(63)) as usize & self.mask
    }

    /// The slot holding `addr`, if any.
    #[inline]
    fn find(&self, addr: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mut i = self.home(addr);
        loop {
            let s = self.slots[i].addr;
            if s == addr {
                return Some(i);
            }
            if s == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Whether a block at `addr` is live.
    #[inline]
    pub(crate) fn contains(&self, addr: u64) -> bool {
        if addr == EMPTY {
            return self.zero.is_some();
        }
        self.find(addr).is_some()
    }

    /// Records the block at `addr`; returns the block it replaces (the same address was still
    /// live).
    #[inline]
    pub(crate) fn insert(&mut self, addr: u64, size: u64, site: u32) -> Option<(u64, u32)> {
        if addr == EMPTY {
            return self.zero.replace((size, site));
        }
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mut i = self.home(addr);
        loop {
            let s = &mut self.slots[i];
            if s.addr == addr {
                let old = (s.size, s.site);
                s.size = size;
                s.site = site;
                return Some(old);
            }
            if s.addr == EMPTY {
                *s = Slot { addr, size, site };
                self.len += 1;
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Forgets the block at `addr`, returning its (size, site) if it was live.
    #[inline]
    pub(crate) fn remove(&mut self, addr: u64) -> Option<(u64, u32)> {
        if addr == EMPTY {
            return self.zero.take();
        }
        let mut hole = self.find(addr)?;
        let out = (self.slots[hole].size, self.slots[hole].site);
        self.len -= 1;
        // Backward shift: pull later entries of the run into the hole when their home is not
        // between the hole and them (cyclically), so lookups never need a tombstone.
        let mut i = (hole + 1) & self.mask;
        loop {
            let s = self.slots[i];
            if s.addr == EMPTY {
                break;
            }
            let home = self.home(s.addr);
            let dist_hole = hole.wrapping_sub(home) & self.mask;
            let dist_here = i.wrapping_sub(home) & self.mask;
            if dist_hole <= dist_here {
                self.slots[hole] = s;
                hole = i;
            }
            i = (i + 1) & self.mask;
        }
        self.slots[hole] = Slot::default();
        Some(out)
    }

    /// Empties the table, handing each (size, site) to `f`.
    pub(crate) fn drain(&mut self, mut f: impl FnMut(u64, u32)) {
        if let Some((size, site)) = self.zero.take() {
            f(size, site);
        }
        for s in &mut self.slots {
            if s.addr != EMPTY {
                f(s.size, s.site);
                *s = Slot::default();
            }
        }
        self.len = 0;
    }

    #[cold]
    fn grow(&mut self) {
        let cap = (self.slots.len() * 2).max(1024);
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); cap]);
        self.mask = cap - 1;
        self.len = 0;
        for s in old {
            if s.addr != EMPTY {
                self.insert(s.addr, s.size, s.site);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn insert_remove_and_replace() {
        let mut t = LiveTable::default();
        assert_eq!(t.remove(0x10), None);
        assert_eq!(t.insert(0x10, 64, 1), None);
        assert_eq!(t.insert(0x10, 32, 2), Some((64, 1)));
        assert!(t.contains(0x10));
        assert_eq!(t.insert(0, 8, 3), None);
        assert_eq!(t.len(), 2);
        assert_eq!(t.remove(0x10), Some((32, 2)));
        assert_eq!(t.remove(0x10), None);
        let mut seen = Vec::new();
        t.drain(|size, site| seen.push((size, site)));
        assert_eq!(seen, vec![(8, 3)]);
        assert_eq!(t.len(), 0);
        assert!(!t.contains(0));
    }

    /// Addresses that share their home slot (a run that wraps around the table's end too)
    /// stay findable whichever of them goes first.
    #[test]
    fn colliding_runs_survive_removals() {
        let mut t = LiveTable::default();
        t.insert(1, 1, 0);
        let cap = t.slots.len();
        let last = cap - 1;
        let mut same: Vec<u64> = (1..u64::MAX)
            .map(|a| a << 4)
            .filter(|&a| t.home(a) == last)
            .take(6)
            .collect();
        for &a in &same {
            t.insert(a, a, 0);
        }
        same.rotate_left(2);
        for (n, &a) in same.iter().enumerate() {
            assert_eq!(t.remove(a), Some((a, 0)));
            for &b in &same[n + 1..] {
                assert!(t.contains(b), "{b:#x} lost after removing {a:#x}");
            }
        }
        assert_eq!(t.len(), 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 64 },
            ..ProptestConfig::default()
        })]
        /// The table agrees with a `HashMap` over any sequence of inserts and removes (few
        /// distinct addresses, so replacements and misses are common).
        #[test]
        #[cfg_attr(miri, ignore = "property test: slow under Miri, no unsafe code involved")]
        fn agrees_with_a_hash_map(
            ops in proptest::collection::vec((any::<bool>(), 0u64..3000, 1u64..100), 0..3000)
        ) {
            let mut t = LiveTable::default();
            let mut m = HashMap::new();
            for (ins, a, size) in ops {
                let addr = a * 16;
                if ins {
                    prop_assert_eq!(t.insert(addr, size, a as u32), m.insert(addr, (size, a as u32)));
                } else {
                    prop_assert_eq!(t.remove(addr), m.remove(&addr));
                }
                prop_assert_eq!(t.len(), m.len());
            }
            for (&addr, _) in m.iter() {
                prop_assert!(t.contains(addr));
            }
        }
    }
}

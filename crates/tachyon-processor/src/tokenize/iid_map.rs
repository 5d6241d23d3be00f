//! A sequence's interned data by interning id (`iid`).
//!
//! Every event looks up its name, category, annotation names, string values and source
//! location by iid, five or more lookups per event. Producers number their interned entries
//! densely from 1 (Perfetto's SDK and Tachyon's do), so small iids are kept in a vector indexed
//! by iid, and only ids that would leave that vector mostly empty go to a hash map. The vector
//! never grows beyond a few slots per entry it holds ([`IidMap::insert`]), whatever iids a
//! hostile trace uses.

use crate::storage::strings::FxHashMap;

/// Slots the vector may always grow to, whatever it holds.
const DENSE_FREE: u64 = 64;
/// Beyond that, the vector may grow to this many slots per entry it holds.
const DENSE_PER_ENTRY: u64 = 4;

/// A map from iid to `V`, with the same answers as a `HashMap<u64, V>` (a later insert of the
/// same iid replaces the value).
#[derive(Debug)]
pub(crate) struct IidMap<V> {
    dense: Vec<Option<V>>,
    /// Entries held in `dense`.
    filled: u64,
    sparse: FxHashMap<u64, V>,
}

impl<V> Default for IidMap<V> {
    fn default() -> Self {
        IidMap {
            dense: Vec::new(),
            filled: 0,
            sparse: FxHashMap::default(),
        }
    }
}

impl<V> IidMap<V> {
    /// The value of `iid`, if one was inserted.
    #[inline]
    pub(crate) fn get(&self, iid: &u64) -> Option<&V> {
        match self.dense.get(*iid as usize) {
            Some(Some(v)) => Some(v),
            // An iid inserted before the vector reached it lives in the map.
            _ => self.sparse.get(iid),
        }
    }

    /// Sets the value of `iid`.
    pub(crate) fn insert(&mut self, iid: u64, v: V) {
        let room = DENSE_FREE + DENSE_PER_ENTRY * (self.filled + 1);
        if iid < self.dense.len() as u64 || iid < room {
            // Within the vector, or close enough to grow it: the iid lives there (and nowhere
            // else, so that `get` finds the latest value).
            self.sparse.remove(&iid);
            let i = iid as usize;
            if i >= self.dense.len() {
                self.dense.resize_with(i + 1, || None);
            }
            if self.dense[i].replace(v).is_none() {
                self.filled += 1;
            }
        } else {
            self.sparse.insert(iid, v);
        }
    }

    /// Every value, forgotten (a new generation of incremental state).
    pub(crate) fn clear(&mut self) {
        self.dense.clear();
        self.filled = 0;
        self.sparse.clear();
    }
}

impl<V> Extend<(u64, V)> for IidMap<V> {
    fn extend<I: IntoIterator<Item = (u64, V)>>(&mut self, iter: I) {
        for (iid, v) in iter {
            self.insert(iid, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The same answers as a `HashMap` for dense, sparse, huge and repeated iids, and the
    /// vector stays proportional to what it holds.
    #[test]
    fn answers_as_a_hash_map_does() {
        let mut rnd = crate::xorshift(0x853c_49e6_748f_ea9bu64);
        for round in 0..20 {
            let mut m = IidMap::default();
            let mut want = HashMap::new();
            for i in 0..2000u64 {
                let r = rnd();
                let iid = match r % 4 {
                    0 => i,
                    1 => r >> 40,
                    2 => u64::MAX - (r % 3),
                    _ => r % 300,
                };
                m.insert(iid, i);
                want.insert(iid, i);
                if round % 5 == 0 && i == 1000 {
                    m.clear();
                    want.clear();
                }
            }
            for iid in want.keys().copied().chain((0..400).map(|_| rnd() % 5000)) {
                assert_eq!(m.get(&iid), want.get(&iid), "iid {iid}");
            }
            assert!(m.dense.len() as u64 <= DENSE_FREE + DENSE_PER_ENTRY * (m.filled + 1));
        }
    }
}

//! The index of one sequence's unread chunks, by extended chunk id, for [`crate::TraceBuffer`].
//!
//! A writer commits its chunks in id order nearly always, and they leave the index (read, or
//! evicted from the ring in write order) oldest first. So the index is a deque sorted by id: an
//! in-order commit is a push at the back, and the read or eviction of the oldest a pop at the
//! front, with no tree node to walk or allocate (a `BTreeMap` here cost about a tenth of a
//! chunk's whole write, more than all the other bookkeeping). Chunks that arrive out of order
//! (a scrape before an older commit, a recommit, or a producer sending ids in any order it
//! likes: producers are untrusted) go to a `BTreeMap` beside it, so no arrival order costs more
//! than a logarithmic insert.

use std::collections::{BTreeMap, VecDeque};

/// Unread chunks of a sequence: extended chunk id → record index.
#[derive(Debug, Default)]
pub(crate) struct ChunkIndex {
    /// Strictly increasing ids: chunks that arrived after every id already here.
    ordered: VecDeque<(u64, usize)>,
    /// Chunks that arrived out of order (never an id also in `ordered`).
    stray: BTreeMap<u64, usize>,
}

impl ChunkIndex {
    /// The position of `ext` in `ordered`, if it is there.
    #[inline]
    fn find_ordered(&self, ext: u64) -> Option<usize> {
        let &(front, _) = self.ordered.front()?;
        if ext == front {
            return Some(0);
        }
        let last = self.ordered.len() - 1;
        let (back, _) = self.ordered[last];
        if ext == back {
            return Some(last);
        }
        if ext < front || ext > back {
            return None;
        }
        self.ordered.binary_search_by_key(&ext, |&(e, _)| e).ok()
    }

    /// The record of chunk `ext`.
    #[inline]
    pub(crate) fn get(&self, ext: u64) -> Option<usize> {
        if let Some(i) = self.find_ordered(ext) {
            return Some(self.ordered[i].1);
        }
        if self.stray.is_empty() {
            return None;
        }
        self.stray.get(&ext).copied()
    }

    /// Indexes chunk `ext` (replacing the record of the same id, if any).
    #[inline]
    pub(crate) fn insert(&mut self, ext: u64, idx: usize) {
        match self.ordered.back() {
            Some(&(back, _)) if ext <= back => {}
            _ if self.stray.contains_key(&ext) => {}
            _ => {
                self.ordered.push_back((ext, idx));
                return;
            }
        }
        match self.find_ordered(ext) {
            Some(i) => self.ordered[i].1 = idx,
            None => {
                self.stray.insert(ext, idx);
            }
        }
    }

    /// Removes chunk `ext` from the index.
    #[inline]
    pub(crate) fn remove(&mut self, ext: u64) -> Option<usize> {
        if let Some(&(front, idx)) = self.ordered.front() {
            if front == ext {
                self.ordered.pop_front();
                return Some(idx);
            }
        }
        if let Some(idx) = self.stray.remove(&ext) {
            return Some(idx);
        }
        // Not the oldest: only a chunk that left the ring out of id order (a rare case, and
        // then the deque moves the shorter side).
        let i = self.find_ordered(ext)?;
        self.ordered.remove(i).map(|(_, idx)| idx)
    }

    /// The chunk with the lowest id.
    #[inline]
    pub(crate) fn first(&self) -> Option<(u64, usize)> {
        let ordered = self.ordered.front().copied();
        if self.stray.is_empty() {
            return ordered;
        }
        let stray = self.stray.first_key_value().map(|(&e, &i)| (e, i));
        match (ordered, stray) {
            (Some(o), Some(s)) => Some(if o.0 < s.0 { o } else { s }),
            (o, s) => o.or(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, usize),
        Remove(u64),
        RemoveFirst,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            // Mostly in-order ids, as writers commit them, with some out of order.
            4 => (0u64..64, any::<usize>()).prop_map(|(e, i)| Op::Insert(e, i)),
            2 => (0u64..64).prop_map(Op::Remove),
            2 => Just(Op::RemoveFirst),
        ]
    }

    proptest::proptest! {
        /// The index answers as a `BTreeMap` does, whatever the order of arrivals and removals.
        #[test]
        fn it_behaves_as_a_sorted_map(
            ops in proptest::collection::vec(op(), 0..200),
            ascending in proptest::prelude::any::<bool>(),
        ) {
            let mut index = ChunkIndex::default();
            let mut model = BTreeMap::new();
            let mut next = 0u64;
            for op in ops {
                match op {
                    Op::Insert(e, i) => {
                        // Half the runs mostly append, as real writers do.
                        let e = if ascending && e % 4 != 0 { next += 1; 64 + next } else { e };
                        index.insert(e, i);
                        model.insert(e, i);
                    }
                    Op::Remove(e) => {
                        proptest::prop_assert_eq!(index.remove(e), model.remove(&e));
                    }
                    Op::RemoveFirst => {
                        let first = model.first_key_value().map(|(&e, &i)| (e, i));
                        proptest::prop_assert_eq!(index.first(), first);
                        if let Some((e, _)) = first {
                            proptest::prop_assert_eq!(index.remove(e), model.remove(&e));
                        }
                    }
                }
                for e in 0..(64 + next + 2) {
                    proptest::prop_assert_eq!(index.get(e), model.get(&e).copied());
                }
                proptest::prop_assert_eq!(
                    index.first(),
                    model.first_key_value().map(|(&e, &i)| (e, i))
                );
            }
        }
    }

    #[test]
    fn in_order_chunks_stay_in_the_deque() {
        let mut index = ChunkIndex::default();
        for e in 0..100 {
            index.insert(e, e as usize);
        }
        assert!(index.stray.is_empty());
        for e in 0..100 {
            assert_eq!(index.first(), Some((e, e as usize)));
            assert_eq!(index.remove(e), Some(e as usize));
        }
        assert_eq!(index.first(), None);
    }
}

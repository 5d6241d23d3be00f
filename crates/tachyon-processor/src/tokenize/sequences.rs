//! The per-sequence state of the tokenizer, by `trusted_packet_sequence_id`.
//!
//! Every packet looks its sequence up, several times on the way through the tokenizer, and a
//! trace's packets come in runs from one sequence (a writer's chunk at a time), so the last
//! sequence found is remembered: most lookups are one comparison instead of a hash lookup.

use std::cell::Cell;

use crate::storage::strings::FxHashMap;

/// Sequence states by id, in the order they were first seen.
#[derive(Debug)]
pub(crate) struct Sequences<T> {
    index: FxHashMap<u32, u32>,
    ids: Vec<u32>,
    states: Vec<T>,
    /// The id and position of the sequence found last (valid only if `states` is not empty:
    /// positions never change once given).
    last: Cell<(u32, u32)>,
}

impl<T> Default for Sequences<T> {
    fn default() -> Self {
        Sequences {
            index: FxHashMap::default(),
            ids: Vec::new(),
            states: Vec::new(),
            last: Cell::new((0, u32::MAX)),
        }
    }
}

impl<T: Default> Sequences<T> {
    #[inline]
    fn position(&self, id: u32) -> Option<usize> {
        let (last_id, last_pos) = self.last.get();
        if last_id == id && last_pos != u32::MAX {
            return Some(last_pos as usize);
        }
        let pos = *self.index.get(&id)?;
        self.last.set((id, pos));
        Some(pos as usize)
    }

    /// The state of sequence `id`, if it was seen.
    #[inline]
    pub(crate) fn get(&self, id: &u32) -> Option<&T> {
        let pos = self.position(*id)?;
        self.states.get(pos)
    }

    /// The state of sequence `id`, if it was seen.
    #[inline]
    pub(crate) fn get_mut(&mut self, id: &u32) -> Option<&mut T> {
        let pos = self.position(*id)?;
        self.states.get_mut(pos)
    }

    /// The state of sequence `id`, and whether it is new (created now, default).
    #[inline]
    pub(crate) fn get_or_insert(&mut self, id: u32) -> (&mut T, bool) {
        match self.position(id) {
            Some(pos) => (&mut self.states[pos], false),
            None => (self.insert(id), true),
        }
    }

    /// A new sequence's state (once per sequence: kept out of the callers' code).
    #[cold]
    #[inline(never)]
    fn insert(&mut self, id: u32) -> &mut T {
        let pos = self.states.len();
        self.index.insert(id, pos as u32);
        self.ids.push(id);
        self.states.push(T::default());
        self.last.set((id, pos as u32));
        &mut self.states[pos]
    }

    /// The state of sequence `id`, created if new.
    #[inline]
    pub(crate) fn or_default(&mut self, id: u32) -> &mut T {
        self.get_or_insert(id).0
    }

    /// Every sequence: (id, state), in the order first seen.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&u32, &T)> {
        self.ids.iter().zip(&self.states)
    }
}

impl<T: Default> std::ops::Index<&u32> for Sequences<T> {
    type Output = T;

    /// Panics if sequence `id` was never seen (a caller's invariant, as with a map).
    #[inline]
    fn index(&self, id: &u32) -> &T {
        self.get(id).expect("sequence exists")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_each_sequence_whatever_was_looked_up_last() {
        let mut s: Sequences<u64> = Sequences::default();
        assert!(s.get(&7).is_none());
        *s.or_default(7) = 70;
        assert_eq!(s.get_or_insert(7), (&mut 70, false));
        *s.or_default(0) = 1;
        *s.or_default(9) = 90;
        for id in [7, 7, 9, 0, 7, 0, 0, 9] {
            let want = match id {
                7 => 70,
                9 => 90,
                _ => 1,
            };
            assert_eq!(s[&id], want, "sequence {id}");
            assert_eq!(s.get_mut(&id).copied(), Some(want));
        }
        assert!(s.get(&8).is_none());
        // The cache remembers a hit, never a miss.
        assert_eq!(s.get(&9), Some(&90));
        let (v, new) = s.get_or_insert(8);
        assert!(new && *v == 0);
        let all: Vec<_> = s.iter().map(|(&id, &v)| (id, v)).collect();
        assert_eq!(all, [(7, 70), (0, 1), (9, 90), (8, 0)]);
    }
}

//! The arguments of tokenized events until they are parsed.
//!
//! Every slice's arguments wait here from tokenizing until the sorted events are parsed, so
//! for a whole-file sort this arena is at the import's peak. An argument is kept as the 4-byte
//! id of its distinct `(flat_key, key, value)` in the arg table being built
//! ([`ArgBuilder::entry_id`]): deduplicating it now costs the same lookup parsing did, and the
//! 24-byte [`PendingArg`] per argument is never held. The parser adds the id to its slice's arg
//! set as it is.

use crate::importers::PendingArg;
use crate::storage::tables::ArgBuilder;
use crate::storage::NONE;

/// Pending arguments, by arena index (events refer to runs of them).
#[derive(Debug, Default)]
pub(crate) struct ArgArena {
    ids: Vec<u32>,
    /// The entries whose key is `NONE`: placeholders the parser fills in (`legacy.rs`). There
    /// are one or two distinct ones, so the parser tells them apart without reading the entry
    /// of every argument (a cache miss each, in sorted order).
    placeholders: Vec<u32>,
}

impl ArgArena {
    /// The number of arguments so far (the index the next one gets).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Appends argument `a`, stored in `table`.
    #[inline]
    pub(crate) fn push(&mut self, table: &mut ArgBuilder, a: PendingArg) {
        let id = self.entry(table, a);
        self.ids.push(id);
    }

    fn entry(&mut self, table: &mut ArgBuilder, a: PendingArg) -> u32 {
        let id = table.entry_id(a.flat_key, a.key, a.value);
        if a.key == NONE && !self.placeholders.contains(&id) {
            self.placeholders.push(id);
        }
        id
    }

    /// Whether entry `id` is a placeholder (its key is `NONE`).
    #[inline]
    pub(crate) fn is_placeholder(&self, id: u32) -> bool {
        !self.placeholders.is_empty() && self.placeholders.contains(&id)
    }

    /// The entry id of the argument at `i` (`i < len()`).
    #[inline]
    pub(crate) fn id(&self, i: usize) -> u32 {
        self.ids[i]
    }

    /// The argument at `i` (`i < len()`).
    pub(crate) fn get(&self, table: &ArgBuilder, i: usize) -> PendingArg {
        let e = table.entry(self.ids[i]);
        PendingArg {
            flat_key: e.flat_key,
            key: e.key,
            value: e.value,
        }
    }

    /// Replaces the argument at `i`, if there is one.
    pub(crate) fn set(&mut self, table: &mut ArgBuilder, i: usize, a: PendingArg) {
        if i < self.ids.len() {
            self.ids[i] = self.entry(table, a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::ArgValue;

    #[test]
    fn arguments_read_back_as_pushed_and_share_entries() {
        let mut table = ArgBuilder::default();
        let mut arena = ArgArena::default();
        let a = PendingArg {
            flat_key: 1,
            key: 2,
            value: ArgValue::Int(-3),
        };
        let b = PendingArg {
            flat_key: 1,
            key: 2,
            value: ArgValue::Str(7),
        };
        arena.push(&mut table, a);
        arena.push(&mut table, b);
        arena.push(&mut table, a);
        assert_eq!(arena.len(), 3);
        assert_eq!(arena.id(0), arena.id(2), "one entry for equal arguments");
        assert_ne!(arena.id(0), arena.id(1));
        let got = arena.get(&table, 1);
        assert_eq!((got.flat_key, got.key), (1, 2));
        assert!(matches!(got.value, ArgValue::Str(7)));
        arena.set(&mut table, 0, b);
        assert_eq!(arena.id(0), arena.id(1));
        arena.set(&mut table, 9, a); // Out of range: ignored.
        assert_eq!(arena.len(), 3);
        assert!(!arena.is_placeholder(arena.id(0)));
        let p = PendingArg {
            flat_key: 5,
            key: NONE,
            value: ArgValue::UInt(0),
        };
        arena.push(&mut table, p);
        assert!(arena.is_placeholder(arena.id(3)));
        assert!(!arena.is_placeholder(arena.id(1)));
    }
}

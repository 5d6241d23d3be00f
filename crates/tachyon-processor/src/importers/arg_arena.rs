//! The arguments of tokenized events until they are parsed.
//!
//! Every slice's arguments wait here from tokenizing until the sorted events are parsed, so
//! for a whole-file sort this arena is at the import's peak. An argument is kept as the 4-byte
//! id of its distinct `(flat_key, key, value)` in the arg table being built
//! ([`ArgBuilder::entry_id`]): deduplicating it now costs the same lookup parsing did, and the
//! 24-byte [`PendingArg`] per argument is never held. The parser adds the id to its slice's arg
//! set as it is.
//!
//! The arena is paged: a page is freed as soon as every event whose arguments lie in it has
//! been parsed ([`ArgArena::hold`] when an event is tokenized, [`ArgArena::release`] when it
//! is parsed), so with the sorter's merge freeing events as it goes, the arguments' memory
//! shrinks while the tables grow. A parsed event only ever reads its own arguments.

use crate::importers::PendingArg;
use crate::storage::tables::ArgBuilder;
use crate::storage::NONE;

/// Arguments per page (256 KiB).
const PAGE: usize = 1 << 16;

/// Pending arguments, by arena index (events refer to runs of them).
#[derive(Debug, Default)]
pub(crate) struct ArgArena {
    /// `None`: freed (every event with arguments in it was parsed).
    pages: Vec<Option<Vec<u32>>>,
    /// Per page: events holding arguments in it that were not parsed yet.
    holds: Vec<u32>,
    len: usize,
    /// The entries whose key is `NONE`: placeholders the parser fills in (`legacy.rs`). There
    /// are one or two distinct ones, so the parser tells them apart without reading the entry
    /// of every argument (a cache miss each, in sorted order).
    placeholders: Vec<u32>,
}

impl ArgArena {
    /// The number of arguments so far (the index the next one gets).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends argument `a`, stored in `table`.
    #[inline]
    pub(crate) fn push(&mut self, table: &mut ArgBuilder, a: PendingArg) {
        let id = self.entry(table, a);
        self.push_id(id);
    }

    /// Appends the argument stored in `table` as entry `id` ([`ArgBuilder::entry_id`]), which
    /// is not a placeholder (its key is not `NONE`).
    #[inline]
    pub(crate) fn push_id(&mut self, id: u32) {
        // The page being filled is the last one, and is never freed (`release`).
        if let Some(Some(p)) = self.pages.last_mut() {
            if p.len() < PAGE {
                p.push(id);
                self.len += 1;
                return;
            }
        }
        self.push_new_page(id);
    }

    #[cold]
    fn push_new_page(&mut self, id: u32) {
        let mut p = Vec::with_capacity(PAGE);
        p.push(id);
        self.pages.push(Some(p));
        self.holds.push(0);
        self.len += 1;
    }

    #[inline]
    fn entry(&mut self, table: &mut ArgBuilder, a: PendingArg) -> u32 {
        let id = table.entry_id(a.flat_key, a.key, a.value);
        if a.key == NONE && !self.placeholders.contains(&id) {
            self.placeholders.push(id);
        }
        id
    }

    /// The pages of the `n > 0` arguments from `start` (a half-open range, which iterates
    /// with one comparison a step where an inclusive one takes two).
    #[inline]
    fn pages_of(start: u32, n: u32) -> std::ops::Range<usize> {
        let start = start as usize;
        start / PAGE..(start + n as usize - 1) / PAGE + 1
    }

    /// An event was tokenized with the `n` arguments from `start`: they stay until it is
    /// parsed.
    pub(crate) fn hold(&mut self, start: u32, n: u32) {
        if n == 0 {
            return;
        }
        for p in Self::pages_of(start, n) {
            if let Some(h) = self.holds.get_mut(p) {
                *h += 1;
            }
        }
    }

    /// The event holding `n` arguments from `start` was parsed: pages no other event holds,
    /// and that no more arguments will be added to, are freed.
    #[inline]
    pub(crate) fn release(&mut self, start: u32, n: u32) {
        if n == 0 {
            return;
        }
        let last = self.len.saturating_sub(1) / PAGE;
        for p in Self::pages_of(start, n) {
            let Some(h) = self.holds.get_mut(p) else {
                continue;
            };
            *h = h.saturating_sub(1);
            if *h == 0 && p < last {
                self.pages[p] = None;
            }
        }
    }

    /// Whether entry `id` is a placeholder (its key is `NONE`).
    #[inline]
    pub(crate) fn is_placeholder(&self, id: u32) -> bool {
        !self.placeholders.is_empty() && self.placeholders.contains(&id)
    }

    /// Whether any argument is a placeholder ([`Self::is_placeholder`]).
    #[inline]
    pub(crate) fn has_placeholders(&self) -> bool {
        !self.placeholders.is_empty()
    }

    /// The entry ids of the `n` arguments from `start`, if they all lie in one page that is
    /// still held (most events' do: a page holds 65 536).
    #[inline]
    pub(crate) fn ids(&self, start: u32, n: u32) -> Option<&[u32]> {
        let (start, n) = (start as usize, n as usize);
        let page = self.pages.get(start / PAGE)?.as_ref()?;
        page.get(start % PAGE..start % PAGE + n)
    }

    /// The entry id of the argument at `i`; `None` if it was freed or never pushed.
    #[inline]
    pub(crate) fn id(&self, i: usize) -> Option<u32> {
        let page = self.pages.get(i / PAGE)?.as_ref()?;
        page.get(i % PAGE).copied()
    }

    /// The argument at `i`, if [`Self::id`] has it.
    pub(crate) fn get(&self, table: &ArgBuilder, i: usize) -> Option<PendingArg> {
        let e = table.entry(self.id(i)?);
        Some(PendingArg {
            flat_key: e.flat_key,
            key: e.key,
            value: e.value,
        })
    }

    /// Replaces the argument at `i`, if there is one.
    pub(crate) fn set(&mut self, table: &mut ArgBuilder, i: usize, a: PendingArg) {
        if self.id(i).is_none() {
            return;
        }
        let id = self.entry(table, a);
        if let Some(Some(page)) = self.pages.get_mut(i / PAGE) {
            page[i % PAGE] = id;
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
        assert_eq!(arena.id(3), None);
        assert_ne!(arena.id(0), arena.id(1));
        let got = arena.get(&table, 1).unwrap();
        assert_eq!((got.flat_key, got.key), (1, 2));
        assert!(matches!(got.value, ArgValue::Str(7)));
        arena.set(&mut table, 0, b);
        assert_eq!(arena.id(0), arena.id(1));
        arena.set(&mut table, 9, a); // Out of range: ignored.
        assert_eq!(arena.len(), 3);
        assert!(!arena.is_placeholder(arena.id(0).unwrap()));
        let p = PendingArg {
            flat_key: 5,
            key: NONE,
            value: ArgValue::UInt(0),
        };
        arena.push(&mut table, p);
        assert!(arena.is_placeholder(arena.id(3).unwrap()));
        assert!(!arena.is_placeholder(arena.id(1).unwrap()));
    }

    /// The cache of recent arguments gives the entry id the table gives, whatever collides in
    /// it (a small value space with many keys: repeats, slot collisions and evictions).
    #[test]
    fn recent_arguments_get_the_tables_ids() {
        let mut table = ArgBuilder::default();
        let mut arena = ArgArena::default();
        let mut next = crate::xorshift(0x9e37_79b9_7f4a_7c15);
        let mut args = Vec::new();
        for _ in 0..50_000 {
            let x = next();
            let value = crate::random_arg_value(x);
            let key = (x >> 8) as u32 % 5;
            let a = PendingArg {
                flat_key: key,
                key: if x % 11 == 0 {
                    NONE
                } else {
                    key + (x % 2) as u32
                },
                value,
            };
            arena.push(&mut table, a);
            args.push(a);
        }
        for (i, a) in args.iter().enumerate() {
            let want = table.entry_id(a.flat_key, a.key, a.value);
            assert_eq!(arena.id(i), Some(want), "argument {i}");
            assert_eq!(arena.is_placeholder(want), a.key == NONE);
        }
    }

    /// A page is freed once the events holding it were all parsed and the arena has moved
    /// past it; the page being filled stays.
    #[test]
    fn pages_are_freed_when_their_events_are_parsed() {
        let mut table = ArgBuilder::default();
        let mut arena = ArgArena::default();
        let a = PendingArg {
            flat_key: 1,
            key: 2,
            value: ArgValue::Int(1),
        };
        // Event x: the last 2 args of page 0 and the first of page 1; event y: one in page 1.
        for _ in 0..PAGE - 2 {
            arena.push(&mut table, a);
        }
        let x = arena.len() as u32;
        for _ in 0..3 {
            arena.push(&mut table, a);
        }
        arena.hold(x, 3);
        let y = arena.len() as u32;
        arena.push(&mut table, a);
        arena.hold(y, 1);
        arena.release(x, 3);
        assert_eq!(arena.id(0), None, "page 0 freed");
        assert!(
            arena.id(y as usize).is_some(),
            "page 1 is still being filled"
        );
        for _ in 0..PAGE {
            arena.push(&mut table, a);
        }
        arena.release(y, 1);
        assert_eq!(arena.id(y as usize), None, "page 1 freed");
        assert!(arena.get(&table, arena.len() - 1).is_some());
        arena.release(y, 1); // Released twice: nothing breaks.
    }
}

//! The large tables of a loaded trace, kept in memory in compact form and read by SQL through
//! virtual tables ([`crate::vtab`]) instead of being copied into SQLite.
//!
//! Copying every slice and argument into SQLite row by row cost most of the import time and
//! held each name and key as text once per row. Here a slice is its fixed-size
//! [`SliceRow`] (strings are pool ids), and arguments are deduplicated: each distinct
//! `(flat_key, key, value)` is stored once in [`ArgTable::entries`] and an arg set is a run of
//! 4-byte entry ids, so the source location and constant arguments every zone repeats cost 4
//! bytes per slice instead of a row each.

use crate::storage::{ArgRow, ArgValue, SliceRow};
use crate::strings::{FxHashMap, StrId, StringPool};

/// One distinct argument.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ArgEntry {
    pub(crate) flat_key: StrId,
    pub(crate) key: StrId,
    pub(crate) value: ArgValue,
}

/// Every arg set, as runs of entry ids.
#[derive(Debug, Default)]
pub(crate) struct ArgTable {
    /// The distinct arguments.
    pub(crate) entries: Vec<ArgEntry>,
    /// `ids[offsets[s]..offsets[s + 1]]` are arg set `s`'s entries, in the order they were
    /// added; a position in `ids` is the row's `args.id`.
    pub(crate) ids: Vec<u32>,
    pub(crate) offsets: Vec<u32>,
}

impl ArgTable {
    /// Builds the table from the importer's rows (sorted here by set, stably).
    pub(crate) fn build(mut rows: Vec<ArgRow>) -> Self {
        // Sets are numbered as they are created and filled at once, so the rows are nearly
        // always in order already; a stable sort (which needs a buffer half their size) only
        // when they are not.
        if !rows.is_sorted_by_key(|a| a.set) {
            rows.sort_by_key(|a| a.set);
        }
        let sets = rows.last().map_or(0, |a| a.set as usize + 1);
        let mut t = ArgTable {
            entries: Vec::new(),
            ids: Vec::with_capacity(rows.len()),
            offsets: Vec::with_capacity(sets + 1),
        };
        let mut seen: FxHashMap<(StrId, StrId, u8, u64), u32> = FxHashMap::default();
        let mut next_set = 0usize;
        for a in &rows {
            while next_set <= a.set as usize {
                t.offsets.push(t.ids.len() as u32);
                next_set += 1;
            }
            let id = *seen
                .entry((a.flat_key, a.key, tag(&a.value), bits(&a.value)))
                .or_insert_with(|| {
                    t.entries.push(ArgEntry {
                        flat_key: a.flat_key,
                        key: a.key,
                        value: a.value,
                    });
                    (t.entries.len() - 1) as u32
                });
            t.ids.push(id);
        }
        drop(seen);
        drop(rows);
        t.offsets.push(t.ids.len() as u32);
        t.entries.shrink_to_fit();
        t
    }

    /// The number of argument rows (`args` rows).
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Row positions of arg set `set` (empty if there is no such set).
    pub(crate) fn set_rows(&self, set: i64) -> std::ops::Range<usize> {
        let Ok(s) = usize::try_from(set) else {
            return 0..0;
        };
        match (self.offsets.get(s), self.offsets.get(s + 1)) {
            (Some(&a), Some(&b)) => a as usize..b as usize,
            _ => 0..0,
        }
    }

    /// The arg set holding row `row` (`row < len()`).
    pub(crate) fn set_of(&self, row: usize) -> usize {
        // The last set whose start is at or before the row (empty sets share a start).
        self.offsets.partition_point(|&o| o as usize <= row) - 1
    }

    /// The argument at row `row`.
    pub(crate) fn row(&self, row: usize) -> &ArgEntry {
        &self.entries[self.ids[row] as usize]
    }

    /// `extract_arg`: the value of `key` in arg set `set`.
    pub(crate) fn lookup(&self, strings: &StringPool, set: i64, key: &str) -> Option<ArgValue> {
        let key = strings.lookup(key)?;
        self.set_rows(set)
            .map(|r| self.row(r))
            .find(|a| a.key == key)
            .map(|a| a.value)
    }
}

fn tag(v: &ArgValue) -> u8 {
    match v {
        ArgValue::Int(_) => 0,
        ArgValue::UInt(_) => 1,
        ArgValue::Real(_) => 2,
        ArgValue::Str(_) => 3,
        ArgValue::Bool(_) => 4,
        ArgValue::Pointer(_) => 5,
        ArgValue::Json(_) => 6,
    }
}

fn bits(v: &ArgValue) -> u64 {
    match *v {
        ArgValue::Int(x) => x as u64,
        ArgValue::UInt(x) | ArgValue::Pointer(x) => x,
        ArgValue::Real(x) => x.to_bits(),
        ArgValue::Str(x) | ArgValue::Json(x) => x as u64,
        ArgValue::Bool(x) => x as u64,
    }
}

/// The tables SQL reads in place, shared by the virtual tables and `extract_arg`.
#[derive(Debug)]
pub(crate) struct Tables {
    pub(crate) strings: StringPool,
    pub(crate) slices: Vec<SliceRow>,
    /// Whether `slices` is ordered by `ts` (it is when slices are created in timestamp
    /// order, as the sorted import does), so that time ranges are found by binary search.
    pub(crate) slices_by_ts: bool,
    pub(crate) args: ArgTable,
}

impl Tables {
    pub(crate) fn new(strings: StringPool, mut slices: Vec<SliceRow>, args: Vec<ArgRow>) -> Self {
        slices.shrink_to_fit();
        let slices_by_ts = slices.windows(2).all(|w| w[0].ts <= w[1].ts);
        Tables {
            strings,
            slices,
            slices_by_ts,
            args: ArgTable::build(args),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arg_sets_share_distinct_entries_and_keep_their_order() {
        let mut s = StringPool::default();
        let (a, b) = (s.intern("a"), s.intern("b"));
        let row = |set, key, value| ArgRow {
            set,
            flat_key: key,
            key,
            value,
        };
        // Set 1 is empty (created but never filled); sets 0 and 2 share `a = 1`.
        let t = ArgTable::build(vec![
            row(2, a, ArgValue::Int(1)),
            row(0, b, ArgValue::Real(2.0)),
            row(0, a, ArgValue::Int(1)),
            row(2, b, ArgValue::Int(2)),
        ]);
        assert_eq!(t.len(), 4);
        assert_eq!(t.entries.len(), 3, "a = 1 is stored once");
        assert_eq!(t.set_rows(0), 0..2);
        assert_eq!(t.set_rows(1), 2..2);
        assert_eq!(t.set_rows(2), 2..4);
        assert_eq!(t.set_rows(3), 0..0);
        assert_eq!(t.set_rows(-1), 0..0);
        assert_eq!(t.row(0).value, ArgValue::Real(2.0));
        assert_eq!(t.row(2).value, ArgValue::Int(1));
        assert_eq!(
            [t.set_of(0), t.set_of(1), t.set_of(2), t.set_of(3)],
            [0, 0, 2, 2]
        );
        assert_eq!(t.lookup(&s, 2, "b"), Some(ArgValue::Int(2)));
        assert_eq!(t.lookup(&s, 1, "b"), None);
        assert_eq!(t.lookup(&s, 0, "nope"), None);
    }
}

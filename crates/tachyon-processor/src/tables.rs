//! The large tables of a loaded trace, kept in memory in compact form and read by SQL through
//! virtual tables ([`crate::vtab`]) instead of being copied into SQLite.
//!
//! Copying every slice and argument into SQLite row by row cost most of the import time and
//! held each name and key as text once per row. Here a slice is its fixed-size 34-byte
//! [`SliceRow`] (strings are pool ids; a slice's category and name share one id), and
//! arguments are deduplicated as they arrive ([`ArgBuilder`]): each distinct
//! `(flat_key, key, value)` is stored once in [`ArgTable::entries`] and an arg set is a run of
//! 4-byte entry ids, so the source location and constant arguments every zone repeats cost 4
//! bytes per slice instead of a row each.

#[cfg(test)]
use crate::storage::ArgRow;
use crate::storage::{ArgValue, SliceNames, SliceRow};
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

/// Collects arguments during the import straight into [`ArgTable`]'s form: each argument is
/// deduplicated as it arrives and costs one 4-byte entry id (no 32-byte row per argument is
/// kept until the end, which set the import's peak memory).
///
/// Arg sets are numbered as they are created and nearly always filled at once, in order, so
/// ids are appended to the run of the newest set. An argument for an older set (a slice end's
/// args merged into its begin's set, a thread's args added later) goes to `late`, and
/// [`ArgBuilder::finish`] merges those in, keeping each set's arguments in arrival order.
#[derive(Debug, Default)]
pub(crate) struct ArgBuilder {
    table: ArgTable,
    seen: FxHashMap<(StrId, StrId, u8, u64), u32>,
    /// (set, entry id) of arguments for sets older than the newest one.
    late: Vec<(u32, u32)>,
}

impl ArgBuilder {
    /// Adds an argument to arg set `set`.
    pub(crate) fn push(&mut self, set: u32, flat_key: StrId, key: StrId, value: ArgValue) {
        let t = &mut self.table;
        let id = *self
            .seen
            .entry((flat_key, key, tag(&value), bits(&value)))
            .or_insert_with(|| {
                t.entries.push(ArgEntry {
                    flat_key,
                    key,
                    value,
                });
                (t.entries.len() - 1) as u32
            });
        // `offsets[s]` is where set `s` starts; the newest set is `offsets.len() - 1`.
        let newest = t.offsets.len() as i64 - 1;
        if (set as i64) < newest {
            self.late.push((set, id));
            return;
        }
        while (t.offsets.len() as i64) <= set as i64 {
            t.offsets.push(t.ids.len() as u32);
        }
        t.ids.push(id);
    }

    /// The finished table.
    pub(crate) fn finish(self) -> ArgTable {
        let ArgBuilder {
            mut table,
            seen,
            late,
        } = self;
        drop(seen);
        if !late.is_empty() {
            // Every set's in-order arguments arrived before its late ones: a stable sort by
            // set of the in-order rows followed by the late rows keeps arrival order.
            let mut rows: Vec<(u32, u32)> = Vec::with_capacity(table.ids.len() + late.len());
            for s in 0..table.offsets.len() {
                let end = table
                    .offsets
                    .get(s + 1)
                    .map_or(table.ids.len(), |&e| e as usize);
                for &id in &table.ids[table.offsets[s] as usize..end] {
                    rows.push((s as u32, id));
                }
            }
            rows.extend(late);
            rows.sort_by_key(|r| r.0);
            table.ids.clear();
            table.offsets.clear();
            for (set, id) in rows {
                while table.offsets.len() <= set as usize {
                    table.offsets.push(table.ids.len() as u32);
                }
                table.ids.push(id);
            }
        }
        table.offsets.push(table.ids.len() as u32);
        table.entries.shrink_to_fit();
        table.ids.shrink_to_fit();
        table.offsets.shrink_to_fit();
        table
    }
}

impl ArgTable {
    /// Builds the table from rows (set, flat key, key, value), each set's in their order.
    #[cfg(test)]
    pub(crate) fn build(rows: Vec<ArgRow>) -> Self {
        let mut b = ArgBuilder::default();
        for a in rows {
            b.push(a.set, a.flat_key, a.key, a.value);
        }
        b.finish()
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
    /// (category, name) of [`SliceRow::name_id`].
    pub(crate) slice_names: Vec<(StrId, StrId)>,
    /// Whether `slices` is ordered by `ts` (it is when slices are created in timestamp
    /// order, as the sorted import does), so that time ranges are found by binary search.
    pub(crate) slices_by_ts: bool,
    pub(crate) args: ArgTable,
}

impl Tables {
    pub(crate) fn new(
        strings: StringPool,
        mut slices: Vec<SliceRow>,
        slice_names: SliceNames,
        args: ArgBuilder,
    ) -> Self {
        slices.shrink_to_fit();
        let slices_by_ts = slices.windows(2).all(|w| w[0].ts <= w[1].ts);
        Tables {
            strings,
            slices,
            slice_names: slice_names.into_pairs(),
            slices_by_ts,
            args: args.finish(),
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

//! The large tables of a loaded trace, kept in memory in compact form and read by SQL through
//! virtual tables ([`crate::sql::vtab`]) instead of being copied into SQLite.
//!
//! Copying every slice and argument into SQLite row by row cost most of the import time and
//! held each name and key as text once per row. Here a slice is its fixed-size 34-byte
//! [`SliceRow`] (strings are pool ids; a slice's category and name share one id), and
//! arguments are deduplicated as they arrive ([`ArgBuilder`]): each distinct
//! `(flat_key, key, value)` is stored once in [`ArgTable::entries`] and an arg set is a run of
//! entry ids as varints, so the source location and constant arguments every zone repeats
//! cost a byte per slice instead of a row each.
//!
//! The import's peak is the tables at their fullest beside what the import still holds (the
//! sorter's events, the arg arena, the deduplication index), so nothing here is held in one
//! form and converted to another at the end: the varints are written as arguments arrive.

use crate::storage::strings::{FxHashMap, StrId, StringPool};
#[cfg(test)]
use crate::storage::ArgRow;
use crate::storage::{put_varint, ArgValue, SliceNames, SliceRow};

/// One distinct argument.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ArgEntry {
    pub(crate) flat_key: StrId,
    pub(crate) key: StrId,
    pub(crate) value: ArgValue,
}

/// Every arg set, as runs of entry ids.
///
/// The runs are stored as LEB128 varints (`data`): the arguments every slice of a callsite
/// repeats (its source location, constant values) are among the first distinct entries and
/// take one byte each, so the SDK's five args per slice take about 7 bytes instead of 20.
/// A set is found from `group` (where every [`GROUP`]th set starts in `data`) by skipping the
/// varints of at most `GROUP - 1` sets before it.
#[derive(Debug, Default)]
pub(crate) struct ArgTable {
    /// The distinct arguments.
    pub(crate) entries: Vec<ArgEntry>,
    /// Rows `offsets[s]..offsets[s + 1]` are arg set `s`'s entries, in the order they were
    /// added; a row's position is its `args.id`.
    pub(crate) offsets: Vec<u32>,
    /// The entry ids of every row, in row order, as varints.
    data: Vec<u8>,
    /// `group[g]`: the position in `data` of set `g * GROUP`'s first id.
    group: Vec<u64>,
}

/// Sets per [`ArgTable::group`] entry.
const GROUP: usize = 16;

/// The entry ids of one arg set, decoded from [`ArgTable`]'s varints.
#[derive(Clone, Debug)]
pub(crate) struct SetIds<'a> {
    data: &'a [u8],
    at: usize,
    left: usize,
}

impl Iterator for SetIds<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let (v, n) = read_varint(self.data, self.at)?;
        self.at += n;
        Some(v)
    }
}

/// Collects arguments during the import straight into [`ArgTable`]'s form: each argument is
/// deduplicated as it arrives and its entry id is appended to [`ArgTable`]'s varints at once,
/// so an argument costs one or two bytes during the import as after it (a 4-byte id per
/// argument, packed at the end, held both forms at once there and set the import's peak).
///
/// Arg sets are numbered as they are created and nearly always filled at once, in order, so
/// ids are appended to the run of the newest set. An argument for an older set (a slice end's
/// args merged into its begin's set, a thread's args added later) goes to `late`, and
/// [`ArgBuilder::finish`] merges those in, keeping each set's arguments in arrival order.
#[derive(Debug, Default)]
pub(crate) struct ArgBuilder {
    /// `table.offsets[s]` is the row where set `s` starts (the newest set's run ends at
    /// `rows`), `table.data` holds every in-order id as a varint and `table.group` where every
    /// [`GROUP`]th set starts in it, as in the finished table.
    table: ArgTable,
    /// In-order arguments so far.
    rows: u32,
    /// The distinct arguments' ids, by content.
    seen: EntryIndex,
    /// (set, entry id) of arguments for sets older than the newest one.
    late: Vec<(u32, u32)>,
    /// In-order arguments given a new value ([`ArgBuilder::update`]) whose id needs more
    /// bytes than the old one had: byte position in `table.data` → new entry id.
    patched: FxHashMap<usize, u32>,
    /// Recently seen distinct arguments and their entry ids, before `seen`.
    recent: RecentArgs,
}

/// Where a distinct argument's content is looked for in [`EntryIndex`] (its home slot, before
/// the table's mask) and the 32 bits of hash kept beside its id.
///
/// The value's lowest 3 bits are not hashed: they pick the slot within a group of 8 adjacent
/// ones (64 bytes) that the rest of the content hashes to. A counter argument (a frame or
/// sequence number, a loop index) takes a new value every event, a new entry each time; its
/// consecutive values then share a cache line of the index instead of each costing a cache
/// miss in a table of megabytes. A group holds at most 8 of one key's values, so linear
/// probing's runs stay short; the fingerprint includes the low bits, so that the values of a
/// group are told apart without reading their entries.
#[inline]
fn entry_hash(flat_key: StrId, key: StrId, tag: u8, bits: u64) -> (usize, u32) {
    let k = (u64::from(flat_key) << 32 | u64::from(key)) ^ u64::from(tag).rotate_right(8);
    let h =
        (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (bits >> 3)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let h = h ^ (h >> 31);
    let low = (bits & 7) as usize;
    ((h as usize & !7) | low, (h >> 32) as u32 ^ low as u32)
}

/// The deduplication index of [`ArgBuilder`]: an open-addressing table (linear probing) of
/// entry ids, each beside 32 bits of its hash, whose contents are compared in
/// [`ArgTable::entries`]. 8 bytes a slot at most 3/4 full, where a map keyed by the
/// argument's content held 32 bytes a slot (the content a second time); it lives only during
/// the import, beside the growing tables, so its size adds to the peak.
#[derive(Debug, Default)]
struct EntryIndex {
    /// (hash tag, entry id); `id == u32::MAX`: empty. Empty or a power of two long.
    slots: Vec<(u32, u32)>,
    len: usize,
}

const EMPTY_SLOT: (u32, u32) = (0, u32::MAX);

impl EntryIndex {
    /// The id of the entry equal to (`flat_key`, `key`, `value`), or a new one that
    /// `add` appends to `entries` (its id is the index).
    #[inline]
    fn get_or_add(
        &mut self,
        entries: &mut Vec<ArgEntry>,
        flat_key: StrId,
        key: StrId,
        value: ArgValue,
    ) -> u32 {
        let (t, b) = (tag(&value), bits(&value));
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow(entries);
        }
        let (home, fp) = entry_hash(flat_key, key, t, b);
        let mask = self.slots.len() - 1;
        let mut i = home & mask;
        loop {
            let (f, id) = self.slots[i];
            if id == u32::MAX {
                let id = entries.len() as u32;
                entries.push(ArgEntry {
                    flat_key,
                    key,
                    value,
                });
                self.slots[i] = (fp, id);
                self.len += 1;
                return id;
            }
            if f == fp {
                let e = &entries[id as usize];
                if e.flat_key == flat_key
                    && e.key == key
                    && tag(&e.value) == t
                    && bits(&e.value) == b
                {
                    return id;
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Doubles the table (rehashing every entry from its content).
    #[cold]
    fn grow(&mut self, entries: &[ArgEntry]) {
        let cap = (self.slots.len() * 2).max(1024);
        let mut slots = vec![EMPTY_SLOT; cap];
        let mask = cap - 1;
        for (f, id) in std::mem::take(&mut self.slots) {
            if id == u32::MAX {
                continue;
            }
            let e = &entries[id as usize];
            let (home, fp) = entry_hash(e.flat_key, e.key, tag(&e.value), bits(&e.value));
            debug_assert_eq!(fp, f);
            let mut i = home & mask;
            while slots[i].1 != u32::MAX {
                i = (i + 1) & mask;
            }
            slots[i] = (f, id);
        }
        self.slots = slots;
    }
}

/// Slots of [`RecentArgs`] (a power of two; 24 bytes each, so the cache stays in L2).
const RECENT_SLOTS: usize = 1 << 12;

/// A direct-mapped cache in front of [`ArgBuilder`]'s deduplication index: a trace repeats
/// most of its arguments within a few events (a callsite's source location, an enum-like
/// string, a thread index), and the index, holding every distinct argument of the trace, costs
/// cache misses per lookup once it is large. A hit gives the same entry id the index would
/// (entries are never removed or changed), so the arg sets are the same with or without it.
#[derive(Debug, Default)]
struct RecentArgs {
    /// Empty until the first argument; a slot with `id == u32::MAX` holds nothing.
    slots: Vec<RecentSlot>,
}

#[derive(Clone, Copy, Debug)]
struct RecentSlot {
    bits: u64,
    flat_key: u32,
    key: u32,
    id: u32,
    tag: u8,
}

impl RecentArgs {
    #[inline]
    fn slot(flat_key: u32, key: u32, tag: u8, bits: u64) -> usize {
        let k = (u64::from(flat_key) << 32 | u64::from(key)) ^ u64::from(tag).rotate_right(8);
        let h = (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ bits).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        (h >> (64 - RECENT_SLOTS.trailing_zeros())) as usize
    }

    #[inline]
    fn get(&self, flat_key: u32, key: u32, tag: u8, bits: u64) -> Option<u32> {
        let s = self.slots.get(Self::slot(flat_key, key, tag, bits))?;
        (s.id != u32::MAX
            && s.bits == bits
            && s.flat_key == flat_key
            && s.key == key
            && s.tag == tag)
            .then_some(s.id)
    }

    #[inline]
    fn put(&mut self, flat_key: u32, key: u32, tag: u8, bits: u64, id: u32) {
        if self.slots.is_empty() {
            self.slots = vec![
                RecentSlot {
                    bits: 0,
                    flat_key: 0,
                    key: 0,
                    id: u32::MAX,
                    tag: 0,
                };
                RECENT_SLOTS
            ];
        }
        self.slots[Self::slot(flat_key, key, tag, bits)] = RecentSlot {
            bits,
            flat_key,
            key,
            id,
            tag,
        };
    }
}

/// The bit of an [`ArgBuilder::set_keys`] position that says it indexes `late`.
const LATE: usize = 1 << (usize::BITS - 1);

/// The varint at `data[at..]`: (value, its length in bytes); `None` if cut or too long.
#[inline]
fn read_varint(data: &[u8], at: usize) -> Option<(u32, usize)> {
    let mut v = 0u32;
    for (n, shift) in (0..35).step_by(7).enumerate() {
        let byte = *data.get(at + n)?;
        v |= u32::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some((v, n + 1));
        }
    }
    None
}

/// Appends `id` to `data` as a varint (the common one-byte case without the loop).
#[inline(always)]
fn push_id_varint(data: &mut Vec<u8>, id: u32) {
    if id < 0x80 {
        data.push(id as u8);
    } else {
        put_varint(data, u64::from(id));
    }
}

impl ArgBuilder {
    /// The id of the distinct argument `(flat_key, key, value)`, stored on first sight.
    pub(crate) fn entry_id(&mut self, flat_key: StrId, key: StrId, value: ArgValue) -> u32 {
        let (tag, bits) = (tag(&value), bits(&value));
        if let Some(id) = self.recent.get(flat_key, key, tag, bits) {
            return id;
        }
        let id = self.entry_id_uncached(flat_key, key, value);
        self.recent.put(flat_key, key, tag, bits, id);
        id
    }

    /// [`entry_id`](Self::entry_id) without the cache of recent arguments.
    fn entry_id_uncached(&mut self, flat_key: StrId, key: StrId, value: ArgValue) -> u32 {
        self.seen
            .get_or_add(&mut self.table.entries, flat_key, key, value)
    }

    /// The distinct argument with id `id` (from [`ArgBuilder::entry_id`]).
    pub(crate) fn entry(&self, id: u32) -> ArgEntry {
        self.table.entries[id as usize]
    }

    /// Adds an argument to arg set `set`.
    pub(crate) fn push(&mut self, set: u32, flat_key: StrId, key: StrId, value: ArgValue) {
        let id = self.entry_id(flat_key, key, value);
        self.push_id(set, id);
    }

    /// Makes `set` the newest arg set (opening it and every set before it not opened yet), so
    /// that its arguments go in order; false when a newer set exists, and they are late.
    #[inline(always)]
    fn open_in_order(&mut self, set: u32) -> bool {
        let t = &mut self.table;
        // `offsets[s]` is where set `s` starts; the newest set is `offsets.len() - 1`.
        let newest = t.offsets.len() as i64 - 1;
        if (set as i64) < newest {
            return false;
        }
        while (t.offsets.len() as i64) <= set as i64 {
            if t.offsets.len() % GROUP == 0 {
                t.group.push(t.data.len() as u64);
            }
            t.offsets.push(self.rows);
        }
        true
    }

    /// Adds the distinct argument `id` (from [`ArgBuilder::entry_id`]) to arg set `set`.
    #[inline]
    pub(crate) fn push_id(&mut self, set: u32, id: u32) {
        if !self.open_in_order(set) {
            self.late.push((set, id));
            return;
        }
        push_id_varint(&mut self.table.data, id);
        self.rows += 1;
    }

    /// Adds the distinct arguments `ids` to arg set `set`, in order: the same as
    /// [`push_id`](Self::push_id) for each, with the set's checks made once (a parsed event's
    /// arguments all go to one set).
    #[inline]
    pub(crate) fn push_ids(&mut self, set: u32, ids: &[u32]) {
        if !self.open_in_order(set) {
            self.late.extend(ids.iter().map(|&id| (set, id)));
            return;
        }
        let t = &mut self.table;
        // At most 5 bytes each: the vector grows at most once for them all.
        t.data.reserve(ids.len() * 5);
        for &id in ids {
            push_id_varint(&mut t.data, id);
        }
        self.rows += ids.len() as u32;
    }

    /// The number of arguments added to older sets so far: a mark for [`ArgBuilder::set_keys`]
    /// (a set's late arguments all come after the mark taken when it was created).
    pub(crate) fn late_len(&self) -> usize {
        self.late.len()
    }

    /// The in-order arguments of set `set`: (byte position in `table.data`, entry id), in order.
    fn in_order(&self, set: usize) -> Vec<(usize, u32)> {
        let t = &self.table;
        let mut out = Vec::new();
        let Some(&start) = t.offsets.get(set) else {
            return out;
        };
        let end = t.offsets.get(set + 1).copied().unwrap_or(self.rows);
        let first = set - set % GROUP;
        let (Some(&at), Some(&base)) = (t.group.get(set / GROUP), t.offsets.get(first)) else {
            return out;
        };
        let mut at = at as usize;
        for _ in base..start {
            match read_varint(&t.data, at) {
                Some((_, n)) => at += n,
                None => return out,
            }
        }
        for _ in start..end {
            let Some((id, n)) = read_varint(&t.data, at) else {
                break;
            };
            out.push((at, self.patched.get(&at).copied().unwrap_or(id)));
            at += n;
        }
        out
    }

    /// The arguments of set `set` so far, in order: (position, key). A position is a byte
    /// position of an in-order argument, or [`LATE`] plus an index into `late` (scanned from
    /// `mark` on, so merging one slice's end args does not rescan every late argument).
    pub(crate) fn set_keys(&self, set: u32, mark: usize) -> Vec<(usize, StrId)> {
        let entries = &self.table.entries;
        let mut out: Vec<(usize, StrId)> = self
            .in_order(set as usize)
            .into_iter()
            .map(|(pos, id)| (pos, entries[id as usize].key))
            .collect();
        for (i, &(ls, id)) in self.late.iter().enumerate().skip(mark) {
            if ls == set {
                out.push((LATE | i, entries[id as usize].key));
            }
        }
        out
    }

    /// Gives the argument at `pos` (from [`ArgBuilder::set_keys`]) a new flat key and value,
    /// keeping its key; a position that names nothing is ignored.
    pub(crate) fn update(&mut self, pos: usize, flat_key: StrId, value: ArgValue) {
        let old = if pos & LATE != 0 {
            self.late.get(pos & !LATE).map(|l| l.1)
        } else {
            read_varint(&self.table.data, pos)
                .map(|(id, _)| self.patched.get(&pos).copied().unwrap_or(id))
        };
        let Some(old) = old else { return };
        let key = self.table.entries[old as usize].key;
        let id = self.entry_id(flat_key, key, value);
        if pos & LATE != 0 {
            self.late[pos & !LATE].1 = id;
            return;
        }
        let Some((_, len)) = read_varint(&self.table.data, pos) else {
            return;
        };
        if protozero::wire::varint_size(u64::from(id)) <= len {
            // Rewritten in place, padded to the old length (a varint may have continuation
            // bytes with nothing in them).
            let mut v = id;
            for (n, b) in self.table.data[pos..pos + len].iter_mut().enumerate() {
                *b = (v & 0x7f) as u8 | if n + 1 < len { 0x80 } else { 0 };
                v >>= 7;
            }
            self.patched.remove(&pos);
        } else {
            self.patched.insert(pos, id);
        }
    }

    /// The finished table: each set's late arguments after its in-order ones (arrival order
    /// within a set is kept). Without late or patched arguments the in-order varints are the
    /// table as they are; with some, the varints are written anew with them merged in.
    pub(crate) fn finish(self) -> ArgTable {
        let ArgBuilder {
            mut table,
            rows,
            seen,
            mut late,
            patched,
            recent,
        } = self;
        drop((seen, recent));
        if !late.is_empty() || !patched.is_empty() {
            table = merge_late(table, rows, late.as_mut_slice(), &patched);
        } else {
            table.offsets.push(rows);
        }
        table.entries.shrink_to_fit();
        table.offsets.shrink_to_fit();
        table.data.shrink_to_fit();
        table.group.shrink_to_fit();
        table
    }
}

/// The table of `old` (whose `rows` in-order ids are its varints, `offsets` not yet closed)
/// with the `late` (set, id)s merged after each set's in-order ones and the `patched` ids
/// (byte position → id) in place of those at their positions.
fn merge_late(
    old: ArgTable,
    rows_in_order: u32,
    late: &mut [(u32, u32)],
    patched: &FxHashMap<usize, u32>,
) -> ArgTable {
    let ArgTable {
        entries,
        mut offsets,
        data: old_data,
        group: _,
    } = old;
    // Stable: a set's late arguments keep their arrival order.
    late.sort_by_key(|l| l.0);
    let sets = offsets
        .len()
        .max(late.last().map_or(0, |l| l.0 as usize + 1));
    let mut data = Vec::with_capacity(old_data.len() + late.len() * 2);
    let mut group = Vec::with_capacity(sets.div_ceil(GROUP));
    let (mut rows, mut li, mut at) = (0u32, 0, 0usize);
    for s in 0..sets {
        // The set's in-order run (before `offsets[s]` is rewritten to count late rows).
        let start = offsets.get(s).copied().unwrap_or(rows_in_order);
        let end = offsets.get(s + 1).copied().unwrap_or(rows_in_order);
        match offsets.get_mut(s) {
            Some(o) => *o = rows,
            None => offsets.push(rows),
        }
        if s % GROUP == 0 {
            group.push(data.len() as u64);
        }
        for _ in start..end {
            let Some((id, n)) = read_varint(&old_data, at) else {
                break;
            };
            push_id_varint(&mut data, patched.get(&at).copied().unwrap_or(id));
            at += n;
            rows += 1;
        }
        while late.get(li).is_some_and(|l| l.0 as usize == s) {
            push_id_varint(&mut data, late[li].1);
            rows += 1;
            li += 1;
        }
    }
    drop(old_data);
    offsets.push(rows);
    ArgTable {
        entries,
        offsets,
        data,
        group,
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
        self.offsets.last().map_or(0, |&n| n as usize)
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

    /// The entry ids of set `set`, in row order (none if there is no such set).
    pub(crate) fn set_ids(&self, set: usize) -> SetIds<'_> {
        let none = SetIds {
            data: &[],
            at: 0,
            left: 0,
        };
        if set + 1 >= self.offsets.len() {
            return none;
        }
        let rows = self.set_rows(set as i64);
        let first = set - set % GROUP;
        let (Some(&at), Some(&base)) = (self.group.get(set / GROUP), self.offsets.get(first))
        else {
            return none;
        };
        let mut it = SetIds {
            data: &self.data,
            at: at as usize,
            left: rows.start.saturating_sub(base as usize),
        };
        // Skip the sets of the group before this one: one byte without the high bit ends
        // each varint.
        while it.left > 0 {
            match it.data.get(it.at) {
                Some(b) if b & 0x80 == 0 => it.left -= 1,
                Some(_) => {}
                None => return none,
            }
            it.at += 1;
        }
        it.left = rows.len();
        it
    }

    /// The distinct argument with id `id` (from [`ArgTable::set_ids`]).
    pub(crate) fn entry(&self, id: u32) -> &ArgEntry {
        &self.entries[id as usize]
    }

    /// The argument at row `row` (`row < len()`), found through its set.
    #[cfg(test)]
    pub(crate) fn row(&self, row: usize) -> &ArgEntry {
        let set = self.set_of(row);
        let skip = row - self.set_rows(set as i64).start;
        let id = self.set_ids(set).nth(skip).expect("row exists");
        self.entry(id)
    }

    /// `extract_arg`: the value of `key` in arg set `set`.
    pub(crate) fn lookup(&self, strings: &StringPool, set: i64, key: &str) -> Option<ArgValue> {
        let key = strings.lookup(key)?;
        let set = usize::try_from(set).ok()?;
        self.set_ids(set)
            .map(|id| self.entry(id))
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

    const NONE_KEY: StrId = crate::storage::NONE;

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

    #[test]
    fn a_sets_args_are_found_and_updated_in_place_and_late() {
        let mut s = StringPool::default();
        let (a, b, c, fa) = (s.intern("a"), s.intern("b"), s.intern("c"), s.intern("fa"));
        let mut ab = ArgBuilder::default();
        ab.push(0, a, a, ArgValue::Int(1));
        let mark = ab.late_len();
        ab.push(1, b, b, ArgValue::Int(1));
        // Set 0 is no longer the newest: its next argument is a late one.
        ab.push(0, c, c, ArgValue::Int(3));
        let keys = ab.set_keys(0, mark);
        assert_eq!(keys.iter().map(|k| k.1).collect::<Vec<_>>(), [a, c]);
        assert!(
            ab.set_keys(0, ab.late_len()).len() == 1,
            "a mark skips earlier late args"
        );
        for (pos, key) in keys {
            let v = if key == a { 10 } else { 30 };
            ab.update(pos, fa, ArgValue::Int(v));
        }
        ab.update(LATE | 99, fa, ArgValue::Int(0));
        ab.update(99, fa, ArgValue::Int(0));
        let t = ab.finish();
        assert_eq!(t.set_rows(0), 0..2);
        assert_eq!((t.row(0).key, t.row(0).flat_key), (a, fa));
        assert_eq!(t.row(0).value, ArgValue::Int(10));
        assert_eq!((t.row(1).key, t.row(1).value), (c, ArgValue::Int(30)));
        assert_eq!(t.lookup(&s, 1, "b"), Some(ArgValue::Int(1)));
    }

    /// The cache of recent arguments gives the ids the map gives, whatever collides in it: a
    /// small value space over every value kind and several keys (repeats, slot collisions,
    /// evictions).
    #[test]
    fn recent_arguments_get_the_maps_ids() {
        let (mut cached, mut plain) = (ArgBuilder::default(), ArgBuilder::default());
        let mut next = crate::xorshift(0x853c_49e6_748f_ea9b);
        for _ in 0..50_000 {
            let x = next();
            let value = crate::random_arg_value(x);
            let (flat_key, key) = ((x >> 8) as u32 % 5, (x >> 12) as u32 % 6);
            assert_eq!(
                cached.entry_id(flat_key, key, value),
                plain.entry_id_uncached(flat_key, key, value)
            );
        }
    }

    /// Updates of in-order and late arguments read back as a plain model of the sets says:
    /// new ids shorter than the old (rewritten in place, padded), longer (patched, merged at
    /// the end), updated twice, with and without late arguments in the table.
    #[test]
    fn updated_arguments_read_back_as_the_model() {
        for seed in [1u64, 2, 3, 4] {
            let mut next = crate::xorshift(0x2545_f491_4f6c_dd1d ^ seed);
            let mut rnd = move |n: u64| next() % n;
            let mut s = StringPool::default();
            let keys: Vec<StrId> = (0..4).map(|k| s.intern(&format!("k{k}"))).collect();
            let mut b = ArgBuilder::default();
            // Values 0..20 000 make ids of one to three varint bytes.
            let mut want: Vec<Vec<(StrId, i64)>> = Vec::new();
            let mut marks = Vec::new();
            for set in 0..2000u32 {
                want.push(Vec::new());
                marks.push(b.late_len());
                for &k in keys.iter().take(rnd(4) as usize) {
                    let v = rnd(20_000) as i64;
                    b.push(set, k, k, ArgValue::Int(v));
                    want[set as usize].push((k, v));
                }
                // A late argument for an older set (seeds 1 and 3 only: 2 and 4 keep the
                // in-order varints as the finished table).
                if seed % 2 == 1 && set > 0 && rnd(5) == 0 {
                    let old = rnd(u64::from(set)) as u32;
                    let v = rnd(20_000) as i64;
                    b.push(old, keys[3], keys[3], ArgValue::Int(v));
                    want[old as usize].push((keys[3], v));
                }
                // Updates of a recent set's args, sometimes twice.
                for _ in 0..rnd(3) {
                    let old = set.saturating_sub(rnd(20) as u32);
                    // In the set's order: its in-order arguments, then its late ones.
                    let found = b.set_keys(old, marks[old as usize]);
                    assert_eq!(found.len(), want[old as usize].len());
                    for (j, (pos, key)) in found.into_iter().enumerate() {
                        assert_eq!(key, want[old as usize][j].0);
                        if rnd(2) == 0 {
                            continue;
                        }
                        let v = if rnd(2) == 0 { rnd(100) } else { rnd(20_000) } as i64;
                        b.update(pos, key, ArgValue::Int(v));
                        want[old as usize][j].1 = v;
                    }
                }
            }
            assert!(
                !b.patched.is_empty(),
                "some new ids are longer than the old"
            );
            assert_eq!(b.late.is_empty(), seed % 2 == 0);
            let t = b.finish();
            for (set, vals) in want.iter().enumerate() {
                let got: Vec<(StrId, i64)> = t
                    .set_ids(set)
                    .map(|id| match t.entry(id).value {
                        ArgValue::Int(v) => (t.entry(id).key, v),
                        _ => (NONE_KEY, -1),
                    })
                    .collect();
                assert_eq!(&got, vals, "seed {seed}, set {set}");
            }
        }
    }

    /// Packed arg sets read back as pushed: many sets (across several groups), ids of one to
    /// five varint bytes, empty sets, and late arguments merged after each set's own.
    #[test]
    fn packed_sets_read_back_as_pushed() {
        let mut next = crate::xorshift(0x9e37_79b9_7f4a_7c15u64);
        let mut rnd = move |n: u64| next() % n;
        let mut s = StringPool::default();
        let k = s.intern("k");
        let mut b = ArgBuilder::default();
        // Enough distinct values for ids of three varint bytes.
        for v in 0..20_000 {
            b.entry_id(k, k, ArgValue::Int(v));
        }
        let mut want: Vec<Vec<i64>> = Vec::new();
        // A set's arguments one at a time or (`push_ids`) all at once, in order and late.
        let push = |b: &mut ArgBuilder, set: u32, vals: &[i64], at_once: bool| {
            let ids: Vec<u32> = vals
                .iter()
                .map(|&v| b.entry_id(k, k, ArgValue::Int(v)))
                .collect();
            if at_once {
                b.push_ids(set, &ids);
            } else {
                for id in ids {
                    b.push_id(set, id);
                }
            }
        };
        for set in 0..3000u32 {
            let vals: Vec<i64> = (0..rnd(6))
                .map(|_| if rnd(2) == 0 { rnd(4) } else { rnd(20_000) } as i64)
                .collect();
            push(&mut b, set, &vals, rnd(2) == 0);
            want.push(vals);
            if set > 0 && rnd(4) == 0 {
                let old = rnd(u64::from(set)) as u32;
                let vals: Vec<i64> = (0..1 + rnd(3)).map(|_| rnd(20_000) as i64).collect();
                push(&mut b, old, &vals, rnd(2) == 0);
                want[old as usize].extend(vals);
            }
        }
        let t = b.finish();
        let mut row = 0;
        for (set, vals) in want.iter().enumerate() {
            let got: Vec<i64> = t
                .set_ids(set)
                .map(|id| match t.entry(id).value {
                    ArgValue::Int(v) => v,
                    _ => -1,
                })
                .collect();
            assert_eq!(&got, vals, "set {set}");
            assert_eq!(t.set_rows(set as i64), row..row + vals.len());
            for r in row..row + vals.len() {
                assert_eq!(t.set_of(r), set);
                assert_eq!(t.row(r).value, ArgValue::Int(vals[r - row]));
            }
            row += vals.len();
        }
        assert_eq!(t.len(), row);
        assert_eq!(t.set_ids(want.len()).count(), 0);
    }
}

//! SQLite virtual tables over the in-memory [`Tables`]: `__intrinsic_slice` and
//! `__intrinsic_args` are read where they lie, so a query scans the columns without a copy.
//!
//! Each table understands the constraints that make joins and lookups cheap: `id = ?` (a row
//! by position), `arg_set_id = ?` (a set's run of rows), `ts` ranges when slices are in time
//! order (binary search), and `track_id = ?`, `name = ?`, `key = ?` (filtered in Rust while
//! scanning, comparing pool ids instead of text). No constraint is marked "omit": SQLite checks
//! every row again, so a value this code does not handle (a real, a text for an integer
//! column, another collation) only widens the scan and never changes a result.
//!
//! This is the crate's only module with `unsafe`: rusqlite's `VTab` and `VTabCursor`
//! are unsafe traits whose contract is a `#[repr(C)]` struct starting with SQLite's base type.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::ops::Range;
use std::sync::Arc;

use rusqlite::types::{Null, ValueRef};
use rusqlite::vtab::{
    read_only_module, Context, CreateVTab, Filters, IndexConstraintOp, IndexInfo, VTab,
    VTabConnection, VTabCursor, VTabKind,
};
use rusqlite::{ffi, Connection, Result};

use crate::sql::opt;
use crate::storage::strings::StrId;
use crate::storage::tables::Tables;
use crate::storage::{ArgValue, NONE};

/// Registers the modules; the schema then creates the tables with
/// `CREATE VIRTUAL TABLE __intrinsic_slice USING tachyon_slice` (and `tachyon_args`).
pub(crate) fn register(conn: &Connection, tables: &Arc<Tables>) -> Result<()> {
    conn.create_module(
        c"tachyon_slice",
        read_only_module::<SliceTab>(),
        Some(tables.clone()),
    )?;
    conn.create_module(
        c"tachyon_args",
        read_only_module::<ArgsTab>(),
        Some(tables.clone()),
    )
}

/// Column numbers of `__intrinsic_slice`, in the declared order.
mod slice_col {
    pub(super) const ID: i32 = 0;
    pub(super) const TS: i32 = 1;
    pub(super) const TRACK_ID: i32 = 3;
    pub(super) const NAME: i32 = 5;
}

const SLICE_SCHEMA: &str = "CREATE TABLE x(id INTEGER, ts INTEGER, dur INTEGER, \
    track_id INTEGER, category TEXT, name TEXT, depth INTEGER, stack_id INTEGER, \
    parent_stack_id INTEGER, parent_id INTEGER, arg_set_id INTEGER, thread_ts INTEGER, \
    thread_dur INTEGER, thread_instruction_count INTEGER, thread_instruction_delta INTEGER)";

const ARGS_SCHEMA: &str = "CREATE TABLE x(id INTEGER, arg_set_id INTEGER, flat_key TEXT, \
    key TEXT, int_value INTEGER, string_value TEXT, real_value REAL, value_type TEXT)";

/// Bits of `idx_num`: which constraints `filter` receives, in this order.
const ID_EQ: c_int = 1;
const SET_EQ: c_int = 2;
const TS_GT: c_int = 4;
const TS_GE: c_int = 8;
const TS_LT: c_int = 16;
const TS_LE: c_int = 32;
const TRACK_EQ: c_int = 64;
const TEXT_EQ: c_int = 128;
/// The order the arguments are passed in (`argv_index`), by bit.
const ARG_ORDER: [c_int; 8] = [ID_EQ, SET_EQ, TS_GT, TS_GE, TS_LT, TS_LE, TRACK_EQ, TEXT_EQ];

/// Picks the usable constraints this table handles (`which` maps a column and operator to a
/// bit), hands them to `filter` in [`ARG_ORDER`], and returns the chosen bits.
fn choose(info: &mut IndexInfo, which: impl Fn(c_int, IndexConstraintOp) -> c_int) -> c_int {
    let mut picked: Vec<(c_int, usize)> = Vec::new();
    let mut bits = 0;
    for (i, c) in info.constraints().enumerate() {
        if !c.is_usable() {
            continue;
        }
        let bit = which(c.column(), c.operator());
        if bit == 0 || bits & bit != 0 {
            continue;
        }
        if bit == TEXT_EQ && info.collation(i) != Ok("BINARY") {
            continue;
        }
        bits |= bit;
        picked.push((bit, i));
    }
    picked.sort_by_key(|&(bit, _)| ARG_ORDER.iter().position(|&b| b == bit));
    for (n, &(_, i)) in picked.iter().enumerate() {
        let mut usage = info.constraint_usage(i);
        usage.set_argv_index(n as c_int + 1);
        usage.set_omit(false);
    }
    info.set_idx_num(bits);
    bits
}

/// The arguments `filter` received, by bit.
fn args_by_bit<'a>(
    idx_num: c_int,
    args: &'a Filters<'_>,
) -> impl Fn(c_int) -> Option<ValueRef<'a>> {
    let values: Vec<ValueRef<'a>> = args.iter().collect();
    move |bit| {
        if idx_num & bit == 0 {
            return None;
        }
        let n = ARG_ORDER
            .iter()
            .filter(|&&b| idx_num & b != 0)
            .position(|&b| b == bit)?;
        values.get(n).copied()
    }
}

/// An integer constraint value (an integral real counts; anything else is not used).
fn int(v: Option<ValueRef<'_>>) -> Option<i64> {
    match v? {
        ValueRef::Integer(i) => Some(i),
        ValueRef::Real(r) if r.fract() == 0.0 && r.abs() < 9.0e18 => Some(r as i64),
        _ => None,
    }
}

/// A text constraint value as a pool id: `Some(None)` if the text was never interned (no
/// row can match), `None` if the value is not text (not used).
fn text_id(t: &Tables, v: Option<ValueRef<'_>>) -> Option<Option<StrId>> {
    match v? {
        ValueRef::Text(b) => Some(
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| t.strings.lookup(s)),
        ),
        _ => None,
    }
}

/// The row range `id = ?` selects.
fn id_range(id: Option<i64>, len: usize) -> Option<Range<usize>> {
    let id = id?;
    Some(match usize::try_from(id) {
        Ok(i) if i < len => i..i + 1,
        _ => 0..0,
    })
}

/// The tables a virtual table module was registered with (its `aux`).
fn connected_tables(aux: Option<&Arc<Tables>>, what: &str) -> Result<Arc<Tables>> {
    aux.cloned()
        .ok_or_else(|| rusqlite::Error::ModuleError(format!("no {what} table")))
}

// ---------------------------------------------------------------------------------------------
// __intrinsic_slice

#[repr(C)]
struct SliceTab {
    /// SQLite's base type; must come first.
    base: ffi::sqlite3_vtab,
    tables: Arc<Tables>,
}

// SAFETY: `SliceTab` is `#[repr(C)]` and starts with `ffi::sqlite3_vtab`, as the trait requires.
unsafe impl<'vtab> VTab<'vtab> for SliceTab {
    type Aux = Arc<Tables>;
    type Cursor = SliceCursor<'vtab>;

    fn connect(
        _db: &mut VTabConnection,
        aux: Option<&Arc<Tables>>,
        _args: &[&[u8]],
    ) -> Result<(String, Self)> {
        Ok((
            SLICE_SCHEMA.to_owned(),
            SliceTab {
                base: ffi::sqlite3_vtab::default(),
                tables: connected_tables(aux, "slice")?,
            },
        ))
    }

    fn best_index(&self, info: &mut IndexInfo) -> Result<()> {
        let sorted = self.tables.slices_by_ts;
        let bits = choose(info, |col, op| {
            use IndexConstraintOp::*;
            match (col, op) {
                (-1 | slice_col::ID, SQLITE_INDEX_CONSTRAINT_EQ) => ID_EQ,
                (slice_col::TS, SQLITE_INDEX_CONSTRAINT_GT) if sorted => TS_GT,
                (slice_col::TS, SQLITE_INDEX_CONSTRAINT_GE) if sorted => TS_GE,
                (slice_col::TS, SQLITE_INDEX_CONSTRAINT_LT) if sorted => TS_LT,
                (slice_col::TS, SQLITE_INDEX_CONSTRAINT_LE) if sorted => TS_LE,
                (slice_col::TRACK_ID, SQLITE_INDEX_CONSTRAINT_EQ) => TRACK_EQ,
                (slice_col::NAME, SQLITE_INDEX_CONSTRAINT_EQ) => TEXT_EQ,
                _ => 0,
            }
        });
        let n = self.tables.slices.len().max(1) as f64;
        let (cost, rows) = if bits & ID_EQ != 0 {
            (1.0, 1.0)
        } else {
            let mut cost = n;
            if bits & (TS_GT | TS_GE) != 0 {
                cost /= 4.0;
            }
            if bits & (TS_LT | TS_LE) != 0 {
                cost /= 4.0;
            }
            // A filtered scan compares ids in Rust, cheaper than SQLite checking every row.
            let mut rows = cost;
            if bits & (TRACK_EQ | TEXT_EQ) != 0 {
                cost *= 0.5;
                rows /= 10.0;
            }
            (cost, rows)
        };
        info.set_estimated_cost(cost);
        info.set_estimated_rows(rows.max(1.0) as i64);
        // Rows come out in id order, which is also time order when slices are sorted.
        let order: Vec<(c_int, bool)> = info
            .order_bys()
            .map(|o| (o.column(), o.is_order_by_desc()))
            .collect();
        let consumed = match order.as_slice() {
            [(-1 | slice_col::ID, false)] => true,
            [(slice_col::TS, false)] | [(slice_col::TS, false), (-1 | slice_col::ID, false)] => {
                sorted
            }
            _ => false,
        };
        info.set_order_by_consumed(consumed);
        Ok(())
    }

    fn open(&'vtab mut self) -> Result<SliceCursor<'vtab>> {
        Ok(SliceCursor {
            base: ffi::sqlite3_vtab_cursor::default(),
            t: &self.tables,
            pos: 0,
            end: 0,
            track: None,
            name: None,
        })
    }
}

impl CreateVTab<'_> for SliceTab {
    const KIND: VTabKind = VTabKind::Default;
}

#[repr(C)]
struct SliceCursor<'vtab> {
    /// SQLite's base type; must come first.
    base: ffi::sqlite3_vtab_cursor,
    t: &'vtab Tables,
    pos: usize,
    end: usize,
    track: Option<u32>,
    name: Option<StrId>,
}

impl SliceCursor<'_> {
    fn skip_unmatched(&mut self) {
        while self.pos < self.end {
            let r = &self.t.slices[self.pos];
            if self.track.is_none_or(|t| r.track == t)
                && self
                    .name
                    .is_none_or(|n| self.t.slice_names[r.name_id as usize].1 == n)
            {
                break;
            }
            self.pos += 1;
        }
    }
}

// SAFETY: `SliceCursor` is `#[repr(C)]` and starts with `ffi::sqlite3_vtab_cursor`, as the
// trait requires.
unsafe impl VTabCursor for SliceCursor<'_> {
    fn filter(&mut self, idx_num: c_int, _idx_str: Option<&str>, args: &Filters<'_>) -> Result<()> {
        let arg = args_by_bit(idx_num, args);
        let slices = &self.t.slices;
        let mut range = 0..slices.len();
        if let Some(r) = id_range(int(arg(ID_EQ)), slices.len()) {
            range = r;
        }
        // Time bounds (only offered when slices are sorted by ts).
        if let Some(v) = int(arg(TS_GT)) {
            range.start = range.start.max(slices.partition_point(|s| s.ts <= v));
        }
        if let Some(v) = int(arg(TS_GE)) {
            range.start = range.start.max(slices.partition_point(|s| s.ts < v));
        }
        if let Some(v) = int(arg(TS_LT)) {
            range.end = range.end.min(slices.partition_point(|s| s.ts < v));
        }
        if let Some(v) = int(arg(TS_LE)) {
            range.end = range.end.min(slices.partition_point(|s| s.ts <= v));
        }
        self.track = int(arg(TRACK_EQ)).map(|t| u32::try_from(t).unwrap_or(NONE));
        self.name = None;
        match text_id(self.t, arg(TEXT_EQ)) {
            Some(Some(id)) => self.name = Some(id),
            Some(None) => range.end = range.start,
            None => {}
        }
        self.pos = range.start;
        self.end = range.end.max(range.start);
        self.skip_unmatched();
        Ok(())
    }

    fn next(&mut self) -> Result<()> {
        self.pos += 1;
        self.skip_unmatched();
        Ok(())
    }

    fn eof(&self) -> bool {
        self.pos >= self.end
    }

    fn column(&self, ctx: &mut Context, i: c_int) -> Result<()> {
        let r = &self.t.slices[self.pos];
        let text = |id: StrId| (id != NONE).then(|| self.t.strings.get(id));
        match i {
            0 => ctx.set_result(&(self.pos as i64)),
            // Braces copy the packed row's fields (no references to them).
            1 => ctx.set_result(&{ r.ts }),
            2 => ctx.set_result(&{ r.dur }),
            3 => ctx.set_result(&{ r.track }),
            4 => ctx.set_result(&text(self.t.slice_names[r.name_id as usize].0)),
            5 => ctx.set_result(&text(self.t.slice_names[r.name_id as usize].1)),
            6 => ctx.set_result(&{ r.depth }),
            9 => ctx.set_result(&opt(r.parent)),
            10 => ctx.set_result(&opt(r.arg_set)),
            _ => ctx.set_result(&Null),
        }
    }

    fn rowid(&self) -> Result<i64> {
        Ok(self.pos as i64)
    }
}

// ---------------------------------------------------------------------------------------------
// __intrinsic_args

mod args_col {
    pub(super) const ID: i32 = 0;
    pub(super) const ARG_SET_ID: i32 = 1;
    pub(super) const KEY: i32 = 3;
}

#[repr(C)]
struct ArgsTab {
    /// SQLite's base type; must come first.
    base: ffi::sqlite3_vtab,
    tables: Arc<Tables>,
}

// SAFETY: `ArgsTab` is `#[repr(C)]` and starts with `ffi::sqlite3_vtab`, as the trait requires.
unsafe impl<'vtab> VTab<'vtab> for ArgsTab {
    type Aux = Arc<Tables>;
    type Cursor = ArgsCursor<'vtab>;

    fn connect(
        _db: &mut VTabConnection,
        aux: Option<&Arc<Tables>>,
        _args: &[&[u8]],
    ) -> Result<(String, Self)> {
        Ok((
            ARGS_SCHEMA.to_owned(),
            ArgsTab {
                base: ffi::sqlite3_vtab::default(),
                tables: connected_tables(aux, "args")?,
            },
        ))
    }

    fn best_index(&self, info: &mut IndexInfo) -> Result<()> {
        let bits = choose(info, |col, op| {
            use IndexConstraintOp::*;
            match (col, op) {
                (-1 | args_col::ID, SQLITE_INDEX_CONSTRAINT_EQ) => ID_EQ,
                (args_col::ARG_SET_ID, SQLITE_INDEX_CONSTRAINT_EQ) => SET_EQ,
                (args_col::KEY, SQLITE_INDEX_CONSTRAINT_EQ) => TEXT_EQ,
                _ => 0,
            }
        });
        let n = self.tables.args.len().max(1) as f64;
        let (cost, rows) = if bits & ID_EQ != 0 {
            (1.0, 1.0)
        } else if bits & SET_EQ != 0 {
            (4.0, 4.0)
        } else if bits & TEXT_EQ != 0 {
            (n * 0.5, n / 10.0)
        } else {
            (n, n)
        };
        info.set_estimated_cost(cost);
        info.set_estimated_rows(rows.max(1.0) as i64);
        let consumed = matches!(
            info.order_bys()
                .map(|o| (o.column(), o.is_order_by_desc()))
                .collect::<Vec<_>>()
                .as_slice(),
            [(-1 | args_col::ID, false)]
        );
        info.set_order_by_consumed(consumed);
        Ok(())
    }

    fn open(&'vtab mut self) -> Result<ArgsCursor<'vtab>> {
        Ok(ArgsCursor {
            base: ffi::sqlite3_vtab_cursor::default(),
            t: &self.tables,
            pos: 0,
            end: 0,
            set: 0,
            set_rows: 0..0,
            ids: Vec::new(),
            key: None,
        })
    }
}

impl CreateVTab<'_> for ArgsTab {
    const KIND: VTabKind = VTabKind::Default;
}

#[repr(C)]
struct ArgsCursor<'vtab> {
    /// SQLite's base type; must come first.
    base: ffi::sqlite3_vtab_cursor,
    t: &'vtab Tables,
    pos: usize,
    end: usize,
    /// The arg set of row `pos`, its rows, and its entry ids (decoded once per set).
    set: usize,
    set_rows: Range<usize>,
    ids: Vec<u32>,
    key: Option<StrId>,
}

impl ArgsCursor<'_> {
    /// Makes `set`, `set_rows` and `ids` those of row `pos` (if `pos < end`).
    fn load_set(&mut self) {
        if self.pos >= self.end || self.set_rows.contains(&self.pos) {
            return;
        }
        let args = &self.t.args;
        if self.pos >= self.set_rows.end && !self.set_rows.is_empty() {
            // Sequential: the next sets (some may be empty).
            while self.set + 1 < args.offsets.len()
                && args.offsets[self.set + 1] as usize <= self.pos
            {
                self.set += 1;
            }
        } else {
            self.set = args.set_of(self.pos);
        }
        self.set_rows = args.set_rows(self.set as i64);
        self.ids.clear();
        self.ids.extend(args.set_ids(self.set));
    }

    /// The argument at row `pos` (`pos < end`, after [`Self::load_set`]).
    fn arg(&self) -> Option<&crate::storage::tables::ArgEntry> {
        let id = *self.ids.get(self.pos.checked_sub(self.set_rows.start)?)?;
        Some(self.t.args.entry(id))
    }

    fn skip_unmatched(&mut self) {
        self.load_set();
        if let Some(k) = self.key {
            while self.pos < self.end && self.arg().is_none_or(|a| a.key != k) {
                self.pos += 1;
                self.load_set();
            }
        }
    }
}

// SAFETY: `ArgsCursor` is `#[repr(C)]` and starts with `ffi::sqlite3_vtab_cursor`, as the
// trait requires.
unsafe impl VTabCursor for ArgsCursor<'_> {
    fn filter(&mut self, idx_num: c_int, _idx_str: Option<&str>, args: &Filters<'_>) -> Result<()> {
        let arg = args_by_bit(idx_num, args);
        let table = &self.t.args;
        let mut range = 0..table.len();
        if let Some(r) = id_range(int(arg(ID_EQ)), table.len()) {
            range = r;
        }
        if let Some(set) = int(arg(SET_EQ)) {
            let r = table.set_rows(set);
            range = range.start.max(r.start)..range.end.min(r.end);
        }
        self.key = None;
        match text_id(self.t, arg(TEXT_EQ)) {
            Some(Some(id)) => self.key = Some(id),
            Some(None) => range.end = range.start,
            None => {}
        }
        self.pos = range.start;
        self.end = range.end.max(range.start);
        self.set_rows = 0..0;
        self.skip_unmatched();
        Ok(())
    }

    fn next(&mut self) -> Result<()> {
        self.pos += 1;
        self.skip_unmatched();
        Ok(())
    }

    fn eof(&self) -> bool {
        self.pos >= self.end
    }

    fn column(&self, ctx: &mut Context, i: c_int) -> Result<()> {
        let Some(&a) = self.arg() else {
            return ctx.set_result(&Null);
        };
        let s = &self.t.strings;
        match (i, a.value) {
            (0, _) => ctx.set_result(&(self.pos as i64)),
            (1, _) => ctx.set_result(&(self.set as i64)),
            (2, _) => ctx.set_result(&s.get(a.flat_key)),
            (3, _) => ctx.set_result(&s.get(a.key)),
            (4, ArgValue::Int(v)) => ctx.set_result(&v),
            // Stored as SQLite's 64-bit integer, as Perfetto does.
            (4, ArgValue::UInt(v) | ArgValue::Pointer(v)) => ctx.set_result(&(v as i64)),
            (4, ArgValue::Bool(v)) => ctx.set_result(&(v as i64)),
            (5, ArgValue::Str(v) | ArgValue::Json(v)) => ctx.set_result(&s.get(v)),
            (6, ArgValue::Real(v)) => ctx.set_result(&v),
            (7, v) => ctx.set_result(&v.type_name()),
            _ => ctx.set_result(&Null),
        }
    }

    fn rowid(&self) -> Result<i64> {
        Ok(self.pos as i64)
    }
}

//! Each `tracing` callsite's Tachyon callsite, made once and leaked (as the macros' statics
//! are), found on the hot path through a per-thread direct-mapped cache keyed by the address of
//! the callsite's `Metadata` (unique and `'static` per callsite), with a global map behind it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use tachyon::integration;
use tachyon::Callsite;
use tracing_core::{Level, Metadata};

/// A `tracing` callsite's Tachyon side.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) cs: &'static Callsite,
    /// Events: the index of the `level` argument (after the fields).
    pub(crate) level_arg: usize,
    /// A `log` record's callsite in `tracing-log` (its `log.*` fields say where it is from).
    pub(crate) log: bool,
    /// An event whose only field is `message` (`tracing::info!("text")`): a log message. An
    /// event with other fields stays an instant, its fields typed arguments.
    pub(crate) message_only: bool,
}

const WAYS: usize = 256;

thread_local! {
    /// Cells, not a `RefCell`: a lookup is one load and one compare, with no borrow flag.
    static NEAR: [Cell<(usize, Option<&'static Entry>)>; WAYS] =
        const { [const { Cell::new((0, None)) }; WAYS] };
}

fn global() -> MutexGuard<'static, HashMap<usize, &'static Entry>> {
    static MAP: OnceLock<Mutex<HashMap<usize, &'static Entry>>> = OnceLock::new();
    MAP.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// The Tachyon callsite of a span's metadata.
#[inline]
pub(crate) fn callsite(meta: &'static Metadata<'static>) -> &'static Callsite {
    entry(meta).cs
}

/// The entry of a span's or event's metadata.
#[inline(always)]
pub(crate) fn entry(meta: &'static Metadata<'static>) -> &'static Entry {
    let key = std::ptr::from_ref(meta) as usize;
    // Metadata are at least 8-aligned and larger than 64 bytes: the bits above them spread.
    let way = (key >> 6 ^ key >> 14) & (WAYS - 1);
    // `NEAR` has no destructor: `with` cannot fail.
    match NEAR.with(|n| n[way].get()) {
        (k, Some(e)) if k == key => e,
        _ => far(meta, key, way),
    }
}

/// A miss in this thread's cache: the entry from the global map (made on the callsite's first
/// use), kept in `way`. Out of line, so that a hit keeps nothing on the stack.
#[cold]
#[inline(never)]
fn far(meta: &'static Metadata<'static>, key: usize, way: usize) -> &'static Entry {
    let e = {
        let mut map = global();
        match map.get(&key) {
            Some(e) => *e,
            None => {
                let e = make(meta);
                map.insert(key, e);
                e
            }
        }
    };
    NEAR.with(|n| n[way].set((key, Some(e))));
    e
}

fn leak_names(names: Vec<&'static str>) -> &'static [&'static str] {
    Box::leak(names.into_boxed_slice())
}

fn make(meta: &'static Metadata<'static>) -> &'static Entry {
    let fields: Vec<&'static str> = meta.fields().iter().map(|f| f.name()).collect();
    let level_arg = fields.len();
    let (name, args) = if meta.is_event() {
        let mut args = fields;
        args.push("level");
        let name = if meta.fields().field("message").is_some() {
            level_name(meta.level())
        } else {
            meta.name()
        };
        (name, leak_names(args))
    } else {
        (meta.name(), leak_names(fields))
    };
    let cs = integration::callsite(
        name,
        Some(meta.target()),
        meta.file().unwrap_or(""),
        meta.line().unwrap_or(0),
        meta.module_path().unwrap_or(""),
        args,
    );
    let log = meta.is_event() && meta.fields().field("log.target").is_some();
    let message_only =
        meta.is_event() && meta.fields().len() == 1 && meta.fields().field("message").is_some();
    Box::leak(Box::new(Entry {
        cs,
        level_arg,
        log,
        message_only,
    }))
}

/// What log-style instants are named (the level, as Tachyon's log messages are).
pub(crate) fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::TRACE => "trace",
        Level::DEBUG => "debug",
        Level::INFO => "info",
        Level::WARN => "warn",
        Level::ERROR => "error",
    }
}

/// The callsite of the instants that start `follows_from` flows.
pub(crate) fn follows_from_callsite() -> &'static Callsite {
    static CS: OnceLock<&'static Callsite> = OnceLock::new();
    CS.get_or_init(|| {
        integration::callsite("follows_from", None, file!(), line!(), module_path!(), &[])
    })
}

/// A `log` record's callsite (through `tracing-log` every record shares one `tracing` callsite
/// per level): one per target, file, line and level, made once. The log's target is the
/// category.
pub(crate) fn log_callsite(
    target: &str,
    file: &str,
    line: u32,
    module_path: &str,
    level: &Level,
) -> &'static Callsite {
    /// A log callsite with its leaked target and file (compared on the per-thread memo).
    type Known = (&'static str, &'static str, &'static Callsite);
    type Key = (String, String, u32, Level);
    static MAP: OnceLock<Mutex<HashMap<Key, Known>>> = OnceLock::new();
    thread_local! {
        static LAST: RefCell<Option<(u32, Level, Known)>> = const { RefCell::new(None) };
    }
    // The same record again on this thread (a log line in a loop): no lock.
    let hit = LAST.with(|l| match *l.borrow() {
        Some((n, lv, (t, f, cs))) if n == line && lv == *level && t == target && f == file => {
            Some(cs)
        }
        _ => None,
    });
    if let Some(cs) = hit {
        return cs;
    }
    let mut map = MAP
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let key = (target.to_owned(), file.to_owned(), line, *level);
    let known = *map.entry(key).or_insert_with(|| {
        let leak = |s: &str| -> &'static str { Box::leak(s.to_owned().into_boxed_str()) };
        let (t, f) = (leak(target), leak(file));
        let cs = integration::callsite(
            level_name(level),
            Some(t),
            f,
            line,
            leak(module_path),
            &["message", "level"],
        );
        (t, f, cs)
    });
    drop(map);
    LAST.with(|l| *l.borrow_mut() = Some((line, *level, known)));
    known.2
}

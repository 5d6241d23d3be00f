//! `tracing` field values as Tachyon arguments: written straight into an event
//! ([`ArgWriter`]), or kept with a span until its slices begin ([`OwnedFields`]); and events.

use std::cell::RefCell;
use std::fmt::{self, Write as _};

use tachyon::integration;
use tachyon::{Callsite, Enabled, EventContext};
use tracing_core::field::{Field, Visit};
use tracing_core::{Event, Level};

use crate::cache;

thread_local! {
    /// Where `Debug` and `Display` values are formatted (reused: no allocation per value once
    /// it has grown).
    static TEXT: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Formats `value` and hands the text to `f`.
fn with_text(value: impl fmt::Display, f: impl FnOnce(&str)) {
    let mut f = Some(f);
    let _ = TEXT.try_with(|t| {
        if let Ok(mut t) = t.try_borrow_mut() {
            t.clear();
            let _ = write!(t, "{value}");
            if let Some(f) = f.take() {
                f(&t);
            }
        }
    });
    if let Some(f) = f {
        // Formatting a value that records an event itself (re-entered), or a thread that is
        // going away: a buffer of its own.
        f(&value.to_string());
    }
}

struct DebugAsDisplay<'a>(&'a dyn fmt::Debug);

impl fmt::Display for DebugAsDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.0, f)
    }
}

/// Writes visited fields as the event's arguments, at their index in the callsite's field set
/// (the callsite's argument names are the field names, in order).
pub(crate) struct ArgWriter<'c, 'a, 'w> {
    cx: &'c mut EventContext<'a, 'w>,
}

impl<'c, 'a, 'w> ArgWriter<'c, 'a, 'w> {
    pub(crate) fn new(cx: &'c mut EventContext<'a, 'w>) -> Self {
        ArgWriter { cx }
    }
}

impl Visit for ArgWriter<'_, '_, '_> {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.cx.arg_at(field.index(), &value);
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.cx.arg_at(field.index(), &value);
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.cx.arg_at(field.index(), &value);
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.cx.arg_at(field.index(), &value);
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.cx.arg_at(field.index(), value);
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        match i64::try_from(value) {
            Ok(v) => self.cx.arg_at(field.index(), &v),
            Err(_) => with_text(value, |t| self.cx.arg_at(field.index(), t)),
        }
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        match u64::try_from(value) {
            Ok(v) => self.cx.arg_at(field.index(), &v),
            Err(_) => with_text(value, |t| self.cx.arg_at(field.index(), t)),
        }
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        with_text(value, |t| self.cx.arg_at(field.index(), t));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        with_text(DebugAsDisplay(value), |t| self.cx.arg_at(field.index(), t));
    }
}

/// A field value kept with a span.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Owned {
    Int(i64),
    Uint(u64),
    Double(f64),
    Bool(bool),
    Text(String),
}

/// A span's field values, by field index, for the slices it begins later.
#[derive(Clone, Debug, Default)]
pub(crate) struct OwnedFields(Vec<(usize, Owned)>);

impl OwnedFields {
    fn set(&mut self, field: &Field, value: Owned) {
        let i = field.index();
        match self.0.iter_mut().find(|(k, _)| *k == i) {
            Some(slot) => slot.1 = value,
            None => self.0.push((i, value)),
        }
    }

    /// Writes the values as arguments of the event being built.
    pub(crate) fn write(&self, cx: &mut EventContext<'_, '_>) {
        for (i, v) in &self.0 {
            match v {
                Owned::Int(v) => cx.arg_at(*i, v),
                Owned::Uint(v) => cx.arg_at(*i, v),
                Owned::Double(v) => cx.arg_at(*i, v),
                Owned::Bool(v) => cx.arg_at(*i, v),
                Owned::Text(v) => cx.arg_at(*i, v.as_str()),
            }
        }
    }
}

impl Visit for OwnedFields {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field, Owned::Int(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.set(field, Owned::Uint(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(field, Owned::Double(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(field, Owned::Bool(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field, Owned::Text(value.to_owned()));
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        let v = i64::try_from(value).map_or_else(|_| Owned::Text(value.to_string()), Owned::Int);
        self.set(field, v);
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        let v = u64::try_from(value).map_or_else(|_| Owned::Text(value.to_string()), Owned::Uint);
        self.set(field, v);
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.set(field, Owned::Text(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.set(field, Owned::Text(format!("{value:?}")));
    }
}

/// The `log.*` fields `tracing-log` gives a `log` record, and its message.
#[derive(Default)]
struct LogRecord {
    target: Option<String>,
    file: Option<String>,
    module_path: Option<String>,
    line: Option<u64>,
    message: String,
}

impl Visit for LogRecord {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "log.target" => self.target = Some(value.to_owned()),
            "log.file" => self.file = Some(value.to_owned()),
            "log.module_path" => self.module_path = Some(value.to_owned()),
            "message" => self.message = value.to_owned(),
            _ => {}
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "log.line" {
            self.line = Some(value);
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message.clear();
            let _ = write!(self.message, "{value:?}");
        }
    }
}

/// Records an event: an instant on this thread's track; a log message when it is log-style.
pub(crate) fn record_event(event: &Event<'_>) {
    let meta = event.metadata();
    let entry = cache::entry(meta);
    if entry.log {
        return record_log(event);
    }
    let Some(en) = entry.cs.check() else { return };
    if entry.message_only {
        let mut rec = LogRecord::default();
        event.record(&mut rec);
        return log_message(entry.cs, en, meta.level(), &rec.message);
    }
    integration::instant(entry.cs, en, None, None, |cx| {
        event.record(&mut ArgWriter::new(cx));
        cx.arg_at(entry.level_arg, meta.level().as_str());
    });
}

/// A `log` record through `tracing-log`: its own callsite (the record's target, file and line).
fn record_log(event: &Event<'_>) {
    let mut rec = LogRecord::default();
    event.record(&mut rec);
    let meta = event.metadata();
    let cs = cache::log_callsite(
        rec.target.as_deref().unwrap_or(meta.target()),
        rec.file.as_deref().unwrap_or(""),
        rec.line.map_or(0, |l| u32::try_from(l).unwrap_or(u32::MAX)),
        rec.module_path.as_deref().unwrap_or(""),
        meta.level(),
    );
    if let Some(en) = cs.check() {
        log_message(cs, en, meta.level(), &rec.message);
    }
}

/// A log-style message: a TrackEvent `log_message` (an instant named after the level, in
/// `android_logs` and the UI's log panel), `tracing`'s level as its priority, the callsite's
/// target as its category and its file and line as its source location.
fn log_message(cs: &'static Callsite, en: Enabled, level: &Level, message: &str) {
    integration::log_message(cs, en, tachyon_level(level), message);
}

/// `tracing`'s level as Tachyon's (`LogMessage.prio`: TRACE is verbose).
fn tachyon_level(level: &Level) -> tachyon::Level {
    match *level {
        Level::TRACE => tachyon::Level::Trace,
        Level::DEBUG => tachyon::Level::Debug,
        Level::INFO => tachyon::Level::Info,
        Level::WARN => tachyon::Level::Warn,
        Level::ERROR => tachyon::Level::Error,
    }
}

//! The `log` crate's records as Tachyon log messages (cargo feature `log-bridge`): existing
//! `log::info!` calls land in the trace like [`message!`](crate::message), with the record's
//! level, text and source location (`android_logs` in the trace processors). Category
//! `tachyon.log` turns them off with the SDK's own messages.
//!
//! ```
//! tachyon::log_bridge::init().expect("no other logger installed");
//! tachyon::start(tachyon::Config::in_memory())?;
//! log::warn!("disk {}% full", 91);
//! tachyon::shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use log::{LevelFilter, Log, Metadata, Record, SetLoggerError};

use crate::track_event::state::ext::with_thread_state;
use crate::track_event::{Callsite, CallsiteKind};
use crate::Level;

/// The callsite whose category (`tachyon.log`) turns the bridge on and off.
static BRIDGE: Callsite = Callsite::new(
    "",
    Some("tachyon.log"),
    file!(),
    line!(),
    module_path!(),
    &[],
    CallsiteKind::Event,
);

struct Bridge;

static LOGGER: Bridge = Bridge;

/// Installs the bridge as the `log` crate's logger, passing every level.
pub fn init() -> Result<(), SetLoggerError> {
    init_with_level(LevelFilter::Trace)
}

/// Installs the bridge, passing records up to `max` (the `log` macros test this first: records
/// above it cost one comparison).
pub fn init_with_level(max: LevelFilter) -> Result<(), SetLoggerError> {
    log::set_logger(&LOGGER)?;
    log::set_max_level(max);
    Ok(())
}

/// A `log` level as a Tachyon level.
pub fn level(l: log::Level) -> Level {
    match l {
        log::Level::Error => Level::Error,
        log::Level::Warn => Level::Warn,
        log::Level::Info => Level::Info,
        log::Level::Debug => Level::Debug,
        log::Level::Trace => Level::Trace,
    }
}

impl Log for Bridge {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        crate::COMPILED_IN && BRIDGE.check().is_some()
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let text = match record.args().as_str() {
            Some(s) => std::borrow::Cow::Borrowed(s),
            None => std::borrow::Cow::Owned(record.args().to_string()),
        };
        let text = crate::sync::clip(&text, crate::track_event::message::MAX_MESSAGE_LEN);
        let location = record.file().map(|f| {
            (
                f,
                record.line().unwrap_or(0),
                record.module_path().unwrap_or(""),
            )
        });
        let level = level(record.level());
        with_thread_state(|st, ts| st.log_message_at(ts, level, &text, location));
    }

    fn flush(&self) {}
}

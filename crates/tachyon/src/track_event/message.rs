//! Log messages (Tracy's `TracyMessage`, `TracyMessageC`, `TracyLogString`): an instant on the
//! thread's track, named after the level, carrying a TrackEvent `log_message` with the
//! callsite's source location, the body and the priority. Perfetto's trace processor (and
//! Tachyon's) turn it into a row of `android_logs`; the Perfetto UI lists it in its log panel.
//!
//! A message whose text is a literal without arguments is interned: its body goes on the
//! sequence once per generation, later messages refer to it by iid. A formatted message is
//! copied (its body interned under a fresh iid each time). Texts longer than
//! [`MAX_MESSAGE_LEN`] bytes are cut, with a marker. `callstack: N,` before the other options
//! gives a message N frames of call stack (Tracy's `TracyMessageS`); `TACHYON_CALLSTACK` gives
//! every message that many.
//!
//! ```
//! use tachyon::Level;
//! tachyon::start(tachyon::Config::in_memory())?;
//! tachyon::message!("loaded the scene");
//! let n = 3;
//! tachyon::message!(color: 0xff8000, "{n} textures missing");
//! tachyon::message!(level: Level::Error, "disk full");
//! tachyon::warn!("retrying in {} ms", 100);
//! tachyon::message!(bytes: b"raw \xff bytes"); // not UTF-8: replaced characters
//! tachyon::message!(callstack: 8, level: Level::Warn, "slow frame"); // with its call stack
//! tachyon::shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use super::state::ext::with_thread_state;
use super::{Callsite, Enabled};

/// Message texts are cut to this many bytes.
pub const MAX_MESSAGE_LEN: usize = 64 * 1024;

/// A message's severity (Tracy's levels; on the trace, `LogMessage.prio`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// `PRIO_VERBOSE`.
    Trace,
    /// `PRIO_DEBUG`.
    Debug,
    /// `PRIO_INFO` (the default).
    Info,
    /// `PRIO_WARN`.
    Warn,
    /// `PRIO_ERROR`.
    Error,
    /// `PRIO_FATAL`.
    Fatal,
}

impl Level {
    /// The name the message's instant carries.
    pub fn name(self) -> &'static str {
        match self {
            Level::Trace => "trace",
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
            Level::Fatal => "fatal",
        }
    }

    /// `LogMessage.Priority` (the same numbers as Android's log priorities).
    pub fn priority(self) -> i32 {
        match self {
            Level::Trace => 2,
            Level::Debug => 3,
            Level::Info => 4,
            Level::Warn => 5,
            Level::Error => 6,
            Level::Fatal => 7,
        }
    }
}

/// Records a message of an enabled callsite (what the macros expand to). `depth`: the frames
/// of call stack the message carries (`callstack: N`; 0: the `TACHYON_CALLSTACK` depth, which
/// is 0 when that is off).
///
/// Always inlined: the stack, when there is one, is taken by `emit_stack`, whose caller must be
/// the function the message is in.
#[doc(hidden)]
#[inline(always)]
pub fn emit(
    cs: &'static Callsite,
    en: Enabled,
    level: Level,
    color: Option<u32>,
    depth: usize,
    args: fmt::Arguments<'_>,
) {
    if depth != 0 || crate::callstack::default_depth() != 0 {
        return emit_stack(cs, en, level, color, depth, args);
    }
    emit_pcs(cs, en, level, color, args, &[])
}

/// [`emit`] with the caller's call stack (Tracy's `TracyMessageS`).
#[inline(never)]
fn emit_stack(
    cs: &'static Callsite,
    en: Enabled,
    level: Level,
    color: Option<u32>,
    depth: usize,
    args: fmt::Arguments<'_>,
) {
    let depth = match depth {
        0 => crate::callstack::default_depth(),
        d => d.min(crate::callstack::MAX_DEPTH),
    };
    let mut pcs = [0u64; crate::callstack::MAX_DEPTH];
    // Skips this function's frame: the first is the function the message is in.
    let n = crate::callstack::capture(&mut pcs[..depth], 1);
    emit_pcs(cs, en, level, color, args, &pcs[..n]);
}

/// A message of a callsite made at run time ([`integration::log_message`](crate::integration::log_message)):
/// the text copied.
pub(crate) fn emit_str(cs: &'static Callsite, en: Enabled, level: Level, text: &str) {
    write(cs, en, level, None, text, false, &[]);
}

/// Formats (unless the text is a literal) and writes.
#[inline(never)]
fn emit_pcs(
    cs: &'static Callsite,
    en: Enabled,
    level: Level,
    color: Option<u32>,
    args: fmt::Arguments<'_>,
    pcs: &[u64],
) {
    match args.as_str() {
        Some(s) => write(cs, en, level, color, s, true, pcs),
        None => {
            let text = fmt::format(args);
            write(cs, en, level, color, &text, false, pcs)
        }
    }
}

/// Records a message given as bytes (invalid UTF-8 is replaced, never refused).
#[doc(hidden)]
pub fn emit_bytes(cs: &'static Callsite, en: Enabled, level: Level, color: Option<u32>, b: &[u8]) {
    let text = String::from_utf8_lossy(b);
    write(cs, en, level, color, &text, false, &[]);
}

fn write(
    cs: &'static Callsite,
    en: Enabled,
    level: Level,
    color: Option<u32>,
    text: &str,
    is_static: bool,
    pcs: &[u64],
) {
    let text = crate::sync::clip(text, MAX_MESSAGE_LEN);
    with_thread_state(|st, ts| {
        let iid = if pcs.is_empty() {
            0
        } else {
            st.intern_callstack(ts, pcs)
        };
        st.log_message(ts, cs, en, level, &text, is_static, color, iid)
    });
}

/// A log message on this thread: `message!("text")`, `message!("x = {}", x)`, with optional
/// `callstack: N,` (the message carries N frames of call stack, Tracy's `TracyMessageS`; every
/// message carries `TACHYON_CALLSTACK` frames when that is set), `level: Level::Warn,` and
/// `color: 0xRRGGBB,` before the text (in this order), or `message!(bytes: expr)` for bytes
/// that may not be UTF-8.
#[macro_export]
macro_rules! message {
    (callstack: $d:expr, $($rest:tt)+) => {
        $crate::__tachyon_message_opts!(($d) $($rest)+)
    };
    ($($rest:tt)+) => {
        $crate::__tachyon_message_opts!((0usize) $($rest)+)
    };
}

/// The level and color of a message.
#[doc(hidden)]
#[macro_export]
macro_rules! __tachyon_message_opts {
    (($d:expr) level: $lvl:expr, color: $c:expr, $($rest:tt)+) => {
        $crate::__tachyon_message!(($lvl) (::core::option::Option::Some($c)) ($d) $($rest)+)
    };
    (($d:expr) level: $lvl:expr, $($rest:tt)+) => {
        $crate::__tachyon_message!(($lvl) (::core::option::Option::None) ($d) $($rest)+)
    };
    (($d:expr) color: $c:expr, $($rest:tt)+) => {
        $crate::__tachyon_message!(($crate::Level::Info) (::core::option::Option::Some($c)) ($d) $($rest)+)
    };
    (($d:expr) $($rest:tt)+) => {
        $crate::__tachyon_message!(($crate::Level::Info) (::core::option::Option::None) ($d) $($rest)+)
    };
}

/// The callsite and the call of a message.
#[doc(hidden)]
#[macro_export]
macro_rules! __tachyon_message {
    (($lvl:expr) ($color:expr) ($d:expr) bytes: $b:expr) => {{
        static __TACHYON_CALLSITE: $crate::Callsite = $crate::__tachyon_message_callsite!();
        if $crate::COMPILED_IN {
            if let ::core::option::Option::Some(en) = __TACHYON_CALLSITE.check() {
                $crate::__message::emit_bytes(&__TACHYON_CALLSITE, en, $lvl, $color, &$b[..]);
            }
        }
    }};
    (($lvl:expr) ($color:expr) ($d:expr) $($fmt:tt)+) => {{
        static __TACHYON_CALLSITE: $crate::Callsite = $crate::__tachyon_message_callsite!();
        if $crate::COMPILED_IN {
            if let ::core::option::Option::Some(en) = __TACHYON_CALLSITE.check() {
                $crate::__message::emit(
                    &__TACHYON_CALLSITE,
                    en,
                    $lvl,
                    $color,
                    $d,
                    ::core::format_args!($($fmt)+),
                );
            }
        }
    }};
}

#[doc(hidden)]
#[macro_export]
macro_rules! __tachyon_message_callsite {
    () => {
        $crate::Callsite::new(
            "",
            ::core::option::Option::Some("tachyon.log"),
            ::core::file!(),
            ::core::line!(),
            ::core::module_path!(),
            &[],
            $crate::CallsiteKind::Event,
        )
    };
}

/// A `Level::Trace` message: `tachyon::trace!("x = {}", x)`.
#[macro_export]
macro_rules! trace {
    (callstack: $d:expr, $($t:tt)+) => { $crate::message!(callstack: $d, level: $crate::Level::Trace, $($t)+) };
    ($($t:tt)+) => { $crate::message!(level: $crate::Level::Trace, $($t)+) };
}
/// A `Level::Debug` message.
#[macro_export]
macro_rules! debug {
    (callstack: $d:expr, $($t:tt)+) => { $crate::message!(callstack: $d, level: $crate::Level::Debug, $($t)+) };
    ($($t:tt)+) => { $crate::message!(level: $crate::Level::Debug, $($t)+) };
}
/// A `Level::Info` message.
#[macro_export]
macro_rules! info {
    (callstack: $d:expr, $($t:tt)+) => { $crate::message!(callstack: $d, level: $crate::Level::Info, $($t)+) };
    ($($t:tt)+) => { $crate::message!(level: $crate::Level::Info, $($t)+) };
}
/// A `Level::Warn` message.
#[macro_export]
macro_rules! warn {
    (callstack: $d:expr, $($t:tt)+) => { $crate::message!(callstack: $d, level: $crate::Level::Warn, $($t)+) };
    ($($t:tt)+) => { $crate::message!(level: $crate::Level::Warn, $($t)+) };
}
/// A `Level::Error` message.
#[macro_export]
macro_rules! error {
    (callstack: $d:expr, $($t:tt)+) => { $crate::message!(callstack: $d, level: $crate::Level::Error, $($t)+) };
    ($($t:tt)+) => { $crate::message!(level: $crate::Level::Error, $($t)+) };
}
/// A `Level::Fatal` message (recorded like the others; nothing aborts).
#[macro_export]
macro_rules! fatal {
    (callstack: $d:expr, $($t:tt)+) => { $crate::message!(callstack: $d, level: $crate::Level::Fatal, $($t)+) };
    ($($t:tt)+) => { $crate::message!(level: $crate::Level::Fatal, $($t)+) };
}

/// Records the program's information once per trace (Tracy's `TracyAppInfo`): an instant
/// `app info` on the process's track (category `tachyon.app_info`, argument `info`), written
/// in every session that runs or starts after the call. `tachyon stats` shows it.
#[macro_export]
macro_rules! app_info {
    ($($fmt:tt)+) => {
        $crate::__message::app_info(::std::format!($($fmt)+))
    };
}

static APP_INFO: std::sync::Mutex<(Vec<String>, u32)> = std::sync::Mutex::new((Vec::new(), 0));

/// Adds `text` to the program's information, and writes it now if a session runs.
#[doc(hidden)]
pub fn app_info(text: String) {
    let text = crate::sync::clip(&text, MAX_MESSAGE_LEN).into_owned();
    let mut info = APP_INFO.lock().unwrap_or_else(|e| e.into_inner());
    info.0.push(text);
    // Rewritten whole, so a session shows every part.
    info.1 = 0;
    drop(info);
    write_app_info();
}

/// Writes the program's information into the running session if it is not there yet (called
/// by `app_info!` and when a session starts).
pub(crate) fn write_app_info() {
    let epoch = super::global::EPOCH.load(std::sync::atomic::Ordering::Relaxed);
    let session = super::global::session_of(epoch);
    if session == 0 || !crate::COMPILED_IN {
        return;
    }
    let mut info = APP_INFO.lock().unwrap_or_else(|e| e.into_inner());
    if info.0.is_empty() || info.1 == session {
        return;
    }
    let text = info.0.join("\n");
    if with_thread_state(|st, ts| st.app_info(ts, &text)).unwrap_or(false) {
        info.1 = session;
    }
}

//! What other instrumentation libraries build on (the `tracing` Layer in `tracing-tachyon`,
//! bridges from `log`-style APIs): callsites made at run time, and zones begun and ended by
//! separate calls instead of a guard's scope.
//!
//! A [`Callsite`] made here is leaked (`&'static`), as the macros' statics are: make one per
//! source callsite of the other library and keep it (a cache keyed by that library's own
//! callsite identity), never one per event. It is checked, interned and filtered by category
//! exactly as the macros' callsites are, and a zone begun with [`zone_begin`] takes the same
//! queued path as `zone!("name")`.
//!
//! ```
//! use tachyon::integration;
//! tachyon::start(tachyon::Config::in_memory())?;
//! let cs = integration::callsite("parse", Some("my_crate::io"), "src/io.rs", 12, "my_crate::io", &["bytes"]);
//! if let Some(en) = cs.check() {
//!     let session = integration::zone_begin_with(cs, en, |cx| cx.arg_at(0, &4096u64));
//!     // ... the work, possibly across other calls on this thread ...
//!     integration::zone_end(session);
//! }
//! tachyon::shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::message::{self, Level};
use super::state::{self, with_state};
use super::{encode, Callsite, CallsiteKind, Enabled, EventContext, Track, TrackSlice};
use crate::clock;

/// A callsite for events (zones, instants) with these static strings, leaked: call it once per
/// source callsite and keep the result.
pub fn callsite(
    name: &'static str,
    category: Option<&'static str>,
    file: &'static str,
    line: u32,
    module_path: &'static str,
    arg_names: &'static [&'static str],
) -> &'static Callsite {
    Box::leak(Box::new(Callsite::new(
        name,
        category,
        file,
        line,
        module_path,
        arg_names,
        CallsiteKind::Event,
    )))
}

/// The session a zone begun by [`zone_begin`] went to; 0: none (nothing to end).
pub type ZoneSession = u32;

/// Begins a zone on this thread's track, named after the callsite, without arguments: the
/// queued path of `zone!("name")`. End it with [`zone_end`] on this thread.
#[inline(always)]
pub fn zone_begin(cs: &'static Callsite, en: Enabled) -> ZoneSession {
    debug_assert_eq!(en.id, cs.id());
    state::named_event::<{ encode::TYPE_SLICE_BEGIN }>(cs)
}

/// Begins a zone with arguments (or flows) that `fill` adds.
#[inline]
pub fn zone_begin_with(
    cs: &'static Callsite,
    en: Enabled,
    fill: impl FnOnce(&mut EventContext<'_, '_>),
) -> ZoneSession {
    with_state(|st| {
        let ts = clock::now();
        st.event(ts, cs, en, encode::TYPE_SLICE_BEGIN, None, None, fill);
        st.session()
    })
    .unwrap_or(0)
}

/// Ends the innermost zone of this thread's track, if `session` is still the running one.
#[inline(always)]
pub fn zone_end(session: ZoneSession) {
    if session != 0 {
        state::slice_end(session);
    }
}

/// An instant on this thread's track (`track: None`) or on a [`Track`], with what `fill`
/// adds; `name` overrides the callsite's name (interned per sequence: keep the set small).
#[inline]
pub fn instant(
    cs: &'static Callsite,
    en: Enabled,
    track: Option<&Track>,
    name: Option<&str>,
    fill: impl FnOnce(&mut EventContext<'_, '_>),
) {
    super::__rt::instant_with(cs, en, track, name, fill)
}

/// Begins a slice on a [`Track`]; it ends when the returned [`TrackSlice`] drops, on any
/// thread.
#[inline]
pub fn track_begin(
    cs: &'static Callsite,
    en: Enabled,
    track: &Track,
    fill: impl FnOnce(&mut EventContext<'_, '_>),
) -> TrackSlice {
    super::__rt::track_begin(cs, en, track, None, fill)
}

/// A log message on this thread's track (as [`message!`](crate::message)): an instant named
/// after `level`, carrying a TrackEvent `log_message` with `text` (copied, cut at
/// [`MAX_MESSAGE_LEN`](crate::MAX_MESSAGE_LEN) bytes), the level as its priority and the
/// callsite's file and line as its source location, in the callsite's category (a `log`
/// record's target). The trace processors list it in `android_logs`.
#[inline]
pub fn log_message(cs: &'static Callsite, en: Enabled, level: Level, text: &str) {
    message::emit_str(cs, en, level, text)
}

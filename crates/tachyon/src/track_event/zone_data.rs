//! Per-instance zone data (Tracy's `ZoneText`, `ZoneValue`, `ZoneColor`, `ZoneName`): stored
//! on this thread until the zone ends, then written as arguments of the slice's end event,
//! which readers merge into the slice's arguments (`text`, `value`, `color`, `name`). A zone
//! without data ends through the queue as before; one with data ends through the thread's
//! state.
//!
//! ```
//! tachyon::start(tachyon::Config::in_memory())?;
//! {
//!     let zone = tachyon::zone!("load");
//!     zone.text("level3.map");
//!     zone.value(42);
//!     zone.color(0x20c020);
//! }
//! tachyon::shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::cell::{Cell, RefCell};

use super::state::ext::{with_thread_state, ArgVal};
use super::ZoneGuard;

/// A zone's text is cut to this many bytes (all its `text` calls together).
pub(crate) const MAX_ZONE_TEXT: usize = 64 * 1024;

thread_local! {
    /// The data of this thread's zones that have some, by key.
    static PENDING: RefCell<Vec<(u32, &'static str, ArgVal)>> = const { RefCell::new(Vec::new()) };
    static NEXT_KEY: Cell<u32> = const { Cell::new(1) };
}

impl ZoneGuard {
    fn put(&self, arg: &'static str, value: ArgVal) {
        if self.session == 0 {
            return;
        }
        let key = match self.data.get() {
            0 => {
                let k = NEXT_KEY.with(|n| {
                    let k = n.get();
                    n.set(k.checked_add(1).unwrap_or(1));
                    k
                });
                self.data.set(k);
                k
            }
            k => k,
        };
        let _ = PENDING.try_with(|p| {
            let mut p = p.borrow_mut();
            match (arg, value) {
                // Texts append, one per line (as Tracy's ZoneText).
                ("text", ArgVal::Str(s)) => {
                    if let Some((_, _, ArgVal::Str(t))) =
                        p.iter_mut().find(|(k, a, _)| *k == key && *a == "text")
                    {
                        t.push('\n');
                        t.push_str(&s);
                        if t.len() > MAX_ZONE_TEXT {
                            *t = crate::sync::clip(t, MAX_ZONE_TEXT).into_owned();
                        }
                    } else {
                        p.push((key, arg, ArgVal::Str(s)));
                    }
                }
                (arg, value) => {
                    p.retain(|(k, a, _)| !(*k == key && *a == arg));
                    p.push((key, arg, value));
                }
            }
        });
    }

    /// Adds a line of text to this zone instance (argument `text`).
    pub fn text(&self, text: &str) {
        if self.session != 0 {
            self.put(
                "text",
                ArgVal::Str(crate::sync::clip(text, MAX_ZONE_TEXT).into_owned()),
            );
        }
    }

    /// Adds text given as bytes (invalid UTF-8 is replaced, never refused).
    pub fn text_bytes(&self, text: &[u8]) {
        if self.session != 0 {
            self.text(&String::from_utf8_lossy(text));
        }
    }

    /// A value for this zone instance (argument `value`).
    pub fn value(&self, value: u64) {
        self.put("value", ArgVal::Uint(value));
    }

    /// A color for this zone instance, `0xRRGGBB` (argument `color`, as `#rrggbb`).
    pub fn color(&self, rgb: u32) {
        if self.session != 0 {
            self.put("color", ArgVal::Str(format!("#{:06x}", rgb & 0xff_ffff)));
        }
    }

    /// A name for this zone instance given after it began (argument `name`: the slice keeps
    /// the name it began with; name it at its begin with `zone!(name: expr)`).
    pub fn name(&self, name: &str) {
        if self.session != 0 {
            let name = crate::sync::clip(name, crate::sync::MAX_NAME_LEN).into_owned();
            self.put("name", ArgVal::Str(name));
        }
    }
}

/// Ends the zone of `session` whose data is under `key`, with its data.
#[cold]
#[inline(never)]
pub(super) fn end_with_data(session: u32, key: u32) {
    let args: Vec<(&'static str, ArgVal)> = PENDING
        .try_with(|p| {
            let mut p = p.borrow_mut();
            let mut out = Vec::new();
            p.retain(|(k, a, v)| {
                if *k == key {
                    out.push((*a, v.clone()));
                    false
                } else {
                    true
                }
            });
            out
        })
        .unwrap_or_default();
    let args: Vec<(&str, ArgVal)> = args.into_iter().collect();
    with_thread_state(|st, ts| st.slice_end_with_args(session, ts, &args));
}

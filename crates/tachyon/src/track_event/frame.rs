//! Frames (Tracy's `FrameMark`, `FrameMarkNamed`, `FrameMarkStart/End`): a track per frame set
//! under the process, one numbered slice per frame (`"Frame 17"`, category `tachyon.frame`,
//! argument `frame_number`).
//!
//! - [`frame_mark!()`](crate::frame_mark) ends the current frame of the main set and begins the
//!   next (continuous frames); `frame_mark!("name")` does the same for a secondary set.
//! - [`frame!("name")`](macro@crate::frame) begins a discontinuous frame that ends when the returned
//!   guard drops.
//!
//! Do not mix the two kinds in one set. A mark costs a call to the thread's state (frames come
//! tens of times a second, not millions).
//!
//! ```
//! tachyon::start(tachyon::Config::in_memory())?;
//! for _ in 0..3 {
//!     tachyon::frame_mark!();
//!     let _load = tachyon::frame!("asset load");
//! }
//! tachyon::shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use super::global::{self, session_of, EPOCH};
use super::state::ext::{with_thread_state, OwnTrack, CAT_FRAME};
use super::{callsite, Callsite, CallsiteKind};

/// The callsite whose category (`tachyon.frame`) turns frames on and off.
static FRAMES: Callsite = Callsite::new(
    "",
    Some(CAT_FRAME),
    file!(),
    line!(),
    module_path!(),
    &[],
    CallsiteKind::Event,
);

/// One frame set: its track and its frame count.
#[derive(Debug)]
pub struct FrameSet {
    name: &'static str,
    uuid: OnceLock<u64>,
    /// Frames begun so far (the next frame's number is this + 1).
    count: AtomicU64,
    /// The session in which the set's current (continuous) frame is open; 0: none.
    open: AtomicU32,
}

/// The main (continuous) frame set, named "Frame".
pub static MAIN: FrameSet = FrameSet::new("Frame");

impl FrameSet {
    /// A set with this name (the track's name and the frames' prefix).
    pub const fn new(name: &'static str) -> FrameSet {
        FrameSet {
            name,
            uuid: OnceLock::new(),
            count: AtomicU64::new(0),
            open: AtomicU32::new(0),
        }
    }

    /// The set named `name` (one per name in the process).
    pub fn named(name: &'static str) -> &'static FrameSet {
        if name == MAIN.name {
            return &MAIN;
        }
        static SETS: Mutex<Option<HashMap<&'static str, &'static FrameSet>>> = Mutex::new(None);
        let mut sets = SETS.lock().unwrap_or_else(|e| e.into_inner());
        sets.get_or_insert_with(HashMap::new)
            .entry(name)
            .or_insert_with(|| Box::leak(Box::new(FrameSet::new(name))))
    }

    fn track(&self) -> OwnTrack<'_> {
        let uuid = *self.uuid.get_or_init(|| {
            global::mix64(
                global::process().uuid ^ callsite::fnv1a64(self.name.as_bytes()) ^ 0x6672_616d_6500,
            )
        });
        OwnTrack {
            uuid,
            name: self.name,
            parent: None,
            counter: None,
            no_merge: false,
        }
    }

    /// Whether frames are recorded now.
    #[inline]
    fn recording() -> bool {
        super::COMPILED_IN && EPOCH.load(Ordering::Relaxed) != 0 && FRAMES.check().is_some()
    }

    /// Ends the set's current frame and begins the next (continuous frames).
    pub fn mark(&self) {
        if !Self::recording() {
            return;
        }
        let number = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        let session = session_of(EPOCH.load(Ordering::Relaxed));
        let end_open = self.open.load(Ordering::Relaxed) == session;
        let track = self.track();
        let written = with_thread_state(|st, ts| st.frame_event(ts, track, end_open, Some(number)))
            .unwrap_or(false);
        self.open
            .store(if written { session } else { 0 }, Ordering::Relaxed);
    }

    /// Begins a discontinuous frame, ended when the guard drops.
    pub fn start(&'static self) -> FrameGuard {
        if !Self::recording() {
            return FrameGuard { set: None };
        }
        let number = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        let track = self.track();
        let written = with_thread_state(|st, ts| st.frame_event(ts, track, false, Some(number)))
            .unwrap_or(false);
        FrameGuard {
            set: written.then(|| (self, session_of(EPOCH.load(Ordering::Relaxed)))),
        }
    }

    /// Frames begun in this set so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// A discontinuous frame: it ends when this drops (on any thread).
#[must_use = "the frame ends when this is dropped"]
#[derive(Debug)]
pub struct FrameGuard {
    set: Option<(&'static FrameSet, u32)>,
}

impl Drop for FrameGuard {
    fn drop(&mut self) {
        if let Some((set, session)) = self.set.take() {
            if session_of(EPOCH.load(Ordering::Relaxed)) == session {
                let track = set.track();
                with_thread_state(|st, ts| st.frame_event(ts, track, true, None));
            }
        }
    }
}

/// Marks the end of a frame: `frame_mark!()` for the main set, `frame_mark!("name")` for a
/// secondary set.
///
/// ```
/// tachyon::frame_mark!();
/// tachyon::frame_mark!("physics");
/// ```
#[macro_export]
macro_rules! frame_mark {
    () => {
        $crate::frame::MAIN.mark()
    };
    ($name:literal) => {{
        static __TACHYON_SET: ::std::sync::OnceLock<&'static $crate::frame::FrameSet> =
            ::std::sync::OnceLock::new();
        __TACHYON_SET
            .get_or_init(|| $crate::frame::FrameSet::named($name))
            .mark()
    }};
}

/// A discontinuous frame of the set `name`: `let _f = frame!("name");` ends it at scope end.
#[macro_export]
macro_rules! frame {
    ($name:literal) => {{
        static __TACHYON_SET: ::std::sync::OnceLock<&'static $crate::frame::FrameSet> =
            ::std::sync::OnceLock::new();
        __TACHYON_SET
            .get_or_init(|| $crate::frame::FrameSet::named($name))
            .start()
    }};
}

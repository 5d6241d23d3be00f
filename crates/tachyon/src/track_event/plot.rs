//! Plots (Tracy's `TracyPlot` / `TracyPlotConfig`): counter tracks of this process with a
//! display kind and a choice between absolute values and deltas, as Perfetto's
//! `CounterDescriptor` allows (`unit`/`unit_name`, `is_incremental`).
//!
//! ```
//! use tachyon::{Plot, PlotKind};
//! tachyon::start(tachyon::Config::in_memory())?;
//! let heap = Plot::new("heap", PlotKind::Bytes);
//! heap.set(4096);
//! let hits = Plot::new("cache hit rate", PlotKind::Percentage);
//! hits.set(97.5);
//! // A delta counter: the trace holds the increments, readers show the running total.
//! let sent = Plot::incremental("bytes sent", PlotKind::Bytes);
//! sent.add(1500);
//! sent.add(500);
//! tachyon::shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use super::state::ext::{with_thread_state, OwnTrack};
use super::{callsite, global, CounterValue};

/// How a plot's values read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlotKind {
    /// Plain numbers.
    Number,
    /// Bytes (`unit: UNIT_SIZE_BYTES`).
    Bytes,
    /// Percent (`unit_name: "%"`).
    Percentage,
}

/// A counter track of this process with a display kind; samples are recorded while a session
/// runs. Integer and floating-point values (`i64`/`u64`/`f64`...). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Plot {
    uuid: u64,
    name: Cow<'static, str>,
    kind: PlotKind,
    incremental: bool,
}

impl Plot {
    /// A plot of absolute values: each sample is the value from then on (drawn as steps).
    pub fn new(name: impl Into<Cow<'static, str>>, kind: PlotKind) -> Plot {
        Plot::make(name.into(), kind, false)
    }

    /// An incremental (delta) counter: each sample ([`add`](Self::add)) is added to the
    /// running total, which is what readers show.
    pub fn incremental(name: impl Into<Cow<'static, str>>, kind: PlotKind) -> Plot {
        Plot::make(name.into(), kind, true)
    }

    fn make(name: Cow<'static, str>, kind: PlotKind, incremental: bool) -> Plot {
        let name = match crate::sync::clip(&name, crate::sync::MAX_NAME_LEN) {
            Cow::Borrowed(_) => name,
            Cow::Owned(s) => Cow::Owned(s),
        };
        // Apart from `counter!`'s tracks of the same name: the descriptor differs.
        let uuid = global::mix64(
            global::process().uuid
                ^ callsite::fnv1a64(name.as_bytes())
                ^ if incremental {
                    0x706c_6f74_6400
                } else {
                    0x706c_6f74_0000
                },
        );
        Plot {
            uuid,
            name,
            kind,
            incremental,
        }
    }

    /// Records a value (for an incremental plot: a delta, as [`add`](Self::add)).
    #[inline]
    pub fn set(&self, value: impl CounterValue) {
        if !super::COMPILED_IN {
            return;
        }
        if global::EPOCH.load(Ordering::Relaxed) == 0 {
            // No session: let go of a writer left from one that ended (as `CounterTrack::set`:
            // a thread that records only plots never reaches its state otherwise, and the
            // stopping session would wait for its writer).
            super::state::release_thread_writer();
            return;
        }
        let sample = value.sample();
        let track = OwnTrack {
            uuid: self.uuid,
            name: &self.name,
            parent: None,
            counter: Some((self.kind, self.incremental)),
            no_merge: false,
        };
        with_thread_state(|st, ts| st.plot_sample(ts, track, sample));
    }

    /// Adds `delta` to an incremental plot (on an absolute one, the same as `set`).
    #[inline]
    pub fn add(&self, delta: impl CounterValue) {
        self.set(delta);
    }

    /// The track's uuid on the trace.
    pub fn uuid(&self) -> u64 {
        self.uuid
    }

    /// The plot's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

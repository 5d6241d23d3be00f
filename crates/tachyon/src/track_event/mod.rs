//! The instrumentation API: zones, instants, counters, flows and tracks, written as Perfetto
//! track events.
//!
//! Every macro declares a `static` [`Callsite`] (name, category, file, line, module path,
//! argument names). Whether it records is one relaxed atomic load of the callsite's state word
//! (set when a session starts or stops, from the session's category filter); when disabled,
//! nothing else runs — argument expressions are not evaluated. With the cargo feature
//! `enabled` turned off, [`COMPILED_IN`] is `false` and every macro compiles to nothing but
//! type checks.
//!
//! When enabled, the event goes to this thread's [`TraceWriter`](crate::backend::TraceWriter) (one
//! packet sequence per thread, see `state.rs`): timestamps are deltas on the sequence's
//! incremental clock, names and source locations are interned (emitted once per sequence and
//! generation). A zone with a static name and an instant without arguments only queue a
//! 16-byte record on their thread (`queue.rs`, as Tracy's client does): no lock, no allocation,
//! no encoding there; the SDK's `tachyon-drain` thread (or the thread itself, when its queue is
//! full or before its next other event) encodes it later, in order, copying the callsite's
//! pre-encoded bytes into the chunk (`encode.rs`). Every other event is written at once, under
//! the thread's own spin lock (one compare-and-swap, contended only while a drainer empties
//! that thread's queue); counters take the same pre-encoded route. No allocation there either.
//!
//! ```
//! tachyon::start(tachyon::Config::in_memory())?;
//! {
//!     let _zone = tachyon::zone!("work");
//!     let _inner = tachyon::zone!("io", "read", bytes = 4096, path = "/tmp/x");
//!     tachyon::instant!("cache miss");
//!     tachyon::counter!("queue depth", 3);
//! }
//! let report = tachyon::shutdown()?.expect("a session was running");
//! assert!(!report.trace.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod callsite;
mod categories;
mod encode;
pub mod frame;
pub(crate) mod global;
pub mod integration;
mod macros;
pub mod message;
mod plot;
mod queue;
pub(crate) mod state;
mod zone_data;

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use callsite::{Callsite, CallsiteKind, Enabled, Unit};
pub use categories::CategoryFilter;
pub use encode::CounterSample;
pub use global::set_process_name;
pub use message::Level;
pub use plot::{Plot, PlotKind};
pub use state::EventContext;

use state::{with_state, TrackRef};
use tachyon_protos::DebugAnnotation;

/// Whether the instrumentation is compiled in (the cargo feature `enabled`, on by default).
pub const COMPILED_IN: bool = cfg!(feature = "enabled");

/// A value an event can carry as an argument (a Perfetto debug annotation).
pub trait ArgValue {
    /// Writes the value into the annotation (its name is already set).
    fn write_arg(&self, a: &mut DebugAnnotation<'_>);
}

macro_rules! arg_value {
    ($method:ident as $as:ty: $($t:ty),*) => {$(
        impl ArgValue for $t {
            #[inline]
            fn write_arg(&self, a: &mut DebugAnnotation<'_>) {
                a.$method(*self as $as);
            }
        }
    )*};
}
arg_value!(set_int_value as i64: i8, i16, i32, i64, isize);
arg_value!(set_uint_value as u64: u8, u16, u32, u64, usize);
arg_value!(set_double_value as f64: f32, f64);

impl ArgValue for bool {
    #[inline]
    fn write_arg(&self, a: &mut DebugAnnotation<'_>) {
        a.set_bool_value(*self);
    }
}

impl ArgValue for str {
    #[inline]
    fn write_arg(&self, a: &mut DebugAnnotation<'_>) {
        a.set_string_value(self);
    }
}

impl ArgValue for String {
    #[inline]
    fn write_arg(&self, a: &mut DebugAnnotation<'_>) {
        a.set_string_value(self);
    }
}

impl ArgValue for char {
    #[inline]
    fn write_arg(&self, a: &mut DebugAnnotation<'_>) {
        let mut buf = [0u8; 4];
        a.set_string_value(self.encode_utf8(&mut buf));
    }
}

impl<T: ArgValue + ?Sized> ArgValue for &T {
    #[inline]
    fn write_arg(&self, a: &mut DebugAnnotation<'_>) {
        (**self).write_arg(a);
    }
}

impl<T: ArgValue> ArgValue for Option<T> {
    /// `None` is written as the string `"None"` (the annotation keeps its name).
    #[inline]
    fn write_arg(&self, a: &mut DebugAnnotation<'_>) {
        match self {
            Some(v) => v.write_arg(a),
            None => a.set_string_value("None"),
        }
    }
}

/// A value a counter can take: integers become `counter_value`, floats
/// `double_counter_value`.
pub trait CounterValue {
    /// The sample.
    fn sample(self) -> CounterSample;
}

macro_rules! counter_value {
    (Int: $($t:ty),*) => {$(
        impl CounterValue for $t {
            #[inline(always)]
            fn sample(self) -> CounterSample {
                CounterSample::Int(self as i64)
            }
        }
    )*};
    (Double: $($t:ty),*) => {$(
        impl CounterValue for $t {
            #[inline(always)]
            fn sample(self) -> CounterSample {
                CounterSample::Double(self as f64)
            }
        }
    )*};
}
counter_value!(Int: i8, i16, i32, i64, isize, u8, u16, u32);
counter_value!(Double: f32, f64);

impl CounterValue for u64 {
    /// Above `i64::MAX`, saturates.
    #[inline(always)]
    fn sample(self) -> CounterSample {
        CounterSample::Int(self.min(i64::MAX as u64) as i64)
    }
}

impl CounterValue for usize {
    #[inline(always)]
    fn sample(self) -> CounterSample {
        (self as u64).sample()
    }
}

// === Zones ===

/// A zone on this thread's track: the slice began when the guard was made and ends when it is
/// dropped. Made by [`zone!`](crate::zone); not `Send` (a zone begins and ends on one thread;
/// use a [`Track`] and [`begin!`](crate::begin) for work that moves).
#[must_use = "the zone ends when this guard is dropped; bind it with `let _zone = ...`"]
#[derive(Debug)]
pub struct ZoneGuard {
    /// The session the begin went to (0: none, nothing to end).
    session: u32,
    /// 0, or the key of the arguments the zone's end carries (text, value, color:
    /// `zone_data.rs`).
    data: std::cell::Cell<u32>,
    _not_send: PhantomData<*const ()>,
}

impl ZoneGuard {
    /// A guard that ends nothing (the callsite is disabled).
    #[inline(always)]
    pub const fn disabled() -> Self {
        ZoneGuard {
            session: 0,
            data: std::cell::Cell::new(0),
            _not_send: PhantomData,
        }
    }

    /// Whether the zone's begin was recorded in a session.
    pub fn is_recording(&self) -> bool {
        self.session != 0
    }
}

/// Set in [`ZoneGuard::session`] when the zone's begin was pushed on the memory tracker's
/// zone stack (`alloc`), so its end pops it (session numbers stay far below).
const ZONE_PUSHED: u32 = 1 << 31;

impl Drop for ZoneGuard {
    #[inline(always)]
    fn drop(&mut self) {
        if self.session != 0 {
            let session = self.session & !ZONE_PUSHED;
            match self.data.get() {
                0 => __rt::zone_end(session),
                key => zone_data::end_with_data(session, key),
            }
            if self.session & ZONE_PUSHED != 0 {
                crate::alloc::zone_pop();
            }
        }
    }
}

/// A recorded zone began: tell the memory tracker, if it attributes allocations to zones.
#[inline(always)]
fn memory_zone(cs: &'static Callsite, session: u32) -> u32 {
    if session != 0 && crate::alloc::zones_on() {
        crate::alloc::zone_push(cs);
        return session | ZONE_PUSHED;
    }
    session
}

// === Flows ===

/// A flow: an arrow linking events, across threads and processes. Attach it with `flow: f` in
/// an event macro (the arrow passes through that event) and end it with `terminating_flow: f`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Flow(u64);

impl Flow {
    /// A new flow, unique in this process and, with overwhelming probability, in the trace.
    pub fn new() -> Flow {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Flow(global::mix64(global::process().uuid ^ n) | 1)
    }

    /// A flow with an id of your own (e.g. shared between processes).
    pub const fn from_id(id: u64) -> Flow {
        Flow(id)
    }

    /// The flow id on the trace.
    pub const fn id(self) -> u64 {
        self.0
    }
}

impl Default for Flow {
    fn default() -> Self {
        Self::new()
    }
}

// === Tracks ===

#[derive(Debug)]
struct TrackInner {
    uuid: u64,
    name: Cow<'static, str>,
}

/// A named track of this process, for work that is not tied to one thread: slices on it begin
/// and end from any thread ([`begin!`](crate::begin)), instants go on it with
/// [`instant_on!`](crate::instant_on). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Track(Arc<TrackInner>);

impl Track {
    /// The process's track with this name: the same name gives the same track.
    pub fn named(name: impl Into<Cow<'static, str>>) -> Track {
        let name = name.into();
        let uuid = global::mix64(
            global::process().uuid ^ callsite::fnv1a64(name.as_bytes()) ^ 0x7472_6163_6b00_0000,
        );
        Track(Arc::new(TrackInner { uuid, name }))
    }

    /// A track of its own, for one asynchronous operation (a request, a job): every call makes
    /// a new track, even with the same name, so overlapping operations never share one.
    pub fn new_async(name: impl Into<Cow<'static, str>>) -> Track {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let uuid = global::mix64(global::process().uuid ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        Track(Arc::new(TrackInner {
            uuid,
            name: name.into(),
        }))
    }

    /// The track's uuid on the trace.
    pub fn uuid(&self) -> u64 {
        self.0.uuid
    }

    /// The track's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    fn as_ref(&self) -> TrackRef<'_> {
        TrackRef {
            uuid: self.0.uuid,
            name: &self.0.name,
            unit: None,
        }
    }
}

/// A slice on a [`Track`], begun by [`begin!`](crate::begin). It ends when dropped or
/// [`end`](Self::end)ed, on whichever thread that happens (it is `Send`).
#[must_use = "the slice ends when this is dropped"]
#[derive(Debug)]
pub struct TrackSlice {
    track: Option<Track>,
    session: u32,
}

impl TrackSlice {
    /// A slice that ends nothing (the callsite is disabled).
    pub const fn disabled() -> Self {
        TrackSlice {
            track: None,
            session: 0,
        }
    }

    /// Ends the slice now.
    pub fn end(self) {}
}

impl Drop for TrackSlice {
    fn drop(&mut self) {
        if let (Some(track), true) = (self.track.take(), self.session != 0) {
            let ts = crate::clock::now();
            with_state(|st| st.slice_end_slow(self.session, ts, Some(track.as_ref())));
        }
    }
}

/// A counter track with a name chosen at run time (the [`counter!`](crate::counter) macro is
/// for static names). Samples are recorded while a session runs.
#[derive(Clone, Debug)]
pub struct CounterTrack {
    uuid: u64,
    name: Cow<'static, str>,
    unit: Unit,
}

impl CounterTrack {
    /// The process's counter track with this name (same name, same track — and the same track
    /// as `counter!` with that name).
    pub fn new(name: impl Into<Cow<'static, str>>, unit: Unit) -> CounterTrack {
        let name = name.into();
        let uuid = global::counter_track_uuid(callsite::fnv1a64(name.as_bytes()));
        CounterTrack { uuid, name, unit }
    }

    /// Records a sample.
    pub fn set(&self, value: impl CounterValue) {
        if !COMPILED_IN {
            return;
        }
        if global::EPOCH.load(Ordering::Relaxed) == 0 {
            // No session: let go of a writer left from one that ended. A thread that records
            // only through counter tracks never reaches its state otherwise, and the stopping
            // session would wait for its writer, then lose its last chunk.
            state::release_thread_writer();
            return;
        }
        let sample = value.sample();
        let ts = crate::clock::now();
        let track = TrackRef {
            uuid: self.uuid,
            name: &self.name,
            unit: Some(self.unit),
        };
        with_state(|st| st.counter_slow(None, track, sample, ts));
    }

    /// The track's uuid on the trace.
    pub fn uuid(&self) -> u64 {
        self.uuid
    }
}

/// Names this thread on the trace (by default it carries the std thread name, if any).
pub fn set_thread_name(name: &str) {
    with_state(|st| st.set_thread_name(name));
}

/// Names this thread and gives it a group hint (Tracy's `SetThreadNameWithHint`): the thread's
/// track carries `sibling_order_rank = group` and the trace's root track asks for explicit
/// thread ordering, so readers (trace_processor's `thread_sort_index_hint`, Perfetto's UI) sort
/// threads by group, lower first, threads without a hint at 0. Call it when the thread starts:
/// readers take the rank from the first descriptor of the thread's track in a trace, so a hint
/// given after the thread's first event of a session counts from the next session on.
pub fn set_thread_name_with_hint(name: &str, group: i32) {
    let name = crate::sync::clip(name, crate::sync::MAX_NAME_LEN);
    with_state(|st| {
        st.set_thread_group(group);
        st.set_thread_name(&name);
    });
}

/// What the macros expand to. Not a stable interface.
#[doc(hidden)]
pub mod __rt {
    use super::*;
    use crate::clock;

    /// Events encoded so far by the threads that recorded them (not by the drainer), for the
    /// client bench's account of where encoding ran.
    pub fn owner_encoded() -> u64 {
        state::OWNER_ENCODED.load(std::sync::atomic::Ordering::Relaxed)
    }

    #[inline(always)]
    pub fn zone_begin(cs: &'static Callsite, en: Enabled) -> ZoneGuard {
        ZoneGuard {
            session: {
                debug_assert_eq!(en.id, cs.id());
                memory_zone(cs, state::named_event::<{ encode::TYPE_SLICE_BEGIN }>(cs))
            },
            data: std::cell::Cell::new(0),
            _not_send: PhantomData,
        }
    }

    #[inline(always)]
    pub fn zone_end(session: u32) {
        state::slice_end(session);
    }

    // Always inlined (also in debug builds): with `TACHYON_CALLSTACK` it calls the `_stack`
    // form, whose stack must start in the function the event is in.
    #[inline(always)]
    pub fn zone_begin_with(
        cs: &'static Callsite,
        en: Enabled,
        dyn_name: Option<&str>,
        fill: impl FnOnce(&mut EventContext<'_, '_>),
    ) -> ZoneGuard {
        if crate::callstack::default_depth() != 0 {
            return zone_begin_stack(cs, en, 0, dyn_name, fill);
        }
        let session = with_state(|st| {
            let ts = clock::now();
            st.event(ts, cs, en, encode::TYPE_SLICE_BEGIN, None, dyn_name, fill);
            st.session()
        });
        ZoneGuard {
            session: memory_zone(cs, session.unwrap_or(0)),
            data: std::cell::Cell::new(0),
            _not_send: PhantomData,
        }
    }

    #[inline(always)]
    pub fn instant(cs: &'static Callsite, en: Enabled) {
        debug_assert_eq!(en.id, cs.id());
        state::named_event::<{ encode::TYPE_INSTANT }>(cs);
    }

    // Always inlined (also in debug builds): with `TACHYON_CALLSTACK` it calls the `_stack`
    // form, whose stack must start in the function the event is in.
    #[inline(always)]
    pub fn instant_with(
        cs: &'static Callsite,
        en: Enabled,
        track: Option<&Track>,
        dyn_name: Option<&str>,
        fill: impl FnOnce(&mut EventContext<'_, '_>),
    ) {
        if crate::callstack::default_depth() != 0 {
            return instant_stack(cs, en, 0, track, dyn_name, fill);
        }
        with_state(|st| {
            let ts = clock::now();
            st.event(
                ts,
                cs,
                en,
                encode::TYPE_INSTANT,
                track.map(Track::as_ref),
                dyn_name,
                fill,
            )
        });
    }

    #[inline]
    pub fn track_begin(
        cs: &'static Callsite,
        en: Enabled,
        track: &Track,
        dyn_name: Option<&str>,
        fill: impl FnOnce(&mut EventContext<'_, '_>),
    ) -> TrackSlice {
        let session = with_state(|st| {
            let ts = clock::now();
            st.event(
                ts,
                cs,
                en,
                encode::TYPE_SLICE_BEGIN,
                Some(track.as_ref()),
                dyn_name,
                fill,
            );
            st.session()
        })
        .unwrap_or(0);
        TrackSlice {
            track: (session != 0).then(|| track.clone()),
            session,
        }
    }

    #[inline(always)]
    pub fn counter(cs: &'static Callsite, en: Enabled, value: CounterSample) {
        with_state(|st| st.counter(cs, en, value));
    }

    /// The depth an event asking for a stack of `depth` frames gets: [`callstack::MAX_DEPTH`]
    /// at most; `usize::MAX` (a bare `callstack` item) means the `TACHYON_CALLSTACK` depth, or
    /// 16 when that is off; 0 means the `TACHYON_CALLSTACK` depth.
    ///
    /// [`callstack::MAX_DEPTH`]: crate::callstack::MAX_DEPTH
    #[inline(always)]
    pub(crate) fn stack_depth(depth: usize) -> usize {
        use crate::callstack::{default_depth, MAX_DEPTH};
        match depth {
            0 => default_depth(),
            usize::MAX if default_depth() == 0 => 16,
            usize::MAX => default_depth(),
            d => d.min(MAX_DEPTH),
        }
    }

    /// Captures the stack of the caller of the `#[inline(never)]` function that calls this
    /// (`inline(always)`, so it adds no frame) and interns it on this thread's sequence.
    #[inline(always)]
    fn stack_iid(depth: usize, ts: u64, st: &mut state::ThreadState, pcs: &[u64]) -> u64 {
        if depth == 0 {
            0
        } else {
            st.intern_callstack(ts, pcs)
        }
    }

    /// A zone whose begin carries the call stack (`zone!(..., callstack)`), `depth` as
    /// `stack_depth` reads it.
    #[inline(never)]
    pub fn zone_begin_stack(
        cs: &'static Callsite,
        en: Enabled,
        depth: usize,
        dyn_name: Option<&str>,
        fill: impl FnOnce(&mut EventContext<'_, '_>),
    ) -> ZoneGuard {
        let depth = stack_depth(depth);
        let mut pcs = [0u64; crate::callstack::MAX_DEPTH];
        // Skips this function's frame: the first is the function the zone is in.
        let n = crate::callstack::capture(&mut pcs[..depth], 1);
        let session = with_state(|st| {
            let ts = clock::now();
            let iid = stack_iid(depth, ts, st, &pcs[..n]);
            st.event(
                ts,
                cs,
                en,
                encode::TYPE_SLICE_BEGIN,
                None,
                dyn_name,
                |cx: &mut EventContext<'_, '_>| {
                    cx.callstack_iid(iid);
                    fill(cx);
                },
            );
            st.session()
        });
        ZoneGuard {
            session: memory_zone(cs, session.unwrap_or(0)),
            data: std::cell::Cell::new(0),
            _not_send: PhantomData,
        }
    }

    /// An instant carrying the call stack (`instant!(..., callstack)`), on `track` or this
    /// thread's.
    #[inline(never)]
    pub fn instant_stack(
        cs: &'static Callsite,
        en: Enabled,
        depth: usize,
        track: Option<&Track>,
        dyn_name: Option<&str>,
        fill: impl FnOnce(&mut EventContext<'_, '_>),
    ) {
        let depth = stack_depth(depth);
        let mut pcs = [0u64; crate::callstack::MAX_DEPTH];
        let n = crate::callstack::capture(&mut pcs[..depth], 1);
        with_state(|st| {
            let ts = clock::now();
            let iid = stack_iid(depth, ts, st, &pcs[..n]);
            st.event(
                ts,
                cs,
                en,
                encode::TYPE_INSTANT,
                track.map(Track::as_ref),
                dyn_name,
                |cx: &mut EventContext<'_, '_>| {
                    cx.callstack_iid(iid);
                    fill(cx);
                },
            )
        });
    }

    /// `AsRef<str>` for dynamic names of any string type.
    #[inline(always)]
    pub fn dyn_name<S: AsRef<str> + ?Sized>(s: &S) -> &str {
        s.as_ref()
    }
}

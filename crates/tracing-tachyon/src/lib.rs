//! A [`tracing_subscriber::Layer`] that records `tracing`'s spans and events in Tachyon's trace
//! (Perfetto track events): a program already instrumented with `tracing` (or with `log`, through
//! `tracing-log`) gets Tachyon traces without changing a line.
//!
//! ```
//! use tracing_subscriber::layer::SubscriberExt;
//!
//! tachyon::start(tachyon::Config::in_memory())?; // or `tachyon::init()` from the environment
//! let subscriber = tracing_subscriber::registry().with(tracing_tachyon::TachyonLayer::new());
//! tracing::subscriber::with_default(subscriber, || {
//!     let span = tracing::info_span!("load", path = "scene.bin", bytes = 4096u64);
//!     let _entered = span.enter();
//!     tracing::info!(textures = 12, "scene loaded");
//! });
//! let report = tachyon::shutdown()?.expect("a session ran");
//! assert!(!report.trace.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! What becomes what:
//!
//! - A span is a zone on the track of the thread that enters it: one slice per entry
//!   ([`SpanMode::PerEntry`], the default; an async task polled on several threads leaves a slice
//!   on each, per poll), or one slice on an async track of its own from creation to close
//!   ([`SpanMode::AsyncTrack`]). Its fields are the slice's arguments, typed (integers, floats,
//!   bools, strings; `Debug` values as strings); its name, target and `file:line` are interned
//!   once per sequence as the event name, category and source location. A value recorded
//!   (`Span::record`) while an entry is open shows on the span's later entries.
//! - An event is an instant on the thread's track, named after the event, its fields and level
//!   as arguments. A log-style event, one whose only field is its message
//!   (`tracing::info!("text")`), and every `log` record through `tracing-log`, is a log message
//!   (TrackEvent `log_message`, as `tachyon::message!` writes: `android_logs` in the trace
//!   processors, the UI's log panel): an instant named after its level, the text as its body,
//!   the level as its priority, its category the event's target (the `log` record's), its
//!   source location the callsite's (the record's) file and line. An event with a message and
//!   other fields stays an instant with typed arguments, so that no field is lost.
//! - `follows_from(a, b)` is a flow: it starts at an instant `follows_from` recorded then (inside
//!   `b`'s slice when `b` is the span entered on that thread, on `b`'s track in async-track
//!   mode) and ends at `a`'s next slice.
//! - A span's target is its category: Tachyon's category filter (`TACHYON_CATEGORIES`, a
//!   session's `TrackEventConfig`) applies on top of `tracing`'s own level and target filters.
//!
//! Cost: a span without fields takes no allocation and no lock; its callsite's Tachyon state is
//! found through a per-thread cache keyed by the callsite's `Metadata` address, and its entry
//! and exit go through the same per-thread queue as `tachyon::zone!("name")`. The criterion
//! bench `layer` measures it beside a Layer that does nothing (`cargo bench -p tracing-tachyon
//! --bench layer`).
#![deny(missing_docs)]

mod cache;
mod fields;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tachyon::integration::{self, ZoneSession};
use tachyon::{Callsite, Flow, Track, TrackSlice};
use tracing_core::span::{Attributes, Id, Record};
use tracing_core::{Event, Interest, Metadata, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use fields::{ArgWriter, OwnedFields};

/// How a span is drawn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpanMode {
    /// A slice on the entering thread's track per entry (`enter` to `exit`). Spans entered on
    /// several threads, or entered again and again (async tasks, one entry per poll), leave one
    /// slice per entry, each on the thread that ran it.
    #[default]
    PerEntry,
    /// One slice per span, from its creation to its close, on an async track of its own (a
    /// process-scoped track named after the span). Costs an allocation per span (the track).
    AsyncTrack,
}

/// The Layer. See the crate docs.
#[derive(Clone, Debug, Default)]
pub struct TachyonLayer {
    mode: SpanMode,
    events: bool,
}

impl TachyonLayer {
    /// Spans per entry on the thread's track, events recorded.
    pub fn new() -> Self {
        TachyonLayer {
            mode: SpanMode::PerEntry,
            events: true,
        }
    }

    /// How spans are drawn.
    pub fn with_span_mode(mut self, mode: SpanMode) -> Self {
        self.mode = mode;
        self
    }

    /// Whether events are recorded (on by default).
    pub fn with_events(mut self, on: bool) -> Self {
        self.events = on;
        self
    }
}

impl TachyonLayer {
    /// A span with something to keep in its extensions (fields, an async track): out of line,
    /// so that the hot case's frame stays small.
    #[inline(never)]
    fn new_span_kept<S>(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let meta = attrs.metadata();
        match self.mode {
            SpanMode::PerEntry => {
                let mut fields = OwnedFields::default();
                attrs.record(&mut fields);
                if let Some(span) = ctx.span(id) {
                    span.extensions_mut().insert(SpanData {
                        fields,
                        ..SpanData::default()
                    });
                }
            }
            SpanMode::AsyncTrack => {
                let cs = cache::callsite(meta);
                let mut data = SpanData::default();
                if let Some(en) = cs.check() {
                    let track = Track::new_async(meta.name());
                    let slice = integration::track_begin(cs, en, &track, |cx| {
                        attrs.record(&mut ArgWriter::new(cx));
                    });
                    data.track = Some((track, slice));
                } else if meta.fields().is_empty() {
                    return;
                }
                attrs.record(&mut data.fields);
                if let Some(span) = ctx.span(id) {
                    span.extensions_mut().insert(data);
                }
            }
        }
    }
}

/// Flows that end at a span's next slice (`follows_from`), by span id; rare, so kept out of
/// the spans' extensions: an entry of a span without fields then needs no extensions lock,
/// only the relaxed load of [`PENDING`].
static INCOMING: Mutex<Option<HashMap<u64, Vec<Flow>>>> = Mutex::new(None);
/// Entries in [`INCOMING`].
static PENDING: AtomicUsize = AtomicUsize::new(0);

fn incoming() -> MutexGuard<'static, Option<HashMap<u64, Vec<Flow>>>> {
    INCOMING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes the flows waiting for span `id`'s next slice.
#[inline]
fn take_incoming(id: u64) -> Vec<Flow> {
    if PENDING.load(Ordering::Relaxed) == 0 {
        return Vec::new();
    }
    take_incoming_slow(id)
}

#[cold]
fn take_incoming_slow(id: u64) -> Vec<Flow> {
    let mut map = incoming();
    match map.as_mut().and_then(|m| m.remove(&id)) {
        Some(flows) => {
            PENDING.fetch_sub(1, Ordering::Relaxed);
            flows
        }
        None => Vec::new(),
    }
}

/// Entries of the per-thread entered stack kept inline (no heap line to touch per entry or
/// exit); deeper nesting continues in [`DEEP`].
const INLINE_DEPTH: usize = 32;

/// The Layer's per-thread state, one thread-local without a destructor (no lazy registration
/// to test on each access).
struct Local {
    /// The span last created on this thread and its Tachyon callsite, until its first entry:
    /// the common `span!(...).entered()` / `#[instrument]` case then enters without looking
    /// the span up in the registry. Taken on use, so it only ever names a span created here
    /// and not entered yet; the `Registry`'s ids carry a generation, so another span cannot
    /// have this id while that one lives, one created later on this thread replaces the memo,
    /// and a close on this thread clears it (a span closed on another thread before its first
    /// entry leaves it, which matters only if its id comes back with the same generation).
    created: Cell<(u64, Option<&'static Callsite>)>,
    /// How many spans are entered on this thread and not exited yet.
    depth: Cell<usize>,
    /// The first [`INLINE_DEPTH`] of them, innermost last.
    stack: [Entered; INLINE_DEPTH],
}

/// An entered span on [`Local`]'s stack: its id, and the session its slice went to (0: not
/// recorded). Two cells: the hot entry pushes the id before its slice begins and stores the
/// session after, so that nothing of the entry has to be kept across the begin.
struct Entered {
    id: Cell<u64>,
    session: Cell<ZoneSession>,
}

impl Entered {
    fn get(&self) -> (u64, ZoneSession) {
        (self.id.get(), self.session.get())
    }

    fn set(&self, (id, session): (u64, ZoneSession)) {
        self.id.set(id);
        self.session.set(session);
    }
}

thread_local! {
    static LOCAL: Local = const {
        Local {
            created: Cell::new((0, None)),
            depth: Cell::new(0),
            stack: [const {
                Entered {
                    id: Cell::new(0),
                    session: Cell::new(0),
                }
            }; INLINE_DEPTH],
        }
    };
    /// The entered spans beyond [`INLINE_DEPTH`] (`DEEP[i]` is entry `INLINE_DEPTH + i`).
    static DEEP: RefCell<Vec<(u64, ZoneSession)>> = const { RefCell::new(Vec::new()) };
}

impl Local {
    /// The hot entry's test: span `raw` is the one [`created`](Self::created) names, no flow
    /// waits for any span, and the entry fits inline. Then the memo is taken, the entry pushed
    /// without a session (its slice begins next: [`set_top_session`](Self::set_top_session))
    /// and the span's callsite returned; otherwise nothing changes and the caller takes
    /// [`enter_slow`].
    #[inline(always)]
    fn take_created(&self, raw: u64) -> Option<&'static Callsite> {
        let d = self.depth.get();
        match (self.created.get(), self.stack.get(d)) {
            ((created, Some(cs)), Some(top))
                if created == raw && PENDING.load(Ordering::Relaxed) == 0 =>
            {
                self.created.set((0, None));
                top.set((raw, 0));
                self.depth.set(d + 1);
                Some(cs)
            }
            _ => None,
        }
    }

    /// Takes the memo if it names span `raw`: its callsite (the memo is empty after).
    fn take_memo(&self, raw: u64) -> Option<&'static Callsite> {
        match self.created.get() {
            (i, Some(cs)) if i == raw => {
                self.created.set((0, None));
                Some(cs)
            }
            _ => None,
        }
    }

    /// The session of the innermost entry's slice, once it has begun.
    #[inline(always)]
    fn set_top_session(&self, session: ZoneSession) {
        if let Some(top) = self.stack.get(self.depth.get().wrapping_sub(1)) {
            top.session.set(session);
        }
    }

    fn get(&self, i: usize) -> (u64, ZoneSession) {
        match self.stack.get(i) {
            Some(c) => c.get(),
            // `try_with`: `DEEP` has a destructor, and a span may exit during thread teardown;
            // an entry lost then reads as unrecorded.
            None => DEEP
                .try_with(|d| d.borrow().get(i - INLINE_DEPTH).copied())
                .ok()
                .flatten()
                .unwrap_or((0, 0)),
        }
    }

    fn set(&self, i: usize, v: (u64, ZoneSession)) {
        match self.stack.get(i) {
            Some(c) => c.set(v),
            None => {
                let _ = DEEP.try_with(|d| {
                    let mut d = d.borrow_mut();
                    let k = i - INLINE_DEPTH;
                    match d.get_mut(k) {
                        Some(slot) => *slot = v,
                        None => d.push(v),
                    }
                });
            }
        }
    }

    /// Pushes an entry.
    #[inline]
    fn push(&self, v: (u64, ZoneSession)) {
        let d = self.depth.get();
        match self.stack.get(d) {
            Some(c) => c.set(v),
            None => self.set(d, v),
        }
        self.depth.set(d + 1);
    }

    /// Removes the innermost entry of span `id`: its session (0 when it has none).
    #[inline]
    fn pop(&self, id: u64) -> ZoneSession {
        let d = self.depth.get();
        // With nothing entered, `d - 1` wraps past the stack: `remove_slow` answers 0.
        if let Some(top) = self.stack.get(d.wrapping_sub(1)) {
            if top.id.get() == id {
                self.depth.set(d - 1);
                return top.session.get();
            }
        }
        self.remove_slow(id)
    }

    /// An exit out of order (guards dropped out of order), or one beyond the inline entries:
    /// the slice that ends is the innermost open one on the track, as the trace format nests
    /// them.
    #[cold]
    fn remove_slow(&self, id: u64) -> ZoneSession {
        let d = self.depth.get();
        let Some(k) = (0..d).rev().find(|&i| self.get(i).0 == id) else {
            return 0;
        };
        let session = self.get(k).1;
        for i in k..d - 1 {
            self.set(i, self.get(i + 1));
        }
        if d > INLINE_DEPTH {
            let _ = DEEP.try_with(|v| v.borrow_mut().truncate(d - 1 - INLINE_DEPTH));
        }
        self.depth.set(d - 1);
        session
    }
}

/// What the Layer keeps in a span's extensions (only spans with fields, flows or async
/// tracks have one).
#[derive(Debug, Default)]
struct SpanData {
    fields: OwnedFields,
    /// Async-track mode: the span's track and its open slice.
    track: Option<(Track, TrackSlice)>,
}

impl<S> tracing_subscriber::Layer<S> for TachyonLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        // Builds the Tachyon callsite now, so the hot path's cache misses find it.
        cache::callsite(meta);
        Interest::always()
    }

    #[inline(always)]
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let meta = attrs.metadata();
        if self.mode == SpanMode::PerEntry && meta.fields().is_empty() {
            // The hot case: nothing to keep; the callsite for the first entry.
            let cs = cache::callsite(meta);
            LOCAL.with(|l| l.created.set((id.into_u64(), Some(cs))));
            return;
        }
        self.new_span_kept(attrs, id, ctx);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            let mut ext = span.extensions_mut();
            match ext.get_mut::<SpanData>() {
                Some(data) => values.record(&mut data.fields),
                None => {
                    let mut data = SpanData::default();
                    values.record(&mut data.fields);
                    ext.insert(data);
                }
            }
        }
    }

    fn on_follows_from(&self, id: &Id, follows: &Id, ctx: Context<'_, S>) {
        let (Some(span), Some(cause)) = (ctx.span(id), ctx.span(follows)) else {
            return;
        };
        let cs = cache::follows_from_callsite();
        let Some(en) = cs.check() else { return };
        let flow = Flow::new();
        // The start: an instant now, on the cause's track (async mode) or this thread's.
        {
            let ext = cause.extensions();
            let track = ext.get::<SpanData>().and_then(|d| d.track.as_ref());
            integration::instant(cs, en, track.map(|(t, _)| t), None, |cx| cx.flow(flow));
        }
        let mut ext = span.extensions_mut();
        if let Some((track, _)) = ext.get_mut::<SpanData>().and_then(|d| d.track.as_ref()) {
            // Async mode: the span's slice is already open; the arrow ends on its track now.
            integration::instant(cs, en, Some(track), None, |cx| cx.terminating_flow(flow));
            return;
        }
        drop(ext);
        let mut map = incoming();
        let flows = map
            .get_or_insert_with(HashMap::new)
            .entry(id.into_u64())
            .or_default();
        if flows.is_empty() {
            PENDING.fetch_add(1, Ordering::Relaxed);
        }
        flows.push(flow);
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if self.events {
            fields::record_event(event);
        }
    }

    #[inline(always)]
    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if self.mode != SpanMode::PerEntry {
            return;
        }
        let raw = id.into_u64();
        // Created here without fields and not entered yet, no flow waiting for any span: no
        // lookup needed; anything else is out of line.
        let Some(cs) = LOCAL.with(|l| l.take_created(raw)) else {
            return enter_slow(id, ctx);
        };
        if let Some(en) = cs.check() {
            let session = integration::zone_begin(cs, en);
            LOCAL.with(|l| l.set_top_session(session));
        }
    }

    #[inline(always)]
    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        if self.mode != SpanMode::PerEntry {
            return;
        }
        let session = LOCAL.with(|l| l.pop(id.into_u64()));
        integration::zone_end(session);
    }

    #[inline(always)]
    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let raw = id.into_u64();
        // Flows to a span that is never entered again end nowhere; the id may be reused.
        if PENDING.load(Ordering::Relaxed) != 0 {
            drop(take_incoming_slow(raw));
        }
        // A span closed before its first entry leaves no memo a later span with its id (the
        // Registry's generation wrapped) could take.
        LOCAL.with(|l| l.take_memo(raw));
        if self.mode == SpanMode::AsyncTrack {
            close_async(&id, ctx);
        }
    }
}

/// Ends an async-track span's slice (out of line: a per-entry span's close is a few loads).
#[inline(never)]
fn close_async<S>(id: &Id, ctx: Context<'_, S>)
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    if let Some(span) = ctx.span(id) {
        // Dropping the slice ends it, on this thread's clock.
        span.extensions_mut().remove::<SpanData>();
    }
}

/// An entry [`Local::take_created`] does not take: a span created elsewhere or entered
/// before, flows waiting, or nesting beyond the inline entries.
#[inline(never)]
fn enter_slow<S>(id: &Id, ctx: Context<'_, S>)
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let raw = id.into_u64();
    let memo = LOCAL.with(|l| l.take_memo(raw));
    let session = match memo {
        Some(cs) if PENDING.load(Ordering::Relaxed) == 0 => match cs.check() {
            Some(en) => integration::zone_begin(cs, en),
            None => 0,
        },
        _ => enter_looked_up(id, ctx),
    };
    LOCAL.with(|l| l.push((raw, session)));
}

/// Begins the slice of one entry of span `id` found in the registry, ending the flows that wait
/// for it (out of line: the memo in [`Local`] spares the common entry this lookup).
#[inline(never)]
fn enter_looked_up<S>(id: &Id, ctx: Context<'_, S>) -> ZoneSession
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let incoming = take_incoming(id.into_u64());
    match ctx.span(id) {
        Some(span) => begin_entry(&span, incoming),
        None => 0,
    }
}

/// Begins the slice of one entry of `span` on this thread, ending the flows in `incoming`: the
/// queued path when the span has neither fields nor flows.
#[inline]
fn begin_entry<'a, R: tracing_subscriber::registry::SpanData<'a>>(
    span: &tracing_subscriber::registry::SpanRef<'a, impl LookupSpan<'a, Data = R>>,
    incoming: Vec<Flow>,
) -> ZoneSession {
    let meta = span.metadata();
    let cs = cache::callsite(meta);
    let Some(en) = cs.check() else { return 0 };
    if meta.fields().is_empty() && incoming.is_empty() {
        return integration::zone_begin(cs, en);
    }
    let ext = span.extensions();
    let fields = ext.get::<SpanData>().map(|d| &d.fields);
    integration::zone_begin_with(cs, en, |cx| {
        if let Some(fields) = fields {
            fields.write(cx);
        }
        for f in incoming {
            cx.terminating_flow(f);
        }
    })
}

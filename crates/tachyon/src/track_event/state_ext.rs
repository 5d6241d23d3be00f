//! The thread state's side of locks, frames, log messages, plots and per-zone data
//! (`sync.rs`, `frame.rs`, `message.rs`, `plot.rs`, `zone_data.rs`). A child module of
//! `state.rs`, so it uses the state's fields and its general path (`sync`, `write_timed`)
//! without widening their visibility.
//!
//! Lock holds are the one hot event here: an uncontended hold queues a single 16-byte record
//! when it ends (half a zone's two), its word carrying how long it lasted in counter ticks and
//! the record's own reading when it ended. A hold that waited had its begin written when it
//! obtained the lock; its end queues a record carrying the session of that begin. The record's
//! word has its two low bits clear (the event types `state.rs` uses are 1–3), then the
//! operation, the lock's index, then the duration or the session:
//!
//! ```text
//!  63                     32 31          5 4   2 1  0
//!  [ ticks held | session  ][ lock index  ][ op ][ 00 ]
//! ```
//!
//! The drainer encodes a hold as a zone's two packets are encoded: from a [`LockTemplate`],
//! the packets' fixed bytes made once per lock, kind of hold and generation of the sequence,
//! each followed by its timestamp's delta, written by the writer's run path
//! ([`TraceWriter::write_event_run`](crate::writer::TraceWriter)) for a run of lock records.
//! The begin's delta is from the sequence's last packet (the hold began after it when this
//! thread queued nothing while holding the lock), the end's from the begin. Both packets fit
//! the fast path's 24 bytes because their interned ids are small: the hold's name (the holding
//! thread's) and its category `tachyon.lock` take the lock callsite's static id on each
//! sequence, and a lock's track uuid has 49 bits (a 7-byte varint):
//!
//! ```text
//!  len │ 5a <n>              track_event (11) {
//!      │   48 01               type (9) = SLICE_BEGIN   (SLICE_END: 48 02)
//!      │   58 <uuid>           track_uuid (11)
//!      │   18 <iid>            category_iids (3)        (begins only)
//!      │   50 <iid>            name_iid (10)            (begins only)
//!      │                     }
//!      │ 68 02               sequence_flags (13) = SEQ_NEEDS_INCREMENTAL_STATE
//!      │ 40 <delta>          timestamp (8), on the sequence's incremental clock
//! ```
//!
//! A hold that began before the sequence's last packet (this thread wrote zones while holding
//! the lock) has its begin stamped with its absolute time on the trace clock instead; the
//! first hold of each lock and kind in a generation goes through the general path, which
//! interns the names and carries the argument `lock_id`, and makes the template.

use std::ptr;

use protozero::wire::{encode_varint, make_tag, WireType};
use tachyon_protos::{
    counter_descriptor, track_descriptor, track_event, InternedData, TracePacket, TrackEvent,
};

use super::{fast_window_delta, push, push_at, with_state, ThreadState};
use crate::clock::{self, TRACE_CLOCK_ID};
use crate::track_event::callsite::{Callsite, Enabled};
use crate::track_event::encode::{self, CounterSample, Template, SEQ_NEEDS_INCREMENTAL_STATE};
use crate::track_event::global::{self, session_of};
use crate::track_event::queue::Record;

/// The hasher of the lock templates' map: its keys are small distinct integers, one
/// multiplication spreads them (SipHash would cost more than the rest of a replay).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// [`IdHasher`]'s builder.
pub(crate) type IdHash = std::hash::BuildHasherDefault<IdHasher>;

/// A field's tag, for fields below 16 (a one-byte tag).
fn tag(field: u32, wire: WireType) -> u8 {
    debug_assert!(field < 16, "field {field} has a longer tag");
    make_tag(field, wire) as u8
}

/// Lock indices stay below this (27 bits of the record word); later locks are not traced.
pub(crate) const MAX_LOCK_INDEX: u32 = 1 << 27;

/// What a lock record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum LockOp {
    /// An exclusive hold begins (the holder obtained the lock).
    Hold = 0,
    /// A shared (read) hold begins.
    HoldShared = 1,
    /// An exclusive hold ends (the holder is about to release the lock).
    Release = 2,
    /// A shared hold ends.
    ReleaseShared = 3,
    /// A whole exclusive hold that did not wait (the word carries its duration).
    Complete = 4,
    /// A whole shared hold that did not wait.
    CompleteShared = 5,
}

impl LockOp {
    fn from_bits(b: u64) -> Option<LockOp> {
        Some(match b {
            0 => LockOp::Hold,
            1 => LockOp::HoldShared,
            2 => LockOp::Release,
            3 => LockOp::ReleaseShared,
            4 => LockOp::Complete,
            5 => LockOp::CompleteShared,
            _ => return None,
        })
    }

    fn shared(self) -> bool {
        matches!(
            self,
            LockOp::HoldShared | LockOp::ReleaseShared | LockOp::CompleteShared
        )
    }

    /// The begin and the end of a hold, shared or not.
    fn pair(shared: bool) -> (LockOp, LockOp) {
        if shared {
            (LockOp::HoldShared, LockOp::ReleaseShared)
        } else {
            (LockOp::Hold, LockOp::Release)
        }
    }

    fn is_begin(self) -> bool {
        matches!(self, LockOp::Hold | LockOp::HoldShared)
    }
}

/// A template's [`EVENT_PREFIX`](encode::EVENT_PREFIX) bytes as little-endian words (what
/// the writer's run path takes).
fn words_of(bytes: &[u8; encode::EVENT_PREFIX]) -> [u64; 3] {
    let mut words = [0u64; 3];
    for (w, b) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        *w = u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    }
    words
}

/// A lock packet's template (length in byte 0, the packet's bytes up to its timestamp's tag)
/// with the varint `v` appended: the packet as a block for
/// [`TraceWriter::write_small_packet`](crate::writer::TraceWriter::write_small_packet). `None`
/// when it does not fit the block.
#[inline]
fn with_varint(template: &[u8], v: u64) -> Option<encode::Block> {
    let n = usize::from(*template.first()?);
    let mut block = [0u8; encode::BLOCK];
    block.get_mut(..=n)?.copy_from_slice(template.get(..=n)?);
    let mut bytes = [0u8; 10];
    let len = encode_varint(v, &mut bytes);
    block
        .get_mut(1 + n..1 + n + len)?
        .copy_from_slice(&bytes[..len]);
    block[0] += len as u8;
    Some(block)
}

/// A begin's template stamped with its absolute time `ts` on the trace clock (the sequence's
/// clock has moved past it): the template without its timestamp's tag, the clock's id, then
/// the timestamp.
fn with_absolute_time(template: &[u8], ts: u64) -> Option<encode::Block> {
    let n = usize::from(*template.first()?);
    let mut head = [0u8; encode::BLOCK];
    // The template up to its flags (its last byte is the timestamp's tag), then field 58 (a
    // two-byte tag), the clock's id, and the timestamp's tag again.
    let body = template.get(1..n)?;
    head.get_mut(1..n)?.copy_from_slice(body);
    let mut at = n;
    let mut put = |v: u64| -> Option<()> {
        let mut b = [0u8; 10];
        let len = encode_varint(v, &mut b);
        head.get_mut(at..at + len)?.copy_from_slice(&b[..len]);
        at += len;
        Some(())
    };
    put(u64::from(make_tag(
        TracePacket::TIMESTAMP_CLOCK_ID_FIELD_NUMBER,
        WireType::Varint,
    )))?;
    put(u64::from(TRACE_CLOCK_ID))?;
    put(u64::from(tag(
        TracePacket::TIMESTAMP_FIELD_NUMBER,
        WireType::Varint,
    )))?;
    head[0] = u8::try_from(at - 1).ok()?;
    with_varint(&head, ts)
}

/// A lock's pre-encoded packets on one thread's sequence, for one kind of hold (exclusive or
/// shared: a shared hold's track is the thread's own under the lock's), valid in one
/// generation: what [`ThreadState::replay_lock_run`] writes a hold from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LockTemplate {
    generation: u32,
    /// The hold's begin up to and including the timestamp's tag, its length in byte 0.
    begin: [u8; LOCK_TEMPLATE],
    /// The hold's end, likewise (at most 19 bytes, 16 with a 49-bit uuid: it fits the run
    /// path's prefix).
    end: [u8; encode::EVENT_PREFIX],
    /// `begin`'s first [`EVENT_PREFIX`](encode::EVENT_PREFIX) bytes as words, when the whole
    /// template fits them (its interned ids below 2^21): the run path's.
    begin_words: Option<[u64; 3]>,
    end_words: [u64; 3],
}

/// Room for the longest begin template: its length byte, then 2 + 2 + 11 + 11 + 11 + 3 bytes
/// with a 10-byte uuid and 10-byte interning ids (41 bytes; stamped with an absolute time, the
/// clock's 2-byte tag and 5-byte id and a 10-byte timestamp added, 58 bytes: within a block).
const LOCK_TEMPLATE: usize = 48;

/// Lock templates of a thread, by [`lock_template_key`].
pub(crate) type LockTemplates = std::collections::HashMap<u64, LockTemplate, IdHash>;

/// The key of a lock's templates: its index and the kind of hold.
#[inline(always)]
fn lock_template_key(index: u32, shared: bool) -> u64 {
    (u64::from(index) << 1) | u64::from(shared)
}

/// The record word of a lock event (see the module docs): `high` is the session of a
/// release, the duration of a complete hold.
#[inline(always)]
fn lock_word(high: u32, index: u32, op: LockOp) -> *const u8 {
    let w = (u64::from(high) << 32) | (u64::from(index) << 5) | ((op as u64) << 2);
    ptr::without_provenance(w as usize)
}

/// A hold of lock `index` from counter reading `since` to `end` (the holder did not wait;
/// `end` was read before the unlock, with nothing queued by this thread since): one record,
/// stamped `end`. A hold longer than the word can say (2^32 ticks, over a second) is written
/// at once instead.
#[inline(always)]
pub(crate) fn lock_hold_complete(index: u32, shared: bool, since: u64, end: u64) {
    let op = if shared {
        LockOp::CompleteShared
    } else {
        LockOp::Complete
    };
    let pushed = u32::try_from(end.wrapping_sub(since))
        .ok()
        .and_then(|held| push_at(lock_word(held, index, op), end));
    if pushed.is_none() {
        lock_complete_cold(index, shared, since, end, None);
    }
}

/// A whole hold from counter reading `since` to `end` through the general path, now (the
/// queue is closed or full, the hold was long, or `flow_out` leaves it for a waiter).
#[cold]
#[inline(never)]
pub(crate) fn lock_complete_cold(
    index: u32,
    shared: bool,
    since: u64,
    end: u64,
    flow_out: Option<u64>,
) {
    let c = clock::clock();
    let (begin, end) = (c.ticks_to_ns(since), c.ticks_to_ns(end));
    with_state(|st| match flow_out {
        // The queue was full (encoded now, by `with_state`) or closed: the hold as the drainer
        // writes it, from the lock's templates when it can.
        None => st.replay_lock_complete(index, shared, begin, end),
        Some(_) => {
            st.lock_complete(begin, end, shared, index, flow_out);
        }
    });
}

/// The hold of lock `index` begun in `session` ends now.
#[inline(always)]
pub(crate) fn lock_release(session: u32, index: u32, shared: bool) {
    let op = if shared {
        LockOp::ReleaseShared
    } else {
        LockOp::Release
    };
    if push(lock_word(session, index, op)).is_none() {
        lock_release_cold(index, op, session);
    }
}

#[cold]
#[inline(never)]
fn lock_release_cold(index: u32, op: LockOp, session: u32) {
    let ts = clock::now();
    with_state(|st| st.lock_event(ts.into(), op, index, session, None));
}

/// The hold of lock `index` ends now, and a flow leaves it (a thread waits for the lock).
#[cold]
#[inline(never)]
pub(crate) fn lock_release_with_flow(session: u32, index: u32, shared: bool, flow: u64) {
    let op = if shared {
        LockOp::ReleaseShared
    } else {
        LockOp::Release
    };
    let ts = clock::now();
    with_state(|st| st.lock_event(ts.into(), op, index, session, Some(flow)));
}

/// This thread waited for lock `index` from `waited_from` to `obtained` and holds it now: the
/// wait slice on the thread's track (ending `flow_in` if a releaser left one), then the hold.
/// The session the hold was recorded in (0: none).
#[cold]
#[inline(never)]
pub(crate) fn lock_contended(
    index: u32,
    shared: bool,
    waited_from: u64,
    obtained: u64,
    flow_in: Option<u64>,
) -> u32 {
    with_state(|st| {
        // At the wait's start: a generation that starts here (the thread's first event in the
        // session) must not be later than the wait's begin, which timed packets never precede.
        if !st.sync(waited_from) {
            return 0;
        }
        st.lock_wait(index, waited_from, obtained, flow_in);
        let op = if shared {
            LockOp::HoldShared
        } else {
            LockOp::Hold
        };
        if st.lock_event(obtained.into(), op, index, 0, None) {
            st.session()
        } else {
            0
        }
    })
    .unwrap_or(0)
}

/// The templates of a hold on `track` in generation `generation` (see the module docs):
/// `None` if a begin would not fit [`LOCK_TEMPLATE`] (it always does).
fn lock_template(generation: u32, track: u64, name_iid: u64, cat_iid: u64) -> Option<LockTemplate> {
    let varint = |buf: &mut Vec<u8>, v: u64| {
        let mut b = [0u8; 10];
        let n = encode_varint(v, &mut b);
        buf.extend_from_slice(&b[..n]);
    };
    let event = |begin: bool| {
        let mut ev: Vec<u8> = Vec::with_capacity(32);
        ev.push(tag(TrackEvent::TYPE_FIELD_NUMBER, WireType::Varint));
        ev.push(if begin {
            track_event::Type::SliceBegin as u8
        } else {
            track_event::Type::SliceEnd as u8
        });
        ev.push(tag(TrackEvent::TRACK_UUID_FIELD_NUMBER, WireType::Varint));
        varint(&mut ev, track);
        if begin {
            ev.push(tag(
                TrackEvent::CATEGORY_IIDS_FIELD_NUMBER,
                WireType::Varint,
            ));
            varint(&mut ev, cat_iid);
            ev.push(tag(TrackEvent::NAME_IID_FIELD_NUMBER, WireType::Varint));
            varint(&mut ev, name_iid);
        }
        let mut packet = vec![
            0,
            tag(
                TracePacket::TRACK_EVENT_FIELD_NUMBER,
                WireType::LengthDelimited,
            ),
            ev.len() as u8,
        ];
        packet.extend_from_slice(&ev);
        packet.extend_from_slice(&[
            tag(TracePacket::SEQUENCE_FLAGS_FIELD_NUMBER, WireType::Varint),
            SEQ_NEEDS_INCREMENTAL_STATE,
            tag(TracePacket::TIMESTAMP_FIELD_NUMBER, WireType::Varint),
        ]);
        packet[0] = (packet.len() - 1) as u8;
        packet
    };
    let (b, e) = (event(true), event(false));
    let mut begin = [0u8; LOCK_TEMPLATE];
    begin.get_mut(..b.len())?.copy_from_slice(&b);
    let mut end = [0u8; encode::EVENT_PREFIX];
    end.get_mut(..e.len())?.copy_from_slice(&e);
    let begin_words = (b.len() <= encode::EVENT_PREFIX).then(|| {
        let mut p = [0u8; encode::EVENT_PREFIX];
        p.copy_from_slice(&begin[..encode::EVENT_PREFIX]);
        words_of(&p)
    });
    Some(LockTemplate {
        generation,
        begin,
        end,
        begin_words,
        end_words: words_of(&end),
    })
}

/// Prefixes of the interning keys of categories, argument names and event names.
const KEY_CATEGORY: &str = "c";
const KEY_ARG_NAME: &str = "a";
const KEY_NAME: &str = "n";
/// Marks (in `ext_keys`) that a holder's name took the lock callsite's id in a generation.
const KEY_HOLDER_ID_TAKEN: &str = "h";

/// Category of lock holds and waits.
pub(crate) const CAT_LOCK: &str = "tachyon.lock";
/// Category of frames.
pub(crate) const CAT_FRAME: &str = "tachyon.frame";
/// Category of log messages.
pub(crate) const CAT_LOG: &str = "tachyon.log";
/// Category of the program's information.
pub(crate) const CAT_APP_INFO: &str = "tachyon.app_info";

/// When an event written through the general path happened.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stamp {
    /// In order with the sequence (a delta on the incremental clock; never before the
    /// sequence's latest packet).
    Sequence(u64),
    /// Earlier than packets the sequence has already: stamped with its absolute time on the
    /// trace clock (the sequence's clock stays where it is).
    Absolute(u64),
}

impl Stamp {
    fn time(self) -> u64 {
        match self {
            Stamp::Sequence(t) | Stamp::Absolute(t) => t,
        }
    }
}

impl From<u64> for Stamp {
    fn from(ts: u64) -> Stamp {
        Stamp::Sequence(ts)
    }
}

/// A value of an argument added to an event.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ArgVal {
    Str(String),
    Uint(u64),
}

/// A track of this process that the caller describes (a lock, a frame set, a plot).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OwnTrack<'a> {
    pub(crate) uuid: u64,
    pub(crate) name: &'a str,
    /// `None`: the process's track.
    pub(crate) parent: Option<u64>,
    /// A counter track: (display kind, incremental).
    pub(crate) counter: Option<(super::super::plot::PlotKind, bool)>,
    /// Never merged with siblings of the same name (per-thread shared-hold tracks).
    pub(crate) no_merge: bool,
}

impl ThreadState {
    /// The interning id of `key` in this generation, and whether it is new (the caller emits
    /// it then). Ids come from the dynamic names' counter, so they never collide with theirs.
    fn intern_key(&mut self, key: &str) -> (u64, bool) {
        let generation = self.generation;
        if let Some(&(iid, g)) = self.ext_keys.get(key) {
            if g == generation {
                return (iid, false);
            }
        }
        let iid = self.next_dyn_iid;
        self.next_dyn_iid += 1;
        self.ext_keys.insert(key.into(), (iid, generation));
        (iid, true)
    }

    /// As [`intern_key`](Self::intern_key), but a key new in this generation takes
    /// `preferred` as its id when given (the caller makes sure no other key of its kind has
    /// it in this generation).
    fn intern_key_as(&mut self, key: &str, preferred: Option<u64>) -> (u64, bool) {
        let Some(iid) = preferred else {
            return self.intern_key(key);
        };
        let generation = self.generation;
        if let Some(&(old, g)) = self.ext_keys.get(key) {
            if g == generation {
                return (old, false);
            }
        }
        self.ext_keys.insert(key.into(), (iid, generation));
        (iid, true)
    }

    /// The category's interning id. `tachyon.lock` takes the lock callsite's static id (short:
    /// a hold's begin then fits the drainer's fast path); that callsite never writes an event,
    /// so its id names no other category on the sequence.
    fn intern_category(&mut self, cat: &str) -> (u64, bool) {
        let key = format!("{KEY_CATEGORY}{cat}");
        let preferred = (cat == CAT_LOCK)
            .then(crate::sync::lock_callsite_id)
            .flatten();
        self.intern_key_as(&key, preferred)
    }

    /// The interning id of the name lock holds of this thread carry (its thread's name): the
    /// lock callsite's static id, the first time in a generation (a renamed thread's next
    /// name takes a dynamic id: an id names one string per generation).
    fn intern_holder_name(&mut self, name: &str) -> (u64, bool) {
        let key = format!("{KEY_NAME}{name}");
        let generation = self.generation;
        let free = self
            .ext_keys
            .get(KEY_HOLDER_ID_TAKEN)
            .is_none_or(|&(_, g)| g != generation);
        let preferred = crate::sync::lock_callsite_id().filter(|_| free);
        let (iid, new) = self.intern_key_as(&key, preferred);
        if new && Some(iid) == preferred {
            self.ext_keys
                .insert(KEY_HOLDER_ID_TAKEN.into(), (iid, generation));
        }
        (iid, new)
    }

    fn intern_arg_name(&mut self, name: &str) -> (u64, bool) {
        let key = format!("{KEY_ARG_NAME}{name}");
        self.intern_key(&key)
    }

    /// The name this thread's events carry on other tracks (lock holds).
    fn holder_name(&self) -> String {
        match &self.thread_name {
            Some(n) => format!("{n} ({})", self.tid),
            None => format!("thread {}", self.tid),
        }
    }

    /// Emits `track`'s descriptor once per generation (after its parent's, which the caller
    /// ensured).
    fn ensure_own_track(&mut self, track: OwnTrack<'_>, ts: u64) {
        if self.tracks_seen.get(&track.uuid) == Some(&self.generation) {
            return;
        }
        if !self.room_for_descriptor(160 + track.name.len()) {
            return;
        }
        let parent = track.parent.unwrap_or(global::process().uuid);
        self.write_descriptor(ts, |d| {
            d.set_uuid(track.uuid);
            d.set_name(track.name);
            d.set_parent_uuid(parent);
            if track.no_merge {
                d.set_sibling_merge_behavior(track_descriptor::SiblingMergeBehavior::None);
            }
            if let Some((kind, incremental)) = track.counter {
                let mut c = d.set_counter();
                match kind {
                    super::super::plot::PlotKind::Number => {}
                    super::super::plot::PlotKind::Bytes => {
                        c.set_unit(counter_descriptor::Unit::SizeBytes)
                    }
                    super::super::plot::PlotKind::Percentage => c.set_unit_name("%"),
                }
                if incremental {
                    c.set_is_incremental(true);
                }
            }
        });
        self.tracks_seen.insert(track.uuid, self.generation);
    }

    /// One track event at `ts` with its interned data: `name` (interned as a dynamic name),
    /// `category` (interned), `args` (names interned), then what `fill` adds.
    #[allow(clippy::too_many_arguments)]
    fn own_event(
        &mut self,
        ts: impl Into<Stamp>,
        ty: track_event::Type,
        track: Option<u64>,
        name: Option<&str>,
        category: Option<&str>,
        args: &[(&str, ArgVal)],
        intern_more: impl FnOnce(&mut InternedData<'_>),
        more_interned: bool,
        fill: impl FnOnce(&mut TrackEvent<'_>),
    ) {
        let name_iid = name.map(|n| self.intern_key(&format!("{KEY_NAME}{n}")));
        let cat_iid = category.map(|c| self.intern_category(c));
        let arg_iids: Vec<(u64, bool)> =
            args.iter().map(|(k, _)| self.intern_arg_name(k)).collect();
        let any_new = more_interned
            || name_iid.is_some_and(|n| n.1)
            || cat_iid.is_some_and(|c| c.1)
            || arg_iids.iter().any(|a| a.1);
        let body = |p: &mut TracePacket<'_>| {
            if any_new {
                let mut i = p.set_interned_data();
                if let (Some((iid, true)), Some(n)) = (name_iid, name) {
                    let mut e = i.add_event_names();
                    e.set_iid(iid);
                    e.set_name(n);
                }
                if let (Some((iid, true)), Some(c)) = (cat_iid, category) {
                    let mut e = i.add_event_categories();
                    e.set_iid(iid);
                    e.set_name(c);
                }
                for ((iid, new), (k, _)) in arg_iids.iter().zip(args) {
                    if *new {
                        let mut a = i.add_debug_annotation_names();
                        a.set_iid(*iid);
                        a.set_name(k);
                    }
                }
                intern_more(&mut i);
            }
            let mut e = p.set_track_event();
            if let Some((iid, _)) = cat_iid {
                e.add_category_iids(iid);
            }
            e.set_type(ty);
            if let Some((iid, _)) = name_iid {
                e.set_name_iid(iid);
            }
            if let Some(t) = track {
                e.set_track_uuid(t);
            }
            for ((iid, _), (_, v)) in arg_iids.iter().zip(args) {
                let mut a = e.add_debug_annotations();
                a.set_name_iid(*iid);
                match v {
                    ArgVal::Str(s) => a.set_string_value(s),
                    ArgVal::Uint(u) => a.set_uint_value(*u),
                }
            }
            fill(&mut e);
        };
        match ts.into() {
            Stamp::Sequence(ts) => self.write_timed(ts, body),
            Stamp::Absolute(ts) => {
                if let Some(w) = self.writer.as_mut() {
                    w.write_packet(|p| {
                        p.set_timestamp(ts);
                        p.set_timestamp_clock_id(TRACE_CLOCK_ID);
                        p.set_sequence_flags(u32::from(SEQ_NEEDS_INCREMENTAL_STATE));
                        body(p);
                    });
                }
            }
        }
    }

    // === Locks ===

    /// Encodes the longest prefix of `records` made of lock records whose packets the lock
    /// templates give and the writer's run path takes (as
    /// [`replay_run`](Self::replay_run) does for zones); the number encoded, 0 when the first
    /// record needs [`replay`](Self::replay). A whole hold is two packets, its begin and its
    /// end; the end of a hold that waited, one. Per hold: the template's generation, the
    /// begin no earlier than the sequence's last packet, both deltas within the fast path's
    /// window; the template is looked up once per run of holds of one lock.
    pub(super) fn replay_lock_run(&mut self, records: &[Record]) -> usize {
        // A zone or instant the zone run left (its event type's two bits set) is no hold:
        // `replay` takes it, with none of the run's setup spent on it.
        if records.first().is_none_or(|r| r.word.addr() & 3 != 0) || self.epoch != self.epoch_now()
        {
            return 0;
        }
        let session = session_of(self.epoch);
        let ThreadState {
            ticks,
            last_ts,
            next_snapshot,
            generation,
            ext_templates,
            writer,
            ..
        } = self;
        let Some(w) = writer.as_mut() else {
            return 0;
        };
        let (ticks, next_snapshot, generation) = (*ticks, *next_snapshot, *generation);
        let mut i = 0;
        // The template of the last record's lock and kind of hold, copied out (no key has all
        // bits set: lock indices have 27).
        let (mut key, mut begin_words, mut end_words) = (u64::MAX, None, [0u64; 3]);
        // A hold's end's delta, when its begin was the last packet handed out.
        let mut pending_end: Option<u64> = None;
        w.write_event_run::<{ encode::EVENT_PREFIX }, 3>(|| {
            if let Some(delta) = pending_end.take() {
                return Some((end_words, delta));
            }
            let record = records.get(i)?;
            let word = record.word.addr() as u64;
            // The operation's bits (`LockOp`): 4 and 5 a whole hold, 2 and 3 the end of one
            // that waited (in `session`), the low bit set for a shared hold; the event type's
            // two bits clear.
            let op = (word >> 2) & 7;
            let complete = op >> 1 == LockOp::Complete as u64 >> 1;
            if word & 3 != 0
                || !complete
                    && (op >> 1 != LockOp::Release as u64 >> 1 || (word >> 32) as u32 != session)
            {
                return None;
            }
            let k = lock_template_key(((word >> 5) as u32) & (MAX_LOCK_INDEX - 1), op & 1 != 0);
            if k != key {
                let t = ext_templates
                    .get(&k)
                    .filter(|t| t.generation == generation)?;
                (key, begin_words, end_words) = (k, t.begin_words, t.end_words);
            }
            let end = ticks.ns(record.ticks);
            if !complete {
                let delta = fast_window_delta(end, *last_ts, next_snapshot)?;
                *last_ts = end;
                i += 1;
                return Some((end_words, delta));
            }
            let words = begin_words?;
            let begin = ticks.ns(record.ticks.wrapping_sub(word >> 32));
            let delta = fast_window_delta(begin, *last_ts, next_snapshot)?;
            let end_delta = fast_window_delta(end, begin, next_snapshot)?;
            *last_ts = end;
            pending_end = Some(end_delta);
            i += 1;
            Some((words, delta))
        });
        // The run stopped between a begin and its end (the chunk's room or packet count): the
        // end goes through the writer's general path, which switches chunks.
        if let Some(delta) = pending_end {
            let mut end = [0u8; encode::EVENT_PREFIX];
            for (b, w) in end.chunks_exact_mut(8).zip(end_words) {
                b.copy_from_slice(&w.to_le_bytes());
            }
            if let Some(block) = with_varint(&end, delta) {
                w.write_small_packet(&block);
            }
        }
        i
    }

    /// Replays one queued lock record (`word` as [`lock_word`] made it) read at counter
    /// reading `ticks`, which [`replay_lock_run`](Self::replay_lock_run) did not take: from the
    /// lock's templates through the writer's general path when the sequence's state allows
    /// (as `write_template_slow`), else through the state's general path, which also makes the
    /// templates for the next time.
    pub(super) fn replay_lock(&mut self, word: u64, ticks: u64) {
        let ts = self.ticks.ns(ticks);
        let Some(op) = LockOp::from_bits((word >> 2) & 7) else {
            return;
        };
        let index = ((word >> 5) as u32) & (MAX_LOCK_INDEX - 1);
        match op {
            LockOp::Complete | LockOp::CompleteShared => {
                let begin = self.ticks.ns(ticks.wrapping_sub(word >> 32));
                self.replay_lock_complete(index, op.shared(), begin, ts);
                return;
            }
            LockOp::Release | LockOp::ReleaseShared => {}
            // Never queued: a hold's begin is written when it waited (`lock_contended`), or
            // comes with its end (`Complete`).
            LockOp::Hold | LockOp::HoldShared => return,
        }
        let session = (word >> 32) as u32;
        if session_of(self.epoch) != session {
            return;
        }
        if self.in_window(ts) {
            let key = lock_template_key(index, op.shared());
            let generation = self.generation;
            if let (Some(t), Some(w)) = (self.ext_templates.get(&key), self.writer.as_mut()) {
                if t.generation == generation && w.is_synced() {
                    if let Some(block) = with_varint(&t.end, ts - self.last_ts) {
                        w.write_small_packet(&block);
                        self.last_ts = ts;
                        return;
                    }
                }
            }
        }
        self.lock_event(ts.into(), op, index, session, None);
    }

    /// A whole hold from `begin` to `end` (trace-clock ns): the lock's templates through the
    /// writer's general path when the sequence's state allows (the begin with its delta if it
    /// is not before the sequence's last packet, else with its absolute time), else the
    /// state's general path (which makes the templates).
    pub(super) fn replay_lock_complete(&mut self, index: u32, shared: bool, begin: u64, end: u64) {
        if self.in_window(end) && begin <= end {
            let generation = self.generation;
            let last_ts = self.last_ts;
            let key = lock_template_key(index, shared);
            if let (Some(t), Some(w)) = (self.ext_templates.get(&key), self.writer.as_mut()) {
                if t.generation == generation && w.is_synced() {
                    let blocks = if begin >= last_ts {
                        with_varint(&t.begin, begin - last_ts).zip(with_varint(&t.end, end - begin))
                    } else {
                        with_absolute_time(&t.begin, begin).zip(with_varint(&t.end, end - last_ts))
                    };
                    if let Some((b, e)) = blocks {
                        w.write_small_packet(&b);
                        w.write_small_packet(&e);
                        self.last_ts = end;
                        return;
                    }
                }
            }
        }
        self.lock_complete(begin, end, shared, index, None);
    }

    /// A whole hold from `begin` to `end` through the general path (the begin stamped with
    /// its absolute time: the sequence has later packets already); `flow_out` leaves its end.
    fn lock_complete(
        &mut self,
        begin: u64,
        end: u64,
        shared: bool,
        index: u32,
        flow_out: Option<u64>,
    ) -> bool {
        if !self.sync(end) {
            return false;
        }
        let (b_op, e_op) = LockOp::pair(shared);
        let session = self.session();
        self.lock_event(Stamp::Absolute(begin), b_op, index, 0, None)
            && self.lock_event(Stamp::Sequence(end), e_op, index, session, flow_out)
    }

    /// Keeps the packets of a hold of lock `index` on `track` (a begin named `name_iid` in
    /// category `cat_iid`, both interned on the sequence now, and an end) for
    /// [`replay_lock_run`](Self::replay_lock_run): each up to and including its timestamp's
    /// tag; the delta follows.
    fn keep_lock_template(
        &mut self,
        index: u32,
        shared: bool,
        track: u64,
        name_iid: u64,
        cat_iid: u64,
    ) {
        let Some(t) = lock_template(self.generation, track, name_iid, cat_iid) else {
            return;
        };
        self.ext_templates
            .insert(lock_template_key(index, shared), t);
    }

    /// The lock's track (and, for a shared hold, this thread's track under it), described
    /// once per generation: the uuid events go to.
    fn lock_track(&mut self, index: u32, shared: bool, ts: u64) -> u64 {
        let uuid = crate::sync::lock_uuid(index);
        if self.tracks_seen.get(&uuid) != Some(&self.generation) {
            let name = crate::sync::lock_name(index);
            // Never merged with another lock of the same name (locks made at one callsite).
            self.ensure_own_track(
                OwnTrack {
                    uuid,
                    name: &name,
                    parent: None,
                    counter: None,
                    no_merge: true,
                },
                ts,
            );
        }
        if !shared {
            return uuid;
        }
        let child = crate::sync::shared_hold_uuid(uuid, self.track_uuid);
        if self.tracks_seen.get(&child) != Some(&self.generation) {
            let child_name = format!("shared: {}", self.holder_name());
            self.ensure_own_track(
                OwnTrack {
                    uuid: child,
                    name: &child_name,
                    parent: Some(uuid),
                    counter: None,
                    no_merge: true,
                },
                ts,
            );
        }
        child
    }

    /// A hold's begin or end on the lock's track at `ts`; `end_session` is the session of the
    /// begin (ends of another session's holds are dropped). False when nothing was written.
    /// A begin carries the argument `lock_id` and makes the lock's templates.
    fn lock_event(
        &mut self,
        ts: Stamp,
        op: LockOp,
        index: u32,
        end_session: u32,
        flow_out: Option<u64>,
    ) -> bool {
        // An absolute stamp comes from `lock_complete`, which synced at the hold's end.
        if let Stamp::Sequence(ts) = ts {
            if !self.sync(ts) {
                return false;
            }
        }
        if !op.is_begin() && session_of(self.epoch) != end_session {
            return false;
        }
        let track = self.lock_track(index, op.shared(), ts.time());
        if op.is_begin() {
            let name = self.holder_name();
            let (name_iid, new_name) = self.intern_holder_name(&name);
            let (cat_iid, new_cat) = self.intern_category(CAT_LOCK);
            let args = [("lock_id", ArgVal::Uint(u64::from(index)))];
            self.own_event(
                ts,
                track_event::Type::SliceBegin,
                Some(track),
                None,
                None,
                &args,
                |i| {
                    if new_name {
                        let mut e = i.add_event_names();
                        e.set_iid(name_iid);
                        e.set_name(&name);
                    }
                    if new_cat {
                        let mut e = i.add_event_categories();
                        e.set_iid(cat_iid);
                        e.set_name(CAT_LOCK);
                    }
                },
                new_name || new_cat,
                |e| {
                    e.add_category_iids(cat_iid);
                    e.set_name_iid(name_iid);
                },
            );
            self.keep_lock_template(index, op.shared(), track, name_iid, cat_iid);
        } else {
            self.own_event(
                ts,
                track_event::Type::SliceEnd,
                Some(track),
                None,
                None,
                &[],
                |_| {},
                false,
                |e| {
                    if let Some(f) = flow_out {
                        e.add_flow_ids(f);
                    }
                },
            );
        }
        true
    }

    /// The "wait for <lock>" slice on this thread's track.
    fn lock_wait(&mut self, index: u32, from: u64, to: u64, flow_in: Option<u64>) {
        let name = format!("wait for {}", crate::sync::lock_name(index));
        let args = [("lock_id", ArgVal::Uint(u64::from(index)))];
        self.own_event(
            from,
            track_event::Type::SliceBegin,
            None,
            Some(&name),
            Some(CAT_LOCK),
            &args,
            |_| {},
            false,
            |_| {},
        );
        self.own_event(
            to,
            track_event::Type::SliceEnd,
            None,
            None,
            None,
            &[],
            |_| {},
            false,
            |e| {
                if let Some(f) = flow_in {
                    e.add_terminating_flow_ids(f);
                }
            },
        );
    }

    // === Frames ===

    /// On frame set track `track`: ends the open frame (if `end_open`), begins frame `number`
    /// (if `Some`), at `ts`. False when nothing was written.
    pub(crate) fn frame_event(
        &mut self,
        ts: u64,
        track: OwnTrack<'_>,
        end_open: bool,
        begin: Option<u64>,
    ) -> bool {
        if !self.sync(ts) {
            return false;
        }
        self.ensure_own_track(track, ts);
        if end_open {
            self.own_event(
                ts,
                track_event::Type::SliceEnd,
                Some(track.uuid),
                None,
                None,
                &[],
                |_| {},
                false,
                |_| {},
            );
        }
        if let Some(n) = begin {
            let name = format!("{} {n}", track.name);
            let args = [("frame_number", ArgVal::Uint(n))];
            self.own_event(
                ts,
                track_event::Type::SliceBegin,
                Some(track.uuid),
                None,
                Some(CAT_FRAME),
                &args,
                |_| {},
                false,
                |e| e.set_name(&name),
            );
        }
        true
    }

    // === Log messages ===

    /// A log message of callsite `cs` at `ts`: an instant on this thread's track named by its
    /// level, carrying `log_message` (source location = the callsite's, interned once per
    /// generation; body interned once per generation when static, else with a fresh iid).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn log_message(
        &mut self,
        ts: u64,
        cs: &'static Callsite,
        en: Enabled,
        level: super::super::message::Level,
        body: &str,
        body_is_static: bool,
        color: Option<u32>,
        callstack_iid: u64,
    ) {
        if !self.sync(ts) {
            return;
        }
        let intern_callsite = !self.seen(en.id);
        let body_iid = if body_is_static {
            en.id
        } else {
            let iid = self.next_dyn_iid;
            self.next_dyn_iid += 1;
            iid
        };
        let new_body = !body_is_static || intern_callsite;
        let mut args = Vec::new();
        if let Some(c) = color {
            args.push(("color", ArgVal::Str(format!("#{:06x}", c & 0xff_ffff))));
        }
        self.own_event(
            ts,
            track_event::Type::Instant,
            None,
            Some(level.name()),
            // `message!`'s callsites are `tachyon.log`'s; other libraries' (`integration`)
            // carry their own category (a `log` record's target).
            Some(cs.category.unwrap_or(CAT_LOG)),
            &args,
            |i| {
                if intern_callsite {
                    let mut l = i.add_source_locations();
                    l.set_iid(en.id);
                    l.set_file_name(cs.file);
                    l.set_function_name(cs.module_path);
                    l.set_line_number(cs.line);
                }
                if new_body {
                    let mut b = i.add_log_message_body();
                    b.set_iid(body_iid);
                    b.set_body(body);
                }
            },
            intern_callsite || new_body,
            |e| {
                if callstack_iid != 0 {
                    e.set_callstack_iid(callstack_iid);
                }
                let mut m = e.set_log_message();
                m.set_source_location_iid(en.id);
                m.set_body_iid(body_iid);
                m.set_prio_raw(level.priority());
            },
        );
        if intern_callsite {
            self.mark_seen(en.id, Template::default());
        }
    }

    #[cfg(feature = "log-bridge")]
    /// A log message whose source location is known only at run time (the `log` crate
    /// bridge): the location interned by its text, the body copied.
    pub(crate) fn log_message_at(
        &mut self,
        ts: u64,
        level: super::super::message::Level,
        body: &str,
        location: Option<(&str, u32, &str)>,
    ) {
        if !self.sync(ts) {
            return;
        }
        let loc = location.map(|(file, line, func)| {
            let (iid, new) = self.intern_key(&format!("s{file}:{line}:{func}"));
            (iid, new, file, line, func)
        });
        let body_iid = self.next_dyn_iid;
        self.next_dyn_iid += 1;
        self.own_event(
            ts,
            track_event::Type::Instant,
            None,
            Some(level.name()),
            Some(CAT_LOG),
            &[],
            |i| {
                if let Some((iid, true, file, line, func)) = loc {
                    let mut l = i.add_source_locations();
                    l.set_iid(iid);
                    l.set_file_name(file);
                    l.set_function_name(func);
                    l.set_line_number(line);
                }
                let mut b = i.add_log_message_body();
                b.set_iid(body_iid);
                b.set_body(body);
            },
            true,
            |e| {
                let mut m = e.set_log_message();
                if let Some((iid, ..)) = loc {
                    m.set_source_location_iid(iid);
                }
                m.set_body_iid(body_iid);
                m.set_prio_raw(level.priority());
            },
        );
    }

    // === Plots, program info, zone data ===

    /// A sample on a plot's counter track at `ts`.
    pub(crate) fn plot_sample(&mut self, ts: u64, track: OwnTrack<'_>, value: CounterSample) {
        if !self.sync(ts) {
            return;
        }
        self.ensure_own_track(track, ts);
        self.own_event(
            ts,
            track_event::Type::Counter,
            Some(track.uuid),
            None,
            None,
            &[],
            |_| {},
            false,
            |e| match value {
                CounterSample::Int(v) => e.set_counter_value(v),
                CounterSample::Double(v) => e.set_double_counter_value(v),
            },
        );
    }

    /// An instant on the process's track carrying the program's information.
    pub(crate) fn app_info(&mut self, ts: u64, text: &str) -> bool {
        if !self.sync(ts) {
            return false;
        }
        let args = [("info", ArgVal::Str(text.to_owned()))];
        self.own_event(
            ts,
            track_event::Type::Instant,
            Some(global::process().uuid),
            Some("app info"),
            Some(CAT_APP_INFO),
            &args,
            |_| {},
            false,
            |_| {},
        );
        true
    }

    /// A slice end on this thread's track, in `session`, with arguments (a zone's text, value,
    /// color, run-time name), merged into the slice's by the readers.
    pub(crate) fn slice_end_with_args(&mut self, session: u32, ts: u64, args: &[(&str, ArgVal)]) {
        if !self.sync(ts) || session_of(self.epoch) != session {
            return;
        }
        self.own_event(
            ts,
            track_event::Type::SliceEnd,
            None,
            None,
            None,
            args,
            |_| {},
            false,
            |_| {},
        );
    }

    /// Sets the rank of this thread's track among its siblings (a group hint: threads of one
    /// group sort together); the next thread descriptor carries it.
    pub(crate) fn set_thread_group(&mut self, rank: i32) {
        self.group_rank = Some(rank);
    }
}

/// Runs `f` on this thread's state (the general path), now: for the modules of this file.
pub(crate) fn with_thread_state<R>(f: impl FnOnce(&mut ThreadState, u64) -> R) -> Option<R> {
    with_state(|st| {
        let ts = clock::now();
        f(st, ts)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tachyon_protos::TracePacketView;

    fn packet(block: &encode::Block) -> &[u8] {
        &block[1..=block[0] as usize]
    }

    /// A lock's templates, stamped, decode as the fields they claim (with the generated
    /// views); the run path's words are the template's bytes; a begin with long ids still has
    /// a template, outside the run path.
    #[test]
    fn lock_templates_decode_as_the_fields_they_claim() {
        // A 49-bit uuid (`sync::lock_uuid`'s largest), static ids up to 2^21.
        for (uuid, name_iid, cat_iid, fits) in [
            ((1u64 << 49) - 1, 1u64, 1u64, true),
            ((1 << 49) - 1, (1 << 21) - 1, (1 << 21) - 1, true),
            (5, 300, 7, true),
            (u64::MAX, 1, 1, true),
            ((1 << 49) - 1, 1 << 40, 1 << 28, false),
            (u64::MAX, u64::MAX, u64::MAX, false),
        ] {
            let t = lock_template(9, uuid, name_iid, cat_iid).expect("fits its block");
            assert_eq!(t.generation, 9);
            assert_eq!(t.begin_words.is_some(), fits, "{uuid} {name_iid} {cat_iid}");
            if let Some(words) = t.begin_words {
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                assert_eq!(bytes[..], t.begin[..encode::EVENT_PREFIX]);
                assert!(usize::from(t.begin[0]) < encode::EVENT_PREFIX);
            }
            let bytes: Vec<u8> = t.end_words.iter().flat_map(|w| w.to_le_bytes()).collect();
            assert_eq!(bytes[..], t.end[..]);
            for delta in [0, 127, 1 << 20, u64::MAX] {
                let b = with_varint(&t.begin, delta).unwrap();
                let p = TracePacketView::decode(packet(&b)).unwrap();
                assert_eq!(p.timestamp(), delta);
                assert!(!p.has_timestamp_clock_id());
                assert_eq!(p.sequence_flags(), 2);
                let e = p.track_event().unwrap();
                assert_eq!(e.r#type(), Some(track_event::Type::SliceBegin));
                assert_eq!(e.track_uuid(), uuid);
                assert_eq!(e.name_iid(), name_iid);
                let cats: Vec<u64> = e.category_iids().collect::<Result<_, _>>().unwrap();
                assert_eq!(cats, vec![cat_iid]);

                let b = with_absolute_time(&t.begin, delta).unwrap();
                let p = TracePacketView::decode(packet(&b)).unwrap();
                assert_eq!(p.timestamp(), delta);
                assert_eq!(p.timestamp_clock_id(), TRACE_CLOCK_ID);
                assert_eq!(p.sequence_flags(), 2);
                let e = p.track_event().unwrap();
                assert_eq!(e.r#type(), Some(track_event::Type::SliceBegin));
                assert_eq!((e.track_uuid(), e.name_iid()), (uuid, name_iid));

                let b = with_varint(&t.end, delta).unwrap();
                let p = TracePacketView::decode(packet(&b)).unwrap();
                assert_eq!(p.timestamp(), delta);
                assert_eq!(p.sequence_flags(), 2);
                let e = p.track_event().unwrap();
                assert_eq!(e.r#type(), Some(track_event::Type::SliceEnd));
                assert_eq!(e.track_uuid(), uuid);
                assert!(!e.has_name_iid());
                assert_eq!(e.category_iids().count(), 0);
            }
        }
    }

    /// The longest templates (10-byte uuid and ids) and their longest stampings are the sizes
    /// the field docs of [`LockTemplate`] and [`LOCK_TEMPLATE`] give, within their arrays and
    /// a block.
    #[test]
    fn the_longest_templates_fit() {
        let t = lock_template(1, u64::MAX, u64::MAX, u64::MAX).expect("fits");
        assert_eq!(usize::from(t.begin[0]) + 1, 41);
        assert_eq!(usize::from(t.end[0]) + 1, 19);
        let b = with_absolute_time(&t.begin, u64::MAX).expect("fits a block");
        assert_eq!(usize::from(b[0]) + 1, 58);
        let b = with_varint(&t.begin, u64::MAX).expect("fits a block");
        assert_eq!(usize::from(b[0]) + 1, 51);
        let t = lock_template(1, (1 << 49) - 1, 1, 1).expect("fits");
        assert_eq!(usize::from(t.end[0]) + 1, 16);
    }

    /// What a hold costs the trace: with small ids, a begin and an end of at most 22 and 18
    /// bytes with their one-byte fragment headers and 2-byte deltas.
    #[test]
    fn a_hold_is_two_small_packets() {
        let t = lock_template(1, (1 << 49) - 1, 100, 100).unwrap();
        let b = with_varint(&t.begin, 1000).unwrap();
        let e = with_varint(&t.end, 1000).unwrap();
        assert_eq!((b[0] + 1, e[0] + 1), (22, 18));
    }
}

//! The thread state's side of locks, frames, log messages, plots and per-zone data
//! (`sync.rs`, `frame.rs`, `message.rs`, `plot.rs`, `zone_data.rs`). A child module of
//! `state.rs`, so it uses the state's fields and its general path (`sync`, `write_timed`)
//! without widening their visibility.
//!
//! Lock holds are the one hot event here: an uncontended hold queues a single 16-byte record
//! when it ends (half a zone's two), its word carrying how long it lasted in counter ticks and
//! the record's own reading when it ended; the drainer writes its begin (with an absolute
//! timestamp, the sequence's clock having moved on meanwhile) and its end. A hold that waited
//! had its begin written when it obtained the lock; its end queues a record carrying the
//! session of that begin. The record's word has its two low bits clear (the event types
//! `state.rs` uses are 1–3), then the operation, the lock's index, then the duration or the
//! session:
//!
//! ```text
//!  63                     32 31          5 4   2 1  0
//!  [ ticks held | session  ][ lock index  ][ op ][ 00 ]
//! ```

use std::ptr;

use protozero::wire::{encode_varint, make_tag, WireType};
use tachyon_protos::{
    counter_descriptor, track_descriptor, track_event, InternedData, TracePacket, TrackEvent,
};

use super::{push, push_at, with_state, ThreadState};
use crate::clock::{self, TRACE_CLOCK_ID};
use crate::track_event::callsite::{Callsite, Enabled};
use crate::track_event::encode::{self, CounterSample, Template, SEQ_NEEDS_INCREMENTAL_STATE};
use crate::track_event::global::{self, session_of};

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

/// A lock packet's pre-encoded template (length in byte 0, as [`encode::Block`]s are) with
/// the varint `v` appended: its timestamp. `None` when it does not fit the block.
#[inline(always)]
fn with_varint(template: &encode::Block, v: u64) -> Option<encode::Block> {
    let mut block = *template;
    let at = 1 + block[0] as usize;
    let mut bytes = [0u8; 10];
    let n = encode_varint(v, &mut bytes);
    block.get_mut(at..at + n)?.copy_from_slice(&bytes[..n]);
    block[0] += n as u8;
    Some(block)
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
    with_state(|st| st.lock_complete(begin, end, shared, index, flow_out));
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

/// Prefixes of the interning keys of categories, argument names and event names.
const KEY_CATEGORY: &str = "c";
const KEY_ARG_NAME: &str = "a";
const KEY_NAME: &str = "n";

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

    fn intern_category(&mut self, cat: &str) -> (u64, bool) {
        let key = format!("{KEY_CATEGORY}{cat}");
        self.intern_key(&key)
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

    /// Replays a queued lock record (`word` as [`lock_word`] made it) at `ts`: the packet
    /// pre-encoded for this lock, operation and generation with the timestamp's delta
    /// appended, when the sequence's state allows (as `write_template_slow`); else the general
    /// path, which also makes the template for the next time.
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
        let key = self.lock_template_key(index, op);
        if self.in_window(ts) {
            let generation = self.generation;
            if let (Some((g, t)), Some(w)) = (self.ext_templates.get(&key), self.writer.as_mut()) {
                if *g == generation && w.is_synced() {
                    if let Some(block) = with_varint(t, ts - self.last_ts) {
                        w.write_small_packet(&block);
                        self.last_ts = ts;
                        return;
                    }
                }
            }
        }
        self.lock_event(ts.into(), op, index, session, None);
    }

    /// A whole hold from `begin` to `end`: the begin's pre-encoded packet with its absolute
    /// timestamp, then the end's with its delta, when the sequence's state allows; else the
    /// general path (which makes both templates).
    fn replay_lock_complete(&mut self, index: u32, shared: bool, begin: u64, end: u64) {
        let (b_op, e_op) = LockOp::pair(shared);
        if self.in_window(end) {
            let generation = self.generation;
            let (b_key, e_key) = (
                self.lock_template_key(index, b_op),
                self.lock_template_key(index, e_op),
            );
            if let (Some((gb, tb)), Some((ge, te)), Some(w)) = (
                self.ext_templates.get(&b_key),
                self.ext_templates.get(&e_key),
                self.writer.as_mut(),
            ) {
                if *gb == generation && *ge == generation && w.is_synced() {
                    if let (Some(b), Some(e)) =
                        (with_varint(tb, begin), with_varint(te, end - self.last_ts))
                    {
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

    /// The key of a lock event's template: the lock's index and the operation (the state is
    /// this thread's, so a shared hold's track is implied).
    #[inline]
    fn lock_template_key(&self, index: u32, op: LockOp) -> u64 {
        (u64::from(index) << 2) | op as u64
    }

    /// Keeps the packet of a lock event just written through the general path (its interned
    /// data is on the sequence now) for [`replay_lock`](Self::replay_lock): the track event,
    /// the flags, the timestamp's tag; the delta follows (a begin: the clock's id, then the
    /// timestamp's tag; the absolute time follows).
    fn keep_lock_template(
        &mut self,
        index: u32,
        op: LockOp,
        track: u64,
        begin: Option<(u64, u64)>,
    ) {
        let mut ev: Vec<u8> = Vec::with_capacity(48);
        let varint = |buf: &mut Vec<u8>, v: u64| {
            let mut b = [0u8; 10];
            let n = encode_varint(v, &mut b);
            buf.extend_from_slice(&b[..n]);
        };
        ev.push(tag(TrackEvent::TRACK_UUID_FIELD_NUMBER, WireType::Varint));
        varint(&mut ev, track);
        ev.push(tag(TrackEvent::TYPE_FIELD_NUMBER, WireType::Varint));
        ev.push(if op.is_begin() {
            track_event::Type::SliceBegin as u8
        } else {
            track_event::Type::SliceEnd as u8
        });
        // The `lock_id` argument rides on the first hold of each track and generation (the
        // general path's): the track says which lock a hold is, and a smaller packet is less
        // for the drainer to write and the service to copy.
        if let Some((name_iid, cat_iid)) = begin {
            ev.push(tag(TrackEvent::NAME_IID_FIELD_NUMBER, WireType::Varint));
            varint(&mut ev, name_iid);
            ev.push(tag(
                TrackEvent::CATEGORY_IIDS_FIELD_NUMBER,
                WireType::Varint,
            ));
            varint(&mut ev, cat_iid);
        }
        let mut packet = vec![
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
        ]);
        if op.is_begin() {
            // A begin is replayed when its hold ends, after the sequence's clock moved on: its
            // absolute time on the trace clock follows.
            // Field 58: a two-byte tag.
            varint(
                &mut packet,
                u64::from(make_tag(
                    TracePacket::TIMESTAMP_CLOCK_ID_FIELD_NUMBER,
                    WireType::Varint,
                )),
            );
            varint(&mut packet, u64::from(TRACE_CLOCK_ID));
        }
        packet.push(tag(TracePacket::TIMESTAMP_FIELD_NUMBER, WireType::Varint));
        // Room for the delta's varint (10 bytes at most) in the block, and one-byte lengths.
        let mut block = [0u8; encode::BLOCK];
        if ev.len() > 127 || 1 + packet.len() + 10 > block.len() {
            return;
        }
        block[0] = packet.len() as u8;
        block[1..=packet.len()].copy_from_slice(&packet);
        let key = self.lock_template_key(index, op);
        self.ext_templates.insert(key, (self.generation, block));
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
        let child = global::mix64(uuid ^ self.track_uuid.rotate_left(23));
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
            let args = [("lock_id", ArgVal::Uint(u64::from(index)))];
            self.own_event(
                ts,
                track_event::Type::SliceBegin,
                Some(track),
                Some(&name),
                Some(CAT_LOCK),
                &args,
                |_| {},
                false,
                |_| {},
            );
            // The iids just used (interned in this generation now).
            let iids = (
                self.intern_key(&format!("{KEY_NAME}{name}")).0,
                self.intern_category(CAT_LOCK).0,
            );
            self.keep_lock_template(index, op, track, Some(iids));
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
            if flow_out.is_none() {
                self.keep_lock_template(index, op, track, None);
            }
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

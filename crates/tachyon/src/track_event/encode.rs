//! The SDK's most common packets encoded by hand: templates built once per callsite and
//! sequence generation, written by
//! [`TraceWriter::try_write_event`](crate::backend::TraceWriter) (slice begins, instants), its
//! two-word variant `try_write_short_event` (slice ends), or as a stack block by
//! [`TraceWriter::write_small_packet`](crate::backend::TraceWriter::write_small_packet) (counters).
//!
//! Every packet here is what the generated writers would produce for the same fields (the
//! tests decode both with the generated views), after a one-byte fragment header holding its
//! length. The layout of a slice begin on the thread's track:
//!
//! ```text
//!  len │ 5a <n>              track_event (11) {
//!      │   18 <iid>            category_iids (3)        (categorized events only)
//!      │   48 01               type (9) = SLICE_BEGIN
//!      │   50 <iid>            name_iid (10)
//!      │   90 02 <iid>         source_location_iid (34)
//!      │                     }
//!      │ 68 02               sequence_flags (13) = SEQ_NEEDS_INCREMENTAL_STATE
//!      │ 40 <delta>          timestamp (8), on the sequence's incremental clock
//! ```
//!
//! Everything before the delta is a [`Template`] fixed per callsite and sequence.

use protozero::wire::{encode_varint, make_tag, WireType};
use tachyon_protos::{trace_packet::SequenceFlags, track_event, TracePacket, TrackEvent};

/// Size of the block counters are encoded in: the longest counter packet (a 10-byte track uuid
/// and a 10-byte value, then flags and a 10-byte delta: 2 + 3 + 10 + 12 + 2 + 11 = 40 bytes)
/// fits with room to spare. A power of two: positions are masked into it instead of checked.
pub(crate) const BLOCK: usize = 64;

pub(crate) type Block = [u8; BLOCK];

/// A tag that fits one varint byte (fields 1–15).
const fn tag1(field: u32, wire_type: WireType) -> u8 {
    let tag = make_tag(field, wire_type);
    assert!(tag < 0x80);
    tag as u8
}

/// A tag of two varint bytes (fields 16–2047).
const fn tag2(field: u32, wire_type: WireType) -> [u8; 2] {
    let tag = make_tag(field, wire_type);
    assert!(tag >= 0x80 && tag < 0x4000);
    [tag as u8 | 0x80, (tag >> 7) as u8]
}

// The fields' numbers come from the generated writers, so these bytes follow the schema.
const TAG_TIMESTAMP: u8 = tag1(TracePacket::TIMESTAMP_FIELD_NUMBER, WireType::Varint);
const TAG_TRACK_EVENT: u8 = tag1(
    TracePacket::TRACK_EVENT_FIELD_NUMBER,
    WireType::LengthDelimited,
);
const TAG_SEQUENCE_FLAGS: u8 = tag1(TracePacket::SEQUENCE_FLAGS_FIELD_NUMBER, WireType::Varint);
const TAG_CATEGORY_IIDS: u8 = tag1(TrackEvent::CATEGORY_IIDS_FIELD_NUMBER, WireType::Varint);
const TAG_TYPE: u8 = tag1(TrackEvent::TYPE_FIELD_NUMBER, WireType::Varint);
const TAG_NAME_IID: u8 = tag1(TrackEvent::NAME_IID_FIELD_NUMBER, WireType::Varint);
const TAG_TRACK_UUID: u8 = tag1(TrackEvent::TRACK_UUID_FIELD_NUMBER, WireType::Varint);
const TAG_SOURCE_LOCATION_IID: [u8; 2] = tag2(
    TrackEvent::SOURCE_LOCATION_IID_FIELD_NUMBER,
    WireType::Varint,
);
const TAG_COUNTER_VALUE: [u8; 2] = tag2(TrackEvent::COUNTER_VALUE_FIELD_NUMBER, WireType::Varint);
const TAG_DOUBLE_COUNTER_VALUE: [u8; 2] = tag2(
    TrackEvent::DOUBLE_COUNTER_VALUE_FIELD_NUMBER,
    WireType::Fixed64,
);

/// `SEQ_NEEDS_INCREMENTAL_STATE`.
pub(crate) const SEQ_NEEDS_INCREMENTAL_STATE: u8 = SequenceFlags::SeqNeedsIncrementalState as u8;

/// TrackEvent types (`track_event.proto`).
pub(crate) const TYPE_SLICE_BEGIN: u8 = track_event::Type::SliceBegin as u8;
pub(crate) const TYPE_SLICE_END: u8 = track_event::Type::SliceEnd as u8;
pub(crate) const TYPE_INSTANT: u8 = track_event::Type::Instant as u8;
pub(crate) const TYPE_COUNTER: u8 = track_event::Type::Counter as u8;

/// The bytes of an event that do not change between two occurrences of it on one sequence
/// (everything but the timestamp's value, and a counter's value), built once per callsite and
/// generation by the slow path and kept in the thread's interning table.
///
/// `bytes[0]` is the number `n` of packet bytes that follow; for named events and slice ends
/// they run up to and including the timestamp's tag, so the packet is `bytes[1..=n]` then the
/// delta's varint ([`TraceWriter::try_write_event`](crate::backend::TraceWriter), which writes the first
/// [`EVENT_PREFIX`] bytes with fixed-size stores straight into the chunk, fixes the first byte
/// into the packet's one-byte fragment header and appends the varint). For counters they end
/// with the track uuid: the value, the flags and the timestamp follow
/// ([`Template::with_counter_value`]).
///
/// The timestamp goes *last* in the packet (protobuf fields may come in any order), so the
/// fast path copies the template with fixed-size moves and appends only the varying bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Template {
    pub(crate) bytes: [u8; TEMPLATE],
}

/// Size of a template: with the generation beside it, an entry of the thread's interning table
/// is 32 bytes (its index a shift).
pub(crate) const TEMPLATE: usize = 28;

/// The bytes of a named event's template the fast path copies: a categorized named event with
/// 4-byte iids (every static callsite id is below [`MAX_STATIC_IID`]) takes 23 bytes and the
/// count byte. Three words: few registers.
pub(crate) const EVENT_PREFIX: usize = 24;

/// Static interning ids (callsites and their argument names) stay below this, so that their
/// varints take at most 4 bytes and a named event's template fits [`EVENT_PREFIX`] (the
/// registry disables callsites beyond it; dynamic names use ids from 2^40 and never have
/// templates).
pub(crate) const MAX_STATIC_IID: u64 = 1 << 28;

const _: () = assert!(TEMPLATE >= EVENT_PREFIX);

impl Default for Template {
    fn default() -> Self {
        Template {
            bytes: [0; TEMPLATE],
        }
    }
}

/// Appends a varint at `pos` (masked to the block: the callers' layouts stay far below 64).
#[inline(always)]
fn put_varint(buf: &mut Block, mut pos: usize, mut v: u64) -> usize {
    while v >= 0x80 {
        buf[pos & (BLOCK - 1)] = v as u8 | 0x80;
        v >>= 7;
        pos += 1;
    }
    buf[pos & (BLOCK - 1)] = v as u8;
    pos + 1
}

impl Template {
    /// Appends `bytes` to the template (built on the slow path: checked).
    fn push(&mut self, bytes: &[u8]) -> &mut Self {
        let at = 1 + self.bytes[0] as usize;
        self.bytes[at..at + bytes.len()].copy_from_slice(bytes);
        self.bytes[0] += bytes.len() as u8;
        self
    }

    /// The bytes the fast path copies ([`EVENT_PREFIX`]).
    #[inline(always)]
    pub(crate) fn event_prefix(&self) -> &[u8; EVENT_PREFIX] {
        self.bytes
            .first_chunk()
            .unwrap_or_else(|| unreachable!("TEMPLATE >= EVENT_PREFIX"))
    }

    /// The packet bytes.
    fn body(&self) -> &[u8] {
        &self.bytes[1..=self.bytes[0] as usize]
    }

    /// A slice begin or an instant on the sequence's default track, named by `iid` (below
    /// [`MAX_STATIC_IID`]).
    pub(crate) fn named_event(ty: u8, iid: u64, categorized: bool) -> Template {
        debug_assert!(iid < MAX_STATIC_IID);
        let mut v = [0u8; 10];
        let n = encode_varint(iid, &mut v);
        let iid = &v[..n];
        let cat_len = if categorized { 1 + iid.len() } else { 0 };
        let event_len = cat_len + 3 + iid.len() + TAG_SOURCE_LOCATION_IID.len() + iid.len();
        let mut t = Template::default();
        t.push(&[TAG_TRACK_EVENT, event_len as u8]);
        if categorized {
            t.push(&[TAG_CATEGORY_IIDS]).push(iid);
        }
        t.push(&[TAG_TYPE, ty, TAG_NAME_IID])
            .push(iid)
            .push(&TAG_SOURCE_LOCATION_IID)
            .push(iid)
            .push(&[
                TAG_SEQUENCE_FLAGS,
                SEQ_NEEDS_INCREMENTAL_STATE,
                TAG_TIMESTAMP,
            ]);
        t
    }

    /// A counter on `track_uuid`; the value is appended per sample.
    pub(crate) fn counter(track_uuid: u64) -> Template {
        let mut v = [0u8; 10];
        let n = encode_varint(track_uuid, &mut v);
        let uuid = &v[..n];
        let event_len = 2 + 1 + uuid.len();
        let mut t = Template::default();
        t.push(&[TAG_TRACK_EVENT, event_len as u8])
            .push(&[TAG_TYPE, TYPE_COUNTER, TAG_TRACK_UUID])
            .push(uuid);
        t
    }

    /// The packet of a named event or slice end with `delta` appended, as a [`Block`] (what
    /// `TraceWriter::try_write_event` writes; for the slow path's fallback and the tests).
    pub(crate) fn with_timestamp(&self, delta: u64) -> Block {
        let mut buf = [0u8; BLOCK];
        let body = self.body();
        buf[1..=body.len()].copy_from_slice(body);
        let pos = put_varint(&mut buf, 1 + body.len(), delta);
        buf[0] = (pos - 1) as u8;
        buf
    }

    /// A counter packet: the template, the value, the flags, then the timestamp delta.
    #[inline(always)]
    pub(crate) fn with_counter_value(&self, value: CounterSample, delta: u64) -> Block {
        let mut buf = [0u8; BLOCK];
        // The template's count byte lands in `buf[0]`, overwritten below.
        buf[..TEMPLATE].copy_from_slice(&self.bytes);
        let mut pos = 1 + self.bytes[0] as usize;
        let start = pos;
        match value {
            CounterSample::Int(v) => {
                buf[pos & (BLOCK - 1)] = TAG_COUNTER_VALUE[0];
                buf[(pos + 1) & (BLOCK - 1)] = TAG_COUNTER_VALUE[1];
                // int64 is a varint of the two's complement (10 bytes when negative).
                pos = put_varint(&mut buf, pos + 2, v as u64);
            }
            CounterSample::Double(v) => {
                buf[pos & (BLOCK - 1)] = TAG_DOUBLE_COUNTER_VALUE[0];
                buf[(pos + 1) & (BLOCK - 1)] = TAG_DOUBLE_COUNTER_VALUE[1];
                pos += 2;
                let at = pos & (BLOCK - 1);
                if let Some(dst) = buf.get_mut(at..at + 8) {
                    dst.copy_from_slice(&v.to_le_bytes());
                }
                pos += 8;
            }
        }
        // The track event's length byte (`bytes[2]`) grows by the value field.
        buf[2] = self.bytes[2] + (pos - start) as u8;
        buf[pos & (BLOCK - 1)] = TAG_SEQUENCE_FLAGS;
        buf[(pos + 1) & (BLOCK - 1)] = SEQ_NEEDS_INCREMENTAL_STATE;
        buf[(pos + 2) & (BLOCK - 1)] = TAG_TIMESTAMP;
        pos = put_varint(&mut buf, pos + 3, delta);
        buf[0] = (pos - 1) as u8;
        buf
    }
}

/// A slice begin or an instant on the sequence's default track, named by the callsite's
/// interned iids (the template and the timestamp in one call, for the tests).
#[cfg(test)]
pub(crate) fn named_event(delta: u64, ty: u8, iid: u64, categorized: bool) -> Block {
    Template::named_event(ty, iid, categorized).with_timestamp(delta)
}

/// A slice end on the default track: `track_event {type: SLICE_END}`, flags, the timestamp's
/// tag; the delta follows.
pub(crate) const SLICE_END: Template = {
    let body = [
        TAG_TRACK_EVENT,
        2,
        TAG_TYPE,
        TYPE_SLICE_END,
        TAG_SEQUENCE_FLAGS,
        SEQ_NEEDS_INCREMENTAL_STATE,
        TAG_TIMESTAMP,
    ];
    let mut bytes = [0u8; TEMPLATE];
    bytes[0] = body.len() as u8;
    let mut i = 0;
    while i < body.len() {
        bytes[1 + i] = body[i];
        i += 1;
    }
    Template { bytes }
};

/// [`SLICE_END`]'s first 8 bytes: the whole template (7 packet bytes after the count), for
/// the fast path's two-word write (`TraceWriter::try_write_short_event`).
pub(crate) const SLICE_END_PREFIX: [u8; 8] = {
    let mut p = [0u8; 8];
    let mut i = 0;
    while i < 8 {
        p[i] = SLICE_END.bytes[i];
        i += 1;
    }
    assert!(SLICE_END.bytes[0] == 7);
    p
};

/// [`SLICE_END`]'s first [`EVENT_PREFIX`] bytes (the template, then zeros): a slice end in
/// the shape of a named event's prefix, for the drainer's runs of mixed events
/// (`TraceWriter::write_event_run`).
pub(crate) const SLICE_END_EVENT_PREFIX: [u8; EVENT_PREFIX] = {
    let mut p = [0u8; EVENT_PREFIX];
    let mut i = 0;
    while i < EVENT_PREFIX {
        p[i] = SLICE_END.bytes[i];
        i += 1;
    }
    p
};

/// A slice end at `delta` (for the tests).
#[cfg(test)]
pub(crate) fn slice_end(delta: u64) -> Block {
    SLICE_END.with_timestamp(delta)
}

/// A counter value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CounterSample {
    /// `counter_value` (int64).
    Int(i64),
    /// `double_counter_value`.
    Double(f64),
}

/// A counter event on `track_uuid` (the template and the sample in one call, for the tests).
#[cfg(test)]
pub(crate) fn counter(delta: u64, track_uuid: u64, value: CounterSample) -> Block {
    Template::counter(track_uuid).with_counter_value(value, delta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tachyon_protos::{track_event, TracePacketView};

    fn packet(block: &Block) -> &[u8] {
        &block[1..=block[0] as usize]
    }

    #[test]
    fn blocks_decode_as_the_fields_they_claim() {
        for (delta, iid, cat) in [
            (0, 1, false),
            (127, 200, true),
            (1 << 40, MAX_STATIC_IID - 1, true),
            (5, MAX_STATIC_IID - 1, false),
        ] {
            // The largest template fits the fast path's copy.
            let t = Template::named_event(TYPE_SLICE_BEGIN, iid, cat);
            assert!((t.bytes[0] as usize) < EVENT_PREFIX, "{iid} {cat}");
            let b = named_event(delta, TYPE_SLICE_BEGIN, iid, cat);
            let p = TracePacketView::decode(packet(&b)).unwrap();
            assert_eq!(p.timestamp(), delta);
            assert_eq!(p.sequence_flags(), 2);
            let e = p.track_event().unwrap();
            assert_eq!(e.r#type(), Some(track_event::Type::SliceBegin));
            assert_eq!(e.name_iid(), iid);
            assert_eq!(e.source_location_iid(), iid);
            let cats: Vec<u64> = e.category_iids().collect::<Result<_, _>>().unwrap();
            assert_eq!(cats, if cat { vec![iid] } else { vec![] });
        }
        let b = slice_end(5);
        let p = TracePacketView::decode(packet(&b)).unwrap();
        assert_eq!(
            p.track_event().unwrap().r#type(),
            Some(track_event::Type::SliceEnd)
        );
        assert_eq!(p.timestamp(), 5);

        let b = counter(u64::MAX, u64::MAX, CounterSample::Int(-1));
        assert_eq!(b[0], 40);
        assert!((b[0] as usize) < BLOCK);
        let p = TracePacketView::decode(packet(&b)).unwrap();
        let e = p.track_event().unwrap();
        assert_eq!(e.r#type(), Some(track_event::Type::Counter));
        assert_eq!(e.track_uuid(), u64::MAX);
        assert_eq!(e.counter_value(), -1);
        let b = counter(1, 7, CounterSample::Double(2.5));
        let e = TracePacketView::decode(packet(&b))
            .unwrap()
            .track_event()
            .unwrap();
        assert_eq!(e.double_counter_value(), 2.5);
    }
}

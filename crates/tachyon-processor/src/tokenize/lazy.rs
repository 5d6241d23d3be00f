//! Hand-written decoders for the messages every event of a trace carries: `TracePacket`,
//! `TrackEvent` and `DebugAnnotation`.
//!
//! The generated views ([`TracePacketView`] and the rest) index every declared field of a
//! message up front (a slot array of 33 fields for a packet, re-read from the bytes on each
//! access), which is what a general reader needs and most of what decoding an SDK trace costs.
//! The importer reads a dozen fields of these messages per event, so here one pass over the
//! bytes keeps exactly those, already converted, and notes whether anything else is present:
//! a packet with any other field, or an event or annotation with a field outside the common
//! set, also gets its generated view (decoded on demand), and the importer reads the rare
//! fields through it. Varints of any length are read inline.
//!
//! The rules are the generated views' (`protozero::gen_support`), field for field: framing
//! errors are those of `protozero::decoder::ProtoDecoder` (a message is malformed exactly when
//! its view's `decode` fails), a field with the wrong wire type is ignored, the last occurrence
//! of a singular field wins, and repeated scalar fields are read packed and unpacked alike. The
//! tests below and the `lazy_views` fuzz target compare every accessor with the generated
//! view's on random and mutated messages.

use protozero::decoder::{DecodeError, PackedFixed64, PackedVarints};
use protozero::wire::{MAX_FIELD_ID, MAX_MESSAGE_LENGTH, MAX_VARINT_SIZE};
use tachyon_protos::{DebugAnnotationView, TracePacketView, TrackEventView};

// === Fields ===

/// One well-formed field: its id and value (a length-delimited payload as a sub-slice).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Value<'a> {
    Varint(u64),
    /// No field the importer reads is a fixed32: its value is not kept.
    Fixed32,
    Fixed64(u64),
    Bytes(&'a [u8]),
}

/// Reads the varint at `pos`: its value and the offset past it.
///
/// The fast paths: a one-byte varint, then any varint of up to 8 bytes when 8 bytes are left
/// (read as one little-endian word, no per-byte bounds check), then 9 and 10 bytes when 10
/// are left. Varints near the end of `buf` take [`varint_slow`], which has the exact rules
/// (and errors) of `protozero::decoder`: bits past the 64th dropped, an 11th byte `VarintTooLong`, the end of
/// the buffer first `TruncatedVarint`. A property test compares the two on random, encoded,
/// redundant and truncated input.
#[inline(always)]
fn varint(buf: &[u8], pos: usize) -> Result<(u64, usize), DecodeError> {
    if let Some(&b) = buf.get(pos) {
        if b < 0x80 {
            return Ok((u64::from(b), pos + 1));
        }
        // Two bytes (a timestamp delta, a string id past 127), also in a message's last
        // bytes, where the word read below does not fit.
        if let Some(&c) = buf.get(pos + 1) {
            if c < 0x80 {
                return Ok((u64::from(b & 0x7f) | u64::from(c) << 7, pos + 2));
            }
            // Three (an int argument, a longer delta), also in the last bytes.
            if let Some(&d) = buf.get(pos + 2) {
                if d < 0x80 {
                    let v = u64::from(b & 0x7f) | u64::from(c & 0x7f) << 7 | u64::from(d) << 14;
                    return Ok((v, pos + 3));
                }
            }
        }
    }
    if let Some(&w) = buf.get(pos..).and_then(|rest| rest.first_chunk::<8>()) {
        let x = u64::from_le_bytes(w);
        // The high bit of each byte that ends the varint, cleared: the lowest one is its end.
        let stops = !x & 0x8080_8080_8080_8080;
        if stops != 0 {
            // Keep the bytes up to and including the last one (mask up to its stop bit).
            let x = x & (stops ^ (stops - 1));
            let len = (stops.trailing_zeros() as usize + 1) / 8;
            // Gather the 7-bit groups: pairs into 14 bits, then 28, then 56.
            let x = (x & 0x007f_007f_007f_007f) | ((x & 0x7f00_7f00_7f00_7f00) >> 1);
            let x = (x & 0x0000_3fff_0000_3fff) | ((x & 0x3fff_0000_3fff_0000) >> 2);
            let x = (x & 0x0000_0000_0fff_ffff) | ((x & 0x0fff_ffff_0000_0000) >> 4);
            return Ok((x, pos + len));
        }
        // Nine or ten bytes (negative int64s, 64-bit ids and hashes) when ten are left.
        if let Some(&[.., b8, b9]) = buf.get(pos..).and_then(|rest| rest.first_chunk::<10>()) {
            let x = (x & 0x007f_007f_007f_007f) | ((x & 0x7f00_7f00_7f00_7f00) >> 1);
            let x = (x & 0x0000_3fff_0000_3fff) | ((x & 0x3fff_0000_3fff_0000) >> 2);
            let x = (x & 0x0000_0000_0fff_ffff) | ((x & 0x0fff_ffff_0000_0000) >> 4);
            let x = x | (u64::from(b8 & 0x7f) << 56);
            if b8 < 0x80 {
                return Ok((x, pos + 9));
            }
            // The tenth byte: only its lowest bit lands inside 64 bits.
            if b9 < 0x80 {
                return Ok((x | (u64::from(b9) << 63), pos + 10));
            }
            return Err(DecodeError::VarintTooLong { offset: pos });
        }
    }
    varint_slow(buf, pos)
}

/// Any varint, byte by byte with bounds checks: the reference the fast path agrees with, and
/// what a varint in the last bytes of a message takes (an SDK packet ends with its timestamp
/// delta, so this is not cold).
#[inline(never)]
fn varint_slow(buf: &[u8], pos: usize) -> Result<(u64, usize), DecodeError> {
    let mut value = 0u64;
    let mut i = 0;
    while i < MAX_VARINT_SIZE {
        let Some(&b) = buf.get(pos + i) else {
            return Err(DecodeError::TruncatedVarint { offset: pos });
        };
        // `7 * i <= 63`: the shift never overflows; bits past the 64th are dropped, as
        // protozero's decoder and Perfetto's `ParseVarInt` do.
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Ok((value, pos + i + 1));
        }
        i += 1;
    }
    Err(DecodeError::VarintTooLong { offset: pos })
}

/// The payload of the length-delimited value whose length varint is at `pos`, and the offset
/// past it; `None` for a payload protozero skips (longer than `MAX_MESSAGE_LENGTH`).
#[inline(always)]
fn len_value(buf: &[u8], pos: usize) -> Result<(Option<&[u8]>, usize), DecodeError> {
    let (len, payload) = varint(buf, pos)?;
    let left = buf.len() - payload;
    if len > left as u64 {
        return Err(DecodeError::PayloadPastEnd {
            offset: payload,
            len,
        });
    }
    let end = payload + len as usize;
    if len > u64::from(MAX_MESSAGE_LENGTH) {
        return Ok((None, end));
    }
    Ok((Some(&buf[payload..end]), end))
}

/// The fixed64 value at `pos` and the offset past it.
#[inline(always)]
fn fixed64_value(buf: &[u8], pos: usize) -> Result<(u64, usize), DecodeError> {
    match buf.get(pos..).and_then(|rest| rest.first_chunk::<8>()) {
        Some(&b) => Ok((u64::from_le_bytes(b), pos + 8)),
        None => Err(DecodeError::TruncatedFixed64 { offset: pos }),
    }
}

/// The field whose tag starts at `pos < buf.len()`, and the offset past it; `None` for a field
/// protozero skips (an id above `MAX_FIELD_ID`, a payload above `MAX_MESSAGE_LENGTH`). The
/// checks and their order are `protozero::decoder`'s.
#[inline(always)]
fn field(buf: &[u8], pos: usize) -> Result<(Option<(u32, Value<'_>)>, usize), DecodeError> {
    let (tag, next) = varint(buf, pos)?;
    field_after_tag(buf, pos, tag, next)
}

/// [`field`] once its tag (`tag`, read from `start`; the value at `pos`) is known: what the
/// decoders' dispatch on whole tags falls back to for a tag it has no arm for.
#[inline(always)]
fn field_after_tag(
    buf: &[u8],
    start: usize,
    tag: u64,
    mut pos: usize,
) -> Result<(Option<(u32, Value<'_>)>, usize), DecodeError> {
    let id = tag >> 3;
    if id == 0 {
        return Err(DecodeError::ZeroFieldId { offset: start });
    }
    let value = match tag & 7 {
        0 => {
            let (v, next) = varint(buf, pos)?;
            pos = next;
            Value::Varint(v)
        }
        1 => {
            let (v, next) = fixed64_value(buf, pos)?;
            pos = next;
            Value::Fixed64(v)
        }
        2 => match len_value(buf, pos)? {
            (Some(b), end) => {
                pos = end;
                Value::Bytes(b)
            }
            (None, end) => return Ok((None, end)),
        },
        5 => {
            if buf.len() < pos + 4 {
                return Err(DecodeError::TruncatedFixed32 { offset: pos });
            }
            pos += 4;
            Value::Fixed32
        }
        w => {
            return Err(DecodeError::InvalidWireType {
                offset: start,
                wire_type: w as u8,
            })
        }
    };
    if id > u64::from(MAX_FIELD_ID) {
        return Ok((None, pos));
    }
    Ok((Some((id as u32, value)), pos))
}

/// The tag of field `id` with wire type `wire`, for matching whole tags.
const fn tag(id: u32, wire: u64) -> u64 {
    ((id as u64) << 3) | wire
}
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LEN: u64 = 2;

/// Where a repeated field's occurrences are: the tag offset of the first and their number
/// (of any wire type; the iterators pick the usable ones).
///
/// The offset is kept in 32 bits, which keeps [`TrackEvent`] small enough to be moved without
/// a call to `memcpy`; a first occurrence past 4 GiB (no payload the importer decodes is that
/// large: `MAX_MESSAGE_LENGTH` is below 2^28) is noted as offset 0, from where the
/// iterators find the same occurrences by their id.
#[derive(Clone, Copy, Debug, Default)]
struct Repeated {
    first: u32,
    count: u32,
}

impl Repeated {
    #[inline(always)]
    fn note(&mut self, at: usize) {
        if self.count == 0 {
            self.first = u32::try_from(at).unwrap_or(0);
        }
        self.count = self.count.saturating_add(1);
    }
}

/// The occurrences of field `id` in a well-formed message, from the first one on.
#[derive(Clone, Debug)]
struct Occurrences<'a> {
    buf: &'a [u8],
    pos: usize,
    id: u32,
    left: u32,
}

impl<'a> Occurrences<'a> {
    fn new(buf: &'a [u8], id: u32, r: Repeated) -> Self {
        Occurrences {
            buf,
            pos: r.first as usize,
            id,
            left: r.count,
        }
    }
}

impl<'a> Iterator for Occurrences<'a> {
    type Item = Value<'a>;

    #[inline]
    fn next(&mut self) -> Option<Value<'a>> {
        while self.left > 0 && self.pos < self.buf.len() {
            // The message was walked whole before: no field in it is malformed.
            let Ok((f, next)) = field(self.buf, self.pos) else {
                self.left = 0;
                return None;
            };
            self.pos = next;
            if let Some((id, v)) = f {
                if id == self.id {
                    self.left -= 1;
                    return Some(v);
                }
            }
        }
        None
    }
}

/// A packed decoder of one wire type's elements, and how an unpacked occurrence of the same
/// field gives its element (`None`: another wire type, ignored).
pub(crate) trait Packed<'a>: Iterator<Item = Result<u64, DecodeError>> {
    fn new(payload: &'a [u8]) -> Self;
    fn unpacked(v: Value<'a>) -> Option<u64>;
}

impl<'a> Packed<'a> for PackedVarints<'a> {
    fn new(payload: &'a [u8]) -> Self {
        PackedVarints::new(payload)
    }
    fn unpacked(v: Value<'a>) -> Option<u64> {
        match v {
            Value::Varint(v) => Some(v),
            _ => None,
        }
    }
}

impl<'a> Packed<'a> for PackedFixed64<'a> {
    fn new(payload: &'a [u8]) -> Self {
        PackedFixed64::new(payload)
    }
    fn unpacked(v: Value<'a>) -> Option<u64> {
        match v {
            Value::Fixed64(v) => Some(v),
            _ => None,
        }
    }
}

/// The elements of a repeated scalar field, packed and unpacked occurrences alike; a malformed
/// packed payload yields one error and ends the iteration (the generated views' rule).
#[derive(Clone, Debug)]
pub(crate) struct Scalars<'a, P> {
    fields: Occurrences<'a>,
    packed: Option<P>,
    /// The one element of a field that occurs once, unpacked, read when the message was
    /// decoded (`fields` is then empty).
    single: Option<u64>,
}

/// A repeated varint field's elements.
pub(crate) type Varints<'a> = Scalars<'a, PackedVarints<'a>>;
/// A repeated fixed64 field's elements.
pub(crate) type Fixed64s<'a> = Scalars<'a, PackedFixed64<'a>>;

impl<'a, P: Packed<'a>> Scalars<'a, P> {
    fn new(fields: Occurrences<'a>) -> Self {
        Scalars {
            fields,
            packed: None,
            single: None,
        }
    }
}

impl<'a, P: Packed<'a>> Iterator for Scalars<'a, P> {
    type Item = Result<u64, DecodeError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(v) = self.single.take() {
            return Some(Ok(v));
        }
        loop {
            if let Some(p) = &mut self.packed {
                match p.next() {
                    Some(Ok(v)) => return Some(Ok(v)),
                    Some(Err(e)) => {
                        self.packed = None;
                        self.fields.left = 0;
                        return Some(Err(e));
                    }
                    None => self.packed = None,
                }
            }
            if self.fields.left == 0 {
                // No occurrence left (or none at all): done without a call into the walk.
                return None;
            }
            let v = self.fields.next()?;
            if let Value::Bytes(b) = v {
                self.packed = Some(P::new(b));
            } else if let Some(v) = P::unpacked(v) {
                return Some(Ok(v));
            }
        }
    }
}

/// The payloads of a repeated message field (length-delimited occurrences only).
#[derive(Clone, Debug)]
struct Messages<'a> {
    fields: Occurrences<'a>,
}

impl<'a> Iterator for Messages<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let o = &mut self.fields;
        let want = tag(o.id, LEN);
        while o.left > 0 && o.pos < o.buf.len() {
            // The message was walked whole before: no field in it is malformed.
            let (t, at) = varint(o.buf, o.pos).ok()?;
            if t == want {
                let (b, next) = len_value(o.buf, at).ok()?;
                o.pos = next;
                if b.is_some() {
                    o.left -= 1;
                    return b;
                }
                continue;
            }
            let (f, next) = field_after_tag(o.buf, o.pos, t, at).ok()?;
            o.pos = next;
            if let Some((id, _)) = f {
                if id == o.id {
                    o.left -= 1;
                }
            }
        }
        None
    }
}

// === TracePacket ===

/// The fields of a `TracePacket` the importer reads for every event; see the module docs.
#[derive(Clone, Debug, Default)]
pub(crate) struct Packet<'a> {
    pub(crate) timestamp: Option<u64>,
    pub(crate) timestamp_clock_id: Option<u32>,
    pub(crate) trusted_packet_sequence_id: Option<u32>,
    pub(crate) sequence_flags: u32,
    pub(crate) incremental_state_cleared: bool,
    pub(crate) previous_packet_dropped: u32,
    pub(crate) first_packet_on_sequence: bool,
    pub(crate) tachyon_packets_dropped: u64,
    /// The payload of `track_event`.
    pub(crate) track_event: Option<&'a [u8]>,
    /// A field the importer reads through the generated view is present (see
    /// [`is_view_field`]): decode it with [`Packet::view`].
    pub(crate) other: bool,
}

/// The `TracePacket` fields the importer reads through the generated view (the descriptors,
/// interned data, clock snapshots, stats, config, service events, system probes, profiles and
/// compressed packets). A packet with none of them is read from [`Packet`] alone, so a field
/// the importer starts reading through the view must be added here. Other fields (the
/// service's `trusted_uid` and `trusted_pid` on every packet, `machine_id`, …) are not read.
fn is_view_field(id: u32) -> bool {
    matches!(
        id,
        2 | 6 | 7 | 9 | 12 | 33 | 35 | 37 | 43 | 44 | 50 | 54 | 59 | 60 | 61 | 66 | 69 | 90 | 133
    )
}

const PACKET_TIMESTAMP: u32 = 8;
const PACKET_TRUSTED_SEQUENCE_ID: u32 = 10;
const PACKET_TRACK_EVENT: u32 = 11;
const PACKET_SEQUENCE_FLAGS: u32 = 13;
const PACKET_INCREMENTAL_STATE_CLEARED: u32 = 41;
const PACKET_PREVIOUS_PACKET_DROPPED: u32 = 42;
const PACKET_TIMESTAMP_CLOCK_ID: u32 = 58;
const PACKET_FIRST_PACKET_ON_SEQUENCE: u32 = 87;
const PACKET_TACHYON_PACKETS_DROPPED: u32 = 1900;
const PACKET_TRUSTED_UID: u32 = 3;
const PACKET_TRUSTED_PID: u32 = 79;

impl<'a> Packet<'a> {
    /// Decodes `bytes`; fails exactly when [`TracePacketView::decode`] does.
    #[inline]
    pub(crate) fn decode(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut p = Packet::default();
        // One arm per whole tag (id and wire type) the importer reads or an SDK packet
        // carries; any other tag takes the general field reader and the rules below it.
        let mut pos = 0;
        while pos < bytes.len() {
            let start = pos;
            let (t, at) = varint(bytes, pos)?;
            pos = match t {
                PACKET_TIMESTAMP_VARINT => {
                    let (v, next) = varint(bytes, at)?;
                    p.timestamp = Some(v);
                    next
                }
                PACKET_TRUSTED_SEQUENCE_ID_VARINT => {
                    let (v, next) = varint(bytes, at)?;
                    p.trusted_packet_sequence_id = Some(v as u32);
                    next
                }
                PACKET_TRACK_EVENT_LEN => {
                    let (b, next) = len_value(bytes, at)?;
                    if b.is_some() {
                        p.track_event = b;
                    }
                    next
                }
                PACKET_SEQUENCE_FLAGS_VARINT => {
                    let (v, next) = varint(bytes, at)?;
                    p.sequence_flags = v as u32;
                    next
                }
                // The service's trusted_uid and trusted_pid: not read.
                PACKET_TRUSTED_UID_VARINT | PACKET_TRUSTED_PID_VARINT => varint(bytes, at)?.1,
                _ => {
                    let (f, next) = field_after_tag(bytes, start, t, at)?;
                    if let Some((id, v)) = f {
                        p.field(id, v);
                    }
                    next
                }
            };
        }
        Ok(p)
    }

    /// A field the tag dispatch in [`Packet::decode`] has no arm for.
    #[inline(never)]
    fn field(&mut self, id: u32, v: Value<'a>) {
        let p = self;
        match (id, v) {
            (PACKET_TIMESTAMP, Value::Varint(v)) => p.timestamp = Some(v),
            (PACKET_TRUSTED_SEQUENCE_ID, Value::Varint(v)) => {
                p.trusted_packet_sequence_id = Some(v as u32)
            }
            (PACKET_TRACK_EVENT, Value::Bytes(b)) => p.track_event = Some(b),
            (PACKET_SEQUENCE_FLAGS, Value::Varint(v)) => p.sequence_flags = v as u32,
            (PACKET_INCREMENTAL_STATE_CLEARED, Value::Varint(v)) => {
                p.incremental_state_cleared = v != 0
            }
            (PACKET_PREVIOUS_PACKET_DROPPED, Value::Varint(v)) => {
                p.previous_packet_dropped = v as u32
            }
            (PACKET_TIMESTAMP_CLOCK_ID, Value::Varint(v)) => p.timestamp_clock_id = Some(v as u32),
            (PACKET_FIRST_PACKET_ON_SEQUENCE, Value::Varint(v)) => {
                p.first_packet_on_sequence = v != 0
            }
            (PACKET_TACHYON_PACKETS_DROPPED, Value::Varint(v)) => p.tachyon_packets_dropped = v,
            (
                PACKET_TIMESTAMP
                | PACKET_TRUSTED_SEQUENCE_ID
                | PACKET_TRACK_EVENT
                | PACKET_SEQUENCE_FLAGS
                | PACKET_INCREMENTAL_STATE_CLEARED
                | PACKET_PREVIOUS_PACKET_DROPPED
                | PACKET_TIMESTAMP_CLOCK_ID
                | PACKET_FIRST_PACKET_ON_SEQUENCE
                | PACKET_TACHYON_PACKETS_DROPPED,
                _,
            ) => {} // The wrong wire type: ignored, as the views do.
            (id, _) => p.other |= is_view_field(id),
        }
    }

    /// The generated view of the same bytes, for the fields this decoder does not keep.
    pub(crate) fn view(bytes: &'a [u8]) -> Result<TracePacketView<'a>, DecodeError> {
        TracePacketView::decode(bytes)
    }
}

// === TrackEvent ===

const EVENT_CATEGORY_IIDS: u32 = 3;
const EVENT_DEBUG_ANNOTATIONS: u32 = 4;
const EVENT_TYPE: u32 = 9;
const EVENT_NAME_IID: u32 = 10;
const EVENT_TRACK_UUID: u32 = 11;
const EVENT_NAME: u32 = 23;
const EVENT_COUNTER_VALUE: u32 = 30;
const EVENT_SOURCE_LOCATION_IID: u32 = 34;
const EVENT_DOUBLE_COUNTER_VALUE: u32 = 44;
const EVENT_FLOW_IDS: u32 = 47;
const EVENT_TERMINATING_FLOW_IDS: u32 = 48;

/// The fields of a `TrackEvent` every kind of event uses (type, track, name, categories,
/// annotations, source location, counter value, flows). An event with any other field known
/// to the schema (legacy events, inline categories, thread time, extra counters, log
/// messages, call stacks, …) is read through its generated view for those
/// ([`TrackEvent::view`]).
///
/// Scalars are kept as plain values with a bit each in `present` (not `Option`s), so that the
/// struct stays below 128 bytes: a larger one is moved (out of `decode`, into the importer)
/// with a call to `memcpy`, which cost more than the rest of the move per event.
#[derive(Clone, Debug)]
pub(crate) struct TrackEvent<'a> {
    bytes: &'a [u8],
    name: Option<&'a [u8]>,
    track_uuid: u64,
    name_iid: u64,
    counter_value: i64,
    double_counter_value: f64,
    source_location_iid: u64,
    /// The first category iid, if its occurrence is an unpacked varint: with one occurrence,
    /// the categories need no second walk.
    first_category: u64,
    category_iids: Repeated,
    debug_annotations: Repeated,
    flow_ids: Repeated,
    terminating_flow_ids: Repeated,
    type_raw: i32,
    /// Which of the scalars above are present (`HAS_*`).
    present: u8,
    /// A field outside the ones above is present: read it through [`TrackEvent::view`].
    rare: bool,
}

const HAS_TYPE: u8 = 1;
const HAS_TRACK_UUID: u8 = 2;
const HAS_NAME_IID: u8 = 4;
const HAS_COUNTER_VALUE: u8 = 8;
const HAS_DOUBLE_COUNTER_VALUE: u8 = 16;
const HAS_SOURCE_LOCATION_IID: u8 = 32;
const HAS_FIRST_CATEGORY: u8 = 64;
// Moved without `memcpy` (see above), also inside `decode`'s `Result`.
const _: () = assert!(std::mem::size_of::<Result<TrackEvent<'static>, DecodeError>>() <= 128);

/// Field ids `TrackEventView` knows besides the ones [`TrackEvent`] keeps: their presence
/// makes the event take the view too. (Ids the view does not know are skipped by both.)
fn is_rare_event_field(id: u32) -> bool {
    matches!(
        id,
        1 | 2 | 6 | 8 | 12 | 16 | 17 | 20 | 21 | 22 | 31 | 33 | 36 | 42 | 45 | 46 | 52..=57
    )
}

impl<'a> TrackEvent<'a> {
    /// Decodes `bytes`; fails exactly when [`TrackEventView::decode`] does.
    #[inline]
    pub(crate) fn decode(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut e = TrackEvent {
            bytes,
            name: None,
            track_uuid: 0,
            name_iid: 0,
            counter_value: 0,
            double_counter_value: 0.0,
            source_location_iid: 0,
            first_category: 0,
            category_iids: Repeated::default(),
            debug_annotations: Repeated::default(),
            flow_ids: Repeated::default(),
            terminating_flow_ids: Repeated::default(),
            type_raw: 0,
            present: 0,
            rare: false,
        };
        let mut pos = 0;
        while pos < bytes.len() {
            let start = pos;
            let (t, at) = varint(bytes, pos)?;
            pos = match t {
                EVENT_CATEGORY_IIDS_VARINT => {
                    let (v, next) = varint(bytes, at)?;
                    if e.category_iids.count == 0 {
                        e.first_category = v;
                        e.present |= HAS_FIRST_CATEGORY;
                    }
                    e.category_iids.note(start);
                    next
                }
                EVENT_DEBUG_ANNOTATIONS_LEN => {
                    let (b, next) = len_value(bytes, at)?;
                    if b.is_some() {
                        e.debug_annotations.note(start);
                    }
                    next
                }
                EVENT_TYPE_VARINT => {
                    let (v, next) = varint(bytes, at)?;
                    e.set_type(v);
                    next
                }
                EVENT_NAME_IID_VARINT => {
                    let (v, next) = varint(bytes, at)?;
                    e.set_name_iid(v);
                    next
                }
                EVENT_TRACK_UUID_VARINT => {
                    let (v, next) = varint(bytes, at)?;
                    e.set_track_uuid(v);
                    next
                }
                EVENT_SOURCE_LOCATION_IID_VARINT => {
                    let (v, next) = varint(bytes, at)?;
                    e.set_source_location_iid(v);
                    next
                }
                _ => {
                    let (f, next) = field_after_tag(bytes, start, t, at)?;
                    if let Some((id, v)) = f {
                        e.field(id, v, start);
                    }
                    next
                }
            };
        }
        Ok(e)
    }

    /// A field the tag dispatch in [`TrackEvent::decode`] has no arm for (its tag at `at`).
    #[inline(never)]
    fn field(&mut self, id: u32, v: Value<'a>, at: usize) {
        let e = self;
        match (id, v) {
            (EVENT_CATEGORY_IIDS, v) => {
                if let (0, Value::Varint(v)) = (e.category_iids.count, v) {
                    e.first_category = v;
                    e.present |= HAS_FIRST_CATEGORY;
                }
                e.category_iids.note(at)
            }
            (EVENT_DEBUG_ANNOTATIONS, _) => e.debug_annotations.note(at),
            (EVENT_FLOW_IDS, _) => e.flow_ids.note(at),
            (EVENT_TERMINATING_FLOW_IDS, _) => e.terminating_flow_ids.note(at),
            (EVENT_TYPE, Value::Varint(v)) => e.set_type(v),
            (EVENT_NAME_IID, Value::Varint(v)) => e.set_name_iid(v),
            (EVENT_TRACK_UUID, Value::Varint(v)) => e.set_track_uuid(v),
            (EVENT_NAME, Value::Bytes(b)) => e.name = Some(b),
            (EVENT_COUNTER_VALUE, Value::Varint(v)) => {
                e.counter_value = v as i64;
                e.present |= HAS_COUNTER_VALUE;
            }
            (EVENT_SOURCE_LOCATION_IID, Value::Varint(v)) => e.set_source_location_iid(v),
            (EVENT_DOUBLE_COUNTER_VALUE, Value::Fixed64(v)) => {
                e.double_counter_value = f64::from_bits(v);
                e.present |= HAS_DOUBLE_COUNTER_VALUE;
            }
            (id, _) => e.rare |= is_rare_event_field(id),
        }
    }

    /// The event's generated view, if it has fields this decoder does not keep (`None`
    /// otherwise: those fields are all absent).
    pub(crate) fn view(&self) -> Option<TrackEventView<'a>> {
        // The bytes decoded once already: the view cannot fail on them.
        self.rare
            .then(|| TrackEventView::decode(self.bytes).ok())
            .flatten()
    }

    #[inline(always)]
    fn set_type(&mut self, v: u64) {
        self.type_raw = v as i32;
        self.present |= HAS_TYPE;
    }
    #[inline(always)]
    fn set_track_uuid(&mut self, v: u64) {
        self.track_uuid = v;
        self.present |= HAS_TRACK_UUID;
    }
    #[inline(always)]
    fn set_name_iid(&mut self, v: u64) {
        self.name_iid = v;
        self.present |= HAS_NAME_IID;
    }
    #[inline(always)]
    fn set_source_location_iid(&mut self, v: u64) {
        self.source_location_iid = v;
        self.present |= HAS_SOURCE_LOCATION_IID;
    }

    // A value is only ever set together with its bit, so an absent one reads as the
    // default (0), as the views' accessors give it.
    pub(crate) fn type_raw(&self) -> i32 {
        self.type_raw
    }
    pub(crate) fn has_type(&self) -> bool {
        self.present & HAS_TYPE != 0
    }
    pub(crate) fn track_uuid(&self) -> u64 {
        self.track_uuid
    }
    pub(crate) fn has_track_uuid(&self) -> bool {
        self.present & HAS_TRACK_UUID != 0
    }
    pub(crate) fn name_iid(&self) -> u64 {
        self.name_iid
    }
    pub(crate) fn has_name_iid(&self) -> bool {
        self.present & HAS_NAME_IID != 0
    }
    pub(crate) fn name_bytes(&self) -> &'a [u8] {
        self.name.unwrap_or_default()
    }
    pub(crate) fn has_name(&self) -> bool {
        self.name.is_some()
    }
    pub(crate) fn counter_value(&self) -> i64 {
        self.counter_value
    }
    pub(crate) fn has_counter_value(&self) -> bool {
        self.present & HAS_COUNTER_VALUE != 0
    }
    pub(crate) fn double_counter_value(&self) -> f64 {
        self.double_counter_value
    }
    pub(crate) fn has_double_counter_value(&self) -> bool {
        self.present & HAS_DOUBLE_COUNTER_VALUE != 0
    }
    pub(crate) fn source_location_iid(&self) -> u64 {
        self.source_location_iid
    }
    pub(crate) fn has_source_location_iid(&self) -> bool {
        self.present & HAS_SOURCE_LOCATION_IID != 0
    }
    pub(crate) fn category_iids(&self) -> Varints<'a> {
        if self.category_iids.count == 1 && self.present & HAS_FIRST_CATEGORY != 0 {
            let v = self.first_category;
            let mut one = Scalars::new(Occurrences::new(self.bytes, 0, Repeated::default()));
            one.single = Some(v);
            return one;
        }
        Scalars::new(Occurrences::new(
            self.bytes,
            EVENT_CATEGORY_IIDS,
            self.category_iids,
        ))
    }
    /// Whether the event has any `flow_ids` or `terminating_flow_ids` occurrence (most have
    /// none, and then the flow arena is not touched).
    #[inline]
    pub(crate) fn has_flows(&self) -> bool {
        self.flow_ids.count != 0 || self.terminating_flow_ids.count != 0
    }
    pub(crate) fn flow_ids(&self) -> Fixed64s<'a> {
        Scalars::new(Occurrences::new(self.bytes, EVENT_FLOW_IDS, self.flow_ids))
    }
    pub(crate) fn terminating_flow_ids(&self) -> Fixed64s<'a> {
        Scalars::new(Occurrences::new(
            self.bytes,
            EVENT_TERMINATING_FLOW_IDS,
            self.terminating_flow_ids,
        ))
    }
    /// The bytes of each debug annotation, undecoded.
    pub(crate) fn debug_annotation_bytes(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        Messages {
            fields: Occurrences::new(self.bytes, EVENT_DEBUG_ANNOTATIONS, self.debug_annotations),
        }
    }
    /// The debug annotations, each decoded as it is reached (a malformed one is an error and
    /// the iteration goes on, as with the view).
    pub(crate) fn debug_annotations(
        &self,
    ) -> impl Iterator<Item = Result<Annotation<'a>, DecodeError>> + 'a {
        Messages {
            fields: Occurrences::new(self.bytes, EVENT_DEBUG_ANNOTATIONS, self.debug_annotations),
        }
        .map(Annotation::decode)
    }
}

// === DebugAnnotation ===

const ANN_NAME_IID: u32 = 1;
const ANN_BOOL: u32 = 2;
const ANN_UINT: u32 = 3;
const ANN_INT: u32 = 4;
const ANN_DOUBLE: u32 = 5;
const ANN_STRING: u32 = 6;
const ANN_POINTER: u32 = 7;
const ANN_NAME: u32 = 10;
const ANN_STRING_IID: u32 = 17;

// The whole tags the decoders' dispatch has arms for.
const ANN_DOUBLE_FIXED64: u64 = tag(ANN_DOUBLE, FIXED64);
const ANN_INT_VARINT: u64 = tag(ANN_INT, VARINT);
const ANN_NAME_IID_VARINT: u64 = tag(ANN_NAME_IID, VARINT);
const ANN_STRING_IID_VARINT: u64 = tag(ANN_STRING_IID, VARINT);
const ANN_STRING_LEN: u64 = tag(ANN_STRING, LEN);
const ANN_UINT_VARINT: u64 = tag(ANN_UINT, VARINT);
const EVENT_CATEGORY_IIDS_VARINT: u64 = tag(EVENT_CATEGORY_IIDS, VARINT);
const EVENT_DEBUG_ANNOTATIONS_LEN: u64 = tag(EVENT_DEBUG_ANNOTATIONS, LEN);
const EVENT_NAME_IID_VARINT: u64 = tag(EVENT_NAME_IID, VARINT);
const EVENT_SOURCE_LOCATION_IID_VARINT: u64 = tag(EVENT_SOURCE_LOCATION_IID, VARINT);
const EVENT_TRACK_UUID_VARINT: u64 = tag(EVENT_TRACK_UUID, VARINT);
const EVENT_TYPE_VARINT: u64 = tag(EVENT_TYPE, VARINT);
const PACKET_SEQUENCE_FLAGS_VARINT: u64 = tag(PACKET_SEQUENCE_FLAGS, VARINT);
const PACKET_TIMESTAMP_VARINT: u64 = tag(PACKET_TIMESTAMP, VARINT);
const PACKET_TRACK_EVENT_LEN: u64 = tag(PACKET_TRACK_EVENT, LEN);
const PACKET_TRUSTED_PID_VARINT: u64 = tag(PACKET_TRUSTED_PID, VARINT);
const PACKET_TRUSTED_SEQUENCE_ID_VARINT: u64 = tag(PACKET_TRUSTED_SEQUENCE_ID, VARINT);
const PACKET_TRUSTED_UID_VARINT: u64 = tag(PACKET_TRUSTED_UID, VARINT);

/// The name and scalar value of a `DebugAnnotation`. One with any other field known to the
/// schema (nested values, dictionaries, arrays, JSON, proto values) is read through its
/// generated view ([`Annotation::view`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct Annotation<'a> {
    pub(crate) name_iid: Option<u64>,
    pub(crate) name: Option<&'a [u8]>,
    pub(crate) bool_value: Option<bool>,
    pub(crate) uint_value: Option<u64>,
    pub(crate) int_value: Option<i64>,
    pub(crate) double_value: Option<f64>,
    pub(crate) string_value: Option<&'a [u8]>,
    pub(crate) string_value_iid: Option<u64>,
    pub(crate) pointer_value: Option<u64>,
    /// A field outside the ones above is present: read the annotation through
    /// [`Annotation::view`].
    pub(crate) rare: bool,
    bytes: &'a [u8],
}

impl<'a> Annotation<'a> {
    /// Decodes `bytes`; fails exactly when [`DebugAnnotationView::decode`] does.
    #[inline]
    pub(crate) fn decode(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut a = Annotation {
            bytes,
            ..Annotation::default()
        };
        let mut pos = 0;
        while pos < bytes.len() {
            let start = pos;
            let (t, at) = varint(bytes, pos)?;
            pos = match t {
                ANN_NAME_IID_VARINT => {
                    let (v, next) = varint(bytes, at)?;
                    a.name_iid = Some(v);
                    next
                }
                ANN_INT_VARINT => {
                    let (v, next) = varint(bytes, at)?;
                    a.int_value = Some(v as i64);
                    next
                }
                ANN_UINT_VARINT => {
                    let (v, next) = varint(bytes, at)?;
                    a.uint_value = Some(v);
                    next
                }
                ANN_STRING_LEN => {
                    let (b, next) = len_value(bytes, at)?;
                    if b.is_some() {
                        a.string_value = b;
                    }
                    next
                }
                ANN_STRING_IID_VARINT => {
                    let (v, next) = varint(bytes, at)?;
                    a.string_value_iid = Some(v);
                    next
                }
                ANN_DOUBLE_FIXED64 => {
                    let (v, next) = fixed64_value(bytes, at)?;
                    a.double_value = Some(f64::from_bits(v));
                    next
                }
                _ => {
                    let (f, next) = field_after_tag(bytes, start, t, at)?;
                    if let Some((id, v)) = f {
                        a.field(id, v);
                    }
                    next
                }
            };
        }
        Ok(a)
    }

    /// A field the tag dispatch in [`Annotation::decode`] has no arm for.
    #[inline(never)]
    fn field(&mut self, id: u32, v: Value<'a>) {
        let a = self;
        match (id, v) {
            (ANN_NAME_IID, Value::Varint(v)) => a.name_iid = Some(v),
            (ANN_NAME, Value::Bytes(b)) => a.name = Some(b),
            (ANN_BOOL, Value::Varint(v)) => a.bool_value = Some(v != 0),
            (ANN_UINT, Value::Varint(v)) => a.uint_value = Some(v),
            (ANN_INT, Value::Varint(v)) => a.int_value = Some(v as i64),
            (ANN_DOUBLE, Value::Fixed64(v)) => a.double_value = Some(f64::from_bits(v)),
            (ANN_STRING, Value::Bytes(b)) => a.string_value = Some(b),
            (ANN_STRING_IID, Value::Varint(v)) => a.string_value_iid = Some(v),
            (ANN_POINTER, Value::Varint(v)) => a.pointer_value = Some(v),
            (8 | 9 | 11..=14 | 16, _) => a.rare = true,
            _ => {}
        }
    }

    /// The annotation's generated view, if it has fields this decoder does not keep.
    pub(crate) fn view(&self) -> Option<DebugAnnotationView<'a>> {
        self.rare
            .then(|| DebugAnnotationView::decode(self.bytes).ok())
            .flatten()
    }
}

// === Trace framing ===

/// The `Trace.packet` field at `pos` of a `Trace` message, in the common form (its one-byte
/// tag, a length within the buffer and at most `MAX_MESSAGE_LENGTH`): the packet's bytes and
/// the offset past them. `None` for anything else (another field, a framing error, a packet
/// protozero skips), which the caller reads with `ProtoDecoder` and its rules: this is the
/// same reading as `ProtoDecoder::read_field` on the cases it accepts.
#[inline(always)]
pub(crate) fn trace_packet(trace: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    const TRACE_PACKET: u8 = tag(1, LEN) as u8;
    if *trace.get(pos)? != TRACE_PACKET {
        return None;
    }
    match len_value(trace, pos + 1) {
        Ok((Some(packet), next)) => Some((packet, next)),
        _ => None,
    }
}

// === The decode-only walk ===

/// Walks a whole trace (`Trace.packet` fields) with the importer's decoders, reading the
/// fields the import bench's `decode_only` baseline reads with the generated views (packet
/// timestamp, clock, sequence id and flags, and each TrackEvent's type, track, name, counter
/// value, categories, flows and annotations' name and scalar values), and nothing else: what
/// decoding costs the import. Stops at the first framing error. Returns a checksum, so that
/// the walk cannot be optimised away.
pub fn decode_walk(trace: &[u8]) -> u64 {
    const TRACE_PACKET: u64 = tag(1, LEN);
    let mut sum = 0u64;
    let mut pos = 0;
    while pos < trace.len() {
        let start = pos;
        let Ok((t, at)) = varint(trace, pos) else {
            break;
        };
        let read = if t == TRACE_PACKET {
            len_value(trace, at)
        } else {
            field_after_tag(trace, start, t, at).map(|(_, next)| (None, next))
        };
        let Ok((packet, next)) = read else {
            break;
        };
        pos = next;
        if let Some(bytes) = packet {
            sum = sum.wrapping_add(walk_packet(bytes));
        }
    }
    sum
}

/// [`decode_walk`]'s reading of one packet: its checksum.
#[inline(always)]
fn walk_packet(bytes: &[u8]) -> u64 {
    let Ok(p) = Packet::decode(bytes) else {
        return 0;
    };
    let mut sum = p
        .timestamp
        .unwrap_or(0)
        .wrapping_add(u64::from(p.timestamp_clock_id.unwrap_or(0)))
        .wrapping_add(u64::from(p.trusted_packet_sequence_id.unwrap_or(0)))
        .wrapping_add(u64::from(p.sequence_flags))
        .wrapping_add(u64::from(p.previous_packet_dropped));
    let Some(Ok(e)) = p.track_event.map(TrackEvent::decode) else {
        return sum;
    };
    sum = sum
        .wrapping_add(e.type_raw() as u64)
        .wrapping_add(e.track_uuid())
        .wrapping_add(e.name_iid())
        .wrapping_add(e.name_bytes().len() as u64)
        .wrapping_add(e.counter_value() as u64);
    for c in e.category_iids().flatten() {
        sum = sum.wrapping_add(c);
    }
    for f in e.flow_ids().flatten() {
        sum = sum.wrapping_add(f);
    }
    for a in e.debug_annotations().flatten() {
        sum = sum
            .wrapping_add(a.name_iid.unwrap_or(0))
            .wrapping_add(a.int_value.unwrap_or(0) as u64)
            .wrapping_add(a.string_value.map_or(0, <[u8]>::len) as u64);
    }
    sum
}

// === Checking against the views ===

/// Whether the lazy decoders read `bytes` as the generated views do, taken as a
/// `TracePacket`, a `TrackEvent` and a `DebugAnnotation` (and, in each, the nested events and
/// annotations): `Err` names the first difference. For the property tests and the
/// `lazy_views` fuzz target.
pub fn agrees_with_views(bytes: &[u8]) -> Result<(), String> {
    packet_agrees(bytes)?;
    event_agrees(bytes)?;
    annotation_agrees(bytes, 0)
}

macro_rules! same {
    ($what:expr, $lazy:expr, $view:expr) => {{
        let (l, v) = ($lazy, $view);
        if l != v {
            return Err(format!("{}: lazy {:?}, view {:?}", $what, l, v));
        }
    }};
}

/// Elements of a repeated field as options (errors carry offsets relative to different
/// slices in the two decoders; whether and where one occurs is what matters).
fn elems<T>(it: impl Iterator<Item = Result<T, DecodeError>>) -> Vec<Option<T>> {
    it.map(Result::ok).collect()
}

fn packet_agrees(bytes: &[u8]) -> Result<(), String> {
    let lazy = Packet::decode(bytes);
    let view = TracePacketView::decode(bytes);
    same!("packet decodes", lazy.is_ok(), view.is_ok());
    let (Ok(p), Ok(v)) = (lazy, view) else {
        return Ok(());
    };
    same!(
        "timestamp",
        p.timestamp,
        v.has_timestamp().then(|| v.timestamp())
    );
    same!(
        "timestamp_clock_id",
        p.timestamp_clock_id,
        v.has_timestamp_clock_id().then(|| v.timestamp_clock_id())
    );
    same!(
        "trusted_packet_sequence_id",
        p.trusted_packet_sequence_id,
        v.has_trusted_packet_sequence_id()
            .then(|| v.trusted_packet_sequence_id())
    );
    same!("sequence_flags", p.sequence_flags, v.sequence_flags());
    same!(
        "incremental_state_cleared",
        p.incremental_state_cleared,
        v.incremental_state_cleared()
    );
    same!(
        "previous_packet_dropped",
        p.previous_packet_dropped,
        v.previous_packet_dropped()
    );
    same!(
        "first_packet_on_sequence",
        p.first_packet_on_sequence,
        v.first_packet_on_sequence()
    );
    same!(
        "tachyon_packets_dropped",
        p.tachyon_packets_dropped,
        v.tachyon_packets_dropped()
    );
    same!(
        "has track_event",
        p.track_event.is_some(),
        v.has_track_event()
    );
    if let (true, Ok(te)) = (v.has_track_event(), v.track_event()) {
        same!("track_event", p.track_event, Some(te.bytes()));
    }
    let other = v.has_trace_packet_defaults()
        || v.has_interned_data()
        || v.has_clock_snapshot()
        || v.has_trace_stats()
        || v.has_trace_config()
        || v.has_track_event_range_of_interest()
        || v.has_service_event()
        || v.has_track_descriptor()
        || v.has_thread_descriptor()
        || v.has_process_descriptor()
        || v.has_process_tree()
        || v.has_sys_stats()
        || v.has_process_stats()
        || v.has_profile_packet()
        || v.has_perf_sample()
        || v.has_streaming_profile_packet()
        || v.has_module_symbols()
        || v.has_compressed_packets()
        || v.has_zstd_compressed_packets();
    if other && !p.other {
        return Err("a packet with other fields was not marked `other`".into());
    }
    match p.track_event {
        Some(event) => event_agrees(event),
        None => Ok(()),
    }
}

fn event_agrees(bytes: &[u8]) -> Result<(), String> {
    let lazy = TrackEvent::decode(bytes);
    let view = TrackEventView::decode(bytes);
    same!("event decodes", lazy.is_ok(), view.is_ok());
    let (Ok(e), Ok(v)) = (lazy, view) else {
        return Ok(());
    };
    same!("has type", e.has_type(), v.has_type());
    same!("type", e.type_raw(), v.type_raw());
    same!("has track_uuid", e.has_track_uuid(), v.has_track_uuid());
    same!("track_uuid", e.track_uuid(), v.track_uuid());
    same!("has name_iid", e.has_name_iid(), v.has_name_iid());
    same!("name_iid", e.name_iid(), v.name_iid());
    same!("has name", e.has_name(), v.has_name());
    same!("name", e.name_bytes(), v.name_bytes());
    same!(
        "has counter_value",
        e.has_counter_value(),
        v.has_counter_value()
    );
    same!("counter_value", e.counter_value(), v.counter_value());
    same!(
        "has double_counter_value",
        e.has_double_counter_value(),
        v.has_double_counter_value()
    );
    same!(
        "double_counter_value",
        e.double_counter_value().to_bits(),
        v.double_counter_value().to_bits()
    );
    same!(
        "has source_location_iid",
        e.has_source_location_iid(),
        v.has_source_location_iid()
    );
    same!(
        "source_location_iid",
        e.source_location_iid(),
        v.source_location_iid()
    );
    same!(
        "category_iids",
        elems(e.category_iids()),
        elems(v.category_iids())
    );
    same!("flow_ids", elems(e.flow_ids()), elems(v.flow_ids()));
    same!(
        "terminating_flow_ids",
        elems(e.terminating_flow_ids()),
        elems(v.terminating_flow_ids())
    );
    let lazy_anns: Vec<_> = e.debug_annotations().collect();
    let view_anns: Vec<_> = v.debug_annotations().collect();
    same!("annotations", lazy_anns.len(), view_anns.len());
    for (l, w) in lazy_anns.iter().zip(&view_anns) {
        same!("annotation decodes", l.is_ok(), w.is_ok());
        if let Ok(w) = w {
            annotation_agrees(w.bytes(), 1)?;
        }
    }
    let rare = v.has_legacy_event()
        || v.has_log_message()
        || v.has_timestamp_delta_us()
        || v.has_timestamp_absolute_us()
        || v.has_thread_time_delta_us()
        || v.has_thread_time_absolute_us()
        || v.has_thread_instruction_count_delta()
        || v.has_thread_instruction_count_absolute()
        || v.has_source_location()
        || v.has_callstack()
        || v.has_callstack_iid()
        || v.has_callstack_weight()
        || v.has_correlation_id()
        || v.has_correlation_id_str()
        || v.has_correlation_id_str_iid()
        || v.categories().count() > 0
        || v.extra_counter_values().count() > 0
        || v.extra_counter_track_uuids().count() > 0
        || v.extra_double_counter_values().count() > 0
        || v.extra_double_counter_track_uuids().count() > 0
        || v.flow_ids_old().count() > 0
        || v.terminating_flow_ids_old().count() > 0;
    if rare && e.view().is_none() {
        return Err("an event with rare fields has no view".into());
    }
    Ok(())
}

/// Nested annotations (dictionary entries, array elements) are compared too, `depth` levels
/// down at most 8.
fn annotation_agrees(bytes: &[u8], depth: u32) -> Result<(), String> {
    let lazy = Annotation::decode(bytes);
    let view = DebugAnnotationView::decode(bytes);
    same!("annotation decodes", lazy.is_ok(), view.is_ok());
    let (Ok(a), Ok(v)) = (lazy, view) else {
        return Ok(());
    };
    same!(
        "name_iid",
        a.name_iid,
        v.has_name_iid().then(|| v.name_iid())
    );
    same!("name", a.name, v.has_name().then(|| v.name_bytes()));
    same!(
        "bool_value",
        a.bool_value,
        v.has_bool_value().then(|| v.bool_value())
    );
    same!(
        "uint_value",
        a.uint_value,
        v.has_uint_value().then(|| v.uint_value())
    );
    same!(
        "int_value",
        a.int_value,
        v.has_int_value().then(|| v.int_value())
    );
    same!(
        "double_value",
        a.double_value.map(f64::to_bits),
        v.has_double_value().then(|| v.double_value().to_bits())
    );
    same!(
        "string_value",
        a.string_value,
        v.has_string_value().then(|| v.string_value_bytes())
    );
    same!(
        "string_value_iid",
        a.string_value_iid,
        v.has_string_value_iid().then(|| v.string_value_iid())
    );
    same!(
        "pointer_value",
        a.pointer_value,
        v.has_pointer_value().then(|| v.pointer_value())
    );
    let rare = v.has_legacy_json_value()
        || v.has_nested_value()
        || v.dict_entries().count() > 0
        || v.array_values().count() > 0
        || v.has_proto_type_name()
        || v.has_proto_type_name_iid()
        || v.has_proto_value();
    if rare && a.view().is_none() {
        return Err("an annotation with rare fields has no view".into());
    }
    if depth < 8 {
        for nested in v.dict_entries().chain(v.array_values()).flatten() {
            annotation_agrees(nested.bytes(), depth + 1)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

//! The SDK's most common packets encoded by hand on the stack, for
//! [`TraceWriter::write_small_packet`](crate::TraceWriter::write_small_packet).
//!
//! Every packet here is what the generated writers would produce for the same fields (the
//! tests decode both with the generated views), in a fixed 64-byte block whose first byte is
//! the packet length. The layout of a slice begin on the thread's track:
//!
//! ```text
//!  len │ 40 <delta>          timestamp (8), on the sequence's incremental clock
//!      │ 5a <n>              track_event (11) {
//!      │   18 <iid>            category_iids (3)        (categorized events only)
//!      │   48 01               type (9) = SLICE_BEGIN
//!      │   50 <iid>            name_iid (10)
//!      │   b0 02 <iid>         source_location_iid (34)
//!      │                     }
//!      │ 68 02               sequence_flags (13) = SEQ_NEEDS_INCREMENTAL_STATE
//! ```

/// Size of the block: the longest packet below (a counter with a 10-byte track uuid and a
/// 10-byte value: 1 + 11 + 2 + 24 + 2 = 40 bytes) fits with room to spare.
pub(crate) const BLOCK: usize = 64;

pub(crate) type Block = [u8; BLOCK];

const TAG_TIMESTAMP: u8 = 8 << 3;
const TAG_TRACK_EVENT: u8 = (11 << 3) | 2;
const TAG_SEQUENCE_FLAGS: u8 = 13 << 3;
const TAG_CATEGORY_IIDS: u8 = 3 << 3;
const TAG_TYPE: u8 = 9 << 3;
const TAG_NAME_IID: u8 = 10 << 3;
const TAG_TRACK_UUID: u8 = 11 << 3;
/// Field 34 (`source_location_iid`), varint: 34 << 3 = 272, two tag bytes.
const TAG_SOURCE_LOCATION_IID: [u8; 2] = [0x90, 0x02];
/// Field 30 (`counter_value`), varint: 240.
const TAG_COUNTER_VALUE: [u8; 2] = [0xf0, 0x01];
/// Field 44 (`double_counter_value`), fixed64: (44 << 3) | 1 = 353.
const TAG_DOUBLE_COUNTER_VALUE: [u8; 2] = [0xe1, 0x02];

/// `SEQ_NEEDS_INCREMENTAL_STATE`.
pub(crate) const SEQ_NEEDS_INCREMENTAL_STATE: u8 = 2;

/// TrackEvent types (`track_event.proto`).
pub(crate) const TYPE_SLICE_BEGIN: u8 = 1;
pub(crate) const TYPE_SLICE_END: u8 = 2;
pub(crate) const TYPE_INSTANT: u8 = 3;
pub(crate) const TYPE_COUNTER: u8 = 4;

/// A cursor over the block; positions stay below [`BLOCK`] by construction (the longest
/// packet is 40 bytes), and indexing checks it anyway.
struct Cursor {
    buf: Block,
    pos: usize,
}

impl Cursor {
    #[inline(always)]
    fn new() -> Self {
        // Byte 0 is the length, filled in by `finish`.
        Cursor {
            buf: [0; BLOCK],
            pos: 1,
        }
    }

    #[inline(always)]
    fn byte(&mut self, b: u8) {
        self.buf[self.pos] = b;
        self.pos += 1;
    }

    #[inline(always)]
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.byte(v as u8 | 0x80);
            v >>= 7;
        }
        self.byte(v as u8);
    }

    #[inline(always)]
    fn finish(mut self) -> Block {
        self.byte(TAG_SEQUENCE_FLAGS);
        self.byte(SEQ_NEEDS_INCREMENTAL_STATE);
        self.buf[0] = (self.pos - 1) as u8;
        self.buf
    }

    /// Starts the track event; returns where its one-byte length goes.
    #[inline(always)]
    fn open_event(&mut self, delta: u64) -> usize {
        self.byte(TAG_TIMESTAMP);
        self.varint(delta);
        self.byte(TAG_TRACK_EVENT);
        self.byte(0);
        self.pos
    }

    #[inline(always)]
    fn close_event(&mut self, start: usize) {
        // Track events here are at most 27 bytes: a one-byte length.
        self.buf[start - 1] = (self.pos - start) as u8;
    }
}

/// A slice begin or an instant on the sequence's default track (the thread's), named by the
/// callsite's interned iids.
#[inline(always)]
pub(crate) fn named_event(delta: u64, ty: u8, iid: u64, categorized: bool) -> Block {
    let mut c = Cursor::new();
    let start = c.open_event(delta);
    if categorized {
        c.byte(TAG_CATEGORY_IIDS);
        c.varint(iid);
    }
    c.byte(TAG_TYPE);
    c.byte(ty);
    c.byte(TAG_NAME_IID);
    c.varint(iid);
    c.byte(TAG_SOURCE_LOCATION_IID[0]);
    c.byte(TAG_SOURCE_LOCATION_IID[1]);
    c.varint(iid);
    c.close_event(start);
    c.finish()
}

/// A slice end on the default track.
#[inline(always)]
pub(crate) fn slice_end(delta: u64) -> Block {
    let mut c = Cursor::new();
    let start = c.open_event(delta);
    c.byte(TAG_TYPE);
    c.byte(TYPE_SLICE_END);
    c.close_event(start);
    c.finish()
}

/// A counter value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CounterSample {
    /// `counter_value` (int64).
    Int(i64),
    /// `double_counter_value`.
    Double(f64),
}

/// A counter event on `track_uuid`.
#[inline(always)]
pub(crate) fn counter(delta: u64, track_uuid: u64, value: CounterSample) -> Block {
    let mut c = Cursor::new();
    let start = c.open_event(delta);
    c.byte(TAG_TYPE);
    c.byte(TYPE_COUNTER);
    c.byte(TAG_TRACK_UUID);
    c.varint(track_uuid);
    match value {
        CounterSample::Int(v) => {
            c.byte(TAG_COUNTER_VALUE[0]);
            c.byte(TAG_COUNTER_VALUE[1]);
            // int64 is a varint of the two's complement (10 bytes when negative).
            c.varint(v as u64);
        }
        CounterSample::Double(v) => {
            c.byte(TAG_DOUBLE_COUNTER_VALUE[0]);
            c.byte(TAG_DOUBLE_COUNTER_VALUE[1]);
            for b in v.to_le_bytes() {
                c.byte(b);
            }
        }
    }
    c.close_event(start);
    c.finish()
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
            (1 << 40, u32::MAX as u64, true),
        ] {
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

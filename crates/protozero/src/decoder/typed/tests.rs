//! Unit tests of `TypedDecoder` and its repeated iterators.

use super::*;
use crate::wire::{encode_varint, MAX_VARINT_SIZE};

/// A tiny test encoder: each call appends one field.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint_raw(&mut self, v: u64) -> &mut Self {
        let mut buf = [0u8; MAX_VARINT_SIZE];
        let n = encode_varint(v, &mut buf);
        self.0.extend_from_slice(&buf[..n]);
        self
    }
    fn varint(&mut self, id: u32, v: u64) -> &mut Self {
        self.varint_raw(u64::from(id) << 3).varint_raw(v)
    }
    fn fixed32(&mut self, id: u32, v: u32) -> &mut Self {
        self.varint_raw((u64::from(id) << 3) | 5);
        self.0.extend(v.to_le_bytes());
        self
    }
    fn fixed64(&mut self, id: u32, v: u64) -> &mut Self {
        self.varint_raw((u64::from(id) << 3) | 1);
        self.0.extend(v.to_le_bytes());
        self
    }
    fn bytes(&mut self, id: u32, b: &[u8]) -> &mut Self {
        self.varint_raw((u64::from(id) << 3) | 2)
            .varint_raw(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }
    fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn done(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

/// The generator's mapping for a message with fields 1, 500 and 3: slots 0, 1, 2.
fn slots(id: u32) -> Option<usize> {
    match id {
        1 => Some(0),
        500 => Some(1),
        3 => Some(2),
        _ => None,
    }
}

fn values<'a>(it: impl Iterator<Item = Field<'a>>) -> Vec<u64> {
    it.map(|f| f.as_u64()).collect()
}

#[test]
fn last_one_wins_and_counts() {
    let b = Msg::default()
        .varint(1, 10)
        .varint(500, 5)
        .varint(1, 11)
        .varint(1, 12)
        .done();
    let d = TypedDecoder::<3>::new(&b, slots);
    assert_eq!(d.error(), None);
    assert_eq!(d.get(0), Some(Field::new(1, FieldValue::Varint(12))));
    assert_eq!(d.count(0), 3);
    assert!(d.has(0));
    assert_eq!(d.get(1).unwrap().as_u64(), 5);
    assert_eq!(d.count(1), 1);
    assert!(!d.has(2));
    assert_eq!(d.get(2), None);
    assert_eq!(d.count(2), 0);
    assert_eq!(d.bytes(), &b[..]);
}

#[test]
fn repeated_yields_every_occurrence_in_wire_order() {
    let b = Msg::default()
        .varint(7, 0)
        .varint(1, 3)
        .bytes(500, b"x")
        .varint(1, 1)
        .varint(9, 9)
        .varint(1, 2)
        .done();
    let d = TypedDecoder::<3>::new(&b, slots);
    let rep = d.repeated(0);
    assert_eq!(rep.len(), 3);
    assert_eq!(values(rep), [3, 1, 2]);
    assert_eq!(
        d.repeated(1).map(|f| f.as_bytes()).collect::<Vec<_>>(),
        [b"x"]
    );
    assert_eq!(d.repeated(2).count(), 0);
    // The iterator can be cloned and restarted independently.
    let mut rep = d.repeated(0);
    rep.next();
    assert_eq!(values(rep.clone()), [1, 2]);
    assert_eq!(values(rep), [1, 2]);
}

#[test]
fn unknown_fields_are_skipped() {
    let b = Msg::default()
        .varint(2, 1)
        .bytes(4, b"zz")
        .varint(1, 8)
        .fixed32(99, 1)
        .done();
    let d = TypedDecoder::<3>::new(&b, slots);
    assert_eq!(d.error(), None);
    assert_eq!((0..3).map(|s| d.count(s)).collect::<Vec<_>>(), [1, 0, 0]);
    assert_eq!(d.get(0).unwrap().as_u64(), 8);
}

#[test]
fn slots_out_of_range_never_panic() {
    let b = Msg::default().varint(1, 1).varint(2, 2).done();
    // slot_of maps id 2 to slot 5 of a 3-slot decoder: treated as unknown.
    let d = TypedDecoder::<3>::new(&b, |id| Some(if id == 2 { 5 } else { 0 }));
    assert_eq!(d.count(0), 1);
    for slot in [3, 5, usize::MAX] {
        assert!(!d.has(slot));
        assert_eq!(d.get(slot), None);
        assert_eq!(d.count(slot), 0);
        assert_eq!(d.repeated(slot).count(), 0);
        assert_eq!(d.repeated_varints(slot).count(), 0);
        assert_eq!(d.repeated_fixed32(slot).count(), 0);
        assert_eq!(d.repeated_fixed64(slot).count(), 0);
    }
    // A decoder with no slots at all.
    let d = TypedDecoder::<0>::new(&b, |_| Some(0));
    assert!(!d.has(0));
    assert_eq!(d.error(), None);
}

#[test]
fn stops_at_the_first_malformed_field() {
    // 1: 1, 500: 2, then wire type 3, then 1: 3 which must not be seen.
    let b = Msg::default()
        .varint(1, 1)
        .varint(500, 2)
        .raw(&[0x0b])
        .varint(1, 3)
        .done();
    // 08 01 | a0 1f 02 | 0b: the bad tag is at offset 5.
    let bad_offset = 5;
    let d = TypedDecoder::<3>::new(&b, slots);
    assert_eq!(
        d.error(),
        Some(DecodeError::InvalidWireType {
            offset: bad_offset,
            wire_type: 3
        })
    );
    assert_eq!(d.get(0).unwrap().as_u64(), 1);
    assert_eq!(d.count(0), 1);
    assert_eq!(values(d.repeated(0)), [1]);
    assert_eq!(d.get(1).unwrap().as_u64(), 2);

    // An error before any field: nothing is present.
    let d = TypedDecoder::<3>::new(&[0x08], slots);
    assert_eq!(d.error(), Some(DecodeError::TruncatedVarint { offset: 1 }));
    assert!((0..3).all(|s| !d.has(s)));
}

#[test]
fn ids_sharing_a_slot_keep_the_first_id() {
    let b = Msg::default()
        .varint(2, 20)
        .varint(1, 10)
        .varint(2, 21)
        .done();
    let d = TypedDecoder::<1>::new(&b, |id| (id <= 2).then_some(0));
    assert_eq!(d.get(0), Some(Field::new(2, FieldValue::Varint(21))));
    assert_eq!(d.count(0), 2);
    assert_eq!(values(d.repeated(0)), [20, 21]);
}

#[test]
fn repeated_varints_accept_packed_and_unpacked() {
    // 1: 5, 1: [6, 300, 7] packed, 3: noise, 1: [] packed, 1: 8, 1: fixed32 (ignored).
    let b = Msg::default()
        .varint(1, 5)
        .bytes(1, &[0x06, 0xac, 0x02, 0x87, 0x80, 0x80, 0x00])
        .varint(3, 0)
        .bytes(1, &[])
        .varint(1, 8)
        .fixed32(1, 99)
        .done();
    let d = TypedDecoder::<3>::new(&b, slots);
    let got: Vec<_> = d.repeated_varints(0).collect();
    assert_eq!(got, [Ok(5), Ok(6), Ok(300), Ok(7), Ok(8)]);
}

#[test]
fn repeated_fixed_accept_packed_and_unpacked() {
    let mut packed32 = vec![];
    packed32.extend(2u32.to_le_bytes());
    packed32.extend(3u32.to_le_bytes());
    let mut packed64 = vec![];
    packed64.extend(20u64.to_le_bytes());
    let b = Msg::default()
        .fixed32(1, 1)
        .bytes(1, &packed32)
        .varint(1, 77)
        .fixed64(1, 123)
        .fixed32(1, 4)
        .bytes(500, &packed64)
        .fixed64(500, 21)
        .fixed32(500, 66)
        .done();
    let d = TypedDecoder::<3>::new(&b, slots);
    assert_eq!(
        d.repeated_fixed32(0).collect::<Vec<_>>(),
        [Ok(1), Ok(2), Ok(3), Ok(4)]
    );
    assert_eq!(d.repeated_fixed64(1).collect::<Vec<_>>(), [Ok(20), Ok(21)]);
    // Read with the wrong width, the packed payloads are errors and the scalars are skipped.
    // Read as 8-byte elements, the 8-byte packed chunk is one element and the fixed32 and varint
    // occurrences are skipped.
    assert_eq!(
        d.repeated_fixed64(0).collect::<Vec<_>>(),
        [Ok(2 | (3 << 32)), Ok(123)]
    );
}

#[test]
fn malformed_packed_payload_yields_one_error_with_a_message_offset() {
    // 1: 1, 1: [2, <truncated varint>], 1: 3.
    let b = Msg::default()
        .varint(1, 1)
        .bytes(1, &[0x02, 0x80])
        .varint(1, 3)
        .done();
    let d = TypedDecoder::<3>::new(&b, slots);
    assert_eq!(d.error(), None);
    let mut it = d.repeated_varints(0);
    assert_eq!(it.next(), Some(Ok(1)));
    assert_eq!(it.next(), Some(Ok(2)));
    // The payload starts at offset 4 (after 08 01 0a 02); the bad varint is its second byte.
    assert_eq!(
        it.next(),
        Some(Err(DecodeError::TruncatedVarint { offset: 5 }))
    );
    assert_eq!(it.next(), None);
    assert_eq!(it.next(), None);

    let b = Msg::default().bytes(3, &[0; 6]).done();
    let d = TypedDecoder::<3>::new(&b, slots);
    let got: Vec<_> = d.repeated_fixed32(2).collect();
    assert_eq!(
        got,
        [Err(DecodeError::PackedSizeNotMultiple {
            offset: 2 + 4,
            element_size: 4
        })]
    );
}

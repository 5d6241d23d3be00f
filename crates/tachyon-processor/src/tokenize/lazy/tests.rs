//! The lazy decoders against the generated views, on random messages that follow the schema
//! (with wrong wire types, packed and unpacked repeats, unknown and out-of-range ids, and
//! nested messages) and on the same messages mutated byte by byte.

use proptest::prelude::*;

use super::*;

/// SplitMix64: the messages are built from one proptest-chosen seed, so that a failure
/// reproduces from it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Varint,
    Fixed64,
    Bytes,
    /// A repeated varint field (written packed or not).
    Varints,
    /// A repeated fixed64 field (written packed or not).
    Fixed64s,
    Event,
    Annotation,
}

const PACKET: &[(u32, Kind)] = &[
    (8, Kind::Varint),
    (10, Kind::Varint),
    (11, Kind::Event),
    (13, Kind::Varint),
    (41, Kind::Varint),
    (42, Kind::Varint),
    (58, Kind::Varint),
    (87, Kind::Varint),
    (1900, Kind::Varint),
    // Fields the importer does not read (the service's trusted uid and pid, machine_id).
    (3, Kind::Varint),
    (79, Kind::Varint),
    (98, Kind::Varint),
    // Fields the lazy packet leaves to the view.
    (6, Kind::Bytes),
    (12, Kind::Bytes),
    (44, Kind::Bytes),
    (50, Kind::Bytes),
    (59, Kind::Bytes),
    (60, Kind::Bytes),
    (69, Kind::Bytes),
    (133, Kind::Bytes),
];

const EVENT: &[(u32, Kind)] = &[
    (3, Kind::Varints),
    (4, Kind::Annotation),
    (9, Kind::Varint),
    (10, Kind::Varint),
    (11, Kind::Varint),
    (23, Kind::Bytes),
    (30, Kind::Varint),
    (34, Kind::Varint),
    (44, Kind::Fixed64),
    (47, Kind::Fixed64s),
    (48, Kind::Fixed64s),
    // Rare fields.
    (1, Kind::Varint),
    (2, Kind::Varint),
    (6, Kind::Bytes),
    (8, Kind::Varint),
    (12, Kind::Varints),
    (16, Kind::Varint),
    (17, Kind::Varint),
    (20, Kind::Varint),
    (21, Kind::Bytes),
    (22, Kind::Bytes),
    (31, Kind::Varints),
    (33, Kind::Bytes),
    (36, Kind::Varints),
    (42, Kind::Varints),
    (45, Kind::Varints),
    (46, Kind::Fixed64s),
    (52, Kind::Varint),
    (53, Kind::Bytes),
    (54, Kind::Varint),
    (55, Kind::Bytes),
    (56, Kind::Varint),
    (57, Kind::Fixed64),
];

const ANNOTATION: &[(u32, Kind)] = &[
    (1, Kind::Varint),
    (2, Kind::Varint),
    (3, Kind::Varint),
    (4, Kind::Varint),
    (5, Kind::Fixed64),
    (6, Kind::Bytes),
    (7, Kind::Varint),
    (10, Kind::Bytes),
    (17, Kind::Varint),
    // Rare fields.
    (8, Kind::Bytes),
    (9, Kind::Bytes),
    (11, Kind::Annotation),
    (12, Kind::Annotation),
    (13, Kind::Varint),
    (14, Kind::Bytes),
    (16, Kind::Bytes),
];

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_tag(out: &mut Vec<u8>, id: u32, wire: u8) {
    put_varint(out, (u64::from(id) << 3) | u64::from(wire));
}

fn value(r: &mut Rng) -> u64 {
    match r.below(6) {
        0 => r.below(4),
        1 => r.below(300),
        2 => u64::MAX - r.below(3),
        3 => r.next() >> r.below(64),
        _ => r.below(50),
    }
}

/// A varint of `v`, sometimes in a redundant (longer) encoding.
fn put_any_varint(r: &mut Rng, out: &mut Vec<u8>, v: u64) {
    if r.chance(5) && v < 1 << 28 {
        out.extend_from_slice(&protozero::wire::redundant_varint(v as u32));
    } else {
        put_varint(out, v);
    }
}

fn message(r: &mut Rng, fields: &[(u32, Kind)], depth: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let n = r.below(if depth > 2 { 3 } else { 10 });
    for _ in 0..n {
        let (mut id, kind) = fields[r.below(fields.len() as u64) as usize];
        if r.chance(5) {
            // An id no view knows, or one protozero skips.
            id = match r.below(3) {
                0 => 5000 + r.below(10) as u32,
                1 => protozero::wire::MAX_FIELD_ID + 1 + r.below(3) as u32,
                _ => 99,
            };
        }
        let wrong_wire = r.chance(8);
        let kind = if wrong_wire {
            [Kind::Varint, Kind::Fixed64, Kind::Bytes][r.below(3) as usize]
        } else {
            kind
        };
        match kind {
            Kind::Varint => {
                put_tag(&mut out, id, 0);
                let v = value(r);
                put_any_varint(r, &mut out, v);
            }
            Kind::Fixed64 => {
                put_tag(&mut out, id, 1);
                out.extend_from_slice(&value(r).to_le_bytes());
            }
            Kind::Bytes => {
                let len = r.below(6) as usize;
                let b: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
                put_tag(&mut out, id, 2);
                put_varint(&mut out, b.len() as u64);
                out.extend_from_slice(&b);
            }
            Kind::Varints | Kind::Fixed64s => {
                let fixed = matches!(kind, Kind::Fixed64s);
                if r.chance(50) {
                    let mut payload = Vec::new();
                    for _ in 0..r.below(4) {
                        if fixed {
                            payload.extend_from_slice(&value(r).to_le_bytes());
                        } else {
                            put_varint(&mut payload, value(r));
                        }
                    }
                    if r.chance(10) {
                        payload.push(0x80); // A broken element.
                    }
                    put_tag(&mut out, id, 2);
                    put_varint(&mut out, payload.len() as u64);
                    out.extend_from_slice(&payload);
                } else if fixed {
                    put_tag(&mut out, id, 1);
                    out.extend_from_slice(&value(r).to_le_bytes());
                } else {
                    put_tag(&mut out, id, 0);
                    put_varint(&mut out, value(r));
                }
            }
            Kind::Event | Kind::Annotation => {
                let inner = match kind {
                    Kind::Event => message(r, EVENT, depth + 1),
                    _ => message(r, ANNOTATION, depth + 1),
                };
                put_tag(&mut out, id, 2);
                put_varint(&mut out, inner.len() as u64);
                out.extend_from_slice(&inner);
            }
        }
    }
    if r.chance(3) {
        // An invalid wire type or a zero id.
        out.push(if r.chance(50) { 0x0b } else { 0x00 });
    }
    out
}

fn mutate(r: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..=r.below(3) {
        if bytes.is_empty() {
            bytes.push(r.next() as u8);
            continue;
        }
        let at = r.below(bytes.len() as u64) as usize;
        match r.below(4) {
            0 => bytes[at] ^= 1 << r.below(8),
            1 => bytes.truncate(at),
            2 => bytes.insert(at, r.next() as u8),
            _ => {
                bytes.remove(at);
            }
        }
    }
}

fn check_packet(bytes: &[u8]) -> Result<(), TestCaseError> {
    packet_agrees(bytes).map_err(TestCaseError::fail)
}

fn check_event(bytes: &[u8]) -> Result<(), TestCaseError> {
    event_agrees(bytes).map_err(TestCaseError::fail)
}

fn check_annotation(bytes: &[u8]) -> Result<(), TestCaseError> {
    annotation_agrees(bytes, 0).map_err(TestCaseError::fail)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn packets_match_the_views(seed in any::<u64>()) {
        let mut r = Rng(seed);
        let mut bytes = message(&mut r, PACKET, 0);
        check_packet(&bytes)?;
        mutate(&mut r, &mut bytes);
        check_packet(&bytes)?;
    }

    #[test]
    fn events_match_the_views(seed in any::<u64>()) {
        let mut r = Rng(seed);
        let mut bytes = message(&mut r, EVENT, 0);
        check_event(&bytes)?;
        mutate(&mut r, &mut bytes);
        check_event(&bytes)?;
    }

    #[test]
    fn annotations_match_the_views(seed in any::<u64>()) {
        let mut r = Rng(seed);
        let mut bytes = message(&mut r, ANNOTATION, 0);
        check_annotation(&bytes)?;
        mutate(&mut r, &mut bytes);
        check_annotation(&bytes)?;
    }

    /// The varint fast paths (one byte; up to 8 bytes from one word) against the byte-by-byte
    /// reader, on random bytes at every offset (past the end too) and on encoded values of
    /// every length, plain, redundant and over-long, whole and truncated, followed by random
    /// bytes.
    #[test]
    fn the_varint_fast_path_matches_the_reference(
        bytes in proptest::collection::vec(any::<u8>(), 0..24),
        v in any::<u64>(),
        shift in 0u32..64,
        pad in 0usize..12,
        seed in any::<u64>(),
    ) {
        for pos in 0..=bytes.len() + 1 {
            prop_assert_eq!(varint(&bytes, pos), varint_slow(&bytes, pos), "offset {}", pos);
        }
        let mut r = Rng(seed);
        let v = v >> shift;
        let mut enc = Vec::new();
        put_varint(&mut enc, v);
        // The same value with `pad` redundant continuation bytes (up to 11 bytes long).
        let mut long = enc.clone();
        if let Some(last) = long.pop() {
            long.push(last | 0x80);
            long.extend(std::iter::repeat_n(0x80, pad.saturating_sub(1)));
            long.push(0);
        }
        for e in [enc, long] {
            for cut in 0..=e.len() {
                let mut buf = e[..cut].to_vec();
                let whole = cut == e.len();
                for tail in 0..3 {
                    if tail > 0 {
                        buf.push(r.next() as u8);
                    }
                    let fast = varint(&buf, 0);
                    prop_assert_eq!(fast, varint_slow(&buf, 0));
                    if whole && e.len() <= MAX_VARINT_SIZE {
                        prop_assert_eq!(fast, Ok((v, e.len())));
                    }
                }
            }
        }
    }

    /// `trace_packet` frames a packet exactly as `ProtoDecoder::read_field` does wherever it
    /// accepts one, and accepts every well-formed packet field: on traces of random packets
    /// (and other fields) mutated byte by byte, at every offset.
    #[test]
    fn trace_framing_matches_the_decoder(seed in any::<u64>()) {
        let mut r = Rng(seed);
        let mut trace = Vec::new();
        for _ in 0..r.below(6) {
            let packet = message(&mut r, PACKET, 0);
            let id = if r.chance(80) { 1 } else { 1 + r.below(3) as u32 };
            put_tag(&mut trace, id, 2);
            put_any_varint(&mut r, &mut trace, packet.len() as u64);
            trace.extend_from_slice(&packet);
        }
        mutate(&mut r, &mut trace);
        for pos in 0..=trace.len() {
            let mut dec = protozero::decoder::ProtoDecoder::new(&trace[pos..]);
            let general = dec.read_field();
            let next = pos + dec.offset();
            match (trace_packet(&trace, pos), general) {
                (Some((packet, end)), Ok(Some(f))) => {
                    prop_assert_eq!(f.id(), 1);
                    match f.value() {
                        protozero::decoder::FieldValue::Bytes(b) => prop_assert_eq!(b, packet),
                        _ => prop_assert!(false, "not bytes at {}", pos),
                    }
                    prop_assert_eq!(end, next);
                }
                (Some(_), other) => prop_assert!(false, "{:?} at {}", other.map(|_| ()), pos),
                (None, Ok(Some(_))) => {
                    // Left to the decoder: another field or wire type. (A packet too long
                    // for the buffer is an error both ways; none here is over
                    // `MAX_MESSAGE_LENGTH`, which both skip.)
                    prop_assert!(trace[pos] != 0x0a, "a well-formed packet at {} left", pos);
                }
                (None, _) => {}
            }
        }
    }

    #[test]
    fn arbitrary_bytes_match_the_views(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        agrees_with_views(&bytes).map_err(TestCaseError::fail)?;
    }
}

/// An SDK-shaped packet (the encoder's template for a slice begin) reads the same both ways.
#[test]
fn a_slice_begin_reads_the_same() {
    // track_event { category_iids: 1, type: SLICE_BEGIN, name_iid: 200,
    //   source_location_iid: 3, debug_annotations { name_iid: 1, int_value: -5 } }
    // sequence_flags: 2, timestamp: 300, trusted_packet_sequence_id: 7
    let mut ev = vec![0x18, 0x01, 0x48, 0x01, 0x50, 0xc8, 0x01, 0x90, 0x02, 0x03];
    let ann = [
        0x08, 0x01, 0x20, 0xfb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
    ];
    ev.push(0x22);
    ev.push(ann.len() as u8);
    ev.extend_from_slice(&ann);
    let mut p = vec![0x5a, ev.len() as u8];
    p.extend_from_slice(&ev);
    p.extend_from_slice(&[0x68, 0x02, 0x40, 0xac, 0x02, 0x50, 0x07]);
    agrees_with_views(&p).unwrap();
    let lp = Packet::decode(&p).unwrap();
    assert_eq!(lp.timestamp, Some(300));
    assert_eq!(lp.trusted_packet_sequence_id, Some(7));
    assert!(!lp.other);
    let e = TrackEvent::decode(lp.track_event.unwrap()).unwrap();
    assert_eq!(
        (e.type_raw(), e.name_iid(), e.source_location_iid()),
        (1, 200, 3)
    );
    assert!(e.view().is_none());
    let a: Vec<_> = e.debug_annotations().collect::<Result<_, _>>().unwrap();
    assert_eq!((a[0].name_iid, a[0].int_value), (Some(1), Some(-5)));
}

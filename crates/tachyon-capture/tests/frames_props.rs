//! Property tests of the frame layer: what the encoder writes the reader gives back exactly,
//! however the records are cut into frames; arbitrary bytes never make the reader or the
//! scanner panic or exceed their limits (the same body as the `capture_frames` fuzz target);
//! the scanner's packet walk ([`packet_info`]) accepts and reads exactly what protozero's
//! general decoder does, on well-formed, mutated and arbitrary packets.

use proptest::prelude::*;
use tachyon_capture::frame::{
    max_payload, packet_info, packet_info_by_decoder, validate_records, Frame, FrameEncoder,
    FrameReader, RecordScanner, MAX_RAW, MAX_RECORD,
};

/// A `Trace.packet` record whose packet is a timestamp (field 8) and `extra` bytes of an
/// unknown length-delimited field 900.
fn record(ts: u64, extra: &[u8]) -> Vec<u8> {
    let mut p = vec![0x40];
    let mut v = ts;
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            p.push(b);
            break;
        }
        p.push(b | 0x80);
    }
    // Field 900, wire type 2: tag varint 7202 = 0xa2 0x38.
    p.extend_from_slice(&[0xa2, 0x38]);
    p.push(extra.len() as u8);
    p.extend_from_slice(extra);
    let mut r = vec![0x0a, p.len() as u8];
    r.extend_from_slice(&p);
    r
}

proptest! {
    #[test]
    fn frames_round_trip(
        packets in prop::collection::vec((any::<u64>(), prop::collection::vec(any::<u8>(), 0..100)), 0..200),
        cuts in prop::collection::vec(0usize..4000, 0..8),
    ) {
        let records: Vec<u8> = packets.iter().flat_map(|(ts, e)| record(*ts, e)).collect();
        // The program sends batches cut anywhere (records may span frames).
        let mut points: Vec<usize> = cuts.into_iter().map(|c| c.min(records.len())).collect();
        points.push(0);
        points.push(records.len());
        points.sort_unstable();
        let mut wire = Vec::new();
        let mut enc = FrameEncoder::new();
        for w in points.windows(2) {
            if w[0] < w[1] {
                wire.extend_from_slice(enc.data(&records[w[0]..w[1]]));
            }
        }
        wire.extend_from_slice(&FrameEncoder::end());
        let mut reader = FrameReader::new(&wire[..]);
        let mut scanner = RecordScanner::new();
        let mut out = Vec::new();
        let mut n = 0;
        loop {
            match reader.next_frame().unwrap() {
                Some(Frame::Data { raw, .. }) => {
                    let (ready, c) = scanner.push(raw).unwrap();
                    out.extend_from_slice(ready);
                    n += c.records;
                }
                Some(Frame::End) => break,
                other => panic!("{other:?}"),
            }
        }
        prop_assert_eq!(out, records);
        prop_assert_eq!(n, packets.len() as u64);
        prop_assert_eq!(scanner.pending(), 0);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..2048)) {
        let mut reader = FrameReader::new(&data[..]);
        let mut scanner = RecordScanner::new();
        while let Ok(Some(frame)) = reader.next_frame() {
            if let Frame::Data { raw, wire_len } = frame {
                prop_assert!(raw.len() <= MAX_RAW);
                prop_assert!(wire_len <= max_payload() + 9);
                match scanner.push(raw) {
                    Ok((ready, counts)) => {
                        prop_assert!(counts.records as usize <= ready.len() / 2);
                        prop_assert!(scanner.pending() <= MAX_RECORD + MAX_RAW);
                    }
                    Err(_) => break,
                }
            }
        }
        let _ = validate_records(&data);
        let _ = tachyon_capture::protocol::Hello::decode(&data);
        let _ = tachyon_capture::protocol::read_reply(&mut &data[..]);
        let _ = tachyon_capture::protocol::read_request(&mut &data[..]);
    }
}

/// A packet of arbitrary fields (id, wire type, value) the way an encoder writes them, with
/// the fields a capture reads (10, 11, 42) and others, in any order.
fn packet_strategy() -> impl Strategy<Value = Vec<u8>> {
    let field = (
        prop_oneof![
            Just(10u32),
            Just(11),
            Just(42),
            1u32..20,
            100u32..2000,
            (1u32 << 24) - 2..(1u32 << 24) + 2
        ],
        0u8..6,
        any::<u64>(),
        prop::collection::vec(any::<u8>(), 0..40),
    );
    prop::collection::vec(field, 0..12).prop_map(|fields| {
        let mut p = Vec::new();
        for (id, wt, v, bytes) in fields {
            let wt = [0u8, 1, 2, 5, 0, 2][wt as usize];
            put(&mut p, (u64::from(id) << 3) | u64::from(wt));
            match wt {
                0 => put(&mut p, v),
                1 => p.extend_from_slice(&v.to_le_bytes()),
                5 => p.extend_from_slice(&(v as u32).to_le_bytes()),
                _ => {
                    put(&mut p, bytes.len() as u64);
                    p.extend_from_slice(&bytes);
                }
            }
        }
        p
    })
}

fn put(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// The walk and the general decoder agree: both accept or both refuse, and on acceptance they
/// read the same track events, sequence and loss flag.
fn same_verdict(p: &[u8]) -> Result<(), TestCaseError> {
    let fast = packet_info(p);
    let reference = packet_info_by_decoder(p);
    prop_assert_eq!(
        fast.is_ok(),
        reference.is_ok(),
        "{:02x?}: {:?} vs {:?}",
        p,
        fast,
        reference
    );
    if let (Ok(a), Ok(b)) = (fast, reference) {
        prop_assert_eq!(a, b, "{:02x?}", p);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_walk_agrees_with_the_decoder_on_packets(p in packet_strategy()) {
        prop_assert!(packet_info(&p).is_ok());
        same_verdict(&p)?;
    }

    #[test]
    fn the_walk_agrees_with_the_decoder_on_mutated_packets(
        p in packet_strategy(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 1..4),
    ) {
        let mut p = p;
        for (at, byte, op) in edits {
            match op {
                // Overwrite, insert, delete a byte, or cut the packet short.
                0 if !p.is_empty() => { let i = at.index(p.len()); p[i] = byte; }
                1 => { let i = at.index(p.len() + 1); p.insert(i, byte); }
                2 if !p.is_empty() => { let i = at.index(p.len()); p.remove(i); }
                3 if !p.is_empty() => { let i = at.index(p.len()); p.truncate(i); }
                _ => {}
            }
        }
        same_verdict(&p)?;
    }

    #[test]
    fn the_walk_agrees_with_the_decoder_on_arbitrary_bytes(
        p in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        same_verdict(&p)?;
    }

    #[test]
    fn the_walk_agrees_on_varint_edges(
        prefix in prop::collection::vec(prop_oneof![Just(0x80u8), Just(0xffu8), Just(0x00u8), Just(0x7fu8), any::<u8>()], 0..14),
        id in prop_oneof![Just(10u8), Just(42), Just(11), Just(8)],
        wt in 0u8..8,
    ) {
        // A tag, then runs of continuation bytes: cut, overlong and 10-byte varints.
        let mut p = vec![(id << 3) | wt];
        p.extend_from_slice(&prefix);
        same_verdict(&p)?;
        // The same as a multi-byte (redundant) tag.
        let mut q = vec![(id << 3) | wt | 0x80, 0x00];
        q.extend_from_slice(&prefix);
        same_verdict(&q)?;
    }
}

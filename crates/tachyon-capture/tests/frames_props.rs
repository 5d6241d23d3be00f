//! Property tests of the frame layer: what the encoder writes the reader gives back exactly,
//! however the records are cut into frames; arbitrary bytes never make the reader or the
//! scanner panic or exceed their limits (the same body as the `capture_frames` fuzz target).

use proptest::prelude::*;
use tachyon_capture::frame::{
    max_payload, validate_records, Frame, FrameEncoder, FrameReader, RecordScanner, MAX_RAW,
    MAX_RECORD,
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

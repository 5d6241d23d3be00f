//! The capture's frame decoder over hostile bytes: frames are read and checked, and the records
//! of data frames scanned, until the input ends or breaks a rule. Must never panic, and never
//! hold more than the limits allow. The first byte picks whether uncompressed frames were
//! negotiated. The scanner's packet walk is compared with protozero's general decoder on the
//! same bytes: both accept or both refuse, and read the same fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tachyon_capture::frame::{
    max_payload, packet_info, packet_info_by_decoder, Frame, FrameReader, RecordScanner,
    MAX_RAW, MAX_RECORD,
};

fuzz_target!(|input: &[u8]| {
    let Some((&mode, data)) = input.split_first() else {
        return;
    };
    let mut reader = FrameReader::new(data);
    reader.accept_raw_frames(mode & 1 != 0);
    let mut scanner = RecordScanner::new();
    while let Ok(Some(frame)) = reader.next_frame() {
        if let Frame::Data { raw, wire_len } = frame {
            assert!(raw.len() <= MAX_RAW);
            assert!(wire_len <= max_payload() + 9);
            match scanner.push(raw) {
                Ok((ready, counts)) => {
                    assert!(counts.records as usize <= ready.len() / 2);
                    assert!(scanner.pending() <= MAX_RECORD + MAX_RAW);
                }
                Err(_) => break,
            }
        }
    }
    let fast = packet_info(data);
    let reference = packet_info_by_decoder(data);
    assert_eq!(fast.is_ok(), reference.is_ok(), "{fast:?} vs {reference:?}");
    if let (Ok(a), Ok(b)) = (fast, reference) {
        assert_eq!(a, b);
    }
    let _ = tachyon_capture::frame::validate_records(data);
    let _ = tachyon_capture::protocol::Hello::decode(data);
    let _ = tachyon_capture::protocol::read_reply(&mut &data[..]);
    let _ = tachyon_capture::protocol::read_welcome(&mut &data[..], 2, 1);
    let _ = tachyon_capture::protocol::read_request(&mut &data[..]);
});

//! The capture's frame decoder over hostile bytes: frames are read and checked, and the records
//! of data frames scanned, until the input ends or breaks a rule. Must never panic, and never
//! hold more than the limits allow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tachyon_capture::frame::{max_payload, Frame, FrameReader, RecordScanner, MAX_RAW, MAX_RECORD};

fuzz_target!(|data: &[u8]| {
    let mut reader = FrameReader::new(data);
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
    let _ = tachyon_capture::frame::validate_records(data);
    let _ = tachyon_capture::protocol::Hello::decode(data);
    let _ = tachyon_capture::protocol::read_reply(&mut &data[..]);
    let _ = tachyon_capture::protocol::read_request(&mut &data[..]);
});

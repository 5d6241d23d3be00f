//! The daemon's socket input: arbitrary bytes arrive as a stream, cut at fuzzer-chosen points,
//! go through the frame reassembler, and every frame through the `IPCFrame` decoder and, for
//! method invocations, the `CommitDataRequest` decoder (the request a producer sends most).
//! Nothing may panic; frames come out bounded; a decoded frame re-encodes to one that decodes
//! to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tachyon_ipc::commit::{decode_commit, encode_commit};
use tachyon_ipc::frame::{FrameBuffer, MAX_FRAME_SIZE};
use tachyon_ipc::rpc::{Frame, Msg};

fuzz_target!(|data: &[u8]| {
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut).max(1);
    let mut frames = FrameBuffer::new();
    for piece in stream.chunks(step) {
        frames.extend(piece);
        loop {
            match frames.next_frame() {
                Ok(Some(body)) => {
                    assert!(!body.is_empty() && body.len() <= MAX_FRAME_SIZE);
                    check_frame(body);
                }
                Ok(None) => break,
                // The daemon closes the connection here.
                Err(_) => return,
            }
        }
    }
    // Every body is also tried directly, so short inputs reach the decoders.
    check_frame(stream);
});

fn check_frame(body: &[u8]) {
    let Ok(frame) = Frame::decode(body) else {
        return;
    };
    let again = frame.encode();
    assert_eq!(Frame::decode(&again).as_ref(), Ok(&frame));
    if let Msg::InvokeMethod { args, .. } = frame.msg {
        if let Ok(commit) = decode_commit(args) {
            // What survives decoding re-encodes to the same request.
            let mut merged = tachyon_ipc::commit::DecodedCommit::default();
            for part in encode_commit(&commit.request) {
                let d = decode_commit(&part).expect("our own encoding decodes");
                assert_eq!(d.invalid_entries, 0);
                merged.request.chunks_to_move.extend(d.request.chunks_to_move);
                merged.request.chunks_to_patch.extend(d.request.chunks_to_patch);
                merged.request.flush_request_id =
                    merged.request.flush_request_id.or(d.request.flush_request_id);
            }
            assert_eq!(
                merged.request.chunks_to_move,
                commit.request.chunks_to_move
            );
            assert_eq!(
                merged.request.flush_request_id,
                commit.request.flush_request_id
            );
        }
    }
}

//! The daemon's socket input: arbitrary bytes arrive as a stream, cut at fuzzer-chosen points,
//! go through the frame reassembler, and every frame through the `IPCFrame` decoder and, for
//! method invocations, the `CommitDataRequest` decoder (the request a producer sends most).
//! Nothing may panic; frames come out bounded; a decoded frame re-encodes to one that decodes
//! to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tachyon_abi::{CommitRequest, Patch};
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
            // What survives decoding re-encodes to the same request: the same moves, the same
            // patches in the same order (a chunk's patches may be split over parts) and the
            // same flush id.
            let original = &commit.request;
            let mut moves = Vec::new();
            let mut patches = Vec::new();
            let mut flush = None;
            for part in encode_commit(original) {
                let d = decode_commit(&part).expect("our own encoding decodes");
                assert_eq!(d.invalid_entries, 0);
                patches.extend(flat_patches(&d.request));
                moves.extend(d.request.chunks_to_move);
                flush = flush.or(d.request.flush_request_id);
            }
            assert_eq!(moves, original.chunks_to_move);
            assert_eq!(patches, flat_patches(original).collect::<Vec<_>>());
            assert_eq!(flush, original.flush_request_id);
        }
    }
}

/// Every patch with the chunk it applies to, in request order.
fn flat_patches(r: &CommitRequest) -> impl Iterator<Item = (u16, u16, u32, Patch)> + '_ {
    r.chunks_to_patch.iter().flat_map(|c| {
        c.patches
            .iter()
            .map(move |p| (c.target_buffer, c.writer_id, c.chunk_id, *p))
    })
}

//! `CommitDataRequest` over the socket: [`tachyon_abi::CommitRequest`] encoded by producers and
//! decoded, as untrusted input, by the daemon.
//!
//! A request larger than one frame is split: moves first, patches after them, the flush
//! acknowledgement last, so applying the parts in order is applying the whole (patches always
//! follow the moves they may refer to).
//!
//! Decoding keeps what is meaningful and counts the rest: a target buffer beyond `u16` becomes
//! [`INVALID_BUFFER`] (no session owns it, so the daemon discards the chunk and frees it), a
//! patch whose data is not 4 bytes or whose writer id is out of range is dropped, and a move
//! carrying inline `data` (Perfetto's shared memory emulation, which Tachyon does not offer) is
//! dropped. A malformed message is an error: the connection is closed.

use std::io;

use protozero::HeapBuffered;
use tachyon_abi::{ChunkToMove, ChunkToPatch, CommitRequest, Patch};
use tachyon_protos::{commit_data_request, CommitDataRequest, CommitDataRequestView};

use crate::frame::MAX_FRAME_SIZE;
use crate::rpc::{Caller, ProtocolError, INVOKE_OVERHEAD};

/// The target buffer given to chunks whose buffer id does not fit the ABI's 16 bits.
pub const INVALID_BUFFER: u16 = u16::MAX;

/// Largest encoded request per frame.
pub const MAX_REQUEST_BYTES: usize = MAX_FRAME_SIZE - INVOKE_OVERHEAD;

/// A decoded request and how many entries of it were dropped as invalid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecodedCommit {
    /// What is left to apply.
    pub request: CommitRequest,
    /// Entries dropped (invalid patches, inline chunk data).
    pub invalid_entries: u64,
}

/// Decodes a `CommitDataRequest` from a producer.
pub fn decode_commit(bytes: &[u8]) -> Result<DecodedCommit, ProtocolError> {
    let m = |e: protozero::DecodeError| ProtocolError(format!("malformed CommitDataRequest: {e}"));
    let v = CommitDataRequestView::decode(bytes).map_err(m)?;
    let mut out = DecodedCommit::default();
    for c in v.chunks_to_move() {
        let c = c.map_err(m)?;
        if !c.data().is_empty() {
            out.invalid_entries += 1;
            continue;
        }
        out.request.chunks_to_move.push(ChunkToMove {
            page: c.page(),
            chunk: c.chunk(),
            target_buffer: u16::try_from(c.target_buffer()).unwrap_or(INVALID_BUFFER),
        });
    }
    for c in v.chunks_to_patch() {
        let c = c.map_err(m)?;
        let Ok(writer_id) = u16::try_from(c.writer_id()) else {
            out.invalid_entries += 1;
            continue;
        };
        let mut patches = Vec::new();
        for p in c.patches() {
            let p = p.map_err(m)?;
            match <[u8; 4]>::try_from(p.data()) {
                Ok(data) => patches.push(Patch {
                    offset: p.offset(),
                    data,
                }),
                Err(_) => out.invalid_entries += 1,
            }
        }
        out.request.chunks_to_patch.push(ChunkToPatch {
            target_buffer: u16::try_from(c.target_buffer()).unwrap_or(INVALID_BUFFER),
            writer_id,
            chunk_id: c.chunk_id(),
            patches,
            has_more_patches: c.has_more_patches(),
        });
    }
    if v.has_flush_request_id() {
        out.request.flush_request_id = Some(v.flush_request_id());
    }
    Ok(out)
}

/// Encodes `req` as one or more `CommitDataRequest`s of at most [`MAX_REQUEST_BYTES`] each.
pub fn encode_commit(req: &CommitRequest) -> Vec<Vec<u8>> {
    encode_commit_limited(req, MAX_REQUEST_BYTES)
}

/// Sends `req` as `CommitData` (split by [`encode_commit`]), asking for no reply.
pub fn send_commit(caller: &Caller, req: &CommitRequest) -> io::Result<()> {
    for part in encode_commit(req) {
        caller.invoke("CommitData", &part, None, true)?;
    }
    Ok(())
}

/// Bytes one move takes at most (tag, length, three varints of ≤ 5 bytes with tags).
const MOVE_MAX: usize = 2 + 3 * 6;
/// Bytes one patch takes at most beside its chunk's header.
const PATCH_MAX: usize = 2 + 6 + 2 + 4;
/// Bytes a chunk-to-patch header takes at most.
const CHUNK_TO_PATCH_MAX: usize = 4 + 4 * 6 + 2;

fn encode_commit_limited(req: &CommitRequest, limit: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut part = Part::new();
    for c in &req.chunks_to_move {
        if part.bytes + MOVE_MAX > limit {
            out.push(part.finish(None));
            part = Part::new();
        }
        part.bytes += MOVE_MAX;
        part.moves.push(*c);
    }
    for c in &req.chunks_to_patch {
        // A chunk's patches may be split over parts: all but the last say more follow.
        let mut rest = &c.patches[..];
        loop {
            let room = limit.saturating_sub(part.bytes + CHUNK_TO_PATCH_MAX) / PATCH_MAX;
            if room == 0 && (!rest.is_empty() || part.bytes + CHUNK_TO_PATCH_MAX > limit) {
                out.push(part.finish(None));
                part = Part::new();
                continue;
            }
            let take = rest.len().min(room);
            let last = take == rest.len();
            part.bytes += CHUNK_TO_PATCH_MAX + take * PATCH_MAX;
            part.patches.push(ChunkToPatch {
                patches: rest[..take].to_vec(),
                has_more_patches: if last { c.has_more_patches } else { true },
                ..c.clone()
            });
            rest = &rest[take..];
            if last {
                break;
            }
        }
    }
    out.push(part.finish(req.flush_request_id));
    out
}

struct Part {
    moves: Vec<ChunkToMove>,
    patches: Vec<ChunkToPatch>,
    bytes: usize,
}

impl Part {
    fn new() -> Part {
        Part {
            moves: Vec::new(),
            patches: Vec::new(),
            bytes: 16,
        }
    }

    fn finish(self, flush_request_id: Option<u64>) -> Vec<u8> {
        let mut buf = HeapBuffered::new();
        {
            let mut r: CommitDataRequest<'_> = buf.root();
            for c in &self.moves {
                let mut m: commit_data_request::ChunksToMove<'_> = r.add_chunks_to_move();
                m.set_page(c.page);
                m.set_chunk(c.chunk);
                m.set_target_buffer(c.target_buffer as u32);
            }
            for c in &self.patches {
                let mut p = r.add_chunks_to_patch();
                p.set_target_buffer(c.target_buffer as u32);
                p.set_writer_id(c.writer_id as u32);
                p.set_chunk_id(c.chunk_id);
                for patch in &c.patches {
                    let mut q = p.add_patches();
                    q.set_offset(patch.offset);
                    q.set_data(&patch.data);
                }
                if c.has_more_patches {
                    p.set_has_more_patches(true);
                }
            }
            if let Some(id) = flush_request_id {
                r.set_flush_request_id(id);
            }
        }
        buf.serialize().expect("heap buffers do not fail")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request(
        moves: usize,
        patch_chunks: usize,
        patches_each: usize,
        flush: bool,
    ) -> CommitRequest {
        CommitRequest {
            chunks_to_move: (0..moves)
                .map(|i| ChunkToMove {
                    page: i as u32 * 7919,
                    chunk: (i % 16) as u32,
                    target_buffer: (i % 3) as u16,
                })
                .collect(),
            chunks_to_patch: (0..patch_chunks)
                .map(|i| ChunkToPatch {
                    target_buffer: 1,
                    writer_id: (i + 1) as u16,
                    chunk_id: u32::MAX - i as u32,
                    patches: (0..patches_each)
                        .map(|j| Patch {
                            offset: j as u32 * 4,
                            data: [0x81, 0x80, 0x80, j as u8],
                        })
                        .collect(),
                    has_more_patches: i % 2 == 0,
                })
                .collect(),
            flush_request_id: flush.then_some(42),
        }
    }

    /// Concatenates decoded parts the way the daemon applies them, merging a chunk's patches.
    fn merge(parts: &[Vec<u8>]) -> CommitRequest {
        let mut all = CommitRequest::default();
        for p in parts {
            assert!(p.len() <= MAX_REQUEST_BYTES, "part of {} bytes", p.len());
            let d = decode_commit(p).unwrap();
            assert_eq!(d.invalid_entries, 0);
            all.chunks_to_move.extend(d.request.chunks_to_move);
            for c in d.request.chunks_to_patch {
                match all.chunks_to_patch.last_mut() {
                    Some(l) if l.writer_id == c.writer_id && l.chunk_id == c.chunk_id => {
                        assert!(l.has_more_patches, "only a continued chunk is split");
                        l.patches.extend(c.patches);
                        l.has_more_patches = c.has_more_patches;
                    }
                    _ => all.chunks_to_patch.push(c),
                }
            }
            if d.request.flush_request_id.is_some() {
                assert!(all.flush_request_id.is_none());
                all.flush_request_id = d.request.flush_request_id;
            }
        }
        all
    }

    #[test]
    fn small_requests_are_one_part_and_round_trip() {
        let r = request(3, 2, 3, true);
        let parts = encode_commit(&r);
        assert_eq!(parts.len(), 1);
        assert_eq!(decode_commit(&parts[0]).unwrap().request, r);
        assert_eq!(encode_commit(&CommitRequest::default()).len(), 1);
    }

    #[test]
    fn large_requests_split_with_moves_first_and_flush_last() {
        let r = request(20_000, 10, 5000, true);
        let parts = encode_commit(&r);
        assert!(parts.len() > 2);
        let last = decode_commit(parts.last().unwrap()).unwrap();
        assert_eq!(last.request.flush_request_id, Some(42));
        assert_eq!(merge(&parts), r);
    }

    #[test]
    fn lies_are_dropped_and_counted() {
        let mut buf = HeapBuffered::new();
        {
            let mut r: CommitDataRequest<'_> = buf.root();
            {
                let mut m = r.add_chunks_to_move();
                m.set_page(1);
                m.set_target_buffer(70_000);
            }
            r.add_chunks_to_move().set_data(b"emulated");
            {
                let mut p = r.add_chunks_to_patch();
                p.set_writer_id(1);
                p.add_patches().set_data(b"toolong");
            }
            r.add_chunks_to_patch().set_writer_id(1 << 20);
        }
        let d = decode_commit(&buf.serialize().unwrap()).unwrap();
        assert_eq!(d.invalid_entries, 3);
        assert_eq!(d.request.chunks_to_move.len(), 1);
        assert_eq!(d.request.chunks_to_move[0].target_buffer, INVALID_BUFFER);
        assert_eq!(d.request.chunks_to_patch.len(), 1);
        assert!(d.request.chunks_to_patch[0].patches.is_empty());
        assert!(decode_commit(&[0x0a, 0x05, 0x08]).is_err());
    }

    proptest! {
        #[test]
        fn any_split_limit_preserves_the_request(
            moves in 0usize..200, chunks in 0usize..6, each in 0usize..200,
            flush in any::<bool>(), limit in 200usize..4000,
        ) {
            let r = request(moves, chunks, each, flush);
            let parts = encode_commit_limited(&r, limit);
            for p in &parts {
                prop_assert!(p.len() <= limit.max(200));
            }
            prop_assert_eq!(merge(&parts), r);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_commit(&bytes);
        }
    }
}

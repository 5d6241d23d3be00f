//! What a producer tells the service when it hands chunks over: the in-memory form of
//! Perfetto's `CommitDataRequest` (`protos/perfetto/common/commit_data_request.proto`).
//!
//! In-process, the client sends these values to the service thread directly; in system mode
//! they travel as the protobuf message over the producer socket. The service treats every field
//! as untrusted either way.

/// A chunk that is Complete in the shared memory buffer and should be copied into a central
/// buffer (`ChunksToMove`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkToMove {
    /// Page index in the shared memory buffer.
    pub page: u32,
    /// Chunk index within the page.
    pub chunk: u32,
    /// The central buffer the writer targets.
    pub target_buffer: u16,
}

/// One 4-byte patch: the final value of a size field in a chunk already handed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Patch {
    /// Offset from the start of the chunk's payload (after its 8-byte header).
    pub offset: u32,
    /// The bytes to write there (a redundant varint; never starts with 0x00).
    pub data: [u8; 4],
}

/// Patches for one chunk (`ChunkToPatch`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkToPatch {
    /// The central buffer the chunk went to.
    pub target_buffer: u16,
    /// The writer that wrote the chunk.
    pub writer_id: u16,
    /// The chunk's id.
    pub chunk_id: u32,
    /// The patches.
    pub patches: Vec<Patch>,
    /// More patches for this chunk will follow in a later request; until then the service must
    /// not read past it.
    pub has_more_patches: bool,
}

/// A commit: chunks to move, then patches to apply (always after the moves of the same
/// request), and optionally the acknowledgement of a flush.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitRequest {
    /// Chunks to copy.
    pub chunks_to_move: Vec<ChunkToMove>,
    /// Patches to apply after the moves.
    pub chunks_to_patch: Vec<ChunkToPatch>,
    /// Set when this commit answers a flush request.
    pub flush_request_id: Option<u64>,
}

impl CommitRequest {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.chunks_to_move.is_empty()
            && self.chunks_to_patch.is_empty()
            && self.flush_request_id.is_none()
    }
}

//! Framing: a 4-byte little-endian length, then that many bytes of an `IPCFrame`.
//!
//! Every length comes from an untrusted peer, so it is checked against [`MAX_FRAME_SIZE`] before
//! a single byte is buffered for it. [`FrameBuffer`] accumulates whatever the socket delivers
//! and cuts whole frames out of it; it never allocates beyond one maximum frame plus one read.

/// The largest frame body accepted or sent (Perfetto's IPC buffer is 128 KiB too). Senders split
/// larger payloads (commit batches, read-back slices) into several frames.
pub const MAX_FRAME_SIZE: usize = 128 * 1024;

/// Bytes of the length prefix.
pub const HEADER_SIZE: usize = 4;

/// A frame's length prefix was zero or above [`MAX_FRAME_SIZE`]: the stream cannot be trusted
/// from here on, and the connection must be closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadFrameSize(pub u32);

impl std::fmt::Display for BadFrameSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IPC frame of {} bytes (allowed: 1..={MAX_FRAME_SIZE})",
            self.0
        )
    }
}

impl std::error::Error for BadFrameSize {}

/// Prepends the length prefix to `body`. `None` when the body is empty or too large.
pub fn frame(body: &[u8]) -> Option<Vec<u8>> {
    if body.is_empty() || body.len() > MAX_FRAME_SIZE {
        return None;
    }
    let mut out = Vec::with_capacity(HEADER_SIZE + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    Some(out)
}

/// Reassembles frames from a byte stream.
#[derive(Debug, Default)]
pub struct FrameBuffer {
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`.
    start: usize,
    /// Bytes returned as frames so far, headers included: the stream offset of the next frame.
    consumed: u64,
}

impl FrameBuffer {
    /// An empty buffer.
    pub fn new() -> FrameBuffer {
        FrameBuffer::default()
    }

    /// Appends bytes received from the stream.
    pub fn extend(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The stream offset where the next frame starts (bytes of all frames returned so far).
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Bytes buffered and not yet returned as a frame.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next whole frame's body, if one is buffered. An error when the next length prefix
    /// is out of bounds (checked as soon as the 4 bytes are there, before the body arrives).
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, BadFrameSize> {
        let avail = &self.buf[self.start..];
        let Some(header) = avail.get(..HEADER_SIZE) else {
            self.compact();
            return Ok(None);
        };
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        if len == 0 || len as usize > MAX_FRAME_SIZE {
            return Err(BadFrameSize(len));
        }
        let end = HEADER_SIZE + len as usize;
        if avail.len() < end {
            self.compact();
            return Ok(None);
        }
        let begin = self.start + HEADER_SIZE;
        self.start += end;
        self.consumed += end as u64;
        Ok(Some(&self.buf[begin..begin + len as usize]))
    }

    /// Moves the unconsumed tail to the front once the consumed head is large, so the buffer
    /// stays within one frame plus one read.
    fn compact(&mut self) {
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_split_anywhere_come_out_whole() {
        let a = frame(b"hello").unwrap();
        let b = frame(&[7u8; 300]).unwrap();
        let stream: Vec<u8> = a.iter().chain(b.iter()).copied().collect();
        for cut in 0..stream.len() {
            let mut fb = FrameBuffer::new();
            let mut got = Vec::new();
            fb.extend(&stream[..cut]);
            while let Some(f) = fb.next_frame().unwrap() {
                got.push(f.to_vec());
            }
            fb.extend(&stream[cut..]);
            while let Some(f) = fb.next_frame().unwrap() {
                got.push(f.to_vec());
            }
            assert_eq!(got, vec![b"hello".to_vec(), vec![7u8; 300]], "cut at {cut}");
            assert_eq!(fb.pending(), 0);
        }
    }

    #[test]
    fn bad_lengths_are_rejected_before_the_body() {
        let mut fb = FrameBuffer::new();
        fb.extend(&0u32.to_le_bytes());
        assert_eq!(fb.next_frame(), Err(BadFrameSize(0)));
        let mut fb = FrameBuffer::new();
        fb.extend(&((MAX_FRAME_SIZE as u32) + 1).to_le_bytes());
        assert_eq!(
            fb.next_frame(),
            Err(BadFrameSize(MAX_FRAME_SIZE as u32 + 1))
        );
        assert!(frame(&[]).is_none());
        assert!(frame(&vec![0; MAX_FRAME_SIZE + 1]).is_none());
        assert!(frame(&vec![0; MAX_FRAME_SIZE]).is_some());
    }

    proptest! {
        #[test]
        fn any_bytes_never_panic_and_stay_bounded(chunks in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..64), 0..32)) {
            let mut fb = FrameBuffer::new();
            'outer: for c in &chunks {
                fb.extend(c);
                loop {
                    match fb.next_frame() {
                        Ok(Some(f)) => prop_assert!(!f.is_empty() && f.len() <= MAX_FRAME_SIZE),
                        Ok(None) => break,
                        Err(_) => break 'outer,
                    }
                }
                prop_assert!(fb.pending() <= HEADER_SIZE + MAX_FRAME_SIZE + 64);
            }
        }
    }
}

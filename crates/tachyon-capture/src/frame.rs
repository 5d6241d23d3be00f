//! Frames: how the trace travels from the program to the capture after the handshake.
//!
//! ```text
//! kind u8 | payload_len u32 | raw_len u32 | payload
//! ```
//!
//! - [`KIND_DATA`]: `payload` is one LZ4 block (`lz4_flex`'s block format) that decompresses
//!   to exactly `raw_len` bytes of whole `Trace.packet` records (field 1 of Perfetto's
//!   `Trace`), the bytes a trace file holds. `raw_len` ≤ [`MAX_RAW`], `payload_len` ≤ the
//!   LZ4 bound of `raw_len`. Each frame is compressed on its own (no dictionary across frames),
//!   so a capture that joins or loses a frame decodes the others.
//! - [`KIND_RAW`]: `payload` is `raw_len` bytes of whole records, uncompressed
//!   (`payload_len` = `raw_len` ≤ [`MAX_RAW`]). Only on a connection whose handshake granted
//!   [`CAP_RAW_FRAMES`](crate::protocol::CAP_RAW_FRAMES) (a capture on the same machine, where
//!   LZ4 costs both sides more CPU than the loopback copy it saves); a reader that did not
//!   negotiate them refuses them ([`FrameError::NotNegotiated`]).
//! - [`KIND_STATUS`]: `payload` is an uncompressed [`AppStatus`] (`raw_len` = 0).
//! - [`KIND_END`]: the trace is complete (the final stats are in the frames before); empty.
//!
//! [`FrameReader`] treats every byte as hostile: lengths are checked before anything is
//! allocated (so at most [`MAX_RAW`] plus its LZ4 bound are ever held), a block must decompress
//! to exactly its declared size, and [`validate_records`] checks that the records are whole
//! and their packets well-formed protobuf before a capture writes them to a file.

use std::io::{self, Read};

use protozero::wire::MAX_MESSAGE_LENGTH;
use protozero::ProtoDecoder;

/// A data frame.
pub const KIND_DATA: u8 = 1;
/// The end of the trace.
pub const KIND_END: u8 = 2;
/// The program's counters.
pub const KIND_STATUS: u8 = 3;
/// A data frame sent uncompressed (negotiated: [`crate::protocol::CAP_RAW_FRAMES`]).
pub const KIND_RAW: u8 = 4;
/// Largest uncompressed payload of a data frame.
pub const MAX_RAW: usize = 1 << 20;
/// Bytes of a frame header.
pub const HEADER_LEN: usize = 9;
/// Size of an [`AppStatus`] payload.
pub const STATUS_LEN: usize = 32;

/// Largest compressed payload a data frame may declare.
pub fn max_payload() -> usize {
    lz4_flex::block::get_maximum_output_size(MAX_RAW)
}

/// The program's own counters, sent every few hundred milliseconds so a capture can show losses
/// as they happen (the trace's `TraceStats` and `previous_packet_dropped` marks say the same
/// in the file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppStatus {
    /// Packets the writers dropped because the shared memory buffer was full.
    pub packets_dropped: u64,
    /// Chunks the central buffer overwrote (or refused) before they were sent.
    pub chunks_lost: u64,
    /// `Trace.packet` records sent so far in this capture.
    pub records_sent: u64,
    /// Uncompressed bytes sent so far.
    pub bytes_sent: u64,
}

impl AppStatus {
    fn encode(&self) -> [u8; STATUS_LEN] {
        let mut b = [0u8; STATUS_LEN];
        for (i, v) in [
            self.packets_dropped,
            self.chunks_lost,
            self.records_sent,
            self.bytes_sent,
        ]
        .into_iter()
        .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8; STATUS_LEN]) -> AppStatus {
        let v = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        AppStatus {
            packets_dropped: v(0),
            chunks_lost: v(1),
            records_sent: v(2),
            bytes_sent: v(3),
        }
    }
}

/// Builds frames (program side). Keeps its buffers between frames.
#[derive(Debug, Default)]
pub struct FrameEncoder {
    out: Vec<u8>,
}

impl FrameEncoder {
    /// A new encoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends data frames for `records` (whole `Trace.packet` records) to the encoder's
    /// output, splitting at record boundaries so that no frame holds more than [`MAX_RAW`]
    /// bytes. A single record larger than that is split across frames too (the capture joins
    /// frames, so records need not align with them; [`RecordScanner`] validates across).
    pub fn data(&mut self, records: &[u8]) -> &[u8] {
        self.out.clear();
        for piece in records.chunks(MAX_RAW) {
            let start = self.out.len();
            let bound = lz4_flex::block::get_maximum_output_size(piece.len());
            self.out.resize(start + HEADER_LEN + bound, 0);
            let n = lz4_flex::block::compress_into(piece, &mut self.out[start + HEADER_LEN..])
                .expect("the output has the LZ4 bound");
            self.out.truncate(start + HEADER_LEN + n);
            self.out[start] = KIND_DATA;
            self.out[start + 1..start + 5].copy_from_slice(&(n as u32).to_le_bytes());
            self.out[start + 5..start + 9].copy_from_slice(&(piece.len() as u32).to_le_bytes());
        }
        &self.out
    }

    /// A status frame.
    pub fn status(status: &AppStatus) -> [u8; HEADER_LEN + STATUS_LEN] {
        let mut b = [0u8; HEADER_LEN + STATUS_LEN];
        b[0] = KIND_STATUS;
        b[1..5].copy_from_slice(&(STATUS_LEN as u32).to_le_bytes());
        b[HEADER_LEN..].copy_from_slice(&status.encode());
        b
    }

    /// Uncompressed data frames for `records` (the [`KIND_RAW`] kind, for a connection that
    /// negotiated it): each a header and a piece of `records` itself (at most [`MAX_RAW`]
    /// bytes), to be written one after the other; nothing is copied.
    pub fn raw_frames(records: &[u8]) -> impl Iterator<Item = ([u8; HEADER_LEN], &[u8])> {
        records.chunks(MAX_RAW).map(|piece| {
            let mut h = [0u8; HEADER_LEN];
            h[0] = KIND_RAW;
            let n = (piece.len() as u32).to_le_bytes();
            h[1..5].copy_from_slice(&n);
            h[5..9].copy_from_slice(&n);
            (h, piece)
        })
    }

    /// The end frame.
    pub fn end() -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = KIND_END;
        b
    }
}

/// A frame the program sent that breaks the rules.
#[derive(Debug)]
pub enum FrameError {
    /// The socket failed, or closed in the middle of a frame.
    Io(io::Error),
    /// An unknown frame kind.
    UnknownKind(u8),
    /// A frame kind this connection's handshake did not grant (uncompressed data frames the
    /// capture did not ask for).
    NotNegotiated(u8),
    /// A length outside the limits.
    BadLength {
        /// Which frame kind.
        kind: u8,
        /// The compressed length declared.
        payload: u32,
        /// The uncompressed length declared.
        raw: u32,
    },
    /// The LZ4 block does not decompress to its declared size.
    BadBlock(String),
    /// The decompressed bytes are not whole, well-formed `Trace.packet` records.
    BadRecords(&'static str),
    /// The stream ended inside a frame: the program cut the connection (its exit budget ran
    /// out while the capture was not reading) or died. The frames before are whole; this one
    /// is lost, and a capture says so ([`truncation_record`]).
    Truncated {
        /// The frame's kind (0 if the header itself was cut before its first byte was known).
        kind: u8,
        /// Bytes of the frame that arrived (header included).
        received: usize,
        /// Bytes the frame should have had (the header's alone if the header was cut).
        expected: usize,
    },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Io(e) => write!(f, "{e}"),
            FrameError::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            FrameError::NotNegotiated(k) => write!(
                f,
                "frame kind {k} (uncompressed data) was not negotiated in the handshake"
            ),
            FrameError::BadLength { kind, payload, raw } => write!(
                f,
                "frame of kind {kind} declares {payload} payload bytes and {raw} uncompressed bytes, outside the limits"
            ),
            FrameError::BadBlock(e) => write!(f, "bad LZ4 block: {e}"),
            FrameError::BadRecords(why) => write!(f, "bad trace records: {why}"),
            FrameError::Truncated {
                kind,
                received,
                expected,
            } => write!(
                f,
                "the stream ended inside a frame of kind {kind} ({received} of {expected} bytes arrived)"
            ),
        }
    }
}

impl std::error::Error for FrameError {}

impl From<io::Error> for FrameError {
    fn from(e: io::Error) -> Self {
        FrameError::Io(e)
    }
}

/// One frame read by [`FrameReader`].
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// Decompressed trace bytes (not yet validated: see [`RecordScanner`]), and the frame's
    /// size on the wire (header included).
    Data {
        /// The uncompressed bytes.
        raw: &'a [u8],
        /// Bytes this frame took on the wire.
        wire_len: usize,
    },
    /// The program's counters.
    Status(AppStatus),
    /// The trace is complete.
    End,
}

/// Reads and checks frames from an untrusted stream (capture side).
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    payload: Vec<u8>,
    raw: Vec<u8>,
    /// [`KIND_RAW`] frames were negotiated.
    raw_frames: bool,
}

impl<R: Read> FrameReader<R> {
    /// Reads frames from `inner`.
    pub fn new(inner: R) -> Self {
        FrameReader {
            inner,
            payload: Vec::new(),
            raw: Vec::new(),
            raw_frames: false,
        }
    }

    /// Accepts uncompressed data frames ([`KIND_RAW`]) from now on: the handshake granted
    /// them. Without this call they are refused.
    pub fn accept_raw_frames(&mut self, on: bool) {
        self.raw_frames = on;
    }

    /// The stream.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The next frame; `Ok(None)` when the stream ends cleanly between frames,
    /// [`FrameError::Truncated`] when it ends inside one.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, FrameError> {
        let mut head = [0u8; HEADER_LEN];
        match read_full(&mut self.inner, &mut head)? {
            0 => return Ok(None),
            HEADER_LEN => {}
            got => {
                return Err(FrameError::Truncated {
                    kind: head[0],
                    received: got,
                    expected: HEADER_LEN,
                })
            }
        }
        let kind = head[0];
        let cut = |got: usize, len: usize| FrameError::Truncated {
            kind,
            received: HEADER_LEN + got,
            expected: HEADER_LEN + len,
        };
        let payload = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes"));
        let raw = u32::from_le_bytes(head[5..9].try_into().expect("4 bytes"));
        let bad = FrameError::BadLength { kind, payload, raw };
        match kind {
            KIND_DATA => {
                let (p, r) = (payload as usize, raw as usize);
                if r == 0
                    || r > MAX_RAW
                    || p == 0
                    || p > lz4_flex::block::get_maximum_output_size(r)
                {
                    return Err(bad);
                }
                let payload = grow(&mut self.payload, p);
                let got = read_full(&mut self.inner, payload)?;
                if got < p {
                    return Err(cut(got, p));
                }
                let n = lz4_flex::block::decompress_into(payload, grow(&mut self.raw, r))
                    .map_err(|e| FrameError::BadBlock(e.to_string()))?;
                if n != r {
                    return Err(FrameError::BadBlock(format!(
                        "{n} bytes decompressed, {r} declared"
                    )));
                }
                Ok(Some(Frame::Data {
                    raw: &self.raw[..r],
                    wire_len: HEADER_LEN + p,
                }))
            }
            KIND_RAW => {
                if !self.raw_frames {
                    return Err(FrameError::NotNegotiated(kind));
                }
                let r = raw as usize;
                if r == 0 || r > MAX_RAW || payload != raw {
                    return Err(bad);
                }
                // Read straight into the records buffer: there is nothing to decompress.
                let got = read_full(&mut self.inner, grow(&mut self.raw, r))?;
                if got < r {
                    return Err(cut(got, r));
                }
                Ok(Some(Frame::Data {
                    raw: &self.raw[..r],
                    wire_len: HEADER_LEN + r,
                }))
            }
            KIND_STATUS => {
                if payload as usize != STATUS_LEN || raw != 0 {
                    return Err(bad);
                }
                let mut b = [0u8; STATUS_LEN];
                let got = read_full(&mut self.inner, &mut b)?;
                if got < STATUS_LEN {
                    return Err(cut(got, STATUS_LEN));
                }
                Ok(Some(Frame::Status(AppStatus::decode(&b))))
            }
            KIND_END => {
                if payload != 0 || raw != 0 {
                    return Err(bad);
                }
                Ok(Some(Frame::End))
            }
            k => Err(FrameError::UnknownKind(k)),
        }
    }
}

/// The first `n` bytes of `buf` (n ≤ [`MAX_RAW`] or its LZ4 bound, checked by the caller),
/// growing it only when it is shorter: a buffer is zeroed once, not at every frame of another
/// size. Its bytes are overwritten before they are read.
fn grow(buf: &mut Vec<u8>, n: usize) -> &mut [u8] {
    if buf.len() < n {
        buf.resize(n, 0);
    }
    &mut buf[..n]
}

/// Fills `buf` as far as the stream goes: the bytes read (less than `buf.len()` only at the
/// end of the stream).
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Largest `Trace.packet` record a capture accepts (Perfetto's packets are far smaller; the
/// bound is what a capture holds at most for one record that spans frames).
pub const MAX_RECORD: usize = 64 << 20;

/// What [`RecordScanner::push`] found in one batch of bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordCounts {
    /// Whole records.
    pub records: u64,
    /// Records whose packet holds a `track_event` (field 11).
    pub track_events: u64,
    /// Records with `previous_packet_dropped` set (field 42) on a sequence that had packets
    /// before (a sequence's first packet carries the flag by convention: nothing precedes it).
    pub loss_marks: u64,
}

/// Splits a stream of decompressed bytes into whole `Trace.packet` records and checks each
/// (capture side): the tag is field 1 with wire type 2, the length fits [`MAX_RECORD`], and
/// the packet's top-level fields decode. Bytes of a record that continues in the next frame
/// are held (at most [`MAX_RECORD`]). Returns the bytes safe to write to a trace file.
#[derive(Debug, Default)]
pub struct RecordScanner {
    pending: Vec<u8>,
    ready: Vec<u8>,
    /// Sequences seen (at most [`MAX_SEQUENCES`] tracked; past that every mark counts).
    sequences: std::collections::HashSet<u64>,
    /// The sequence of the last packet (already in `sequences`): packets come in runs per
    /// sequence (a chunk's worth), so most need no hash lookup.
    last_sequence: Option<u64>,
}

/// Sequences whose first packet [`RecordScanner`] remembers.
const MAX_SEQUENCES: usize = 1 << 16;

impl RecordScanner {
    /// A scanner at the start of a trace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `bytes`; returns the whole, checked records they complete (to write out) and what
    /// they hold. An error means the stream is not a trace: nothing more from it should be
    /// written.
    ///
    /// With no record held over from the last batch (a program's frames end at record
    /// boundaries unless a record is larger than a frame), the records returned are a prefix of
    /// `bytes` itself: nothing is copied.
    pub fn push<'a>(&'a mut self, bytes: &'a [u8]) -> Result<(&'a [u8], RecordCounts), FrameError> {
        self.ready.clear();
        let mut counts = RecordCounts::default();
        let held = !self.pending.is_empty();
        if held {
            self.pending.extend_from_slice(bytes);
        }
        let data: &[u8] = if held { &self.pending } else { bytes };
        let mut pos = 0;
        let mut ready_end = 0;
        loop {
            let rest = &data[pos..];
            if rest.is_empty() {
                break;
            }
            if rest[0] != 0x0a {
                return Err(FrameError::BadRecords(
                    "a record is not Trace.packet (field 1, bytes)",
                ));
            }
            let Some((len, n)) = read_varint(&rest[1..], 0) else {
                if rest.len() > 11 {
                    return Err(FrameError::BadRecords("a record's length is not a varint"));
                }
                break;
            };
            if len > MAX_RECORD as u64 {
                return Err(FrameError::BadRecords("a record is longer than the limit"));
            }
            let total = 1 + n + len as usize;
            if rest.len() < total {
                break;
            }
            let info = packet_info(&rest[1 + n..total]).map_err(FrameError::BadRecords)?;
            counts.track_events += u64::from(info.track_events);
            let (sequence, dropped) = (info.sequence, info.dropped);
            if let Some(seq) = sequence {
                let first = self.last_sequence != Some(seq)
                    && self.sequences.len() < MAX_SEQUENCES
                    && self.sequences.insert(seq);
                self.last_sequence = Some(seq);
                if dropped && !first {
                    counts.loss_marks += 1;
                }
            }
            counts.records += 1;
            pos += total;
            ready_end = pos;
        }
        if !held {
            self.pending.extend_from_slice(&bytes[ready_end..]);
            return Ok((&bytes[..ready_end], counts));
        }
        self.ready.extend_from_slice(&self.pending[..ready_end]);
        self.pending.drain(..ready_end);
        Ok((&self.ready, counts))
    }

    /// Bytes of an unfinished record held (non-zero at the end of a stream: a truncated
    /// record, which is not written).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// What a capture reads from one `TracePacket` while it checks it ([`packet_info`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketInfo {
    /// `track_event` fields (11) in the packet.
    pub track_events: u32,
    /// `trusted_packet_sequence_id` (10): the last occurrence's value, read as protobuf's
    /// `uint64` reads any wire type (a length-delimited one reads 0).
    pub sequence: Option<u64>,
    /// `previous_packet_dropped` (42) of the last occurrence is non-zero.
    pub dropped: bool,
}

/// Walks the top-level fields of one `TracePacket` from an untrusted peer without building a
/// value per field: varints are skipped (or read, for the two fields a capture needs), payloads
/// and fixed values are stepped over. It accepts exactly what `protozero`'s [`ProtoDecoder`]
/// accepts (the differential property tests and the `capture_frames` fuzz target compare the
/// two, [`packet_info_by_decoder`]), and names what is wrong otherwise: a varint cut short or
/// longer than 10 bytes, field id 0, a group or undefined wire type, a value or payload that
/// runs past the packet.
#[inline]
pub fn packet_info(p: &[u8]) -> Result<PacketInfo, &'static str> {
    const CUT: &str = "a packet's varint is cut short or longer than 10 bytes";
    const PAST_END: &str = "a packet's field runs past the end of the packet";
    let mut info = PacketInfo::default();
    let mut pos = 0;
    while pos < p.len() {
        let (tag, next) = match p[pos] {
            b if b < 0x80 => (u64::from(b), pos + 1),
            _ => read_varint(p, pos).ok_or(CUT)?,
        };
        pos = next;
        let id = tag >> 3;
        if id == 0 {
            return Err("a packet has a field with id 0");
        }
        // The fields a capture reads; any other is only stepped over.
        let wanted = id == 10 || id == 42;
        let value = match tag & 7 {
            0 if wanted => {
                let (v, next) = read_varint(p, pos).ok_or(CUT)?;
                pos = next;
                v
            }
            0 => {
                pos = skip_varint(p, pos).ok_or(CUT)?;
                0
            }
            1 => {
                let bytes = p.get(pos..pos + 8).ok_or(PAST_END)?;
                pos += 8;
                u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
            }
            2 => {
                let (len, start) = match p.get(pos) {
                    Some(&b) if b < 0x80 => (u64::from(b), pos + 1),
                    _ => read_varint(p, pos).ok_or(CUT)?,
                };
                if len > (p.len() - start) as u64 {
                    return Err(PAST_END);
                }
                pos = start + len as usize;
                if len > u64::from(MAX_MESSAGE_LENGTH) {
                    // protozero steps over such a payload without returning its field.
                    continue;
                }
                0
            }
            5 => {
                let bytes = p.get(pos..pos + 4).ok_or(PAST_END)?;
                pos += 4;
                u64::from(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
            }
            _ => return Err("a packet has a group or undefined wire type (3, 4, 6 or 7)"),
        };
        match id {
            11 => info.track_events += 1,
            10 => info.sequence = Some(value),
            42 => info.dropped = value != 0,
            _ => {}
        }
    }
    Ok(info)
}

/// [`packet_info`] through `protozero`'s general decoder (a value per field): the reference the
/// walk is tested and fuzzed against.
#[doc(hidden)]
pub fn packet_info_by_decoder(p: &[u8]) -> Result<PacketInfo, &'static str> {
    let mut info = PacketInfo::default();
    let mut d = ProtoDecoder::new(p);
    loop {
        match d.read_field() {
            Ok(Some(f)) => match f.id() {
                11 => info.track_events += 1,
                10 => info.sequence = Some(f.as_u64()),
                42 => info.dropped = f.as_u64() != 0,
                _ => {}
            },
            Ok(None) => return Ok(info),
            Err(_) => return Err("a packet is not valid protobuf"),
        }
    }
}

/// The varint at `pos` and the offset past it, as `protozero` reads one (at most 10 bytes,
/// bits past the 64th dropped); `None` if it is cut short or longer.
#[inline]
fn read_varint(p: &[u8], pos: usize) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &b) in p.get(pos..)?.iter().take(10).enumerate() {
        // `7 * i <= 63`: the shift never overflows; bits moved past 64 are dropped.
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some((v, pos + i + 1));
        }
    }
    None
}

/// The offset past the varint at `pos`, without its value; `None` as for [`read_varint`].
#[inline]
fn skip_varint(p: &[u8], pos: usize) -> Option<usize> {
    let rest = p.get(pos..)?;
    let n = rest.len().min(10);
    rest[..n]
        .iter()
        .position(|&b| b < 0x80)
        .map(|i| pos + i + 1)
}

/// The `Trace.packet` record a capture appends to its file when the stream was cut inside a
/// frame ([`FrameError::Truncated`]) or closed without the end frame, so that the trace itself
/// states the loss (Perfetto readers show `stats` rows of severity `data_loss`). The
/// program's own final `TraceStats` never arrived, so this one, on the service's sequence (1),
/// carries the last figures known: `final_flush_outcome` = FAILED (the end of the trace, with
/// any frame cut short, is missing: `traced_final_flush_failed`), and in buffer 0 what the
/// program said in its last status frame: `trace_writer_packet_loss` = packets its writers
/// dropped, `chunks_overwritten` = chunks its central buffer overwrote. Only fields Perfetto's
/// own trace processor reads are used.
pub fn truncation_record(last: &AppStatus) -> Vec<u8> {
    fn field(out: &mut Vec<u8>, id: u32, v: u64) {
        put_varint(out, u64::from(id) << 3);
        put_varint(out, v);
    }
    fn nested(out: &mut Vec<u8>, id: u32, body: &[u8]) {
        put_varint(out, (u64::from(id) << 3) | 2);
        put_varint(out, body.len() as u64);
        out.extend_from_slice(body);
    }
    let mut buffer = Vec::new();
    field(&mut buffer, 3, last.chunks_lost); // chunks_overwritten
    field(&mut buffer, 19, last.packets_dropped); // trace_writer_packet_loss
    let mut stats = Vec::new();
    nested(&mut stats, 1, &buffer); // buffer_stats
    field(&mut stats, 15, 2); // final_flush_outcome: FINAL_FLUSH_FAILED
    let mut packet = Vec::new();
    nested(&mut packet, 35, &stats); // trace_stats
    field(&mut packet, 10, 1); // trusted_packet_sequence_id: the service's
    let mut record = Vec::new();
    nested(&mut record, 1, &packet); // Trace.packet
    record
}

fn put_varint(out: &mut Vec<u8>, v: u64) {
    let mut bytes = [0u8; 10];
    let n = protozero::wire::encode_varint(v, &mut bytes);
    out.extend_from_slice(&bytes[..n]);
}

/// Checks a whole batch of records at once (as [`RecordScanner`] with nothing held over):
/// an error if `bytes` does not end at a record boundary. For fuzzing and tests.
pub fn validate_records(bytes: &[u8]) -> Result<RecordCounts, FrameError> {
    let mut s = RecordScanner::new();
    let (_, counts) = s.push(bytes)?;
    if s.pending() != 0 {
        return Err(FrameError::BadRecords("the bytes end inside a record"));
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(packet: &[u8]) -> Vec<u8> {
        let mut r = vec![0x0a, packet.len() as u8];
        r.extend_from_slice(packet);
        r
    }

    #[test]
    fn frames_round_trip() {
        // A packet with a timestamp (field 8) and an empty track_event (field 11).
        let packet = [0x40, 0x05, 0x5a, 0x00];
        let records: Vec<u8> = (0..1000).flat_map(|_| record(&packet)).collect();
        let mut enc = FrameEncoder::new();
        let mut wire = enc.data(&records).to_vec();
        wire.extend_from_slice(&FrameEncoder::status(&AppStatus {
            packets_dropped: 3,
            ..AppStatus::default()
        }));
        wire.extend_from_slice(&FrameEncoder::end());
        let mut r = FrameReader::new(&wire[..]);
        match r.next_frame().unwrap().unwrap() {
            Frame::Data { raw, wire_len } => {
                assert_eq!(raw, &records[..]);
                assert!(wire_len < records.len() / 4, "{wire_len}");
                let c = validate_records(raw).unwrap();
                assert_eq!(c.records, 1000);
                assert_eq!(c.track_events, 1000);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(r.next_frame().unwrap(), Some(Frame::Status(s)) if s.packets_dropped == 3)
        );
        assert_eq!(r.next_frame().unwrap(), Some(Frame::End));
        assert_eq!(r.next_frame().unwrap(), None);
    }

    #[test]
    fn hostile_frames_are_refused_before_allocating() {
        // A lying size: 4 GiB uncompressed.
        let mut f = vec![KIND_DATA];
        f.extend_from_slice(&10u32.to_le_bytes());
        f.extend_from_slice(&u32::MAX.to_le_bytes());
        f.extend_from_slice(&[0; 10]);
        assert!(matches!(
            FrameReader::new(&f[..]).next_frame(),
            Err(FrameError::BadLength { .. })
        ));
        // A block that decompresses to less than it declares.
        let block = lz4_flex::block::compress(b"hello hello hello");
        let mut f = vec![KIND_DATA];
        f.extend_from_slice(&(block.len() as u32).to_le_bytes());
        f.extend_from_slice(&1000u32.to_le_bytes());
        f.extend_from_slice(&block);
        assert!(matches!(
            FrameReader::new(&f[..]).next_frame(),
            Err(FrameError::BadBlock(_))
        ));
        // An unknown kind, a truncated header.
        assert!(matches!(
            FrameReader::new(&[9u8, 0, 0, 0, 0, 0, 0, 0, 0][..]).next_frame(),
            Err(FrameError::UnknownKind(9))
        ));
        assert!(matches!(
            FrameReader::new(&[1u8, 0, 0][..]).next_frame(),
            Err(FrameError::Truncated {
                kind: 1,
                received: 3,
                expected: HEADER_LEN
            })
        ));
    }

    #[test]
    fn a_stream_cut_inside_a_frame_keeps_the_frames_before() {
        let packet = [0x40, 0x05, 0x5a, 0x00];
        let records: Vec<u8> = (0..100).flat_map(|_| record(&packet)).collect();
        let mut enc = FrameEncoder::new();
        let first = enc.data(&records).to_vec();
        let second = enc.data(&records).to_vec();
        let mut wire = first.clone();
        wire.extend_from_slice(&second[..second.len() / 2]);
        let mut r = FrameReader::new(&wire[..]);
        assert!(matches!(r.next_frame(), Ok(Some(Frame::Data { raw, .. })) if raw == &records[..]));
        match r.next_frame() {
            Err(FrameError::Truncated {
                kind,
                received,
                expected,
            }) => {
                assert_eq!(kind, KIND_DATA);
                assert_eq!(received, second.len() / 2);
                assert_eq!(expected, second.len());
            }
            other => panic!("{other:?}"),
        }
        // A status frame cut short.
        let status = FrameEncoder::status(&AppStatus::default());
        assert!(matches!(
            FrameReader::new(&status[..20]).next_frame(),
            Err(FrameError::Truncated {
                kind: KIND_STATUS,
                received: 20,
                ..
            })
        ));
    }

    #[test]
    fn the_truncation_record_is_a_valid_trace_stats_packet() {
        let last = AppStatus {
            packets_dropped: 300,
            chunks_lost: 7,
            ..AppStatus::default()
        };
        let rec = truncation_record(&last);
        assert_eq!(validate_records(&rec).unwrap().records, 1);
        // Trace.packet → TracePacket.trace_stats (35) → buffer_stats (1) and the outcome.
        let mut d = ProtoDecoder::new(&rec);
        let packet = d.read_field().unwrap().unwrap();
        assert_eq!(packet.id(), 1);
        let mut p = ProtoDecoder::new(packet.as_bytes());
        let (mut stats, mut seq) = (None, None);
        while let Some(f) = p.read_field().unwrap() {
            match f.id() {
                35 => stats = Some(f.as_bytes()),
                10 => seq = Some(f.as_u64()),
                other => panic!("field {other}"),
            }
        }
        assert_eq!(seq, Some(1));
        let mut t = ProtoDecoder::new(stats.unwrap());
        let buffer = t.read_field().unwrap().unwrap();
        assert_eq!(buffer.id(), 1);
        let outcome = t.read_field().unwrap().unwrap();
        assert_eq!((outcome.id(), outcome.as_u64()), (15, 2));
        let mut b = ProtoDecoder::new(buffer.as_bytes());
        let mut got = Vec::new();
        while let Some(f) = b.read_field().unwrap() {
            got.push((f.id(), f.as_u64()));
        }
        assert_eq!(got, [(3, 7), (19, 300)]);
    }

    #[test]
    fn raw_frames_round_trip_only_when_negotiated() {
        let packet = [0x40, 0x05, 0x5a, 0x00];
        let records: Vec<u8> = (0..300_000).flat_map(|_| record(&packet)).collect();
        assert!(records.len() > MAX_RAW);
        let mut wire = Vec::new();
        for (head, piece) in FrameEncoder::raw_frames(&records) {
            assert!(piece.len() <= MAX_RAW);
            wire.extend_from_slice(&head);
            wire.extend_from_slice(piece);
        }
        wire.extend_from_slice(&FrameEncoder::end());
        let mut r = FrameReader::new(&wire[..]);
        r.accept_raw_frames(true);
        let mut scanner = RecordScanner::new();
        let (mut got, mut n, mut on_wire) = (Vec::new(), 0, 0);
        while let Some(f) = r.next_frame().unwrap() {
            match f {
                Frame::Data { raw, wire_len } => {
                    on_wire += wire_len;
                    let (ready, c) = scanner.push(raw).unwrap();
                    got.extend_from_slice(ready);
                    n += c.records;
                }
                Frame::End => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got, records);
        assert_eq!(n, 300_000);
        assert_eq!(on_wire, wire.len() - HEADER_LEN);
        // A reader that did not negotiate them refuses them, naming why.
        let e = FrameReader::new(&wire[..]).next_frame().unwrap_err();
        assert!(matches!(e, FrameError::NotNegotiated(KIND_RAW)), "{e:?}");
        assert!(e.to_string().contains("not negotiated"), "{e}");
        // Lying sizes: payload and raw lengths differ, zero, or above the limit.
        for (p, r) in [
            (10u32, 11u32),
            (0, 0),
            (MAX_RAW as u32 + 1, MAX_RAW as u32 + 1),
        ] {
            let mut f = vec![KIND_RAW];
            f.extend_from_slice(&p.to_le_bytes());
            f.extend_from_slice(&r.to_le_bytes());
            f.extend_from_slice(&[0; 16]);
            let mut reader = FrameReader::new(&f[..]);
            reader.accept_raw_frames(true);
            assert!(
                matches!(reader.next_frame(), Err(FrameError::BadLength { .. })),
                "{p} {r}"
            );
        }
    }

    #[test]
    fn the_walk_names_what_is_wrong() {
        let bad = |p: &[u8]| packet_info(p).unwrap_err();
        assert!(bad(&[0x08]).contains("cut short"));
        assert!(
            bad(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01])
                .contains("longer than 10")
        );
        assert!(bad(&[0x00, 0x01]).contains("id 0"));
        assert!(bad(&[0x0b]).contains("wire type"));
        assert!(bad(&[0x5a, 0x05, 0x00]).contains("past the end"));
        assert!(bad(&[0x51, 0x00]).contains("past the end"));
        // Sequence 7 (a 2-byte tag, redundantly encoded), two track events, the loss flag.
        let p = [
            0xd0, 0x00, 0x07, 0x5a, 0x00, 0x5a, 0x01, 0x08, 0xd0, 0x02, 0x01,
        ];
        assert_eq!(
            packet_info(&p),
            Ok(PacketInfo {
                track_events: 2,
                sequence: Some(7),
                dropped: true
            })
        );
        assert_eq!(packet_info(&p), packet_info_by_decoder(&p));
    }

    #[test]
    fn records_are_joined_across_frames_and_garbage_is_refused() {
        let packet = [0x40, 0x05, 0x5a, 0x00];
        let records: Vec<u8> = (0..3).flat_map(|_| record(&packet)).collect();
        let mut s = RecordScanner::new();
        let (ready, c) = s.push(&records[..5]).unwrap();
        assert_eq!(ready.len(), 0);
        assert_eq!(c.records, 0);
        let (ready, c) = s.push(&records[5..]).unwrap();
        assert_eq!(ready, &records[..]);
        assert_eq!(c.records, 3);
        assert!(validate_records(&[0x12, 0x00]).is_err());
        assert!(validate_records(&[0x0a, 0x02, 0xff, 0xff]).is_err());
        assert!(validate_records(&[0x0a, 0x05, 0x40]).is_err());
    }
}

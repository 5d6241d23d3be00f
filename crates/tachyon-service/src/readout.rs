//! Read-out: turns packets leaving a [`crate::TraceBuffer`] into `Trace.packet` records of the
//! output file, after checking them and appending what only the service may say.
//!
//! 1. **Validate** each packet as Perfetto's `PacketStreamValidator` does: it must parse as a
//!    protobuf message (well-formed, wire types 0/1/2/5, at most 256 MiB) and must not set a
//!    field reserved for the service (`trusted_uid` 3, `trusted_packet_sequence_id` 10,
//!    `trace_config` 33, `trace_stats` 35, `synchronization_marker` 36, `compressed_packets`
//!    50, `service_event` 69, `trusted_pid` 79, `machine_id` 98, `trace_provenance` 124,
//!    `protovms` 125, `zstd_compressed_packets` 133). Rejected packets are counted as
//!    `invalid_packets`, never written.
//! 2. **Append the trusted fields** after the producer's bytes: `trusted_uid`,
//!    `trusted_packet_sequence_id` (unique per producer and writer; 1 is the service's own),
//!    `trusted_pid`, and `previous_packet_dropped` when the buffer saw loss. Protobuf keeps the
//!    last occurrence of a field, so a producer cannot override them.

use crate::fast_hash::IdMap;

use protozero::{FieldValue, ProtoDecoder};
use tachyon_protos::TracePacket;

use crate::trace_buffer::{PacketInfo, ProducerId, WriterId};

/// TracePacket fields only the service may set.
pub const RESERVED_PACKET_FIELDS: [u32; 12] = [3, 10, 33, 35, 36, 50, 69, 79, 98, 124, 125, 133];

/// `trusted_packet_sequence_id` of the service's own packets (stats, markers, snapshots).
pub const SERVICE_SEQUENCE_ID: u32 = 1;

const PREVIOUS_PACKET_DROPPED: u32 = TracePacket::PREVIOUS_PACKET_DROPPED_FIELD_NUMBER;
const MAX_PACKET_SIZE: usize = (1 << 28) - 1;

/// Who a producer is, as the service established it (from the connection, never from data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerIdentity {
    /// The producer process's pid.
    pub pid: i32,
    /// Its uid.
    pub uid: i32,
}

/// Why a packet was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidPacket {
    /// It does not parse as a protobuf message (or is larger than 256 MiB).
    Malformed,
    /// It sets a field reserved for the service.
    ReservedField(u32),
}

/// [`RESERVED_PACKET_FIELDS`] as a bitmap over ids 0..192 (all of them are below 134).
const RESERVED_BITMAP: [u64; 3] = {
    let mut bits = [0u64; 3];
    let mut i = 0;
    while i < RESERVED_PACKET_FIELDS.len() {
        let id = RESERVED_PACKET_FIELDS[i] as usize;
        bits[id / 64] |= 1 << (id % 64);
        i += 1;
    }
    bits
};

const fn is_reserved(id: u64) -> bool {
    id < 192 && RESERVED_BITMAP[id as usize / 64] & (1 << (id % 64)) != 0
}

/// Reads a varint of at most `max` bytes at `*at`; `None` if it is longer or cut short.
#[inline(always)]
fn varint(bytes: &[u8], at: &mut usize, max: usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..max {
        let b = *bytes.get(*at + i)?;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            *at += i + 1;
            return Some(v);
        }
    }
    None
}

/// What a field's first byte says about the field, for the fast check: a one-byte tag (below
/// 0x80: field ids 1..15) of a varint, a length-delimited field, or a fixed 64- or 32-bit
/// value, or [`TAG_OTHER`] for anything the general field code must look at (field id 0, wire
/// types 3, 4, 6, 7, the reserved ids below 16 ([`is_reserved`]), which are refused only after their value is
/// read, as the decoder does, and longer tags).
const TAG_OTHER: u8 = 0;
const TAG_VARINT: u8 = 1;
const TAG_BYTES: u8 = 2;
const TAG_FIXED64: u8 = 9;
const TAG_FIXED32: u8 = 5;
const FIRST_BYTES: [u8; 256] = {
    let mut t = [TAG_OTHER; 256];
    let mut tag = 0;
    while tag < 128 {
        let id = tag >> 3;
        let reserved = is_reserved(id as u64);
        t[tag] = if id == 0 || reserved {
            TAG_OTHER
        } else {
            match tag & 7 {
                0 => TAG_VARINT,
                1 => TAG_FIXED64,
                2 => TAG_BYTES,
                5 => TAG_FIXED32,
                _ => TAG_OTHER,
            }
        };
        tag += 1;
    }
    t
};

/// The common case of [`validate_packet`] in one pass over the bytes, without a decoder: every
/// field has an id in 1..2^24 and wire type 0, 1, 2 or 5, and fits. `None` for anything else
/// (the full check then decides, so both agree on every input; a property test checks it).
///
/// Fields with a one-byte tag that is neither reserved nor `previous_packet_dropped` (all the
/// SDK writes on its hot path) take one table look-up and skip their value; any other field
/// goes through [`general_field`].
#[inline(always)]
fn validate_fast(packet: &[u8]) -> Option<Result<u32, InvalidPacket>> {
    let mut dropped = 0;
    let mut at = 0;
    while let Some(&first) = packet.get(at) {
        let class = FIRST_BYTES[usize::from(first)];
        if class == TAG_VARINT {
            // Skip the value: its bytes up to the first below 0x80, at most 10.
            let mut end = at + 1;
            loop {
                let b = *packet.get(end)?;
                end += 1;
                if b < 0x80 {
                    break;
                }
                if end - at > 10 {
                    return None;
                }
            }
            at = end;
        } else if class == TAG_BYTES {
            at += 1;
            let len = match packet.get(at) {
                Some(&b) if b < 0x80 => {
                    at += 1;
                    usize::from(b)
                }
                _ => usize::try_from(varint(packet, &mut at, 5)?).ok()?,
            };
            // `len` is below 2^35 and `at` below 2^28: no overflow on 64-bit targets.
            at = at.checked_add(len).filter(|&e| e <= packet.len())?;
        } else if class != TAG_OTHER {
            // A fixed-size value: the class is the tag and value's size.
            at = Some(at + usize::from(class)).filter(|&e| e <= packet.len())?;
        } else {
            match general_field(packet, at)? {
                Ok((next, d)) => {
                    at = next;
                    if let Some(d) = d {
                        dropped = d;
                    }
                }
                Err(reserved) => return Some(Err(reserved)),
            }
        }
    }
    Some(Ok(dropped))
}

/// One field of [`validate_fast`] the table does not decide, at `at`: `None` if the fast check
/// cannot decide the packet, a reserved field's error, or the offset after the field and the
/// value of `previous_packet_dropped` if it is that field.
#[inline(never)]
fn general_field(
    packet: &[u8],
    mut at: usize,
) -> Option<Result<(usize, Option<u32>), InvalidPacket>> {
    let tag = varint(packet, &mut at, 5)?;
    let id = tag >> 3;
    if id == 0 || id >= 1 << 24 {
        return None;
    }
    let mut dropped = None;
    match tag & 7 {
        0 => {
            let v = varint(packet, &mut at, 10)?;
            if id == u64::from(PREVIOUS_PACKET_DROPPED) {
                dropped = Some(v as u32);
            }
        }
        1 => at = at.checked_add(8).filter(|&e| e <= packet.len())?,
        2 => {
            let len = varint(packet, &mut at, 5)?;
            at = at
                .checked_add(usize::try_from(len).ok()?)
                .filter(|&e| e <= packet.len())?;
        }
        5 => at = at.checked_add(4).filter(|&e| e <= packet.len())?,
        _ => return None,
    }
    // After the value, as the decoder (a field cut short is malformed first).
    if is_reserved(id) {
        return Some(Err(InvalidPacket::ReservedField(id as u32)));
    }
    Some(Ok((at, dropped)))
}

/// Checks a packet against the rules above; on success returns the `previous_packet_dropped`
/// value the producer itself wrote (0 if none), so the service can merge its own bits in.
#[inline]
pub fn validate_packet(packet: &[u8]) -> Result<u32, InvalidPacket> {
    if packet.len() > MAX_PACKET_SIZE {
        return Err(InvalidPacket::Malformed);
    }
    match validate_fast(packet) {
        Some(r) => r,
        None => validate_full(packet),
    }
}

/// [`validate_packet`] through the general decoder.
fn validate_full(packet: &[u8]) -> Result<u32, InvalidPacket> {
    let mut dropped = 0;
    let mut decoder = ProtoDecoder::new(packet);
    loop {
        match decoder.read_field() {
            Ok(Some(field)) => {
                if RESERVED_PACKET_FIELDS.contains(&field.id()) {
                    return Err(InvalidPacket::ReservedField(field.id()));
                }
                if field.id() == PREVIOUS_PACKET_DROPPED {
                    if let FieldValue::Varint(v) = field.value() {
                        dropped = v as u32;
                    }
                }
            }
            Ok(None) => break,
            Err(_) => return Err(InvalidPacket::Malformed),
        }
    }
    // The decoder silently skips fields it cannot index (ids above 2^24, lengths above 256 MiB);
    // a packet made of such fields is still well-formed protobuf, so it passes.
    Ok(dropped)
}

/// The trusted fields of one sequence, encoded once (they are the same on all its packets).
#[derive(Clone, Copy, Debug)]
struct Trailer {
    key: (ProducerId, WriterId),
    identity: ProducerIdentity,
    /// `trusted_uid`, `trusted_packet_sequence_id`, `trusted_pid`: at most 32 bytes.
    bytes: [u8; 32],
    len: u8,
}

/// Writes validated packets with their trusted fields as `Trace.packet` records.
#[derive(Debug)]
pub struct PacketWriter {
    sequence_ids: IdMap<(ProducerId, WriterId), u32>,
    next_sequence_id: u32,
    scratch: Vec<u8>,
    /// The last sequence's trusted fields: packets come out of a buffer sequence by sequence.
    trailer: Option<Trailer>,
    invalid_packets: u64,
    packets_written: u64,
}

impl Default for PacketWriter {
    fn default() -> Self {
        PacketWriter {
            sequence_ids: IdMap::default(),
            next_sequence_id: SERVICE_SEQUENCE_ID + 1,
            scratch: Vec::new(),
            trailer: None,
            invalid_packets: 0,
            packets_written: 0,
        }
    }
}

impl PacketWriter {
    /// A writer with no sequences assigned yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Packets rejected so far (`TraceStats.invalid_packets`).
    pub fn invalid_packets(&self) -> u64 {
        self.invalid_packets
    }

    /// Packets written so far.
    pub fn packets_written(&self) -> u64 {
        self.packets_written
    }

    /// The `trusted_packet_sequence_id` of a producer's writer, if one of its packets was
    /// written.
    pub fn existing_sequence_id(&self, producer: ProducerId, writer: WriterId) -> Option<u32> {
        self.sequence_ids.get(&(producer, writer)).copied()
    }

    /// The `trusted_packet_sequence_id` of a producer's writer (assigned on first use).
    pub fn sequence_id(&mut self, producer: ProducerId, writer: WriterId) -> u32 {
        let next = &mut self.next_sequence_id;
        *self
            .sequence_ids
            .entry((producer, writer))
            .or_insert_with(|| {
                let id = *next;
                *next += 1;
                id
            })
    }

    /// The encoded trusted fields of a sequence (cached for the last one asked for).
    #[inline]
    fn trailer(&mut self, key: (ProducerId, WriterId), identity: ProducerIdentity) -> &Trailer {
        if self
            .trailer
            .as_ref()
            .is_some_and(|t| t.key == key && t.identity == identity)
        {
            return self.trailer.as_ref().expect("checked");
        }
        self.new_trailer(key, identity)
    }

    #[cold]
    fn new_trailer(&mut self, key: (ProducerId, WriterId), identity: ProducerIdentity) -> &Trailer {
        let seq = self.sequence_id(key.0, key.1);
        let mut t = Trailer {
            key,
            identity,
            bytes: [0; 32],
            len: 0,
        };
        let mut trusted = protozero::StaticBuffered::new(&mut t.bytes);
        {
            let mut p: TracePacket<'_> = trusted.root();
            p.set_trusted_uid(identity.uid);
            p.set_trusted_packet_sequence_id(seq);
            p.set_trusted_pid(identity.pid);
        }
        let len = trusted
            .finish()
            .expect("32 bytes hold two sign-extended int32s and a uint32")
            .len();
        t.len = len as u8;
        self.trailer.insert(t)
    }

    /// Validates one packet read out of a buffer and appends it to `out` as a `Trace.packet`
    /// record with the trusted fields. Returns false (and counts it) if it was rejected.
    ///
    /// The producer's bytes are copied as they are (checked, never re-encoded) and the trusted
    /// fields appended after them, encoded once per sequence.
    // Inlined into the read-out loop with the common path (a call per packet, saving registers,
    // costs more than a small packet's check); the gathering of fragments is out of line.
    #[inline(always)]
    pub fn write_packet(
        &mut self,
        info: PacketInfo,
        fragments: &[&[u8]],
        producer: ProducerIdentity,
        out: &mut Vec<u8>,
    ) -> bool {
        // A packet in one fragment (nearly all of them) is checked where it lies.
        if let [one] = fragments {
            return self.write_one(info, one, producer, out);
        }
        self.write_gathered(info, fragments, producer, out)
    }

    /// [`write_packet`](Self::write_packet) for a packet in several fragments: gathered first.
    #[inline(never)]
    fn write_gathered(
        &mut self,
        info: PacketInfo,
        fragments: &[&[u8]],
        producer: ProducerIdentity,
        out: &mut Vec<u8>,
    ) -> bool {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        for f in fragments {
            scratch.extend_from_slice(f);
        }
        let ok = self.write_one(info, &scratch, producer, out);
        self.scratch = scratch;
        ok
    }

    /// [`write_packet`](Self::write_packet) for a packet in one piece.
    // Inlined into the read-out loop: the calls per packet, each saving registers and setting
    // up a frame sized for the rare path, cost more than the common path's work.
    #[inline(always)]
    fn write_one(
        &mut self,
        info: PacketInfo,
        packet: &[u8],
        producer: ProducerIdentity,
        out: &mut Vec<u8>,
    ) -> bool {
        match validate_packet(packet) {
            Ok(own_dropped) => {
                let trailer = self.trailer((info.producer, info.writer), producer);
                let dropped = own_dropped | info.previous_packet_dropped;
                if dropped == 0 && packet.len() <= SMALL {
                    write_small_record(out, packet, &trailer.bytes, trailer.len as usize);
                } else {
                    let trailer = &trailer.bytes[..trailer.len as usize];
                    if dropped == 0 {
                        write_record(out, &[packet, trailer]);
                    } else {
                        write_with_dropped(out, packet, trailer, dropped);
                    }
                }
                self.packets_written += 1;
                true
            }
            Err(_) => {
                self.invalid_packets += 1;
                false
            }
        }
    }
}

/// A record whose packet reports loss: `previous_packet_dropped` (the producer's bits and the
/// service's) after the producer's own fields (the last occurrence of a field wins). Rare, and
/// kept out of line so the common path's frame stays small.
#[cold]
#[inline(never)]
fn write_with_dropped(out: &mut Vec<u8>, packet: &[u8], trailer: &[u8], dropped: u32) {
    let mut storage = [0u8; 8];
    let mut extra = protozero::StaticBuffered::new(&mut storage);
    extra
        .root::<TracePacket<'_>>()
        .set_previous_packet_dropped(dropped);
    let extra = extra.finish().expect("8 bytes hold a uint32 field");
    write_record(out, &[packet, trailer, extra]);
}

/// Packets up to this size take [`write_small_record`] (with a trailer of at most 32 bytes the
/// record's length stays below 128, a one-byte varint).
const SMALL: usize = 14;

/// The bytes of `p` (at most 16) as a little-endian number, read with at most two fixed-size
/// loads that overlap in the middle (a call to `memcpy` costs more than a ten-byte packet).
#[inline(always)]
fn small_value(p: &[u8]) -> u128 {
    let n = p.len();
    if n >= 8 {
        let lo = u64::from_le_bytes(p[..8].try_into().expect("8 bytes"));
        let hi = u64::from_le_bytes(p[n - 8..].try_into().expect("8 bytes"));
        // The bytes both loads hold are the same: or-ing them is exact.
        u128::from(lo) | u128::from(hi) << (8 * (n - 8))
    } else if n >= 4 {
        let lo = u32::from_le_bytes(p[..4].try_into().expect("4 bytes"));
        let hi = u32::from_le_bytes(p[n - 4..].try_into().expect("4 bytes"));
        u128::from(lo) | u128::from(hi) << (8 * (n - 4))
    } else if n > 0 {
        u128::from(p[0])
            | u128::from(p[n / 2]) << (8 * (n / 2))
            | u128::from(p[n - 1]) << (8 * (n - 1))
    } else {
        0
    }
}

/// [`write_record`] for a packet of at most [`SMALL`] bytes and its trailer (`trailer[..len]`,
/// 32 bytes held): the record's tag, length and packet are put together in a register and
/// stored with one 16-byte store, the trailer with one 32-byte copy, and `out` is cut back to
/// the record's end after each (the bytes past it are overwritten by the next record). Only
/// stores, of fixed sizes: no `memcpy` call, no zeroing, and no load of bytes just stored
/// (assembling the record on the stack and copying it out stalled on every record, a wide load
/// waiting for the narrow stores that wrote it).
#[inline(always)]
fn write_small_record(out: &mut Vec<u8>, packet: &[u8], trailer: &[u8; 32], len: usize) {
    let n = packet.len();
    debug_assert!(n <= SMALL && len <= 32);
    let at = out.len();
    let head = 0x0a | ((n + len) as u128) << 8; // below 128: a one-byte varint
    let first = head | small_value(packet) << 16;
    out.extend_from_slice(&first.to_le_bytes());
    out.truncate(at + 2 + n);
    out.extend_from_slice(trailer);
    out.truncate(at + 2 + n + len);
}

/// Appends a `Trace.packet` record (field 1, length-delimited) made of `parts` to `out`.
#[inline]
pub fn write_record(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.reserve(len + 11);
    let mut head = [0u8; 11];
    head[0] = 0x0a;
    let n = protozero::wire::encode_varint(len as u64, &mut head[1..]);
    out.extend_from_slice(&head[..1 + n]);
    for p in parts {
        out.extend_from_slice(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> PacketInfo {
        PacketInfo {
            producer: 1,
            writer: 7,
            previous_packet_dropped: 0,
        }
    }

    proptest::proptest! {
        /// The one-pass check says what the decoder-based one says, whenever it decides.
        #[test]
        fn the_fast_check_agrees_with_the_full_one(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            if let Some(fast) = validate_fast(&bytes) {
                proptest::prop_assert_eq!(fast, validate_full(&bytes));
            }
        }

        /// Well-formed packets (the usual case) are decided by the fast check.
        #[test]
        fn the_fast_check_decides_well_formed_packets(
            fields in proptest::collection::vec((1u32..200, 0u8..4, 0u64..1 << 40), 0..12),
        ) {
            let mut buf = protozero::HeapBuffered::new();
            {
                let mut m = buf.root_message();
                for &(id, kind, v) in &fields {
                    match kind {
                        0 => m.append_uint64(id, v),
                        1 => m.append_fixed64(id, v),
                        2 => m.append_bytes(id, &v.to_le_bytes()[..(v % 8) as usize]),
                        _ => m.append_fixed32(id, v as u32),
                    }
                }
            }
            let bytes = buf.serialize().unwrap();
            let fast = validate_fast(&bytes);
            proptest::prop_assert!(fast.is_some());
            proptest::prop_assert_eq!(fast.unwrap(), validate_full(&bytes));
        }
    }

    proptest::proptest! {
        /// The register-assembled record is byte for byte the general one, after any output.
        #[test]
        fn small_records_are_written_like_any_record(
            before in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            packet in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..=SMALL),
            trailer in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..=32),
        ) {
            let mut held = [0xeeu8; 32];
            held[..trailer.len()].copy_from_slice(&trailer);
            let mut small = before.clone();
            write_small_record(&mut small, &packet, &held, trailer.len());
            let mut general = before;
            write_record(&mut general, &[&packet, &trailer]);
            proptest::prop_assert_eq!(small, general);
        }
    }

    #[test]
    fn reserved_fields_are_rejected() {
        for id in RESERVED_PACKET_FIELDS {
            let mut buf = protozero::HeapBuffered::new();
            buf.root_message().append_uint32(8, 1);
            buf.root_message().append_uint32(id, 1);
            let bytes = buf.serialize().unwrap();
            assert_eq!(
                validate_packet(&bytes),
                Err(InvalidPacket::ReservedField(id))
            );
        }
    }

    #[test]
    fn malformed_packets_are_rejected_and_counted() {
        let mut w = PacketWriter::new();
        let mut out = Vec::new();
        let id = ProducerIdentity { pid: 1, uid: 2 };
        assert!(!w.write_packet(info(), &[&[0x08]], id, &mut out)); // truncated varint
        assert!(!w.write_packet(info(), &[&[0x0b, 0x00]], id, &mut out)); // wire type 3
        assert!(!w.write_packet(info(), &[&[0x50, 0x01]], id, &mut out)); // field 10 set
        assert_eq!(w.invalid_packets(), 3);
        assert!(out.is_empty());
    }

    #[test]
    fn trusted_fields_are_appended_and_win() {
        let mut w = PacketWriter::new();
        let mut out = Vec::new();
        // timestamp 8 = 5, previous_packet_dropped 42 = 256 (SMB full, from the writer).
        let packet = [0x40, 0x05, 0xd0, 0x02, 0x80, 0x02];
        let info = PacketInfo {
            previous_packet_dropped: 2,
            ..info()
        };
        assert!(w.write_packet(
            info,
            &[&packet[..2], &packet[2..]],
            ProducerIdentity { pid: 42, uid: 1000 },
            &mut out
        ));
        let record = ProtoDecoder::new(&out).find_field(1).unwrap();
        let p = record.as_message();
        assert_eq!(p.find_field(8).unwrap().as_u64(), 5);
        assert_eq!(p.find_field(3).unwrap().as_i32(), 1000);
        assert_eq!(p.find_field(79).unwrap().as_i32(), 42);
        assert_eq!(p.find_field(10).unwrap().as_u32(), 2);
        assert_eq!(p.find_last_field(42).unwrap().as_u32(), 258);
        // The next writer gets the next sequence id.
        assert_eq!(w.sequence_id(1, 8), 3);
        assert_eq!(w.sequence_id(1, 7), 2);
    }
}

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

/// Checks a packet against the rules above; on success returns the `previous_packet_dropped`
/// value the producer itself wrote (0 if none), so the service can merge its own bits in.
pub fn validate_packet(packet: &[u8]) -> Result<u32, InvalidPacket> {
    if packet.len() > MAX_PACKET_SIZE {
        return Err(InvalidPacket::Malformed);
    }
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

/// Writes validated packets with their trusted fields as `Trace.packet` records.
#[derive(Debug)]
pub struct PacketWriter {
    sequence_ids: IdMap<(ProducerId, WriterId), u32>,
    next_sequence_id: u32,
    scratch: Vec<u8>,
    invalid_packets: u64,
    packets_written: u64,
}

impl Default for PacketWriter {
    fn default() -> Self {
        PacketWriter {
            sequence_ids: IdMap::default(),
            next_sequence_id: SERVICE_SEQUENCE_ID + 1,
            scratch: Vec::new(),
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

    /// Validates one packet read out of a buffer and appends it to `out` as a `Trace.packet`
    /// record with the trusted fields. Returns false (and counts it) if it was rejected.
    pub fn write_packet(
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
        let ok = match validate_packet(&scratch) {
            Ok(own_dropped) => {
                let seq = self.sequence_id(info.producer, info.writer);
                let dropped = own_dropped | info.previous_packet_dropped;
                // At most 36 bytes: two sign-extended int32s, a uint32 and the loss bits.
                let mut storage = [0u8; 40];
                let mut trusted = protozero::StaticBuffered::new(&mut storage);
                {
                    let mut p: TracePacket<'_> = trusted.root();
                    p.set_trusted_uid(producer.uid);
                    p.set_trusted_packet_sequence_id(seq);
                    p.set_trusted_pid(producer.pid);
                    if dropped != 0 {
                        p.set_previous_packet_dropped(dropped);
                    }
                }
                let trusted = trusted.finish().expect("40 bytes hold the trusted fields");
                write_record(out, &[&scratch, trusted]);
                self.packets_written += 1;
                true
            }
            Err(_) => {
                self.invalid_packets += 1;
                false
            }
        };
        self.scratch = scratch;
        ok
    }
}

/// Appends a `Trace.packet` record (field 1, length-delimited) made of `parts` to `out`.
pub fn write_record(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.push(0x0a);
    let mut buf = [0u8; 10];
    let n = protozero::wire::encode_varint(len as u64, &mut buf);
    out.extend_from_slice(&buf[..n]);
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

//! `compression_type: COMPRESSION_TYPE_DEFLATE`: the read-out's `Trace.packet` records are
//! compressed in batches, each batch becoming one packet whose `compressed_packets` (field 50)
//! holds a zlib stream of the batch's records, as Perfetto's service writes them: the inflated
//! bytes are themselves a `Trace` (each packet behind its field-1 preamble), so readers
//! (Perfetto's trace processor, Tachyon's) tokenize them like the file around them.
//!
//! Batches end on record boundaries and hold at most [`BATCH_BYTES`] of input, so a reader never
//! inflates more than that for one packet. The level is [`LEVEL`]: the service compresses on the
//! thread that also copies producers' chunks, so speed matters more than the last percent
//! (Perfetto uses zlib's 6).

use protozero::ProtoDecoder;

use crate::readout::write_record;

/// Input per compressed packet at most (a single larger record makes a batch of its own).
pub(crate) const BATCH_BYTES: usize = 1 << 20;
/// The zlib level (1: fastest).
pub(crate) const LEVEL: u8 = 1;

/// `TracePacket.compressed_packets`, length-delimited: (50 << 3) | 2 as a varint.
const COMPRESSED_PACKETS_TAG: [u8; 2] = [0x92, 0x03];

/// Appends `records` (well-formed `Trace.packet` records: the service's own output) to `out` as
/// compressed packets.
pub(crate) fn deflate_records(records: &[u8], out: &mut Vec<u8>) {
    let mut start = 0;
    while start < records.len() {
        let end = batch_end(records, start);
        let z = miniz_oxide::deflate::compress_to_vec_zlib(&records[start..end], LEVEL);
        let mut head = [0u8; 12];
        head[..2].copy_from_slice(&COMPRESSED_PACKETS_TAG);
        let n = protozero::wire::encode_varint(z.len() as u64, &mut head[2..]);
        write_record(out, &[&head[..2 + n], &z]);
        start = end;
    }
}

/// The end of the batch starting at `start`: whole records up to [`BATCH_BYTES`], at least one.
fn batch_end(records: &[u8], start: usize) -> usize {
    let mut decoder = ProtoDecoder::new(&records[start..]);
    let mut end = start;
    while let Ok(Some(_)) = decoder.read_field() {
        let next = start + decoder.offset();
        if next - start > BATCH_BYTES && end > start {
            break;
        }
        end = next;
    }
    if end == start {
        // Not a record (cannot happen with the service's own output): keep the bytes anyway.
        records.len()
    } else {
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: usize, fill: u8) -> Vec<u8> {
        let mut out = Vec::new();
        write_record(&mut out, &[&vec![fill; n]]);
        out
    }

    fn inflate(out: &[u8]) -> Vec<u8> {
        let mut all = Vec::new();
        let mut d = ProtoDecoder::new(out);
        while let Ok(Some(f)) = d.read_field() {
            assert_eq!(f.id(), 1);
            let p = f.as_message();
            let z = p.find_field(50).expect("compressed_packets").as_bytes();
            all.extend(miniz_oxide::inflate::decompress_to_vec_zlib(z).unwrap());
        }
        all
    }

    #[test]
    fn records_come_back_whole_in_batches() {
        let mut records = Vec::new();
        for i in 0..300 {
            records.extend(record(10_000 + i, i as u8));
        }
        let mut out = Vec::new();
        deflate_records(&records, &mut out);
        assert_eq!(inflate(&out), records);
        let packets = ProtoDecoder::new(&out).take_while(Result::is_ok).count();
        // About 3 MB of input: a few batches of at most 1 MiB.
        assert!((3..=4).contains(&packets), "{packets}");
        assert!(out.len() < records.len() / 10);
    }

    #[test]
    fn a_record_larger_than_a_batch_is_a_batch_of_its_own() {
        let records = [record(10, 1), record(BATCH_BYTES + 5, 2), record(10, 3)].concat();
        let mut out = Vec::new();
        deflate_records(&records, &mut out);
        assert_eq!(inflate(&out), records);
    }
}

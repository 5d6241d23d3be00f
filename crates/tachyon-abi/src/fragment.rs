//! Fragments: how a chunk's payload is cut into pieces of packets.
//!
//! A payload is a run of fragments, one per counted packet. Each fragment is a varint size of
//! at most 4 bytes followed by that many bytes. The writer reserves 4 bytes for the size before
//! it knows it and back-fills a *redundant* varint (continuation bit set on bytes 0–2, clear on
//! byte 3), or compacts small fragments to a 1-byte size. The largest 4-byte value,
//! 2^28 − 1 ([`PACKET_SIZE_DROP_PACKET`]), tells the service to drop the packet; since no
//! fragment can be that big, everything after it in the chunk is ignored.
//!
//! The parser here works on a *copy* of the payload (the service copies a chunk out of shared
//! memory before looking at it), checks every size against the bytes that are left, and never
//! panics.

use protozero::wire::redundant_varint;

use crate::error::AbiError;
use crate::layout::{FRAGMENT_HEADER_SIZE, PACKET_SIZE_DROP_PACKET};

/// Encodes `size` (≤ 2^28 − 1) as the 4-byte redundant varint a writer back-fills
/// ([`protozero::wire::redundant_varint`], the encoding of protozero's reserved size fields),
/// or `None` if it does not fit.
///
/// ```
/// assert_eq!(tachyon_abi::encode_fragment_header(7), Some([0x87, 0x80, 0x80, 0x00]));
/// assert_eq!(tachyon_abi::encode_fragment_header(1 << 28), None);
/// ```
#[must_use]
pub const fn encode_fragment_header(size: u32) -> Option<[u8; FRAGMENT_HEADER_SIZE]> {
    if size > PACKET_SIZE_DROP_PACKET {
        return None;
    }
    Some(redundant_varint(size))
}

/// The fragment header a writer writes over a packet it cannot finish: the redundant varint of
/// [`PACKET_SIZE_DROP_PACKET`] (`FF FF FF 7F`).
pub const DROP_PACKET_FRAGMENT_HEADER: [u8; FRAGMENT_HEADER_SIZE] =
    redundant_varint(PACKET_SIZE_DROP_PACKET);

/// Decodes the fragment size varint at the start of `bytes`: `(size, header length)`.
///
/// At most 4 bytes are read. Errors: the bytes end before the varint does
/// ([`AbiError::TruncatedFragmentHeader`]), or the 4th byte still has its continuation bit
/// ([`AbiError::OverlongFragmentHeader`]). `offset` only labels the error.
pub fn decode_fragment_header(bytes: &[u8], offset: usize) -> Result<(u32, usize), AbiError> {
    let mut size = 0u32;
    for i in 0..FRAGMENT_HEADER_SIZE {
        let Some(&b) = bytes.get(i) else {
            return Err(AbiError::TruncatedFragmentHeader { offset });
        };
        size |= u32::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((size, i + 1));
        }
    }
    Err(AbiError::OverlongFragmentHeader { offset })
}

/// One fragment of a chunk's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment<'b> {
    /// A fragment's bytes: a whole packet, or a piece of one when the chunk's continuation flags
    /// say so (first fragment continues the previous chunk, last continues on the next). May be
    /// empty: a writer pads an inflated packet count with a zero-size fragment.
    Data(&'b [u8]),
    /// The writer dropped this packet (size = [`PACKET_SIZE_DROP_PACKET`]); the rest of the
    /// chunk is ignored. The service counts it as `trace_writer_packet_loss`.
    Dropped,
}

/// Iterator over the fragments of a payload copy; see [`Fragments::new`].
///
/// Yields `Ok` fragments, then stops after `count` of them, after a [`Fragment::Dropped`], or
/// after the first error (which it yields once).
#[derive(Clone, Debug)]
pub struct Fragments<'b> {
    payload: &'b [u8],
    offset: usize,
    index: u16,
    count: u16,
    done: bool,
}

impl<'b> Fragments<'b> {
    /// Fragments `0..count` of `payload` (the chunk's bytes after its 8-byte header).
    ///
    /// For a chunk that is still being written (scraped), pass `count − 1`: the last counted
    /// packet may be open and its size not written yet.
    #[must_use]
    pub fn new(payload: &'b [u8], count: u16) -> Fragments<'b> {
        Fragments {
            payload,
            offset: 0,
            index: 0,
            count,
            done: false,
        }
    }

    /// Payload offset where the next fragment header would start (after the last one yielded).
    #[must_use]
    pub fn offset(&self) -> usize {
        self.offset
    }

    fn next_fragment(&mut self) -> Result<Fragment<'b>, AbiError> {
        let offset = self.offset;
        let rest = self.payload.get(offset..).unwrap_or_default();
        if rest.is_empty() {
            return Err(AbiError::MissingFragment {
                index: self.index,
                offset,
            });
        }
        let (size, header_len) = decode_fragment_header(rest, offset)?;
        if size == PACKET_SIZE_DROP_PACKET {
            self.done = true;
            return Ok(Fragment::Dropped);
        }
        let data_offset = offset + header_len;
        let available = rest.len() - header_len;
        // `size` < 2^28, so it fits in usize on every target this crate builds for.
        let len = size as usize;
        if len > available {
            return Err(AbiError::FragmentOutOfBounds {
                offset: data_offset,
                size,
                available,
            });
        }
        self.offset = data_offset + len;
        Ok(Fragment::Data(&rest[header_len..header_len + len]))
    }
}

impl<'b> Iterator for Fragments<'b> {
    type Item = Result<Fragment<'b>, AbiError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.index >= self.count {
            return None;
        }
        let item = self.next_fragment();
        self.index += 1;
        if item.is_err() {
            self.done = true;
        }
        Some(item)
    }
}

impl core::iter::FusedIterator for Fragments<'_> {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn collect(payload: &[u8], count: u16) -> Vec<Result<Fragment<'_>, AbiError>> {
        Fragments::new(payload, count).collect()
    }

    #[test]
    fn redundant_varint_encoding() {
        assert_eq!(encode_fragment_header(0), Some([0x80, 0x80, 0x80, 0x00]));
        assert_eq!(encode_fragment_header(7), Some([0x87, 0x80, 0x80, 0x00]));
        assert_eq!(encode_fragment_header(300), Some([0xAC, 0x82, 0x80, 0x00]));
        assert_eq!(DROP_PACKET_FRAGMENT_HEADER, [0xFF, 0xFF, 0xFF, 0x7F]);
        assert_eq!(
            encode_fragment_header(PACKET_SIZE_DROP_PACKET),
            Some([0xFF, 0xFF, 0xFF, 0x7F])
        );
        assert_eq!(encode_fragment_header(PACKET_SIZE_DROP_PACKET + 1), None);
        for size in [
            0,
            1,
            127,
            128,
            16383,
            16384,
            2_097_151,
            2_097_152,
            PACKET_SIZE_DROP_PACKET,
        ] {
            let h = encode_fragment_header(size).unwrap();
            assert_eq!(decode_fragment_header(&h, 0), Ok((size, 4)));
        }
    }

    #[test]
    fn compact_and_canonical_headers_decode() {
        assert_eq!(decode_fragment_header(&[0x05], 0), Ok((5, 1)));
        assert_eq!(decode_fragment_header(&[0xAC, 0x02], 0), Ok((300, 2)));
        assert_eq!(
            decode_fragment_header(&[0x80, 0x80, 0x01], 0),
            Ok((1 << 14, 3))
        );
        assert_eq!(
            decode_fragment_header(&[], 9),
            Err(AbiError::TruncatedFragmentHeader { offset: 9 })
        );
        assert_eq!(
            decode_fragment_header(&[0x80, 0x80], 3),
            Err(AbiError::TruncatedFragmentHeader { offset: 3 })
        );
        assert_eq!(
            decode_fragment_header(&[0x80, 0x80, 0x80, 0x80, 0x00], 1),
            Err(AbiError::OverlongFragmentHeader { offset: 1 })
        );
    }

    #[test]
    fn fragments_in_order() {
        let mut payload = Vec::new();
        payload.extend_from_slice(&encode_fragment_header(3).unwrap());
        payload.extend_from_slice(b"abc");
        payload.push(2); // compacted header
        payload.extend_from_slice(b"de");
        payload.push(0); // inflated-count padding: an empty packet
        payload.extend_from_slice(&[0xEE; 5]); // unused tail
        let got = collect(&payload, 3);
        assert_eq!(
            got,
            vec![
                Ok(Fragment::Data(b"abc")),
                Ok(Fragment::Data(b"de")),
                Ok(Fragment::Data(b""))
            ]
        );
        // Scraped: only the first count − 1 are trusted.
        assert_eq!(collect(&payload, 2).len(), 2);
        assert_eq!(collect(&payload, 0), vec![]);
    }

    #[test]
    fn drop_sentinel_ends_the_chunk() {
        let mut payload = vec![1, b'x'];
        payload.extend_from_slice(&DROP_PACKET_FRAGMENT_HEADER);
        payload.extend_from_slice(&[0x55; 16]);
        assert_eq!(
            collect(&payload, 10),
            vec![Ok(Fragment::Data(b"x")), Ok(Fragment::Dropped)]
        );
    }

    #[test]
    fn out_of_bounds_and_missing_fragments_are_errors() {
        let payload = [5, b'a', b'b'];
        assert_eq!(
            collect(&payload, 1),
            vec![Err(AbiError::FragmentOutOfBounds {
                offset: 1,
                size: 5,
                available: 2
            })]
        );
        let payload = [1, b'a'];
        assert_eq!(
            collect(&payload, 3),
            vec![
                Ok(Fragment::Data(b"a")),
                Err(AbiError::MissingFragment {
                    index: 1,
                    offset: 2
                })
            ]
        );
        let payload = [1, b'a', 0x80];
        assert_eq!(
            collect(&payload, 2),
            vec![
                Ok(Fragment::Data(b"a")),
                Err(AbiError::TruncatedFragmentHeader { offset: 2 })
            ]
        );
        // A 4-byte size just below the sentinel is simply out of bounds.
        let payload = [0xFE, 0xFF, 0xFF, 0x7F];
        assert!(matches!(
            collect(&payload, 1)[0],
            Err(AbiError::FragmentOutOfBounds { .. })
        ));
    }
}

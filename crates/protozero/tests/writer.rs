//! The writer's fixed cases: the seed's golden bytes, compaction, patches, buffers, buffer switches
//! and errors.

mod common;

use common::{collect, EagerDelegate};
use protozero::{
    ContiguousMemoryRange, Delegate, Error, HeapBuffered, ProtoDecoder, ScatteredStreamWriter,
    StaticBuffered, MAX_NESTING_DEPTH,
};

/// `nested { str_val: "foo", int_val: 42 }` as field 3 of TestMsg (seed 001).
fn write_seed_example(msg: &mut protozero::Message<'_>) {
    let mut nested = msg.begin_nested(3);
    nested.append_string(1, "foo");
    nested.append_int32(2, 42);
}

#[test]
fn seed_example_is_compacted_to_canonical_bytes() {
    let mut buf = HeapBuffered::new();
    write_seed_example(&mut buf.root_message());
    assert_eq!(
        buf.serialize().unwrap(),
        [0x1a, 0x07, 0x0a, 0x03, 0x66, 0x6f, 0x6f, 0x10, 0x2a]
    );
}

#[test]
fn seed_example_keeps_the_redundant_size_when_it_spans_buffers() {
    // 6-byte slices: tag + reserved size (5 bytes) and one payload byte in the first slice,
    // so the message is not contiguous when it ends and cannot be compacted.
    let mut buf = HeapBuffered::with_slice_sizes(6, 6);
    write_seed_example(&mut buf.root_message());
    assert_eq!(
        buf.serialize().unwrap(),
        [0x1a, 0x87, 0x80, 0x80, 0x00, 0x0a, 0x03, 0x66, 0x6f, 0x6f, 0x10, 0x2a]
    );
}

#[test]
fn seed_example_size_arrives_through_a_patch() {
    let mut w = ScatteredStreamWriter::new(EagerDelegate::new(7));
    write_seed_example(&mut w.root_message());
    assert_eq!(w.delegate().patch_count, 1);
    assert_eq!(
        collect(&mut w),
        [0x1a, 0x87, 0x80, 0x80, 0x00, 0x0a, 0x03, 0x66, 0x6f, 0x6f, 0x10, 0x2a]
    );
}

#[test]
fn seed_example_carried_whole_needs_no_patch_and_compacts() {
    // The delegate carries each full buffer into the next: the message ends up contiguous in
    // the last buffer, its size is written in place and compacted to one byte.
    let mut w = ScatteredStreamWriter::new(EagerDelegate::carrying_all(7));
    write_seed_example(&mut w.root_message());
    assert_eq!(w.delegate().patch_count, 0);
    assert!(w.delegate().carried > 0);
    assert_eq!(
        collect(&mut w),
        [0x1a, 0x07, 0x0a, 0x03, 0x66, 0x6f, 0x6f, 0x10, 0x2a]
    );
}

#[test]
fn a_carry_that_would_split_a_size_field_is_declined() {
    // 7-byte buffers, field 1 (2 bytes) then a nested message: tag at 2, size field at 3..7.
    // A carry of the last 2 bytes would start inside the size field: the writer carries
    // nothing and the size arrives through a patch, as without carrying.
    let mut w = ScatteredStreamWriter::new(EagerDelegate::carrying_last(7, 2));
    {
        let mut root = w.root_message();
        root.append_uint32(1, 5);
        let mut n = root.begin_nested(3);
        n.append_uint32(2, 42);
    }
    assert_eq!(w.delegate().carried, 0);
    assert_eq!(w.delegate().patch_count, 1);
    assert_eq!(
        collect(&mut w),
        [0x08, 0x05, 0x1a, 0x82, 0x80, 0x80, 0x00, 0x10, 0x2a]
    );
}

#[test]
fn empty_nested_message_compacts_to_zero_length() {
    let mut buf = HeapBuffered::new();
    buf.root_message().begin_nested(5);
    assert_eq!(buf.serialize().unwrap(), [0x2a, 0x00]);
}

#[test]
fn compaction_stops_at_127_bytes() {
    for (len, expect_compact) in [(125usize, true), (126, false)] {
        // Payload = tag (1) + length (1) + len bytes: 127 or 128 bytes.
        let mut buf = HeapBuffered::with_slice_sizes(4096, 4096);
        {
            let mut m = buf.root_message();
            let mut n = m.begin_nested(1);
            n.append_bytes(2, &vec![0xab; len]);
        }
        let out = buf.serialize().unwrap();
        let size = len + 2;
        if expect_compact {
            assert_eq!(out[..2], [0x0a, size as u8]);
            assert_eq!(out.len(), 2 + size);
        } else {
            assert_eq!(out[..5], [0x0a, 0x80, 0x81, 0x80, 0x00]);
            assert_eq!(out.len(), 5 + size);
        }
        let f = ProtoDecoder::new(&out).find_field(1).unwrap();
        assert_eq!(f.as_bytes().len(), size);
    }
}

#[test]
fn deep_nesting_with_eager_hand_off_patches_every_level() {
    let mut w = ScatteredStreamWriter::new(EagerDelegate::new(5));
    {
        let mut root = w.root_message();
        let mut a = root.begin_nested(1);
        a.append_uint32(1, 1);
        let mut b = a.begin_nested(2);
        b.append_string(3, "a string that is longer than any buffer");
        let mut c = b.begin_nested(4);
        c.append_fixed64(5, 0x0102030405060708);
    }
    assert!(w.delegate().patch_count >= 3);
    let bytes = collect(&mut w);
    let a = ProtoDecoder::new(&bytes)
        .find_field(1)
        .unwrap()
        .as_message();
    assert_eq!(a.find_field(1).unwrap().as_u32(), 1);
    let b = a.find_field(2).unwrap().as_message();
    assert_eq!(
        b.find_field(3).unwrap().as_str().unwrap(),
        "a string that is longer than any buffer"
    );
    let c = b.find_field(4).unwrap().as_message();
    assert_eq!(c.find_field(5).unwrap().as_fixed64(), 0x0102030405060708);
}

#[test]
fn static_buffer_too_small_is_an_error_not_an_abort() {
    let mut storage = [0u8; 8];
    let mut buf = StaticBuffered::new(&mut storage);
    {
        let mut m = buf.root_message();
        m.append_uint64(1, u64::MAX); // 11 bytes: does not fit
        m.append_uint32(2, 1); // dropped after the error
        let mut n = m.begin_nested(3);
        n.append_string(1, "dropped");
    }
    assert_eq!(buf.error(), Some(Error::BufferExhausted));
    assert_eq!(buf.finish(), Err(Error::BufferExhausted));
}

#[test]
fn static_buffer_exact_fit_succeeds() {
    let mut storage = [0u8; 11];
    let mut buf = StaticBuffered::new(&mut storage);
    buf.root_message().append_uint64(1, u64::MAX);
    assert_eq!(buf.finish().unwrap().len(), 11);
}

#[test]
fn nesting_past_the_limit_is_an_error() {
    fn nest(m: &mut protozero::Message<'_>, depth: usize) {
        if depth > 0 {
            nest(&mut m.begin_nested(1), depth - 1);
        }
    }
    let mut buf = HeapBuffered::new();
    nest(&mut buf.root_message(), MAX_NESTING_DEPTH);
    assert!(buf.serialize().is_ok());
    let mut buf = HeapBuffered::new();
    nest(&mut buf.root_message(), MAX_NESTING_DEPTH + 1);
    assert_eq!(buf.serialize(), Err(Error::NestingTooDeep));
}

/// Hands out one reusable 1 MiB buffer over and over, redirecting every size field to a patch
/// slot first (so reuse is legal): lets a test write more than 256 MiB without holding it.
struct SinkDelegate {
    buf: Box<[u8]>,
    #[allow(clippy::vec_box)] // the Box gives each slot a stable address as the Vec grows
    slots: Vec<Box<[u8; 4]>>,
}

// SAFETY: the one buffer is reused only after the writer has left it, and every size field in
// it was redirected to a boxed slot (kept until drop; a Box's heap address is stable).
unsafe impl Delegate for SinkDelegate {
    fn get_new_buffer(&mut self, _: *mut u8, min_len: usize) -> Option<ContiguousMemoryRange> {
        assert!(min_len <= self.buf.len());
        Some(ContiguousMemoryRange::from_slice(&mut self.buf))
    }
    fn annotate_patch(&mut self, _: *mut u8) -> *mut u8 {
        self.slots.push(Box::new([0; 4]));
        self.slots.last_mut().unwrap().as_mut_ptr()
    }
}

#[test]
fn message_over_256_mib_is_an_error_not_silent_corruption() {
    let delegate = SinkDelegate {
        buf: vec![0; 1 << 20].into_boxed_slice(),
        slots: Vec::new(),
    };
    let mut w = ScatteredStreamWriter::new(delegate);
    let block = vec![0x55u8; 1 << 20];
    {
        let mut root = w.root_message();
        let mut big = root.begin_nested(1);
        for _ in 0..256 {
            big.append_raw_proto_bytes(&block);
        }
        assert_eq!(big.size(), 256 << 20);
    }
    assert_eq!(w.error(), Some(Error::MessageTooLarge { size: 256 << 20 }));
}

#[test]
fn message_of_exactly_the_limit_is_fine() {
    let delegate = SinkDelegate {
        buf: vec![0; 1 << 20].into_boxed_slice(),
        slots: Vec::new(),
    };
    let mut w = ScatteredStreamWriter::new(delegate);
    let block = vec![0x55u8; 1 << 20];
    {
        let mut root = w.root_message();
        let mut big = root.begin_nested(1);
        for _ in 0..255 {
            big.append_raw_proto_bytes(&block);
        }
        big.append_raw_proto_bytes(&block[..(1 << 20) - 1]);
    }
    assert_eq!(w.error(), None);
    let slot = *w.delegate().slots[0];
    assert_eq!(slot, [0xff, 0xff, 0xff, 0x7f]);
}

#[test]
fn leaked_nested_writer_leaves_an_empty_message_not_garbage() {
    let mut buf = HeapBuffered::new();
    {
        let mut root = buf.root_message();
        let mut a = root.begin_nested(1);
        std::mem::forget(a.begin_nested(2));
        a.append_uint32(3, 7);
    }
    let out = buf.serialize().unwrap();
    // The leaked child's size stays the zero placeholder; its parent is still well-formed.
    let a = ProtoDecoder::new(&out).find_field(1).unwrap().as_message();
    assert_eq!(a.find_field(2).unwrap().as_bytes(), b"");
    assert_eq!(a.find_field(3).unwrap().as_u32(), 7);
}

#[test]
fn scattered_bytes_and_packed_fields() {
    let mut buf = HeapBuffered::with_slice_sizes(3, 3);
    {
        let mut m = buf.root_message();
        m.append_scattered_bytes(1, &[b"ab", b"", b"cde"]);
        m.append_packed_varint(2, [1u64, 300, u64::MAX]);
        m.append_packed_fixed32(3, &[1, 2]);
        m.append_packed_fixed64(4, &[3]);
        m.append_packed_sint32(5, [-1, 1]);
        m.append_packed_varint(6, std::iter::empty());
    }
    let out = buf.serialize().unwrap();
    let d = ProtoDecoder::new(&out);
    assert_eq!(d.find_field(1).unwrap().as_bytes(), b"abcde");
    let v: Vec<u64> = d
        .find_field(2)
        .unwrap()
        .packed_varints()
        .map(Result::unwrap)
        .collect();
    assert_eq!(v, [1, 300, u64::MAX]);
    let v: Vec<u32> = d
        .find_field(3)
        .unwrap()
        .packed_fixed32()
        .map(Result::unwrap)
        .collect();
    assert_eq!(v, [1, 2]);
    let v: Vec<u64> = d
        .find_field(4)
        .unwrap()
        .packed_fixed64()
        .map(Result::unwrap)
        .collect();
    assert_eq!(v, [3]);
    let v: Vec<u64> = d
        .find_field(5)
        .unwrap()
        .packed_varints()
        .map(Result::unwrap)
        .collect();
    assert_eq!(v, [1, 2]);
    assert_eq!(d.find_field(6).unwrap().as_bytes(), b"");
}

#[test]
fn negative_int32_takes_ten_bytes() {
    let mut buf = HeapBuffered::new();
    buf.root_message().append_int32(1, -1);
    assert_eq!(
        buf.serialize().unwrap(),
        [0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
    );
}

// === ScatteredStreamWriter::switch_buffer ===

/// Size of every buffer [`SwitchDelegate`] allocates.
const SWITCH_BUF: usize = 32;
/// What a fresh [`SwitchDelegate`] buffer holds before the writer writes it.
const UNWRITTEN: u8 = 0xAA;

/// What [`SwitchDelegate`] hands out at its next `get_new_buffer` call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hand {
    /// A fresh buffer of `SWITCH_BUF` bytes.
    Full,
    /// An empty range at the start of a fresh buffer (non-null).
    Empty,
    /// `ContiguousMemoryRange::empty()`: an empty range with null pointers.
    Null,
}

/// Records every `get_new_buffer` call (`used_end`, `min_len`) and every `annotate_patch`;
/// redirects every size field to a fresh patch slot, so that a size written later into a buffer
/// already left shows up.
struct SwitchDelegate {
    /// Every allocation handed out (from `Box::into_raw`, `SWITCH_BUF` bytes, freed on drop).
    buffers: Vec<*mut u8>,
    /// `(used_end, min_len)` of each `get_new_buffer` call.
    calls: Vec<(*mut u8, usize)>,
    /// `(size_field, slot)` of each `annotate_patch` call.
    patches: Vec<(*mut u8, *mut [u8; 4])>,
    next: Hand,
}

impl SwitchDelegate {
    fn new() -> Self {
        SwitchDelegate {
            buffers: Vec::new(),
            calls: Vec::new(),
            patches: Vec::new(),
            next: Hand::Full,
        }
    }

    /// The bytes the writer produced: the used part of each buffer (up to the `used_end` it
    /// was left at, or `write_ptr` for the current one) with the patches applied.
    fn output(&self, write_ptr: *mut u8) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, &begin) in self.buffers.iter().enumerate() {
            let end = self
                .calls
                .get(i + 1)
                .map_or(write_ptr, |&(used_end, _)| used_end);
            let used = end as usize - begin as usize;
            assert!(used <= SWITCH_BUF);
            // SAFETY: a live allocation of SWITCH_BUF bytes; the writer is not writing.
            let mut bytes = unsafe { std::slice::from_raw_parts(begin, used) }.to_vec();
            for &(size_field, slot) in &self.patches {
                let offset = (size_field as usize).wrapping_sub(begin as usize);
                if offset < used {
                    // SAFETY: a live 4-byte allocation.
                    bytes[offset..offset + 4].copy_from_slice(&unsafe { *slot });
                }
            }
            out.extend(bytes);
        }
        out
    }

    /// The bytes of buffer `i` from `from` to its end.
    fn tail(&self, i: usize, from: *mut u8) -> Vec<u8> {
        let begin = self.buffers[i];
        let skip = from as usize - begin as usize;
        // SAFETY: a live allocation of SWITCH_BUF bytes; the writer is not writing.
        let all = unsafe { std::slice::from_raw_parts(begin, SWITCH_BUF) };
        all[skip..].to_vec()
    }
}

impl Drop for SwitchDelegate {
    fn drop(&mut self) {
        for &begin in &self.buffers {
            let slice = std::ptr::slice_from_raw_parts_mut(begin, SWITCH_BUF);
            // SAFETY: from Box::into_raw of a boxed slice of SWITCH_BUF bytes, freed once.
            drop(unsafe { Box::from_raw(slice) });
        }
        for &(_, slot) in &self.patches {
            // SAFETY: from Box::into_raw, freed once.
            drop(unsafe { Box::from_raw(slot) });
        }
    }
}

// SAFETY: every range is a fresh allocation (or an empty range at its start), kept alive and
// never handed out again until the delegate drops; every size field is redirected to a fresh
// boxed slot kept alive until then too.
unsafe impl Delegate for SwitchDelegate {
    fn get_new_buffer(
        &mut self,
        used_end: *mut u8,
        min_len: usize,
    ) -> Option<ContiguousMemoryRange> {
        self.calls.push((used_end, min_len));
        if self.next == Hand::Null {
            return Some(ContiguousMemoryRange::empty());
        }
        let begin = Box::into_raw(vec![UNWRITTEN; SWITCH_BUF].into_boxed_slice()).cast::<u8>();
        self.buffers.push(begin);
        let len = if self.next == Hand::Empty {
            0
        } else {
            SWITCH_BUF
        };
        Some(ContiguousMemoryRange {
            begin,
            end: begin.wrapping_add(len),
        })
    }

    fn annotate_patch(&mut self, size_field: *mut u8) -> *mut u8 {
        let slot = Box::into_raw(Box::new([0u8; 4]));
        self.patches.push((size_field, slot));
        slot.cast()
    }
}

const TAG_1_VARINT: u32 = protozero::wire::make_tag(1, protozero::WireType::Varint);
const TAG_2_VARINT: u32 = protozero::wire::make_tag(2, protozero::WireType::Varint);
const TAG_2_BYTES: u32 = protozero::wire::make_tag(2, protozero::WireType::LengthDelimited);

#[test]
fn switch_buffer_leaves_at_the_write_pointer_and_open_sizes_go_through_annotate_patch() {
    let mut w = ScatteredStreamWriter::new(SwitchDelegate::new());
    w.write_varint_field(TAG_1_VARINT, 5);
    let level = w.begin_nested(TAG_2_BYTES);
    let start = w.written();
    let size_field = w.write_ptr().wrapping_sub(4);
    w.write_varint_field(TAG_1_VARINT, 7);
    let (left_at, written) = (w.write_ptr(), w.written());
    assert!(
        w.bytes_available() >= 16,
        "room left: no write would switch"
    );

    w.switch_buffer(4);

    let d = w.delegate();
    assert_eq!(d.calls.len(), 2, "first buffer, then the switch");
    assert_eq!(d.calls[1], (left_at, 4), "used_end is the write pointer");
    assert_eq!(
        d.patches.len(),
        1,
        "the open size field, before the buffer was left"
    );
    assert_eq!(d.patches[0].0, size_field);
    assert!(
        d.tail(0, left_at).iter().all(|&b| b == UNWRITTEN),
        "nothing written past the write pointer"
    );
    assert_eq!(w.error(), None);
    assert_eq!(w.written(), written, "the switch writes nothing");
    assert_eq!(w.write_ptr(), w.delegate().buffers[1]);
    assert_eq!(w.bytes_available(), SWITCH_BUF);

    w.write_varint_field(TAG_2_VARINT, 300);
    w.end_nested(level, start);
    assert_eq!(w.error(), None);
    // The nested message spans the switch: its size (5) arrives in the patch slot, in the
    // redundant 4-byte form (it cannot be compacted).
    // SAFETY: a live 4-byte slot, freed only when the delegate drops.
    let slot = unsafe { *w.delegate().patches[0].1 };
    assert_eq!(slot, [0x85, 0x80, 0x80, 0x00]);
    let out = w.delegate().output(w.write_ptr());
    assert_eq!(
        out,
        [0x08, 0x05, 0x12, 0x85, 0x80, 0x80, 0x00, 0x08, 0x07, 0x10, 0xac, 0x02]
    );
    let nested = ProtoDecoder::new(&out).find_field(2).unwrap().as_message();
    assert_eq!(nested.find_field(1).unwrap().as_u32(), 7);
    assert_eq!(nested.find_field(2).unwrap().as_u32(), 300);
}

#[test]
fn switch_buffer_to_an_empty_range_switches_again_at_the_next_write() {
    let mut w = ScatteredStreamWriter::new(SwitchDelegate::new());
    w.write_varint_field(TAG_1_VARINT, 5);
    let left_at = w.write_ptr();
    w.delegate_mut().next = Hand::Empty;

    w.switch_buffer(0);

    assert_eq!(w.error(), None);
    assert_eq!(w.delegate().calls[1], (left_at, 0));
    assert_eq!(w.bytes_available(), 0);
    let parked = w.write_ptr();
    assert_eq!(parked, w.delegate().buffers[1]);

    w.delegate_mut().next = Hand::Full;
    w.write_varint_field(TAG_2_VARINT, 300);
    assert_eq!(w.error(), None);
    assert_eq!(w.delegate().calls.len(), 3);
    assert_eq!(
        w.delegate().calls[2],
        (parked, 1),
        "left the empty range at its start"
    );
    assert_eq!(
        w.delegate().output(w.write_ptr()),
        [0x08, 0x05, 0x10, 0xac, 0x02]
    );
}

#[test]
fn switch_buffer_fails_on_a_null_or_short_range_and_a_failed_writer_stays_failed() {
    // A null range is no buffer, even when `min_len` is 0.
    let mut w = ScatteredStreamWriter::new(SwitchDelegate::new());
    w.write_varint_field(TAG_1_VARINT, 5);
    w.delegate_mut().next = Hand::Null;
    w.switch_buffer(0);
    assert_eq!(w.error(), Some(Error::BufferExhausted));
    assert_eq!(w.bytes_available(), 0);

    // Sticky: neither a switch nor a write reaches the delegate any more.
    w.delegate_mut().next = Hand::Full;
    let calls = w.delegate().calls.len();
    w.switch_buffer(0);
    w.switch_buffer(4);
    w.write_varint_field(TAG_2_VARINT, 300);
    assert_eq!(w.delegate().calls.len(), calls);
    assert_eq!(w.error(), Some(Error::BufferExhausted));

    // A range shorter than `min_len`.
    let mut w = ScatteredStreamWriter::new(SwitchDelegate::new());
    w.write_varint_field(TAG_1_VARINT, 5);
    w.delegate_mut().next = Hand::Empty;
    w.switch_buffer(1);
    assert_eq!(w.error(), Some(Error::BufferExhausted));
}

#[test]
fn block_prefix_writes_only_its_prefix_and_only_when_the_whole_block_fits() {
    let mut w = ScatteredStreamWriter::new(SwitchDelegate::new());
    // No range yet: nothing fits, nothing is written, no buffer is asked for.
    let block = [0x08, 0x2a, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee];
    assert!(!w.try_write_block_prefix(&block, 2));
    assert_eq!(w.written(), 0);
    assert!(w.delegate().calls.is_empty());

    w.write_varint_field(TAG_1_VARINT, 5);
    // Two bytes advance the stream; the block's tail lands past the write pointer only.
    assert!(w.try_write_block_prefix(&block, 2));
    assert_eq!(w.written(), 4);
    assert_eq!(w.delegate().output(w.write_ptr()), [0x08, 0x05, 0x08, 0x2a]);
    assert_eq!(w.delegate().tail(0, w.write_ptr())[..6], [0xee; 6]);
    // The next write overwrites that tail.
    w.write_varint_field(TAG_2_VARINT, 1);
    assert_eq!(
        w.delegate().output(w.write_ptr()),
        [0x08, 0x05, 0x08, 0x2a, 0x10, 0x01]
    );

    // A length beyond the block is refused.
    assert!(!w.try_write_block_prefix(&block, 9));
    // A block larger than the room left is refused whole, even if its prefix would fit.
    let room = w.bytes_available();
    let big = [0x08u8; SWITCH_BUF];
    assert!(room < SWITCH_BUF);
    let before = w.written();
    assert!(!w.try_write_block_prefix(&big, 1));
    assert_eq!(w.written(), before);
    assert_eq!(w.delegate().calls.len(), 1, "no buffer switch either");
    assert_eq!(w.error(), None);
}

/// `write_in_place` hands out exactly the current buffer's free bytes and moves the position by
/// what the closure used, capped at the buffer's end; a writer with no buffer yet hands out an
/// empty slice and stays where it is. The bytes come out between the writes around them.
#[test]
fn write_in_place_uses_the_free_bytes_and_moves_past_what_it_used() {
    let mut w = ScatteredStreamWriter::new(EagerDelegate::new(64));
    // No buffer yet: nothing to write into.
    let seen = w.write_in_place(|free| (5, free.len()));
    assert_eq!(seen, 0);
    assert_eq!(w.written(), 0);
    w.write_bytes(&[1, 2, 3]);
    let free = w.bytes_available();
    let got = w.write_in_place(|buf| {
        assert_eq!(buf.len(), free);
        buf[..4].copy_from_slice(&[4, 5, 6, 7]);
        // Scribbled past what it uses: free space, overwritten by the next write.
        buf[4] = 0xee;
        (4, "done")
    });
    assert_eq!(got, "done");
    assert_eq!(w.written(), 7);
    w.write_bytes(&[8]);
    // More than is left: the position stops at the buffer's end.
    let left = w.bytes_available();
    w.write_in_place(|buf| {
        buf.fill(9);
        (left + 100, ())
    });
    assert_eq!(w.bytes_available(), 0);
    assert_eq!(w.written(), 8 + left as u64);
    let mut want = vec![1, 2, 3, 4, 5, 6, 7, 8];
    want.resize(8 + left, 9);
    assert_eq!(collect(&mut w), want);
}

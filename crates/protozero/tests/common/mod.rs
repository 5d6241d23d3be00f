//! Test support shared by the writer's integration tests: a delegate that hands buffers off
//! eagerly (as a tracing chunk is committed), and the test schema loaded with protox.
#![allow(dead_code, unreachable_pub)]

use protozero::{ContiguousMemoryRange, Delegate, ScatteredStreamWriter};

/// Poison written over a buffer once it is handed off: any later write into it shows up.
pub const POISON: u8 = 0xEE;

/// How much of a buffer being left [`EagerDelegate`] asks the writer to carry into the next.
enum Carry {
    Nothing,
    /// All of it.
    All,
    /// Its last `n` bytes (at most all).
    Last(usize),
    /// A pseudo-random number of its last bytes, from this xorshift state.
    Random(u64),
}

/// A delegate with fixed-size buffers that copies each buffer out and poisons it the moment
/// the writer leaves it, and redirects every open size field in it to a patch slot — so every
/// size of a message that crosses a buffer boundary must arrive through a patch.
pub struct EagerDelegate {
    size: usize,
    /// Live buffers (raw, from `Box::into_raw`, freed on drop). The last one is current.
    buffers: Vec<(*mut u8, usize)>,
    /// Copies of the used part of each handed-off buffer.
    handed_off: Vec<Vec<u8>>,
    /// (buffer index, offset, slot) for each patch handed out.
    patches: Vec<(usize, usize, *mut [u8; 4])>,
    /// How many patches were requested (for tests asserting that patches happened).
    pub patch_count: usize,
    /// What `carry_over` asks the writer to carry.
    carry: Carry,
    /// The write pointer the last `carry_over` was given: when the next `get_new_buffer`
    /// leaves the buffer before it, the bytes in between are carried.
    carry_end: *mut u8,
    /// Bytes carried in all (for tests asserting that carrying happened; the writer declines
    /// carries that would split a size field).
    pub carried: usize,
}

impl EagerDelegate {
    pub fn new(size: usize) -> Self {
        EagerDelegate {
            size,
            buffers: Vec::new(),
            handed_off: Vec::new(),
            patches: Vec::new(),
            patch_count: 0,
            carry: Carry::Nothing,
            carry_end: std::ptr::null_mut(),
            carried: 0,
        }
    }

    /// Like [`EagerDelegate::new`], but every time the writer leaves a buffer the delegate asks
    /// it to carry its last `n` bytes into the next.
    pub fn carrying_last(size: usize, n: usize) -> Self {
        EagerDelegate::with_carry(size, Carry::Last(n))
    }

    /// Like [`EagerDelegate::new`], but every time the writer leaves a buffer the delegate asks
    /// it to carry all of it into the next, which grows to hold it (a carry from a buffer's
    /// start splits no size field, so the writer declines none).
    pub fn carrying_all(size: usize) -> Self {
        EagerDelegate::with_carry(size, Carry::All)
    }

    /// Like [`EagerDelegate::new`], but every time the writer leaves a buffer the delegate asks
    /// it to carry a pseudo-random number of its last bytes (from none to all) into the next.
    pub fn carrying(size: usize, seed: u64) -> Self {
        EagerDelegate::with_carry(size, Carry::Random(seed | 1))
    }

    fn with_carry(size: usize, carry: Carry) -> Self {
        let mut d = EagerDelegate::new(size);
        d.carry = carry;
        d
    }

    fn hand_off(&mut self, used_end: *mut u8) {
        if let Some(&(ptr, len)) = self.buffers.last() {
            let used = used_end as usize - ptr as usize;
            assert!(used <= len);
            // SAFETY: ptr..ptr+len is a live allocation of ours.
            let buf = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
            self.handed_off.push(buf[..used].to_vec());
            buf.fill(POISON);
        }
    }
}

impl Drop for EagerDelegate {
    fn drop(&mut self) {
        for &(ptr, len) in &self.buffers {
            // SAFETY: allocated by Box::into_raw of a boxed slice of `len` bytes, freed once.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) });
        }
        for &(_, _, slot) in &self.patches {
            // SAFETY: allocated by Box::into_raw, freed once.
            drop(unsafe { Box::from_raw(slot) });
        }
    }
}

// SAFETY: every buffer is a fresh allocation kept alive (poisoned, never reused) until the
// delegate drops; every patch slot is a fresh 4-byte allocation kept alive until then too.
unsafe impl Delegate for EagerDelegate {
    fn get_new_buffer(
        &mut self,
        used_end: *mut u8,
        min_len: usize,
    ) -> Option<ContiguousMemoryRange> {
        let carry_end = std::mem::replace(&mut self.carry_end, std::ptr::null_mut());
        let carry = if carry_end.is_null() {
            0
        } else {
            carry_end as usize - used_end as usize
        };
        let len = self.size.max(min_len);
        assert!(len >= carry, "min_len covers the carried bytes");
        let ptr = Box::into_raw(vec![0u8; len].into_boxed_slice()) as *mut u8;
        if carry > 0 {
            // SAFETY: `used_end..carry_end` lies in the live buffer being left (`carry_over`
            // saw `carry_end` as its write pointer), and the new allocation holds `carry`.
            unsafe { std::ptr::copy_nonoverlapping(used_end, ptr, carry) };
            self.carried += carry;
        }
        self.hand_off(used_end);
        self.buffers.push((ptr, len));
        // SAFETY: within the allocation.
        let end = unsafe { ptr.add(len) };
        Some(ContiguousMemoryRange { begin: ptr, end })
    }

    fn carry_over(&mut self, used_end: *mut u8, _min_len: usize) -> usize {
        let Some(&(ptr, _)) = self.buffers.last() else {
            return 0;
        };
        let used = used_end as usize - ptr as usize;
        self.carry_end = used_end;
        match &mut self.carry {
            Carry::Nothing => 0,
            Carry::All => used,
            Carry::Last(n) => (*n).min(used),
            Carry::Random(state) => {
                *state ^= *state << 13;
                *state ^= *state >> 7;
                *state ^= *state << 17;
                (*state % (used as u64 + 1)) as usize
            }
        }
    }

    fn annotate_patch(&mut self, size_field: *mut u8) -> *mut u8 {
        let &(ptr, len) = self.buffers.last().expect("a patch needs a current buffer");
        let offset = size_field as usize - ptr as usize;
        assert!(
            offset + 4 <= len,
            "size field outside the buffer being left"
        );
        let slot = Box::into_raw(Box::new([0u8; 4]));
        self.patches.push((self.buffers.len() - 1, offset, slot));
        self.patch_count += 1;
        slot as *mut u8
    }
}

/// Collects what an eager writer produced: the handed-off copies plus the current buffer, with
/// every patch applied. Panics if a patch was never written (first byte still zero) or a
/// handed-off buffer was written after hand-off.
pub fn collect(w: &mut ScatteredStreamWriter<EagerDelegate>) -> Vec<u8> {
    let used_end = w.write_ptr();
    let d = w.delegate_mut();
    d.hand_off(used_end);
    for (i, &(ptr, len)) in d.buffers.iter().enumerate() {
        // SAFETY: live allocation.
        let buf = unsafe { std::slice::from_raw_parts(ptr, len) };
        assert!(
            buf.iter().all(|&b| b == POISON),
            "buffer {i} was written after hand-off"
        );
    }
    for &(idx, offset, slot) in &d.patches {
        // SAFETY: live 4-byte allocation.
        let bytes = unsafe { *slot };
        assert_ne!(
            bytes[0], 0,
            "patch for buffer {idx} offset {offset} was never written"
        );
        d.handed_off[idx][offset..offset + 4].copy_from_slice(&bytes);
    }
    d.handed_off.concat()
}

/// The test schema's descriptor pool, compiled from `tests/protos/test_messages.proto` at run
/// time with protox (no protoc needed).
pub fn pool() -> prost_reflect::DescriptorPool {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/protos");
    let fds = protox::compile(["test_messages.proto"], [dir]).expect("test .proto compiles");
    prost_reflect::DescriptorPool::from_file_descriptor_set(fds).expect("valid descriptors")
}

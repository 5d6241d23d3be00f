//! The write path performs zero heap allocations: a counting global allocator watches this
//! thread while messages (nested, packed, scattered, with compaction) are written into a fixed
//! buffer. The file has a single test on purpose: the allocator is global.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    // `const` initialisation and no destructor: reading it never allocates.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> usize {
    ALLOCATIONS.with(|c| c.get())
}

fn write_everything(storage: &mut [u8]) -> usize {
    let mut buf = protozero::StaticBuffered::new(storage);
    {
        let mut root = buf.root_message();
        root.append_int32(1, 0x12345678);
        root.append_uint32(3, 0x90ABCDEF);
        root.append_int64(2, -5);
        root.append_sint64(6, -5);
        root.append_double(12, 1.5);
        root.append_string(500, "fffffffffffffffffffffffffffffff");
        root.append_scattered_bytes(15, &[b"ab", b"cd"]);
        root.append_packed_varint(20, [1u64, 2, 3]);
        root.append_packed_fixed32(18, &[1, 2, 3]);
        for _ in 0..3 {
            let mut a = root.begin_nested(14);
            a.append_bool(13, true);
            let mut b = a.begin_nested(14);
            b.append_bytes(15, &[0u8; 200]); // too big to compact
            let mut c = b.begin_nested(14);
            c.append_fixed64(8, 7);
        }
    }
    buf.finish().expect("fits").len()
}

#[test]
fn fixed_buffer_writes_do_not_allocate() {
    let mut storage = [0u8; 4096];
    // Warm up anything lazily initialised outside the writer (none expected).
    write_everything(&mut storage);
    let before = allocations();
    let len = write_everything(&mut storage);
    let after = allocations();
    assert!(len > 700, "the message was really written ({len} bytes)");
    assert_eq!(after - before, 0, "the write path allocated");

    // The counter works: a Vec allocation is seen.
    let v = std::hint::black_box(vec![1u8; 16]);
    assert_eq!(allocations() - after, 1);
    drop(v);
}

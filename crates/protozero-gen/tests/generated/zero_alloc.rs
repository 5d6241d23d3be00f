//! Generated writers and views do not allocate: a counting global allocator watches the test
//! thread while a message is written into a fixed buffer with the generated setters and read
//! back, every field, with the generated getters. (The counter is per thread, so the other
//! tests of this binary running in parallel do not disturb it.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use protozero::StaticBuffered;

use crate::golden_code::pz::test::everything::Kind;
use crate::golden_code::pz::test::{Everything, EverythingView};

struct Counting;

thread_local! {
    // `const` initialisation and no destructor: reading it never allocates.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> usize {
    ALLOCATIONS.with(|c| c.get())
}

#[test]
fn writers_and_views_do_not_allocate() {
    let mut storage = [0u8; 1024];
    let before = allocations();
    let len = {
        let mut buf = StaticBuffered::new(&mut storage);
        {
            let mut w: Everything<'_> = buf.root();
            w.set_f_int32(-1);
            w.set_f_string("hello");
            w.set_f_enum(Kind::One);
            w.set_child().set_point().set_x(3);
            w.add_r_string("a");
            w.set_p_sint64_packed([1, -2, 3]);
            w.set_p_double_packed(&[0.5, 1.5]);
            w.set_p_enum_packed([Kind::Kind, Kind::One]);
            let mut e = w.add_named_points();
            e.set_key("k");
            e.set_value().set_y(4);
        }
        buf.finish().unwrap().len()
    };
    let bytes = &storage[..len];
    let v = EverythingView::decode(bytes).unwrap();
    let mut sum = i64::from(v.f_int32()) + v.f_string().unwrap().len() as i64;
    sum += i64::from(v.f_enum().unwrap().as_i32());
    sum += i64::from(v.child().unwrap().point().unwrap().x());
    sum += v.r_string().map(|s| s.unwrap().len() as i64).sum::<i64>();
    sum += v.p_sint64().map(Result::unwrap).sum::<i64>();
    sum += v.p_double().map(Result::unwrap).sum::<f64>() as i64;
    sum += v.p_enum().filter(|k| k.is_ok()).count() as i64;
    for e in v.named_points() {
        let e = e.unwrap();
        sum += e.key().unwrap().len() as i64 + i64::from(e.value().unwrap().y());
    }
    sum += i64::from(v.f_uint32() == u32::MAX) + i64::from(v.has_nested());
    assert_eq!(allocations(), before, "the write or read path allocated");
    assert_eq!(sum, -1 + 5 + 1 + 3 + 1 + 2 + 2 + 2 + 1 + 4 + 1);
}

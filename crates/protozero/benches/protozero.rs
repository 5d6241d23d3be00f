//! The ProtoZero benchmark of seed 001 (Perfetto's `src/protozero/test/protozero_benchmark.cc`),
//! replicated: criterion group `protozero`, ids `{simple,nested}/{protozero,prost,speed_of_light}`.
//!
//! Message `EveryField` with int32 = 1, int64 = 2, uint32 = 3, uint64 = 4, repeated nested =
//! 14, string = 500. *Simple* is five setters (0x12345678 as int32, 0x90ABCDEF as uint32,
//! 0x11111111 as int64, 0xFFFFFFFF as uint64, a 31-character string); *nested* is simple plus
//! three levels of nesting (four levels in all). Each iteration writes into the next 512-byte
//! slot of a 64 MiB working set (by default), then XOR-chains the slot's 64 words (the "clobber") so the
//! stores are really retired.
//!
//! Unlike Perfetto's version, the protozero variant finalizes every nested size (and so pays
//! for compaction of the small inner levels).
//!
//! Run: `cargo bench -p protozero --bench protozero`. `PROTOZERO_BENCH_WORKING_SET_KIB` sets
//! another working set, a power of two in KiB (`=64` for a cache-resident one); the code
//! measured and the bench ids stay the same.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};

/// The default working set: 64 MiB, far beyond the last-level cache.
const WORKING_SET: usize = 64 << 20;
const SLOT: usize = 512;
const SLOT_WORDS: usize = SLOT / 8;

/// The working set in bytes: `PROTOZERO_BENCH_WORKING_SET_KIB` KiB if set, else
/// [`WORKING_SET`]. A power of two, so that cycling through the slots stays a mask.
fn working_set() -> usize {
    const VAR: &str = "PROTOZERO_BENCH_WORKING_SET_KIB";
    let Ok(kib) = std::env::var(VAR) else {
        return WORKING_SET;
    };
    kib.trim()
        .parse::<usize>()
        .ok()
        .and_then(|kib| kib.checked_mul(1 << 10))
        .filter(|&b| b.is_power_of_two())
        .unwrap_or_else(|| panic!("{VAR}={kib:?}: expected a power of two (KiB)"))
}

const INT32: i32 = 0x12345678;
const UINT32: u32 = 0x90ABCDEF;
const INT64: i64 = 0x11111111;
const UINT64: u64 = 0xFFFFFFFF;
/// 31 × 'f', as the 4 words of 0x66 bytes (the last one ending in a NUL) of the original.
const STRING: &str = "fffffffffffffffffffffffffffffff";

/// [`working_set`] bytes (64 MiB by default) of 8-byte aligned slots, cycled through so the
/// benchmark is not all-L1.
struct WorkingSet {
    words: Vec<u64>,
    next: usize,
    /// The number of slots minus one (a power of two minus one).
    mask: usize,
}

impl WorkingSet {
    fn new() -> Self {
        let bytes = working_set();
        WorkingSet {
            words: vec![0; bytes / 8],
            next: 0,
            mask: bytes / SLOT - 1,
        }
    }

    /// Runs `fill` on the next slot, then clobbers it.
    #[inline(always)]
    fn iteration(&mut self, fill: impl FnOnce(&mut [u64; SLOT_WORDS])) {
        let i = self.next;
        self.next = (i + 1) & self.mask;
        let slot: &mut [u64; SLOT_WORDS] = (&mut self.words[i * SLOT_WORDS..(i + 1) * SLOT_WORDS])
            .try_into()
            .unwrap();
        fill(slot);
        clobber(slot);
    }
}

/// XOR-chains the slot's words (the first one seeded with a stack address, as the original
/// seeds it with `&state`) so every store of the iteration must have been performed.
#[inline(always)]
fn clobber(slot: &mut [u64; SLOT_WORDS]) {
    let seed = 0u8;
    slot[0] = black_box(&seed) as *const u8 as u64;
    for i in 1..SLOT_WORDS {
        slot[i] ^= slot[i - 1];
    }
    black_box(slot);
}

fn as_bytes(slot: &mut [u64; SLOT_WORDS]) -> &mut [u8] {
    let len = std::mem::size_of_val(slot);
    // SAFETY: a `[u64; N]` is `8 × N` initialized bytes, any byte pattern is a valid u64, and
    // the returned slice reborrows `slot` exclusively for its lifetime.
    unsafe { std::slice::from_raw_parts_mut(slot.as_mut_ptr() as *mut u8, len) }
}

// === protozero ===

fn protozero_simple(msg: &mut protozero::Message<'_>) {
    msg.append_int32(1, black_box(INT32));
    msg.append_uint32(3, black_box(UINT32));
    msg.append_int64(2, black_box(INT64));
    msg.append_uint64(4, black_box(UINT64));
    msg.append_string(500, black_box(STRING));
}

fn protozero_nested(msg: &mut protozero::Message<'_>, depth: u32) {
    protozero_simple(msg);
    if depth < 3 {
        protozero_nested(&mut msg.begin_nested(14), depth + 1);
    }
}

fn protozero_write(slot: &mut [u64; SLOT_WORDS], nested: bool) {
    let mut buf = protozero::StaticBuffered::new(as_bytes(slot));
    {
        let mut msg = buf.root_message();
        if nested {
            protozero_nested(&mut msg, 0);
        } else {
            protozero_simple(&mut msg);
        }
    }
    debug_assert!(buf.finish().is_ok());
    black_box(buf.written());
}

// === prost (the libprotobuf analog: fill a struct, then serialize it) ===

#[derive(Clone, PartialEq, prost::Message)]
struct EveryField {
    #[prost(int32, optional, tag = "1")]
    field_int32: Option<i32>,
    #[prost(int64, optional, tag = "2")]
    field_int64: Option<i64>,
    #[prost(uint32, optional, tag = "3")]
    field_uint32: Option<u32>,
    #[prost(uint64, optional, tag = "4")]
    field_uint64: Option<u64>,
    #[prost(message, repeated, tag = "14")]
    field_nested: Vec<EveryField>,
    #[prost(string, optional, tag = "500")]
    field_string: Option<String>,
}

fn prost_simple(msg: &mut EveryField) {
    msg.field_int32 = Some(black_box(INT32));
    msg.field_uint32 = Some(black_box(UINT32));
    msg.field_int64 = Some(black_box(INT64));
    msg.field_uint64 = Some(black_box(UINT64));
    msg.field_string = Some(black_box(STRING).to_owned());
}

fn prost_nested(msg: &mut EveryField, depth: u32) {
    prost_simple(msg);
    if depth < 3 {
        msg.field_nested.push(EveryField::default());
        prost_nested(msg.field_nested.last_mut().unwrap(), depth + 1);
    }
}

fn prost_write(slot: &mut [u64; SLOT_WORDS], nested: bool) {
    let mut msg = EveryField::default();
    if nested {
        prost_nested(&mut msg, 0);
    } else {
        prost_simple(&mut msg);
    }
    let mut out = as_bytes(slot);
    prost::Message::encode(&msg, &mut out).expect("fits in 512 bytes");
}

// === speed of light: aligned 8-byte stores and a string copy, no encoding, no checks ===

struct SpeedOfLight {
    ptr: *mut u8,
}

impl SpeedOfLight {
    #[inline(always)]
    fn append(&mut self, v: u64) {
        // SAFETY: the writers below store at most 4 × (4 × 8 + 32) = 256 bytes into a 512-byte
        // slot that is 8-byte aligned, and every advance is a multiple of 8.
        unsafe {
            (self.ptr as *mut u64).write(v);
            self.ptr = self.ptr.add(8);
        }
    }

    #[inline(always)]
    fn append_str(&mut self, s: &str) {
        // SAFETY: as above; the 31-byte string plus its NUL is 32 bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), self.ptr, s.len());
            *self.ptr.add(s.len()) = 0;
            self.ptr = self.ptr.add(s.len() + 1);
        }
    }
}

fn sol_simple(w: &mut SpeedOfLight) {
    w.append(black_box(INT32) as u64);
    w.append(black_box(UINT32) as u64);
    w.append(black_box(INT64) as u64);
    w.append(black_box(UINT64));
    w.append_str(black_box(STRING));
}

fn sol_nested(w: &mut SpeedOfLight, depth: u32) {
    sol_simple(w);
    if depth < 3 {
        // The nested message is placed right after the previous one.
        sol_nested(w, depth + 1);
    }
}

fn sol_write(slot: &mut [u64; SLOT_WORDS], nested: bool) {
    let mut w = SpeedOfLight {
        ptr: slot.as_mut_ptr() as *mut u8,
    };
    if nested {
        sol_nested(&mut w, 0);
    } else {
        sol_simple(&mut w);
    }
}

fn bench(c: &mut Criterion) {
    let mut ws = WorkingSet::new();
    let mut group = c.benchmark_group("protozero");
    for (name, nested) in [("simple", false), ("nested", true)] {
        group.bench_function(format!("{name}/protozero"), |b| {
            b.iter(|| ws.iteration(|slot| protozero_write(slot, nested)))
        });
        group.bench_function(format!("{name}/prost"), |b| {
            b.iter(|| ws.iteration(|slot| prost_write(slot, nested)))
        });
        group.bench_function(format!("{name}/speed_of_light"), |b| {
            b.iter(|| ws.iteration(|slot| sol_write(slot, nested)))
        });
    }
    group.finish();
}

/// The encodings the benchmark measures are real: protozero and prost produce messages that
/// decode to the same values. Checked once before measuring.
fn check_equivalence() {
    for nested in [false, true] {
        let mut a = [0u64; SLOT_WORDS];
        let mut b = [0u64; SLOT_WORDS];
        let mut buf = protozero::StaticBuffered::new(as_bytes(&mut a));
        {
            let mut msg = buf.root_message();
            if nested {
                protozero_nested(&mut msg, 0);
            } else {
                protozero_simple(&mut msg);
            }
        }
        let ours = buf.finish().expect("fits").to_vec();
        prost_write(&mut b, nested);
        let decoded = <EveryField as prost::Message>::decode(ours.as_slice()).expect("decodes");
        let mut want = EveryField::default();
        if nested {
            prost_nested(&mut want, 0);
        } else {
            prost_simple(&mut want);
        }
        assert_eq!(decoded, want);
        assert_eq!(ours.len(), if nested { 241 } else { 58 });
    }
}

fn benches(c: &mut Criterion) {
    check_equivalence();
    bench(c);
}

criterion_group!(protozero_benches, benches);
criterion_main!(protozero_benches);

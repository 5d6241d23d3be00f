//! A string pool: every name, category, argument key and string value is stored once and
//! referred to by a 32-bit id, so the per-event records stay small and fixed-size.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Id of a string in a [`StringPool`].
pub(crate) type StrId = u32;

/// A small, fast, non-cryptographic hasher (the multiply-rotate scheme of rustc's FxHasher).
///
/// Keys here are interning ids and strings taken from the trace. A hostile trace could aim for
/// collisions, but the worst it gets is a slower import of its own data, which is acceptable
/// for a local analysis tool; SipHash costs a large share of the import time. (The tracing
/// service's `fast_hash::IdHasher` is seeded per process instead: there, producer-chosen ids
/// must not be able to slow down a daemon serving others.)
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct FxHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// `HashMap` with [`FxHasher`].
pub(crate) type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Interns strings; ids are dense from 0 in insertion order.
#[derive(Debug, Default)]
pub(crate) struct StringPool {
    ids: FxHashMap<Box<str>, StrId>,
    strings: Vec<Box<str>>,
    /// A direct-mapped cache of recently interned byte strings, (hash, id), in front of `ids`:
    /// strings that come inline with every event (string annotation values, inline names)
    /// repeat, and a hit costs a hash and one comparison where the map, holding every string
    /// of the trace, costs a UTF-8 check, a hash and a probe that misses the cache once it is
    /// large. A hit gives the id the map would (pooled strings never change). Empty until
    /// first used; `id == StrId::MAX` holds nothing.
    recent: Vec<(u64, StrId)>,
}

/// Slots of [`StringPool::recent`] (a power of two; 16 bytes each).
const RECENT_SLOTS: usize = 1 << 10;
/// Longer strings skip the cache (few repeat, and comparing them costs more).
const RECENT_MAX_LEN: usize = 256;

impl StringPool {
    /// The id of `s`, adding it if new.
    pub(crate) fn intern(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.strings.len() as StrId;
        self.strings.push(s.into());
        self.ids.insert(s.into(), id);
        id
    }

    /// Interns raw bytes from the trace; invalid UTF-8 is replaced, never rejected.
    pub(crate) fn intern_bytes(&mut self, b: &[u8]) -> StrId {
        if b.len() > RECENT_MAX_LEN {
            return self.intern_bytes_uncached(b);
        }
        let mut h = FxHasher::default();
        h.write(b);
        h.write_usize(b.len());
        let hash = h.finish();
        if self.recent.is_empty() {
            self.recent = vec![(0, StrId::MAX); RECENT_SLOTS];
        }
        let slot = (hash.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            >> (64 - RECENT_SLOTS.trailing_zeros())) as usize;
        let (h, id) = self.recent[slot];
        if h == hash && id != StrId::MAX && self.get(id).as_bytes() == b {
            return id;
        }
        let id = self.intern_bytes_uncached(b);
        // Only valid UTF-8 is cached (an invalid string's pooled form differs from its bytes).
        if self.get(id).as_bytes() == b {
            self.recent[slot] = (hash, id);
        }
        id
    }

    /// [`intern_bytes`](Self::intern_bytes) without the cache of recent strings.
    fn intern_bytes_uncached(&mut self, b: &[u8]) -> StrId {
        match std::str::from_utf8(b) {
            Ok(s) => self.intern(s),
            Err(_) => self.intern(&String::from_utf8_lossy(b)),
        }
    }

    /// The id of `s` if it was interned.
    pub(crate) fn lookup(&self, s: &str) -> Option<StrId> {
        self.ids.get(s).copied()
    }

    pub(crate) fn get(&self, id: StrId) -> &str {
        &self.strings[id as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_is_stable_and_lossy_on_bad_utf8() {
        let mut p = StringPool::default();
        let a = p.intern("a");
        let b = p.intern("b");
        assert_ne!(a, b);
        assert_eq!(p.intern("a"), a);
        assert_eq!(p.get(b), "b");
        let bad = p.intern_bytes(&[b'x', 0xff]);
        assert_eq!(p.get(bad), "x\u{fffd}");
    }

    /// The cache of recent strings gives the ids the map gives, whatever collides in it:
    /// repeats, invalid UTF-8 (pooled lossily), strings too long for the cache, the empty one.
    #[test]
    fn recent_strings_get_the_maps_ids() {
        let mut pool = StringPool::default();
        let mut plain = StringPool::default();
        let mut next = crate::xorshift(0x2545_f491_4f6c_dd1d);
        for _ in 0..20_000 {
            let x = next();
            let s: Vec<u8> = match x % 5 {
                0 => vec![b'x', 0xff], // Invalid UTF-8: pooled as "x\u{fffd}".
                1 => vec![b'a'; (x >> 8) as usize % 300],
                _ => format!("v{}", (x >> 8) % 3000).into_bytes(),
            };
            assert_eq!(pool.intern_bytes(&s), plain.intern_bytes_uncached(&s));
        }
        let empty = pool.intern_bytes(b"");
        assert_eq!(pool.get(empty), "");
    }
}

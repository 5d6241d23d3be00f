//! A direct-mapped cache in front of the string pool for strings that come inline with every
//! event (string annotation values, inline event and annotation names).
//!
//! Such strings repeat (an enum-like value, the same few names), and interning one costs a
//! UTF-8 check, a hash and a probe of a pool that holds every string of the trace. A hit here
//! costs a hash of the bytes and one comparison with the pooled string, and gives the id the
//! pool would (pooled strings never change), so the tables are the same with or without it.

use std::hash::Hasher;

use crate::storage::strings::{FxHasher, StrId, StringPool};

/// Slots (a power of two; 16 bytes each).
const SLOTS: usize = 1 << 10;
/// Longer strings are interned directly (few repeat, and comparing them costs more).
const MAX_LEN: usize = 256;

#[derive(Debug, Default)]
pub(crate) struct RecentStrings {
    /// (hash, id); empty until first used; `id == u32::MAX` holds nothing.
    slots: Vec<(u64, StrId)>,
}

impl RecentStrings {
    /// The pool id of `bytes` (interned as [`StringPool::intern_bytes`] does).
    #[inline]
    pub(crate) fn intern(&mut self, pool: &mut StringPool, bytes: &[u8]) -> StrId {
        if bytes.len() > MAX_LEN {
            return pool.intern_bytes(bytes);
        }
        let mut h = FxHasher::default();
        h.write(bytes);
        h.write_usize(bytes.len());
        let hash = h.finish();
        if self.slots.is_empty() {
            self.slots = vec![(0, StrId::MAX); SLOTS];
        }
        let slot =
            (hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOTS.trailing_zeros())) as usize;
        let (h, id) = self.slots[slot];
        // Only valid UTF-8 is cached (an invalid string's pooled form differs from its bytes).
        if h == hash && id != StrId::MAX && pool.get(id).as_bytes() == bytes {
            return id;
        }
        let id = pool.intern_bytes(bytes);
        if pool.get(id).as_bytes() == bytes {
            self.slots[slot] = (hash, id);
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gives_the_pools_ids() {
        let mut pool = StringPool::default();
        let mut recent = RecentStrings::default();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let s: Vec<u8> = match x % 5 {
                0 => vec![b'x', 0xff], // Invalid UTF-8: pooled as "x\u{fffd}".
                1 => vec![b'a'; (x >> 8) as usize % 300],
                _ => format!("v{}", (x >> 8) % 3000).into_bytes(),
            };
            let id = recent.intern(&mut pool, &s);
            assert_eq!(id, pool.intern_bytes(&s));
        }
        let empty = recent.intern(&mut pool, b"");
        assert_eq!(pool.get(empty), "");
    }
}

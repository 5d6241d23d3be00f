//! A fast hasher for the service's small integer keys (producer and writer ids), looked up once
//! or more per packet read out. SipHash, std's default, cost more than the rest of a packet's
//! read-out. The keys partly come from producers, so the hash is seeded per process (from std's
//! random keys): a producer cannot precompute ids that collide.
//!
//! The trace processor has its own fast hasher (`tachyon-processor`'s `strings::FxHasher`) and
//! this one is not shared with it on purpose: that one is unseeded (a hostile trace can only
//! slow down its own import) and hashes strings, this one guards a long-running daemon against
//! its producers, and the two crates share no dependency where a hasher would belong.

use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::OnceLock;

/// Builds [`IdHasher`]s with this process's seed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IdHash {
    seed: u64,
}

impl Default for IdHash {
    fn default() -> Self {
        static SEED: OnceLock<u64> = OnceLock::new();
        IdHash {
            seed: *SEED.get_or_init(|| RandomState::new().hash_one(0x7ac4_1f0e_u64) | 1),
        }
    }
}

impl BuildHasher for IdHash {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(self.seed)
    }
}

/// Folds integers with a multiply-rotate step and finishes with a 64-bit mixer, so every input
/// bit reaches the bucket bits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IdHasher(u64);

impl IdHasher {
    #[inline]
    fn add(&mut self, v: u64) {
        self.0 = (self.0 ^ v)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
}

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // splitmix64's finalizer.
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(b));
        }
    }

    #[inline]
    fn write_u16(&mut self, v: u16) {
        self.add(u64::from(v));
    }

    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }

    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
}

/// A `HashMap` keyed by ids.
pub(crate) type IdMap<K, V> = std::collections::HashMap<K, V, IdHash>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbouring_ids_spread_over_buckets() {
        let h = IdHash::default();
        let mut low_bits = std::collections::HashSet::new();
        for producer in 1..=8u32 {
            for writer in 1..=128u16 {
                low_bits.insert(h.hash_one((producer, writer)) & 0x3ff);
            }
        }
        // 1024 keys into 1024 buckets: a good hash fills about 63% of them.
        assert!(low_bits.len() > 550, "{} buckets used", low_bits.len());
    }
}

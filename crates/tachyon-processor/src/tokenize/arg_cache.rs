//! A sequence's recently seen debug annotations and source locations, by their bytes (or iid),
//! with the arg entries they became: an SDK writes the same annotation (an interned name with
//! the same enum-like string, a thread index, …) and the same source location over and over,
//! and each would otherwise be decoded, resolved through the sequence's interned data, and
//! looked up in the arg table again.
//!
//! What an annotation becomes depends on the sequence's interned data (its name and string
//! iids), so each sequence has its own cache, emptied whenever that data changes (a new
//! generation, or any interned data added). Entry ids are never removed or changed in the arg
//! table, so a hit gives exactly the ids a decode would.

/// Annotations longer than this are not cached (the common ones, an iid and a scalar, take
/// 4 to 20 bytes).
const MAX_BYTES: usize = 24;
/// Slots of each direct-mapped table.
const ANNOTATION_SLOTS: usize = 256;
const LOCATION_SLOTS: usize = 64;

/// The bytes of a short annotation as three zero-padded words, and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Key {
    words: [u64; 3],
    len: u8,
}

impl Key {
    #[inline]
    fn new(bytes: &[u8]) -> Option<Key> {
        if bytes.len() > MAX_BYTES {
            return None;
        }
        // Each 8-byte part, zero-padded, read with at most two loads (no copy of the bytes
        // into a buffer first: a copy of a variable length is a call to `memcpy`).
        let n = bytes.len();
        let (a, rest) = bytes.split_at(n.min(8));
        let (b, c) = rest.split_at(rest.len().min(8));
        Some(Key {
            words: [le_word(a), le_word(b), le_word(c)],
            len: n as u8,
        })
    }

    #[inline]
    fn slot(&self) -> usize {
        let [a, b, c] = self.words;
        let h = (a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.rotate_left(23) ^ c.rotate_left(47))
            .wrapping_add(u64::from(self.len))
            .wrapping_mul(0xbf58_476d_1ce4_e5b9);
        (h >> (64 - ANNOTATION_SLOTS.trailing_zeros())) as usize
    }
}

/// Up to 8 bytes as a little-endian word, zero-padded: for 2 to 7 bytes, two loads that
/// overlap in the middle (the overlapping bytes are the same in both, so or-ing them is exact).
#[inline(always)]
fn le_word(b: &[u8]) -> u64 {
    let n = b.len();
    if let Some(w) = b.first_chunk::<8>() {
        return u64::from_le_bytes(*w);
    }
    if n >= 4 {
        let lo = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let hi = u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]]);
        return u64::from(lo) | u64::from(hi) << ((n - 4) * 8);
    }
    if n >= 2 {
        let lo = u16::from_le_bytes([b[0], b[1]]);
        let hi = u16::from_le_bytes([b[n - 2], b[n - 1]]);
        return u64::from(lo) | u64::from(hi) << ((n - 2) * 8);
    }
    b.first().map_or(0, |&x| u64::from(x))
}

#[derive(Clone, Copy, Debug, Default)]
struct AnnotationSlot {
    key: Key,
    /// The arg entry id; `u32::MAX`: empty.
    id: u32,
    /// Hit since it was filled (or last spared): see [`ArgCache::put_annotation`].
    hit: bool,
}

/// The args of an interned source location: file, function, line and iid entries.
#[derive(Clone, Copy, Debug)]
struct LocationSlot {
    iid: u64,
    ids: [u32; 4],
}

/// One sequence's cache (empty until first used).
#[derive(Debug, Default)]
pub(crate) struct ArgCache {
    annotations: Vec<AnnotationSlot>,
    locations: Vec<Option<LocationSlot>>,
}

impl ArgCache {
    /// Forgets everything: the sequence's interned data changed. The tables keep their
    /// memory: an SDK adds interned data often, and the next put refills them in place.
    pub(crate) fn clear(&mut self) {
        self.annotations.clear();
        self.locations.clear();
    }

    /// The arg entry a debug annotation with these bytes became, if cached (`Ok`); else the
    /// key to remember it by ([`ArgCache::put_annotation`]), `None` if it is too long to be
    /// cached.
    #[inline]
    pub(crate) fn annotation(&mut self, bytes: &[u8]) -> Result<u32, Option<Key>> {
        let key = Key::new(bytes).ok_or(None)?;
        match self.annotations.get_mut(key.slot()) {
            Some(s) if s.id != u32::MAX && s.key == key => {
                s.hit = true;
                Ok(s.id)
            }
            _ => Err(Some(key)),
        }
    }

    /// Remembers that a debug annotation with the bytes of `key` became the one arg entry
    /// `id`, unless its slot holds one that was hit since it was filled: that one is spared
    /// once (its mark cleared) instead. An annotation that repeats (an enum-like string, a
    /// thread index) thus keeps its slot against values seen once since (a counter's, which
    /// other sequences may have made entries of), and the next such value takes it only if
    /// it was not hit again in between.
    #[inline]
    pub(crate) fn put_annotation(&mut self, key: Key, id: u32) {
        if self.annotations.is_empty() {
            let empty = AnnotationSlot {
                key: Key::default(),
                id: u32::MAX,
                hit: false,
            };
            self.annotations.resize(ANNOTATION_SLOTS, empty);
        }
        let s = &mut self.annotations[key.slot()];
        if s.id != u32::MAX && s.hit {
            s.hit = false;
            return;
        }
        *s = AnnotationSlot {
            key,
            id,
            hit: false,
        };
    }

    /// The arg entries of interned source location `iid`, if cached.
    #[inline]
    pub(crate) fn location(&self, iid: u64) -> Option<[u32; 4]> {
        match self.locations.get(iid as usize % LOCATION_SLOTS) {
            Some(Some(s)) if s.iid == iid => Some(s.ids),
            _ => None,
        }
    }

    /// Remembers the arg entries of interned source location `iid`.
    #[inline]
    pub(crate) fn put_location(&mut self, iid: u64, ids: [u32; 4]) {
        if self.locations.is_empty() {
            self.locations.resize(LOCATION_SLOTS, None);
        }
        self.locations[iid as usize % LOCATION_SLOTS] = Some(LocationSlot { iid, ids });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every hit is an exact match of bytes (whatever collides in a slot), misses are misses,
    /// and a cleared cache has nothing.
    #[test]
    fn hits_only_on_the_same_bytes() {
        fn put(c: &mut ArgCache, bytes: &[u8], id: u32) {
            if let Some(key) = Key::new(bytes) {
                c.put_annotation(key, id);
            }
        }
        let mut c = ArgCache::default();
        let mut next = crate::xorshift(0x5851_f42d_4c95_7f2d);
        let mut want = std::collections::HashMap::new();
        for i in 0..20_000u32 {
            let x = next();
            let len = (x % 30) as usize;
            let bytes: Vec<u8> = (0..len).map(|j| (x >> (j % 8 * 8)) as u8 % 4).collect();
            // As the importer uses it: a put only after a miss.
            match c.annotation(&bytes) {
                Ok(id) => assert_eq!(want.get(&bytes), Some(&id), "{bytes:?}"),
                Err(None) => assert!(len > MAX_BYTES),
                Err(Some(_)) => {
                    put(&mut c, &bytes, i);
                    // Stored, or refused to spare a hit slot (then still a miss).
                    if let Ok(id) = c.annotation(&bytes) {
                        assert_eq!(id, i);
                        want.insert(bytes.clone(), i);
                    }
                }
            }
        }
        // The words are the bytes zero-padded, for every length and content.
        for len in 0..=MAX_BYTES {
            for _ in 0..50 {
                let x = [next(), next(), next()];
                let bytes: Vec<u8> = (0..len).map(|j| (x[j / 8] >> (j % 8 * 8)) as u8).collect();
                let mut padded = [0u8; MAX_BYTES];
                padded[..len].copy_from_slice(&bytes);
                let word = |i: usize| {
                    u64::from_le_bytes(padded[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
                };
                let key = Key::new(&bytes).expect("short");
                assert_eq!(key.words, [word(0), word(1), word(2)], "{bytes:?}");
                assert_eq!(usize::from(key.len), len);
            }
        }
        // A slot hit since it was filled is spared once by a colliding put, then taken.
        let mut c = ArgCache::default();
        let a = [1u8, 2, 3];
        let slot = Key::new(&a).expect("short").slot();
        let b: Vec<u8> = (0..u32::MAX)
            .map(|n| n.to_le_bytes().to_vec())
            .find(|b| Key::new(b).expect("short").slot() == slot)
            .expect("a colliding key");
        put(&mut c, &a, 1);
        put(&mut c, &b, 2); // Not hit yet: replaced.
        assert!(c.annotation(&a).is_err());
        put(&mut c, &a, 1);
        assert_eq!(c.annotation(&a), Ok(1)); // Hit.
        put(&mut c, &b, 2); // Spared once.
        assert_eq!(c.annotation(&b), Err(Key::new(&b)));
        put(&mut c, &b, 2); // Not hit since: replaced.
        assert_eq!(c.annotation(&b), Ok(2));
        assert!(c.annotation(&a).is_err());
        // Trailing zero bytes are not padding.
        let mut c = ArgCache::default();
        put(&mut c, &[1, 0], 7);
        assert!(c.annotation(&[1]).is_err());
        assert_eq!(c.annotation(&[1, 0]), Ok(7));
        c.put_location(3, [1, 2, 3, 4]);
        c.put_location(3 + LOCATION_SLOTS as u64, [5, 6, 7, 8]);
        assert_eq!(c.location(3), None, "evicted by a colliding iid");
        assert_eq!(c.location(3 + LOCATION_SLOTS as u64), Some([5, 6, 7, 8]));
        c.clear();
        assert!(c.annotation(&[1, 0]).is_err());
        assert_eq!(c.location(3 + LOCATION_SLOTS as u64), None);
    }
}

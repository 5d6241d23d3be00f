//! Allocation sites and pools by number: the zone-path interner (path id → parent path +
//! zone callsite) and the pool names.
//!
//! The interner is called from inside the allocator hook with the thread's recording guard
//! set, so the memory its tables take is never recorded (nor the frees of it). Its lock is
//! never taken by code that could run inside a hook holding it on the same thread.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use crate::track_event::Callsite;

struct Paths {
    /// Entry `id - 1`: (parent path id, callsite address).
    nodes: Vec<(u32, usize)>,
    index: BTreeMap<(u32, usize), u32>,
}

static PATHS: Mutex<Paths> = Mutex::new(Paths {
    nodes: Vec::new(),
    index: BTreeMap::new(),
});

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The id of `parent` extended by the zone whose callsite is at `cs` (ids start at 1; 0 is
/// "no zone"). Paths are never forgotten (there are as many as distinct zone nestings).
pub(crate) fn intern_path(parent: u32, cs: usize) -> u32 {
    let mut p = lock(&PATHS);
    if let Some(&id) = p.index.get(&(parent, cs)) {
        return id;
    }
    let Ok(id) = u32::try_from(p.nodes.len() + 1) else {
        return parent;
    };
    p.nodes.push((parent, cs));
    p.index.insert((parent, cs), id);
    id
}

/// The zone names of path `id`, outermost first (empty for 0). A zone whose name is made at
/// run time (`zone!(name: ...)`) shows as `file:line` of its macro.
pub(crate) fn path_names(id: u32) -> Vec<String> {
    let p = lock(&PATHS);
    let mut out = Vec::new();
    let mut cur = id;
    while cur != 0 {
        let Some(&(parent, cs)) = p.nodes.get(cur as usize - 1) else {
            break;
        };
        // SAFETY: `cs` is the address of a `&'static Callsite` (from `zone_push`), and
        // callsites are statics that are never freed.
        let cs = unsafe { &*(cs as *const Callsite) };
        out.push(if cs.name.is_empty() {
            let file = cs.file.rsplit(['/', '\\']).next().unwrap_or(cs.file);
            format!("{file}:{}", cs.line)
        } else {
            cs.name.to_owned()
        });
        cur = parent;
    }
    out.reverse();
    out
}

static POOLS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Pool numbers start at 1 (0 is the global allocator).
pub(crate) fn pool_id(name: &str) -> u16 {
    let mut pools = lock(&POOLS);
    if let Some(i) = pools.iter().position(|n| n == name) {
        return i as u16 + 1;
    }
    if pools.len() >= u16::MAX as usize - 1 {
        return pools.len() as u16;
    }
    pools.push(name.to_owned());
    pools.len() as u16
}

/// The name of pool `id`.
pub(crate) fn pool_name(id: u16) -> String {
    if id == 0 {
        return super::GLOBAL_HEAP.to_owned();
    }
    lock(&POOLS)
        .get(id as usize - 1)
        .cloned()
        .unwrap_or_else(|| format!("pool {id}"))
}

// === Native call stacks ===

/// Site ids with this bit set are native call stacks (the rest are zone paths).
pub(crate) const STACK_SITE: u32 = 1 << 31;

/// Distinct stacks kept per process; once full, new stacks fall back to their zone path (a
/// stack of 64 frames takes about 600 bytes here, so the table stays under ~40 MiB).
pub(crate) const MAX_STACKS: usize = 1 << 16;

/// Stacks hash well enough with one multiply-xor per frame.
#[derive(Default)]
struct FrameHasher(u64);

impl std::hash::Hasher for FrameHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

type StackIndex =
    std::collections::HashMap<Box<[u64]>, u32, std::hash::BuildHasherDefault<FrameHasher>>;

struct Stacks {
    /// Entry `i`: the zone path id, then the frames, innermost first.
    keys: Vec<Box<[u64]>>,
    index: StackIndex,
}

static STACKS: Mutex<Stacks> = Mutex::new(Stacks {
    keys: Vec::new(),
    index: StackIndex::with_hasher(std::hash::BuildHasherDefault::new()),
});

/// The site id of the stack `key` (`[zone path id, frames innermost first...]`), or `None`
/// when the table is full. Called from inside the hook with the thread's guard set: the
/// table's own allocations are not recorded, and no thread holding the lock can enter it
/// again.
pub(crate) fn intern_stack(key: &[u64]) -> Option<u32> {
    let mut s = lock(&STACKS);
    if let Some(&id) = s.index.get(key) {
        return Some(id);
    }
    if s.keys.len() >= MAX_STACKS {
        return None;
    }
    let id = STACK_SITE | s.keys.len() as u32;
    let boxed: Box<[u64]> = key.into();
    s.keys.push(boxed.clone());
    s.index.insert(boxed, id);
    Some(id)
}

/// A 64-bit hash of a stack key (for the per-thread cache of the last stack: equal hashes are
/// taken as equal stacks, a 2^-64 chance of attributing a block to the wrong one).
pub(crate) fn stack_hash(key: &[u64]) -> u64 {
    let mut h = 0x243f_6a88_85a3_08d3u64 ^ key.len() as u64;
    for &v in key {
        h = (h.rotate_left(23) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    h ^ (h >> 31)
}

/// What a site is made of: zone names (outermost first), and for a native stack its frames
/// (innermost first, as captured).
pub(crate) fn site_parts(site: u32) -> (Vec<String>, Vec<u64>) {
    if site & STACK_SITE == 0 {
        return (path_names(site), Vec::new());
    }
    let key = lock(&STACKS)
        .keys
        .get((site & !STACK_SITE) as usize)
        .cloned();
    match key {
        Some(k) if !k.is_empty() => (path_names(k[0] as u32), k[1..].to_vec()),
        _ => (Vec::new(), Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_intern_once_apart_from_paths() {
        let a = intern_stack(&[0, 0x1000, 0x2000]).unwrap();
        assert_ne!(a & STACK_SITE, 0);
        assert_eq!(intern_stack(&[0, 0x1000, 0x2000]), Some(a));
        let b = intern_stack(&[0, 0x1000]).unwrap();
        assert_ne!(a, b);
        assert_eq!(site_parts(a), (Vec::new(), vec![0x1000, 0x2000]));
        assert_eq!(site_parts(0), (Vec::new(), Vec::new()));
    }
}

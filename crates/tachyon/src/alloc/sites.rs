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

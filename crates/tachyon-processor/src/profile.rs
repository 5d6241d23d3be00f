//! Call stacks: Perfetto's `stack_profile_mapping`, `stack_profile_frame` and
//! `stack_profile_callsite` tables and their interning, shared by everything that records
//! stacks (here: heap profiles, `heap.rs`).
//!
//! This is the subset the heap profile importer needs, with the interface of the call-stack
//! importer built beside it (issue 21: `StackProfile::{mapping, frame, callsite}`, the same
//! tables and columns); when both are present, that one supersedes this file.
//!
//! Mappings described identically share a row; frames are unique per (mapping, relative pc,
//! name); callsites per (parent, frame), depth 0 at the root.

use crate::storage::{Storage, NONE};
use crate::strings::{FxHashMap, StrId, StringPool};

/// Frames beyond this depth of one stack are dropped (a hostile trace cannot make a callsite
/// chain as long as the file).
const MAX_STACK_DEPTH: usize = 1024;

#[derive(Clone, Debug)]
pub(crate) struct MappingRow {
    /// Hex of the raw build id (NONE when the binary has none).
    pub(crate) build_id: StrId,
    pub(crate) exact_offset: u64,
    pub(crate) start_offset: u64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) load_bias: u64,
    pub(crate) name: StrId,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct FrameRow {
    pub(crate) name: StrId,
    pub(crate) mapping: u32,
    pub(crate) rel_pc: u64,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct CallsiteRow {
    pub(crate) depth: u32,
    pub(crate) parent: u32,
    pub(crate) frame: u32,
}

/// Identity of a shared mapping.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct MappingKey {
    name: StrId,
    build_id: Box<[u8]>,
    exact_offset: u64,
    start_offset: u64,
    start: u64,
    end: u64,
    load_bias: u64,
}

/// The trace's call-stack tables and their interning.
#[derive(Debug, Default)]
pub(crate) struct StackProfile {
    pub(crate) mappings: Vec<MappingRow>,
    pub(crate) frames: Vec<FrameRow>,
    pub(crate) callsites: Vec<CallsiteRow>,
    shared_mappings: FxHashMap<MappingKey, u32>,
    frame_index: FxHashMap<(u32, u64, StrId), u32>,
    callsite_index: FxHashMap<(u32, u32), u32>,
}

/// A mapping as a producer describes it, resolved to strings.
#[derive(Debug)]
pub(crate) struct MappingParams<'a> {
    pub(crate) name: StrId,
    pub(crate) build_id: &'a [u8],
    pub(crate) exact_offset: u64,
    pub(crate) start_offset: u64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) load_bias: u64,
}

impl StackProfile {
    /// A mapping row: shared (one row per identical description) or a new row each time.
    pub(crate) fn mapping(
        &mut self,
        strings: &mut StringPool,
        p: &MappingParams<'_>,
        shared: bool,
    ) -> u32 {
        let key = MappingKey {
            name: p.name,
            build_id: p.build_id.into(),
            exact_offset: p.exact_offset,
            start_offset: p.start_offset,
            start: p.start,
            end: p.end,
            load_bias: p.load_bias,
        };
        if shared {
            if let Some(&id) = self.shared_mappings.get(&key) {
                return id;
            }
        }
        let id = self.mappings.len() as u32;
        let build_id = if p.build_id.is_empty() {
            NONE
        } else {
            let hex: String = p.build_id.iter().map(|b| format!("{b:02x}")).collect();
            strings.intern(&hex)
        };
        self.mappings.push(MappingRow {
            build_id,
            exact_offset: p.exact_offset,
            start_offset: p.start_offset,
            start: p.start,
            end: p.end,
            load_bias: p.load_bias,
            name: p.name,
        });
        if shared {
            self.shared_mappings.insert(key, id);
        }
        id
    }

    /// The frame at `rel_pc` of `mapping` named `name` (NONE: not symbolized).
    pub(crate) fn frame(&mut self, mapping: u32, rel_pc: u64, name: StrId) -> u32 {
        *self
            .frame_index
            .entry((mapping, rel_pc, name))
            .or_insert_with(|| {
                let id = self.frames.len() as u32;
                self.frames.push(FrameRow {
                    name,
                    mapping,
                    rel_pc,
                });
                id
            })
    }

    /// The callsite of `frames` (outermost first): the chain of callsites from the root, each
    /// unique per (parent, frame). NONE for an empty stack.
    pub(crate) fn callsite(&mut self, frames: &[u32]) -> u32 {
        let mut parent = NONE;
        for (depth, &frame) in frames.iter().take(MAX_STACK_DEPTH).enumerate() {
            parent = *self
                .callsite_index
                .entry((parent, frame))
                .or_insert_with(|| {
                    let id = self.callsites.len() as u32;
                    self.callsites.push(CallsiteRow {
                        depth: depth as u32,
                        parent,
                        frame,
                    });
                    id
                });
        }
        parent
    }
}

/// The tables and views, with Perfetto's names and columns.
pub(crate) const SCHEMA: &str = "
CREATE TABLE __intrinsic_stack_profile_mapping(
    id INTEGER PRIMARY KEY, type TEXT NOT NULL DEFAULT '__intrinsic_stack_profile_mapping',
    build_id TEXT, exact_offset INTEGER, start_offset INTEGER, start INTEGER, \"end\" INTEGER,
    load_bias INTEGER, name TEXT);
CREATE VIEW stack_profile_mapping AS SELECT id, build_id, exact_offset, start_offset, start,
    \"end\", load_bias, name FROM __intrinsic_stack_profile_mapping;
CREATE TABLE __intrinsic_stack_profile_frame(
    id INTEGER PRIMARY KEY, name TEXT, mapping INTEGER, rel_pc INTEGER, symbol_set_id INTEGER,
    deobfuscated_name TEXT, type TEXT);
CREATE VIEW stack_profile_frame AS SELECT * FROM __intrinsic_stack_profile_frame;
CREATE TABLE __intrinsic_stack_profile_callsite(
    id INTEGER PRIMARY KEY, depth INTEGER, parent_id INTEGER, frame_id INTEGER);
CREATE VIEW stack_profile_callsite AS SELECT * FROM __intrinsic_stack_profile_callsite;
";

/// Copies the rows into the tables of [`SCHEMA`].
pub(crate) fn load(tx: &rusqlite::Connection, st: &Storage) -> rusqlite::Result<()> {
    use rusqlite::params;
    let s = &st.strings;
    let text = |id: u32| (id != NONE).then(|| s.get(id));
    let opt = |id: u32| (id != NONE).then_some(i64::from(id));
    let p = &st.profile;
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_stack_profile_mapping(id, build_id, exact_offset, \
         start_offset, start, \"end\", load_bias, name) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for (i, m) in p.mappings.iter().enumerate() {
        ins.execute(params![
            i as i64,
            text(m.build_id),
            m.exact_offset as i64,
            m.start_offset as i64,
            m.start as i64,
            m.end as i64,
            m.load_bias as i64,
            text(m.name)
        ])?;
    }
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_stack_profile_frame(id, name, mapping, rel_pc) \
         VALUES (?1, ?2, ?3, ?4)",
    )?;
    for (i, f) in p.frames.iter().enumerate() {
        ins.execute(params![i as i64, text(f.name), f.mapping, f.rel_pc as i64])?;
    }
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_stack_profile_callsite(id, depth, parent_id, frame_id) \
         VALUES (?1, ?2, ?3, ?4)",
    )?;
    for (i, c) in p.callsites.iter().enumerate() {
        ins.execute(params![i as i64, c.depth, opt(c.parent), c.frame])?;
    }
    Ok(())
}

//! The state tracks' rows; `importers::state` fills them.

use crate::storage::strings::FxHashMap;

/// One state: from `ts` for `dur` (-1: still the track's state at the end).
#[derive(Clone, Copy, Debug)]
pub(crate) struct StateRow {
    pub(crate) ts: i64,
    pub(crate) dur: i64,
    pub(crate) track: u32,
    pub(crate) category: u32,
    pub(crate) value: u32,
    pub(crate) arg_set: u32,
}

#[derive(Debug, Default)]
pub(crate) struct StateStore {
    pub(crate) rows: Vec<StateRow>,
    /// Track → its current state (a row index).
    pub(crate) active: FxHashMap<u32, u32>,
}

//! The rows of `android_logs`; `importers::logs` fills them.

use crate::storage::strings::StrId;

/// A row of `android_logs`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogRow {
    pub(crate) ts: i64,
    pub(crate) utid: u32,
    pub(crate) prio: u32,
    pub(crate) tag: StrId,
    pub(crate) msg: StrId,
}

//! Log messages: a TrackEvent's `log_message` becomes a row of `android_logs`, as in
//! Perfetto's `TrackEventParser::ParseLogMessage`: `ts`, `utid` (the event's thread: a message
//! off a thread's tracks is dropped, with `track_event_parser_errors`), `prio` (the message's
//! priority, `PRIO_INFO` when absent), `tag` (`file:line` of its source location, if any) and
//! `msg` (the interned body). The view has Perfetto's columns.

use crate::importers::{Event, EventKind, Parser};
use crate::storage::logs::LogRow;
use crate::storage::stats::Stat;
use crate::storage::strings::StrId;
use crate::storage::NONE;

/// `LogMessage.PRIO_INFO` (the same number as Android's `INFO`).
pub(crate) const PRIO_INFO: u32 = 4;

/// A message before its thread is known (tokenizer side).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PendingLog {
    pub(crate) prio: u32,
    pub(crate) tag: StrId,
    pub(crate) msg: StrId,
}

impl Parser {
    /// Queues the log row of a track event at `ts` on `base`'s track.
    pub(crate) fn push_log(&mut self, base: &Event, log: PendingLog, out: &mut Vec<Event>) {
        let idx = self.arena_logs.len() as u64;
        self.arena_logs.push(log);
        let mut ev = Event::bare(EventKind::Log, base.ts, base.track, idx);
        ev.legacy_thread = base.legacy_thread;
        out.push(ev);
    }

    /// Parses a queued log row: its thread from the event's track.
    pub(crate) fn apply_log(&mut self, ev: &Event, track: Option<u32>) {
        let Some(log) = self.arena_logs.get(ev.data as usize).copied() else {
            return;
        };
        let utid = track.map_or(NONE, |t| self.st.tracks[t as usize].utid);
        if utid == NONE {
            self.st.stats.inc(Stat::track_event_parser_errors);
            return;
        }
        self.st.android_logs.push(LogRow {
            ts: ev.ts,
            utid,
            prio: log.prio,
            tag: log.tag,
            msg: log.msg,
        });
    }
}

//! TrackEvent state tracks: a track whose descriptor has a `state` (a `StateDescriptor`) takes
//! `TYPE_STATE` events, each naming the state the track is in from then on (the event's name;
//! no name: no state). As Perfetto's `StateTracker`: a state lasts until the next event with
//! another value on the track (`dur = -1` while none came); an event repeating the current
//! value continues it, its args added to the state's; an event without a value ends the
//! current state and starts none.
//!
//! Rows go to the `state` table; the tracks (`thread_state_track_event`,
//! `process_state_track_event`, `global_state_track_event`, event type `state`) are listed by
//! the `state_track`, `process_state_track` and `thread_state_track` views.
//!
//! A `TYPE_STATE` event on a track that is not a state track, or without a track uuid, is a
//! parser error (`track_event_parser_errors`), as in Perfetto.

use crate::import::{Event, Importer};
use crate::storage::{Storage, NONE};
use crate::strings::FxHashMap;

pub(crate) const SCHEMA: &str = r#"
CREATE TABLE __intrinsic_state(
  id INTEGER PRIMARY KEY, ts INTEGER NOT NULL, dur INTEGER NOT NULL, track_id INTEGER NOT NULL,
  category TEXT, value TEXT NOT NULL, arg_set_id INTEGER);
CREATE VIEW state AS SELECT * FROM __intrinsic_state;
CREATE VIEW state_track AS SELECT id, name, parent_id, type, dimension_arg_set_id,
  source_arg_set_id, machine_id FROM __intrinsic_track WHERE event_type = 'state';
CREATE VIEW process_state_track AS SELECT id, name, type, parent_id, source_arg_set_id,
  machine_id, upid FROM __intrinsic_track WHERE event_type = 'state' AND upid IS NOT NULL;
CREATE VIEW thread_state_track AS SELECT id, name, type, parent_id, source_arg_set_id,
  machine_id, utid FROM __intrinsic_track WHERE event_type = 'state' AND utid IS NOT NULL;
"#;

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
    active: FxHashMap<u32, u32>,
}

impl Importer {
    /// A `TYPE_STATE` event (kind `EventKind::State`) on state track `track`.
    pub(crate) fn apply_state(&mut self, ev: &Event, track: u32) {
        if let Some(&row) = self.st.states.active.get(&track) {
            let current = self.st.states.rows[row as usize];
            if current.value == ev.name && ev.name != NONE {
                let set = self.args_for(current.arg_set, ev);
                self.st.states.rows[row as usize].arg_set = set;
                return;
            }
            let r = &mut self.st.states.rows[row as usize];
            r.dur = ev.ts.saturating_sub(r.ts);
            self.st.states.active.remove(&track);
        }
        if ev.name == NONE {
            return;
        }
        let arg_set = self.args_for(NONE, ev);
        let id = self.st.states.rows.len() as u32;
        self.st.states.rows.push(StateRow {
            ts: ev.ts,
            dur: -1,
            track,
            category: ev.category,
            value: ev.name,
            arg_set,
        });
        self.st.states.active.insert(track, id);
    }
}

pub(crate) fn load(tx: &rusqlite::Connection, st: &Storage) -> rusqlite::Result<()> {
    use rusqlite::params;
    let s = &st.strings;
    let text = |id: u32| (id != NONE).then(|| s.get(id));
    let opt = |id: u32| (id != NONE).then_some(id as i64);
    let mut ins = tx.prepare(
        "INSERT INTO __intrinsic_state(id, ts, dur, track_id, category, value, arg_set_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    for (i, r) in st.states.rows.iter().enumerate() {
        ins.execute(params![
            i as i64,
            r.ts,
            r.dur,
            r.track,
            text(r.category),
            text(r.value),
            opt(r.arg_set)
        ])?;
    }
    Ok(())
}

SELECT s.ts, s.dur, s.name, s.category, s.depth, thread.tid
FROM slice s JOIN thread_track tt ON s.track_id = tt.id JOIN thread USING (utid) ORDER BY s.ts;

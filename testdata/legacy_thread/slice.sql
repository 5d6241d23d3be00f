SELECT s.ts, s.dur, s.name, s.depth, t.type, t.name AS track, thread.tid, thread.name AS thread
FROM slice s JOIN track t ON s.track_id = t.id
LEFT JOIN thread_track tt ON tt.id = t.id LEFT JOIN thread USING (utid) ORDER BY s.ts;

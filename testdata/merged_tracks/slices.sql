SELECT s.ts, s.dur, s.name, s.depth, s.track_id, t.name AS track, t.type
FROM slice s JOIN track t ON s.track_id = t.id ORDER BY s.ts;

SELECT s.ts, s.dur, s.name, t.name AS track FROM slice s JOIN track t ON s.track_id = t.id ORDER BY s.ts;

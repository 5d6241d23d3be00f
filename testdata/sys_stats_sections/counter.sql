SELECT t.id AS track_id, t.type, t.name, t.unit, c.ts, c.value
FROM counter c JOIN counter_track t ON c.track_id = t.id ORDER BY t.id, c.ts;

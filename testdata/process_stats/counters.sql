SELECT t.id, t.type, t.name, t.unit, p.pid, c.ts, c.value
FROM counter c JOIN process_counter_track t ON c.track_id = t.id JOIN process p USING (upid)
ORDER BY t.id, c.ts;

SELECT c.ts, c.value, ct.name, ct.type, ct.unit FROM counter c JOIN counter_track ct ON c.track_id = ct.id
ORDER BY ct.name, c.ts;

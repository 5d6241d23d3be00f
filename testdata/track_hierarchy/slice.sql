SELECT s.name, s.track_id FROM slice s ORDER BY s.ts;

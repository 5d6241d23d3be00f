SELECT 'process' AS scope, p.name AS track, p.type, p.unit, process.pid AS id FROM process_counter_track p JOIN process USING (upid)
UNION ALL
SELECT 'thread', t.name, t.type, t.unit, thread.tid FROM thread_counter_track t JOIN thread USING (utid)
ORDER BY 1;

SELECT s.ts, s.dur, s.name, thread.tid, thread.name AS thread_name, process.name AS process_name
FROM slice s JOIN thread_track tt ON s.track_id = tt.id JOIN thread USING (utid)
JOIN process USING (upid) ORDER BY s.ts;

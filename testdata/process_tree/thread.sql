SELECT utid, tid, thread.name, upid, is_main_thread, pid
FROM thread LEFT JOIN process USING (upid) ORDER BY utid;

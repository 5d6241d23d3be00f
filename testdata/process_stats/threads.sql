SELECT utid, tid, upid, pid, thread.name, is_main_thread
FROM thread LEFT JOIN process USING (upid) ORDER BY utid;

SELECT utid, tid, thread.name, upid, is_main_thread, pid, process.name AS pname, cmdline
FROM thread LEFT JOIN process USING (upid) ORDER BY utid;

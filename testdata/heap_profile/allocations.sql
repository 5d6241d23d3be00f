SELECT a.id, a.ts, p.pid, a.heap_name, a.callsite_id, a.count, a.size FROM heap_profile_allocation a JOIN process p USING (upid) ORDER BY a.id;

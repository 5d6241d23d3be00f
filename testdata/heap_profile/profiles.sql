SELECT h.ts, h.ts_end, h.dur, p.pid, h.heap_name FROM heap_profile h JOIN process p USING (upid) ORDER BY h.id;

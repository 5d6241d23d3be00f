SELECT s.ts, s.callsite_id, c.depth, f.name AS frame, t.tid, p.pid, s.process_priority
FROM cpu_profile_stack_sample s
JOIN stack_profile_callsite c ON c.id = s.callsite_id
JOIN stack_profile_frame f ON f.id = c.frame_id
JOIN thread t USING (utid)
LEFT JOIN process p USING (upid)
ORDER BY s.ts;

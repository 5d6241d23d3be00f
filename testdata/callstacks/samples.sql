SELECT p.ts, t.tid, p.cpu, p.cpu_mode, c.depth, f.rel_pc, m.name AS mapping, p.perf_session_id
FROM perf_sample p JOIN thread t USING (utid)
JOIN stack_profile_callsite c ON c.id = p.callsite_id
JOIN stack_profile_frame f ON f.id = c.frame_id
JOIN stack_profile_mapping m ON m.id = f.mapping
ORDER BY p.ts;

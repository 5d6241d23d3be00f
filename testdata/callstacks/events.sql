SELECT s.name, s.ts, e.callsite_id, e.end_callsite_id,
       f.rel_pc AS leaf_pc, m.name AS leaf_mapping, COALESCE(f.name, sym.name) AS leaf
FROM __intrinsic_track_event_callstacks e
JOIN slice s ON s.id = e.slice_id
JOIN stack_profile_callsite c ON c.id = COALESCE(e.callsite_id, e.end_callsite_id)
JOIN stack_profile_frame f ON f.id = c.frame_id
JOIN stack_profile_mapping m ON m.id = f.mapping
LEFT JOIN stack_profile_symbol sym ON sym.id = f.symbol_set_id
ORDER BY e.id;

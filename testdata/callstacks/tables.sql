SELECT 'mapping' AS t, id, name, build_id, start, "end", exact_offset, NULL AS x FROM stack_profile_mapping
UNION ALL SELECT 'frame', id, name, mapping, rel_pc, symbol_set_id, NULL, NULL FROM stack_profile_frame
UNION ALL SELECT 'callsite', id, depth, parent_id, frame_id, NULL, NULL, NULL FROM stack_profile_callsite
UNION ALL SELECT 'symbol', id, symbol_set_id, name, source_file, line_number, NULL, NULL FROM stack_profile_symbol
ORDER BY t, id;

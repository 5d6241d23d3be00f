SELECT t.id, t.name, t.type, t.parent_id,
       extract_arg(t.dimension_arg_set_id, 'upid') AS upid,
       extract_arg(t.dimension_arg_set_id, 'utid') AS utid,
       extract_arg(t.dimension_arg_set_id, 'parent_track_uuid') AS parent_uuid,
       extract_arg(t.dimension_arg_set_id, 'merge_key_type') AS merge_type,
       extract_arg(t.dimension_arg_set_id, 'merge_key_value') AS merge_key,
       extract_arg(t.dimension_arg_set_id, 'track_compressor_idx') AS idx,
       extract_arg(t.source_arg_set_id, 'trace_id') AS uuid
FROM track t ORDER BY t.id;

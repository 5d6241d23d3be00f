SELECT t.id, t.name, t.type, t.parent_id, pt.upid, extract_arg(t.source_arg_set_id, 'trace_id') AS uuid,
       extract_arg(t.source_arg_set_id, 'description') AS description,
       extract_arg(t.source_arg_set_id, 'child_ordering') AS ordering,
       extract_arg(t.source_arg_set_id, 'sibling_order_rank') AS rank
FROM track t LEFT JOIN process_track pt USING (id) ORDER BY t.id;

SELECT t.id, t.type, t.name, tt.utid, thread.name AS thread_name, t.parent_id,
       extract_arg(t.dimension_arg_set_id, 'utid') AS dim_utid
FROM track t LEFT JOIN thread_track tt USING (id) LEFT JOIN thread USING (utid) ORDER BY t.id;

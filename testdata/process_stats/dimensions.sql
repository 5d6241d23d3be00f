SELECT t.id, a.key, a.display_value
FROM counter_track t JOIN args a ON a.arg_set_id = t.dimension_arg_set_id ORDER BY t.id, a.key;

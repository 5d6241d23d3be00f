SELECT s.ts, a.key, a.int_value, a.string_value FROM state s JOIN args a USING (arg_set_id)
ORDER BY s.ts, a.id;

SELECT flat_key, key, int_value, string_value, value_type, display_value
FROM slice JOIN args USING (arg_set_id) ORDER BY args.id;

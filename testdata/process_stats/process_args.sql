SELECT p.pid, a.key, a.display_value FROM process p JOIN args a USING (arg_set_id) ORDER BY p.pid, a.key;

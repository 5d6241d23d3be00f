SELECT id, ts, dur, track_id, category, name, depth, parent_id, cat, slice_id FROM slice ORDER BY id;

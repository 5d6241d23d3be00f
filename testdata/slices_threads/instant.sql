SELECT ts, track_id, name FROM instant;

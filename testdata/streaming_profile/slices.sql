SELECT ts, name FROM slice ORDER BY ts;

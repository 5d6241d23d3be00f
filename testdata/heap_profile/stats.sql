SELECT name, idx, severity, source, value FROM stats WHERE value != 0 AND (name LIKE 'heapprofd%' OR name LIKE 'stackprofile%') ORDER BY name, idx;

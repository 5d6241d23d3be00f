SELECT name, idx, severity, source, value FROM stats
WHERE name GLOB 'traced_*' OR value != 0 ORDER BY name, idx;

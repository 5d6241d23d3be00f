SELECT name, idx, severity, value FROM stats
WHERE name GLOB 'stackprofile_*' OR name GLOB 'perf_*' ORDER BY name, idx;

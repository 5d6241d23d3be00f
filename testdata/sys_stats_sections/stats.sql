SELECT name, severity, value FROM stats WHERE value != 0 ORDER BY name;

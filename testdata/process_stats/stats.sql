SELECT name, severity, value FROM stats WHERE name = 'proc_stat_unknown_counters';

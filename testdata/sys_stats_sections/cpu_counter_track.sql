SELECT id, name, type, cpu, unit FROM cpu_counter_track ORDER BY cpu, id;

SELECT name, idx, value FROM stats WHERE severity = 'data_loss' AND value != 0 ORDER BY name, idx;

SELECT s.ts, s.dur, s.name, s.depth, t.name AS track, t.type,
  EXTRACT_ARG(t.dimension_arg_set_id, 'track_compressor_idx') AS idx,
  EXTRACT_ARG(t.dimension_arg_set_id, 'scope') AS scope, process.name AS process
FROM slice s JOIN track t ON s.track_id = t.id
LEFT JOIN process_track pt ON pt.id = t.id LEFT JOIN process USING (upid) ORDER BY s.ts;

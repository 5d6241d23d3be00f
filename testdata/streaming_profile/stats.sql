SELECT name, value FROM stats
WHERE name IN ('stackprofile_parser_error', 'streaming_profile_invalid_timestamp',
  'stackprofile_invalid_callstack_id', 'track_event_invalid_timestamp')
ORDER BY name;

SELECT s.ts, s.dur, s.category, s.value, st.name AS track, st.type, p.name AS process,
  t.name AS thread
FROM state s JOIN state_track st ON s.track_id = st.id
LEFT JOIN process_state_track pst ON pst.id = st.id LEFT JOIN process p ON p.upid = pst.upid
LEFT JOIN thread_state_track tst ON tst.id = st.id LEFT JOIN thread t ON t.utid = tst.utid
ORDER BY s.ts;

SELECT s.ts, s.dur, s.name, s.depth, t.name AS thread FROM slice s JOIN thread_track tt ON s.track_id = tt.id JOIN thread t USING(utid) ORDER BY s.ts;

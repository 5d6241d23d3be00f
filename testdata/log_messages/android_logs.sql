SELECT l.ts, t.tid, l.prio, l.tag, l.msg FROM android_logs l JOIN thread t USING (utid) ORDER BY l.ts;

SELECT p.upid, p.pid, p.name, p.cmdline, p.parent_upid, pp.pid AS ppid, p.uid, p.android_appid
FROM process p LEFT JOIN process pp ON p.parent_upid = pp.upid ORDER BY p.upid;

SELECT f.id, f.trace_id, o.name AS out_name, i.name AS in_name
FROM flow f JOIN slice o ON f.slice_out = o.id JOIN slice i ON f.slice_in = i.id ORDER BY f.id;

SELECT extract_arg(arg_set_id, 'debug.dict.inner.y') AS y,
       extract_arg(arg_set_id, 'debug.arr[1].z') AS z,
       extract_arg(arg_set_id, 'debug.interned_name') AS interned,
       extract_arg(arg_set_id, 'debug.d') AS d,
       extract_arg(arg_set_id, 'debug.result') AS result,
       extract_arg(arg_set_id, 'source.line_number') AS line,
       extract_arg(arg_set_id, 'debug.missing') AS missing,
       extract_arg(NULL, 'debug.b') AS null_set
FROM slice;

"""The analysis cache kept beside each export (`.<name>.analysis-cache/`): the keys (key.py: a file's size, mtime
and sampled hash, the code's fingerprint), a table command's printed answer (answers.py, asked before pandas
is imported) and a loaded Trace (loads.py on trace_store.py: zstd Arrow frames + json)."""

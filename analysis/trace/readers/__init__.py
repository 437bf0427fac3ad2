"""Trace readers, one module per format: nsys SQLite exports (nsys.py on nsys_db.py and sqlite_read.py),
torch.profiler JSON (kineto.py on kineto_json.py), a report given instead of its export (nsys_export.py), and
the one entry that picks between them by the file's first bytes (sniff.py) and reads it (read.py:
`read_trace`, and `start_read`, a run's first file read ahead)."""

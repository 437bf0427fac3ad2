"""Trace readers, one module per format: nsys SQLite exports (nsys.py on nsys_db.py and sqlite_read.py),
torch.profiler JSON (kineto.py on kineto_json.py), a report given instead of its export (nsys_export.py), and
the one entry that picks between them (load.py: `read_trace`)."""

"""Runs analysed file by file (`--jobs`, `--dask`; session.OpenRuns enters here only then): each file a
task in processes or on a Dask cluster (pool.py, dask_run.py, file_task.py; tasks.py: one task's
outcome), grouped back into runs (per_file.py) and each run's per-rank results merged (rank_merge.py)."""

"""Parallel execution: the per-file tasks of `--jobs` processes and `--dask` clusters (parallel.py, dask_run.py,
file_task.py) and the per-rank results merged back into a run (rank_merge.py); measure_runs.py is the one
interface over serial, --jobs and Dask."""

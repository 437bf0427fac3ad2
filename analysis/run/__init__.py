"""A run: which input files form one run (run_files.py `find_runs`), a run loaded once and measured
(loaded_run.py: `load_run`, `LoadedRun`; run_files.py also checks the files are one run's), put on one
clock (clocks.py, from the collectives the ranks shared: clock_offsets.py)."""

"""A run: which input files form one run (run_files.py `find_runs`), a run loaded once and measured
(loaded_run.py: `load_run`, `LoadedRun`; run_files.py also checks the files are one run's), put on one
clock (clocks.py: the clocks the files record, checked against the collectives the ranks shared)."""

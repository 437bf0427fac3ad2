"""A run: which input files form one run (runs.py `find_runs`, run_identity.py), a run read and put on one clock
(clocks.py, from the collectives the ranks shared: clock_offsets.py)."""

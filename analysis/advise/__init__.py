"""The advise feature: DDP's bucket-size what-if (advice*.py on bucket_model.py, comm_cost.py, interference.py,
stall_replay.py), sharded runs' in sharded/, and `python -m analysis.advise` (command.py)."""

"""The advise feature: what the step would be at other settings, from one recorded run.

One model core: the collective cost (comm_cost.py), the compute slowdown (slowdown.py), collectives queued
on a communicator (communicator.py), bootstrap intervals and the recommendation (uncertainty.py), the
candidate table (candidate_table.py). Two layouts plug into it (layouts.py says which run gets which):
buckets/ (DDP's bucket size) and sharded/ (fsdp's prefetch depth and reduce-scatter communicator), each
with its recorded inputs, replay, predictions and result. `advise()` (advice.py) is the Python API,
`python -m analysis.advise` (command.py) its command."""

"""The advise feature: what the step would be at other settings, from one recorded run.

One model core: the recorded run as both layouts read it and which layout models it (recorded.py), the
collective cost (comm_cost.py) and the host time per call (call_cost.py), the compute slowdown
(slowdown.py), collectives queued on a communicator, the replays' engine (communicator.py), the bootstrap,
its intervals and the recommendation (uncertainty.py), the answer's JSON pieces, table and CSV
(candidate_table.py). Two layouts plug into it: buckets/ (DDP's bucket size) and sharded/ (fsdp's prefetch
depth and reduce-scatter communicator), each with its recorded inputs, replay, predictions and result.
`advise()` (advice.py) is the Python API, `python -m analysis.advise` (command.py) its command."""

"""The sharded layout (fsdp, torch_fsdp): prefetch depth and reduce-scatter communicator. Inputs from a
recorded run (recorded.py, spans.py), the replay (replay.py), the predictions (predict.py), the answer
(result.py)."""

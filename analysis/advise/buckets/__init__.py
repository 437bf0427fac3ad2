"""The bucket layout: DDP's bucket size. Inputs from a recorded run (recorded.py), the replay on CPU ranges
(replay.py) and on GPU kernels (gpu.py), the predictions (predict.py) and the answer (result.py)."""

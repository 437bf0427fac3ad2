"""advise for sharded runs (fsdp, torch_fsdp): the recorded inputs (shard_recorded.py, shard_inputs.py), the
replay at other prefetch depths (shard_model.py), the answer and its table."""

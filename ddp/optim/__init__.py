"""Optimizers for data-parallel training: ShardedOptimizer (optimizer-state sharding, ZeRO-1)."""

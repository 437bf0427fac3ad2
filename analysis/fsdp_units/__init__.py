"""The FSDP per-unit view: each sharded unit's all-gather, whether it arrived in time and if not why
(gather_*.py, in_time.py), and its two charts (charts.py)."""

"""The overlap feature: how much communication ran under compute, per rank and step, and per step across
ranks (metrics.py), `analyze_trace` (analyze.py), and `python -m analysis.overlap` (command.py)."""

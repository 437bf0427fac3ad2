"""The collectives feature: every collective's call rows, bandwidths and waits (collective_rows.py,
collective_stats.py), the view (collectives_view.py) and `python -m analysis.collectives` (command.py)."""

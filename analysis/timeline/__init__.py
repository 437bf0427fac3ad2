"""The timeline feature: a loaded run's lanes and segments (lanes.py, panel.py), drawn as one plotly figure
(render_*.py), the page (timeline_page.py) and `python -m analysis.timeline` (command.py)."""

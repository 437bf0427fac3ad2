"""The timeline feature: a loaded run's lanes and segments (lane_segments.py, lanes.py), one trace's picture
as a panel with its level of detail (panel.py), drawn as one plotly figure (figure.py) in the segments'
colours, hover labels and highlight bands (style.py), the page (timeline_page.py) and
`python -m analysis.timeline` (command.py)."""

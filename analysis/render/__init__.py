"""Rendering primitives every feature shares: the table/CSV/JSON printer (table.py), the colours (palette.py),
offline HTML pages (html_page.py), plotly figures from dicts (figure_dicts.py), drop-downs
that show one choice at a time (drop_downs.py) and PNG/SVG export through
Chromium (export.py)."""

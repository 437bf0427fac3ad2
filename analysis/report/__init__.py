"""The report feature: the report folder (report_folder.py, html_report.py, report_collectives.py,
compare_page.py), the baseline comparison and CI gate (compare.py, gate.py, gate_command.py) and `python -m
analysis.report` (command.py)."""

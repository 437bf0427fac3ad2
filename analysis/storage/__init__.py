"""What the analysis keeps on disk: the report folder's own files and its results.db history (report_files.py)."""

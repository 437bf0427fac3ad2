"""The typed frames both readers produce (`Trace`, in trace.py), how they are merged, and what they say about
the run. Nothing is imported here: the CLIs' options import frames/patterns.py before pandas is needed."""

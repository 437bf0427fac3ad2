"""The typed frames both readers produce (`Trace`), how they are merged, and what they say about the run."""

from analysis.frames.trace import Trace

__all__ = ["Trace"]

"""The analysis CLIs' progress lines (`[overlap] 1/2 files done, ...`), printed on stderr once a run has
lasted 3 s: whether they appear depends on how loaded the machine is, so a check of what a command
printed on stderr leaves them out."""

from __future__ import annotations

import re

_PROGRESS = re.compile(r"^(\[\w+\] )?\d+/\d+ files done\b.*\n?", re.MULTILINE)


def without_progress(stderr: str) -> str:
    """`stderr` minus the progress lines."""
    return _PROGRESS.sub("", stderr)

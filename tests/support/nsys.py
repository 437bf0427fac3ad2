"""The real nsys, for the tests that record with it: `NSYS` (its path, None when it is not installed) and
`RECORDS_WITH_NSYS`, the marks of a module whose tests run run_nsys.sh under it."""

from __future__ import annotations

import pytest

from profiling.nsys import NsysError, find_nsys

try:
    NSYS = find_nsys()
except NsysError:
    NSYS = None

RECORDS_WITH_NSYS = [
    pytest.mark.nsys,  # records with the real nsys
    pytest.mark.skipif(NSYS is None, reason="nsys not installed (bash scripts/install_nsys.sh)"),
]

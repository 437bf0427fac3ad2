"""Fixtures for the whole suite."""

from __future__ import annotations

import os
import sys

import pytest

from tests import gpu_traces

# The scripts the tests start (run_nsys.sh) run with $PYTHON: make it the interpreter running the tests.
os.environ["PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def gpu_trace(tmp_path_factory):
    """gpu_trace("naive.sqlite") -> path of that real H100 trace, decompressed once per test run."""
    if not gpu_traces.available():
        pytest.skip("../shared/data/gpu_h100 not present")
    folder = tmp_path_factory.mktemp("gpu_h100")
    return lambda name: gpu_traces.decompress(name, folder)

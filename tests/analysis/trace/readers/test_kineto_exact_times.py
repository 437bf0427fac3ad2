"""Kineto times to the ns as written: integral µs exactly, fractional µs to the ns, at any magnitude."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from analysis.run.loaded_run import load_trace
from analysis.trace.readers.kineto_columns import _ns
from analysis.trace.readers.kineto_events import EXACT_FLOAT_US
from tests.support.synthetic_kineto import KinetoWriter

REAL = Path(__file__).resolve().parents[4] / ".." / "shared" / "data" / "kineto_ddp_2rank_nccl.json.gz"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _write(tmp_path: Path, base: int, start: np.ndarray, end: np.ndarray) -> Path:
    w = KinetoWriter(tmp_path / "t.json", base_time_ns=base)
    w.process(7)
    w.kernels(7, 7, 0, 7, start, end, "gemm", launch=start - 5_000)
    return w.close()


@pytest.mark.parametrize(
    "base, first",
    [
        (0, 1_700_000_000_123_456_789),  # absolute epoch µs (~1.7e15): float64 keeps only 1/4 µs
        (0, 4_458_676_522_690_655),  # µs ~4.5e12, like the real trace: below EXACT_FLOAT_US, the fast path
        (1_779_782_330_000_000_000, 1_779_782_330_000_000_001),  # small times after baseTimeNanoseconds
    ],
)
def test_every_ns_survives(tmp_path: Path, base: int, first: int) -> None:
    rng = np.random.default_rng(3)
    start = first + np.cumsum(rng.integers(1, 50_000, 400))
    end = start + rng.integers(1, 30_000, 400)
    ops = load_trace(_write(tmp_path, base, start, end)).gpu_ops  # frames: ns on the file's own clock
    assert ops["start"].tolist() == (start - base).tolist()
    assert ops["end"].tolist() == (end - base).tolist()


def test_integral_and_fractional_parts_are_scaled_apart() -> None:
    us = np.array([2.0**52 - 1, 1_700_000_000_123_456.0, 4_458_676_522_690.655, 0.001, -3.5, 0.0])
    assert _ns(us).tolist() == [(2**52 - 1) * 1000, 1_700_000_000_123_456_000, 4_458_676_522_690_655, 1, -3500, 0]
    assert 4_458_676_522_690.655 < EXACT_FLOAT_US <= 1_700_000_000_123_456.0


@pytest.fixture(scope="module")
def decimal_reference() -> dict:
    """Per device, from the JSON with its numbers parsed as decimals: GPU ops, summed durations, first
    start and last end, all in ns."""
    if not REAL.exists():
        pytest.skip(f"{REAL} not present")
    events = json.loads(gzip.decompress(REAL.read_bytes()), parse_float=Decimal)["traceEvents"]
    per_device: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            start, dur = round(e["ts"] * 1000), max(round(e["dur"] * 1000), 0)
            per_device.setdefault(e["args"]["device"], []).append((start, start + dur))
    return {d: sorted(ops) for d, ops in per_device.items()}


@pytest.mark.real
def test_real_trace_per_device_totals_are_exact(decimal_reference: dict) -> None:
    ops = load_trace(REAL).gpu_ops
    assert sorted(ops["device"].unique().tolist()) == sorted(decimal_reference)
    for device, want in decimal_reference.items():
        mine = ops[ops["device"] == device]
        got = sorted(zip(mine["start"].tolist(), mine["end"].tolist(), strict=True))
        assert got == want  # every op to the ns
        assert int((mine["end"] - mine["start"]).sum()) == sum(e - s for s, e in want)
        assert (int(mine["start"].min()), int(mine["end"].max())) == (want[0][0], max(e for _, e in want))

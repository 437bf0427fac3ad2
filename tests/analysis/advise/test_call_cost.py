"""call_cost: the host time of each collective's issue, from `comm_issue` ranges, against the median worked
out here from the raw ranges of a synthetic two-rank nsys export."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.advise.call_cost import RANGES, call_cost
from analysis.run.loaded_run import load_run
from contract import ALL_REDUCE, comm_issue_range, step_range
from tests.support.synthetic import PUSH_POP, NsysWriter


def test_the_issue_ranges_give_each_rank_its_median(tmp_path):
    rng = np.random.default_rng(3)
    lengths = {101: rng.integers(1_000, 9_000, 6), 102: rng.integers(20_000, 40_000, 6)}
    w = NsysWriter(tmp_path / "run.sqlite", flavour="2026")
    for rank, pid in enumerate((101, 102)):
        w.process(pid)
        w.meta_mark(pid, pid, 10, rank=rank, implementation="overlap_bucket", world_size=2, backend="gloo")
        w.nvtx(pid, pid, 100, 200_000, step_range(0), kind=PUSH_POP)
        starts = 1_000 + 30_000 * np.arange(6)
        for k, (s, n) in enumerate(zip(starts, lengths[pid], strict=True)):  # six issues per rank
            w.nvtx(pid, pid, int(s), int(s + n), comm_issue_range(ALL_REDUCE, f"bucket{k}"), kind=PUSH_POP)
    w.close()
    trace = load_run([tmp_path / "run.sqlite"]).trace
    got = call_cost(trace, pd.DataFrame(columns=["rank", "issue_ns"]), [0, 1], gpu=False)
    assert got.source == RANGES and got.calls == 12
    assert got.host_ns.tolist() == pytest.approx([float(np.median(lengths[101])), float(np.median(lengths[102]))])


def test_without_ranges_on_cpu_it_says_why(tmp_path):
    w = NsysWriter(tmp_path / "run.sqlite", flavour="2026")
    w.process(101)
    w.meta_mark(101, 101, 10, rank=0, implementation="overlap_bucket", world_size=1, backend="gloo")
    w.nvtx(101, 101, 100, 200_000, step_range(0), kind=PUSH_POP)
    w.close()
    got = call_cost(load_run([tmp_path / "run.sqlite"]).trace, pd.DataFrame(columns=["rank", "issue_ns"]), [0], False)
    assert not got.measured and got.host_ns.tolist() == [0.0] and "no comm_issue ranges" in got.source

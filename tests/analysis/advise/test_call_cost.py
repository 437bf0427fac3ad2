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


def test_the_part_of_an_issue_that_grows_with_its_bytes_is_not_charged_per_call(tmp_path):
    # each issue takes 700 us plus 0.09 ms per MB of its bucket (on CPU: the gradients' division), with noise
    rng = np.random.default_rng(5)
    sizes = {f"bucket{k}": b for k, b in enumerate([1e6, 2e6, 5e6, 5e6, 9e6])}
    w = NsysWriter(tmp_path / "run.sqlite", flavour="2026")
    lengths: dict[int, list[tuple[float, int]]] = {0: [], 1: []}
    for rank, pid in enumerate((101, 102)):
        w.process(pid)
        w.meta_mark(pid, pid, 10, rank=rank, implementation="overlap_bucket", world_size=2, backend="gloo")
        w.nvtx(pid, pid, 100, 2_000_000, step_range(0), kind=PUSH_POP)
        for k, (tag, nbytes) in enumerate(sizes.items()):
            n = int(700_000 + 0.09 * nbytes + rng.integers(-20_000, 20_000))
            start = 1_000 + 300_000 * k
            w.nvtx(pid, pid, start, start + n, comm_issue_range(ALL_REDUCE, tag), kind=PUSH_POP)
            lengths[rank].append((nbytes, n))
    w.close()
    calls = pd.DataFrame(
        [{"rank": r, "op": ALL_REDUCE, "tag": t, "bytes": b, "issue_ns": 0} for r in (0, 1) for t, b in sizes.items()]
    )
    got = call_cost(load_run([tmp_path / "run.sqlite"]).trace, calls, [0, 1], gpu=False)

    # the expected figure by hand: a line over each size's median length, then each rank's median remainder
    pooled: dict[float, list[float]] = {}
    for pairs in lengths.values():
        for nbytes, n in pairs:
            pooled.setdefault(nbytes, []).append(n)
    sizes_seen = sorted(pooled)
    per_byte, _ = np.polyfit(sizes_seen, [float(np.median(pooled[x])) for x in sizes_seen], 1)
    want = [float(np.median([n - per_byte * nbytes for nbytes, n in lengths[r]])) for r in (0, 1)]
    assert got.host_ns.tolist() == pytest.approx(want)
    assert got.host_ns.tolist() == pytest.approx([700_000, 700_000], rel=0.05)  # not the 1.1 ms median length


def test_issues_of_one_size_count_whole(tmp_path):
    # every bucket the same size: a per-byte part cannot be told apart, so each issue counts whole (not 0)
    w = NsysWriter(tmp_path / "run.sqlite", flavour="2026")
    w.process(101)
    w.meta_mark(101, 101, 10, rank=0, implementation="overlap_bucket", world_size=1, backend="gloo")
    w.nvtx(101, 101, 100, 2_000_000, step_range(0), kind=PUSH_POP)
    for k, n in enumerate([900_000, 1_100_000, 1_000_000]):
        w.nvtx(
            101,
            101,
            1_000 + 300_000 * k,
            1_000 + 300_000 * k + n,
            comm_issue_range(ALL_REDUCE, f"bucket{k}"),
            kind=PUSH_POP,
        )
    w.close()
    calls = pd.DataFrame(
        [{"rank": 0, "op": ALL_REDUCE, "tag": f"bucket{k}", "bytes": 5e6, "issue_ns": 0} for k in range(3)]
    )
    got = call_cost(load_run([tmp_path / "run.sqlite"]).trace, calls, [0], gpu=False)
    assert got.host_ns.tolist() == [1_000_000.0]

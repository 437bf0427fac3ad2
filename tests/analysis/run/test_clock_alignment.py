"""Clock alignment from the collectives on the real per-rank H100 pairs: one rank's session clock
moved by 2-20 ms either way is found and undone; right clocks are left alone."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.api import analyze
from analysis.overlap.analyze import analyze_trace
from analysis.overlap.metrics import SPLIT_METRICS
from analysis.run.loaded_run import load_trace
from tests.support.synthetic_kineto import KinetoWriter

pytestmark = pytest.mark.real  # the real per-rank H100 pairs
SHIFTS_NS = [2_000_000, -2_000_000, 10_000_000, -10_000_000, 20_000_000, -20_000_000]


def shifted_copy(path: Path, into: Path, shift_ns: int) -> Path:
    """A copy of an nsys export whose session clock (TARGET_INFO_SESSION_START_TIME) is shift_ns off."""
    out = into / f"shifted{shift_ns}.{path.name}"
    shutil.copyfile(path, out)
    out.chmod(0o644)
    with sqlite3.connect(out) as db:
        db.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + ?", (shift_ns,))
    return out


def split(paths: list[Path]) -> tuple[pd.DataFrame, str]:
    result = analyze(paths, merge=True)
    steps = result.steps[result.steps["step"].notna()].set_index(["rank", "step"])[SPLIT_METRICS]
    return steps, str(result.summary["clock_note"].iloc[0])


@pytest.fixture(scope="module")
def pairs(gpu_trace) -> dict:
    out = {}
    for impl in ("naive", "overlap"):
        paths = [gpu_trace(f"{impl}.rank{r}.sqlite") for r in (0, 1)]
        out[impl] = (paths, *split(paths))
    return out


@pytest.mark.parametrize("impl", ["naive", "overlap"])
def test_right_clocks_are_left_alone(pairs: dict, impl: str) -> None:
    _, _, note = pairs[impl]
    assert "rank 1: session clock kept" in note and "over 1096 collectives" in note


@pytest.mark.parametrize("impl", ["naive", "overlap"])
@pytest.mark.parametrize("shift_ns", SHIFTS_NS)
def test_a_shifted_session_clock_is_undone(pairs: dict, impl: str, shift_ns: int, tmp_path: Path) -> None:
    (rank0, rank1), truth, kept = pairs[impl]
    got, note = split([rank0, shifted_copy(rank1, tmp_path, shift_ns)])
    moved = float(note.split("aligned on the collectives, ")[1].split(" ms")[0])
    assert moved == pytest.approx(-shift_ns / 1e6, abs=0.002)  # undone, to the estimate's µs
    estimate = kept.split("collectives' estimate ")[1].split(" ±")[0]  # the collectives say the same
    assert f"offset {estimate}, collectives' estimate {estimate}" in note
    assert got.index.equals(truth.index)
    # each call's wait and transfer move by the estimate's distance from the session clocks, so a step's
    # sums move by that times its calls (219 per step): the bound is 20 µs per rank and step (the
    # plain median of the ends, 0.5 µs off, moved them by up to 112 µs; no alignment, by up to 138 ms)
    diff_ms = (got - truth).abs().to_numpy()
    assert np.nanmax(diff_ms) < 0.020


def test_the_one_piece_load_aligns_the_same_way(pairs: dict, tmp_path: Path) -> None:
    """load_trace (timeline, report) and the per-file merge (overlap, collectives) share the one rule."""
    (rank0, rank1), truth, _ = pairs["naive"]
    paths = [rank0, shifted_copy(rank1, tmp_path, -7_000_000)]
    whole = analyze_trace(load_trace(paths))
    _, note = split(paths)
    assert str(whole.summary["clock_note"].iloc[0]) == note and "rank 1: aligned on the collectives" in note
    steps = whole.steps[whole.steps["step"].notna()].set_index(["rank", "step"])[SPLIT_METRICS]
    assert np.nanmax((steps - truth).abs().to_numpy()) < 0.020


def as_kineto(nsys_path: Path, out: Path, shift_ns: int = 0) -> Path:
    """The rank's kernels, copies and NVTX ranges of a real nsys export written as a torch.profiler
    trace whose baseTimeNanoseconds is the export's session clock (moved by shift_ns)."""
    trace = load_trace(nsys_path)
    base = int(trace.info[0]["clock_offset_ns"]) + shift_ns
    ((pid, meta),) = trace.meta.items()
    w = KinetoWriter(out, base_time_ns=base, flows=False)
    w.process(pid[1])
    w.meta_mark(pid[1], pid[1], base, **{k: v for k, v in meta.items() if k != "pid"})
    ops = trace.gpu_ops
    for kind, write in (("kernel", w.kernels), ("memcpy", w.memcpy)):
        mine = ops[ops["kind"] == kind]
        t = lambda c, mine=mine: mine[c].to_numpy() + base
        launch = np.where(mine["launch_start"].to_numpy() >= 0, t("launch_start"), -1)
        names = mine["name"].astype(str).to_numpy() if kind == "kernel" else "Memcpy HtoD"
        write(
            pid[1],
            mine["launch_tid"].to_numpy(),
            mine["device"].to_numpy(),
            mine["stream"].to_numpy(),
            t("start"),
            t("end"),
            names,
            launch=launch,
        )
    ranges = trace.nvtx[trace.nvtx["kind"] == "push_pop"]
    w.nvtx(
        pid[1],
        ranges["tid"].to_numpy(),
        ranges["start"].to_numpy() + base,
        ranges["end"].to_numpy() + base,
        ranges["text"].astype(str).to_numpy(),
    )
    return w.close()


@pytest.fixture(scope="module")
def kineto_pair(gpu_trace, tmp_path_factory) -> tuple[list[Path], Path, pd.DataFrame]:
    """The overlap pair's nsys files, its rank 0 as a Kineto file, and the split of both ranks as Kineto
    files on their right clocks: written and computed once for the module (the tests only read them)."""
    nsys = [gpu_trace(f"overlap.rank{r}.sqlite") for r in (0, 1)]
    folder = tmp_path_factory.mktemp("kineto")
    k0 = as_kineto(nsys[0], folder / "k0.json")
    truth, _ = split([k0, as_kineto(nsys[1], folder / "k1.json")])
    return nsys, k0, truth


@pytest.mark.parametrize("shift_ns", [0, 12_000_000, -3_000_000])
def test_kineto_per_rank_files_align_alike(kineto_pair, tmp_path: Path, shift_ns: int) -> None:
    nsys, k0, truth = kineto_pair
    got, note = split([k0, as_kineto(nsys[1], tmp_path / f"s{shift_ns}.json", shift_ns)])
    verdict = "aligned on the collectives" if shift_ns else "session clock kept"
    assert f"rank 1: {verdict}" in note
    assert got.index.equals(truth.index) and len(truth) == 10
    assert np.nanmax((got - truth).abs().to_numpy()) < (0.020 if shift_ns else 1e-9)

"""The figures of docs/own-job.md, on the real per-rank H100 exports (../shared/data/gpu_h100):

clocks    rank 1's session clock moved by ±2, ±10, ±20 ms: the offset the alignment finds, and how far
          each rank's per-step wait/transfer lies from the unshifted run's (max, median, µs)
autograd  rank 0's export with every NVTX row deleted: the backward compute kernels found from the
          autograd engine's thread against those our `backward` ranges hold

  python benchmarks/own_job_figures.py [--impl naive overlap] [--work DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's analysis, not an installed one

from analysis import analyze
from analysis.measure.phases import launched_inside
from analysis.overlap.metrics import SPLIT_METRICS
from analysis.run.loaded_run import load_trace
from analysis.trace.frames import GPU_KERNEL, Trace
from tests import gpu_traces

SHIFTS_NS = [2_000_000, -2_000_000, 10_000_000, -10_000_000, 20_000_000, -20_000_000]


def edited_copy(path: Path, into: Path, name: str, sql: str, *args: int) -> Path:
    out = into / f"{name}.{path.name}"
    shutil.copyfile(path, out)
    out.chmod(0o644)
    db = sqlite3.connect(out)
    db.execute(sql, args)
    db.commit()
    db.close()
    return out


def split(paths: list[Path]) -> tuple[pd.DataFrame, str]:
    result = analyze(paths, merge=True)
    steps = result.steps[result.steps["step"].notna()].set_index(["rank", "step"])[SPLIT_METRICS]
    return steps, str(result.summary["clock_note"].iloc[0])


def clock_figures(impl: str, work: Path) -> None:
    rank0, rank1 = (gpu_traces.decompress(f"{impl}.rank{r}.sqlite", work) for r in (0, 1))
    truth, note = split([rank0, rank1])
    print(f"{impl} unshifted: {note}")
    for ns in SHIFTS_NS:
        sql = "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + ?"
        got, note = split([rank0, edited_copy(rank1, work, f"shift{ns}", sql, ns)])
        diff_us = (got - truth).abs().to_numpy() * 1000
        print(
            f"{impl} shift {ns / 1e6:+.0f} ms: per-step wait/transfer vs unshifted max {np.nanmax(diff_us):.1f} µs, "
            f"median {np.nanmedian(diff_us):.1f} µs; {note}"
        )


def backward_compute(trace: Trace) -> np.ndarray:
    ops = trace.gpu_ops
    compute = (ops["kind"].cat.codes.to_numpy() == GPU_KERNEL) & ~ops["is_comm"].to_numpy()
    return launched_inside(ops, trace.nvtx[trace.nvtx["text"] == "backward"]) & compute


def autograd_figures(impl: str, work: Path) -> None:
    original = gpu_traces.decompress(f"{impl}.rank0.sqlite", work)
    stripped = edited_copy(original, work, "no_nvtx", "DELETE FROM NVTX_EVENTS")
    truth, got = backward_compute(load_trace(original)), backward_compute(load_trace(stripped))
    print(
        f"{impl}.rank0 without NVTX: backward compute kernels: ours {int(truth.sum())}, from the autograd "
        f"thread {int(got.sum())}, both {int((truth & got).sum())}, only ours {int((truth & ~got).sum())}, "
        f"only the thread's {int((got & ~truth).sum())}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", nargs="+", default=["naive", "overlap"], choices=["naive", "overlap"])
    p.add_argument("--work", type=Path, help="folder for the decompressed and edited copies (default: a temporary one)")
    args = p.parse_args()
    if not gpu_traces.available():
        print("error: ../shared/data/gpu_h100 not present", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for impl in args.impl:
            autograd_figures(impl, work)
            clock_figures(impl, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

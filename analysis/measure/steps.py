"""Step windows: when a step begins and ends, and which work it launched.

A trace marks steps with CPU NVTX ranges (`step N`). On the CPU they are the step: the host does the
work inside them. With a GPU the host only *launches* work, and when it does not wait for the GPU at
the end of a step (PyTorch DDP does not, nor do most training loops) the GPU runs on past the CPU
range. So on ranks with GPU work:

  - step k lasts from its start to step k+1's start (the period of the loop, which is what the
    run's own timer measures); its work is everything launched in [start_k, start_k+1);
  - the last step has no successor: its work is what was launched inside its CPU range, and it lasts
    until the later of its CPU end and the end of that work.

On ranks without GPU work (CPU-only traces) a step is its CPU range and owns what starts inside it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def step_windows(steps: pd.DataFrame, gpu: bool, launch: np.ndarray, work_end: np.ndarray) -> pd.DataFrame:
    """One rank's windows: step, start, launch_end (work launched in [start, launch_end) is the
    step's), end (the step lasts [start, end)). `steps`: that rank's step ranges (step, start, end);
    launch/work_end: when each piece of its work was launched and when it ended (GPU ranks)."""
    steps = steps.sort_values("start", kind="stable")
    start, cpu_end = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
    if not gpu or start.size == 0:
        return pd.DataFrame({"step": steps["step"].to_numpy(), "start": start, "launch_end": cpu_end, "end": cpu_end})
    launch_end = np.r_[start[1:], cpu_end[-1]]
    end = launch_end.copy()
    last = (launch >= start[-1]) & (launch < cpu_end[-1])
    end[-1] = max(int(cpu_end[-1]), int(work_end[last].max()) if last.any() else 0)
    return pd.DataFrame({"step": steps["step"].to_numpy(), "start": start, "launch_end": launch_end, "end": end})


def window_index(windows: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """For each time t: the index (0..n-1) of the window whose launch span [start, launch_end)
    contains it, else -1."""
    start, launch_end = windows["start"].to_numpy(np.int64), windows["launch_end"].to_numpy(np.int64)
    t = np.asarray(t, dtype=np.int64)
    if start.size == 0:
        return np.full(t.shape, -1, dtype=np.int64)
    i = np.searchsorted(start, t, side="right") - 1  # latest window starting at or before t
    hit = (i >= 0) & (t >= 0) & (t < launch_end[np.maximum(i, 0)])
    return np.where(hit, i, -1)

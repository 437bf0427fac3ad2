"""Every prediction's uncertainty, and the recommendation that respects it.

Row 0 of every replayed result is the estimate from all recorded steps; rows 1..B replay a resample of
the steps (drawn with replacement, fixed seed) with the model's parameters refitted on that resample
alone. The spread of the replicates is the uncertainty of each prediction (sampling noise of the recorded
steps and of the fitted parameters together), given as the half-width of a 95 % interval. The replicates
are paired across candidates, so the gain of one candidate over another has its own, smaller, spread:
the recorded setting is kept unless the best candidate's gain exceeds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.trace.frames import NS_PER_MS

REPLICATES = 200
SEED = 0
Z95 = 1.96  # half-width of a 95 % interval in standard deviations (normal approximation)


def resamples(steps: int, replicates: int = REPLICATES, seed: int = SEED) -> np.ndarray:
    """(1 + replicates, steps): every step in order, then resamples with replacement (one row if 1 step)."""
    if steps < 2:
        return np.zeros((1, steps), dtype=np.int64)
    draws = np.random.default_rng(seed).integers(0, steps, size=(replicates, steps))
    return np.vstack([np.arange(steps)[None, :], draws])


def resampled_calls(calls: pd.DataFrame, steps: np.ndarray, rows: np.ndarray) -> Iterator[pd.DataFrame]:
    """Each row's calls, in turn: those of its steps (indices into `steps`, the recorded step numbers),
    a step drawn twice giving its calls twice, in the row's order."""
    by_step = [calls[calls["step"] == s] for s in steps]
    for pick in rows:  # one frame per replicate (a few hundred), made when its fit asks for it
        yield pd.concat([by_step[i] for i in pick], ignore_index=True)


def row_means_ms(values: np.ndarray, rows: int) -> np.ndarray:
    """Each row's mean in ms, of values (ns) replayed for every (row, step) flattened, rows first."""
    return values.reshape(rows, -1).mean(axis=1) / NS_PER_MS


def half_width(rows: np.ndarray) -> np.ndarray:
    """Z95 x the spread of the replicates (rows 1..) of each column; 0 without two replicates."""
    return Z95 * rows[1:].std(axis=0) if len(rows) > 2 else np.zeros(np.shape(rows)[1:])


def keep_rule(steps: np.ndarray, own: int, best: int) -> tuple[bool, float, float]:
    """(keep the recorded candidate?, the best one's gain over it, Z95 x the spread of that gain) from
    predicted steps (1 + B, C): row 0 the estimate, rows 1.. bootstrap replicates, paired by row."""
    diff = steps[:, own] - steps[:, best]  # paired: the same replicate's steps for both candidates
    gain, err = float(diff[0]), float(half_width(diff))
    return best == own or gain <= err, gain, err


@dataclass(frozen=True)
class Choice:
    """The setting chosen; `kept` when the best candidate's gain over the recorded one is within its error
    (gain None: no recorded setting among the candidates)."""

    setting: Any
    best: Any
    kept: bool
    gain_ms: float | None
    gain_ms_err: float | None

    def reason(self, label: Callable[[Any], str], noun: str) -> str:
        """Why, naming a setting by `label` and the knob by `noun` ("size", "setting")."""
        if self.gain_ms is None:
            return f"the fastest predicted; no recorded {noun} to keep"
        gain = f"{self.gain_ms:.3f} ± {self.gain_ms_err:.3f} ms"
        if self.kept and self.best != self.setting:
            return f"kept: {label(self.best)} would gain {gain}, within the uncertainty"
        if self.kept:
            return f"kept: the recorded {noun} is the fastest predicted"
        return f"{gain} faster than the recorded {noun}, beyond the uncertainty"


def choose(settings: list, steps: np.ndarray, recorded: Any) -> Choice | None:
    """The recommendation from predicted steps (1 + B, C), one column per setting: keep the recorded
    setting unless the best one's gain exceeds Z95 x the spread of its paired differences."""
    if not settings:
        return None
    best = int(np.argmin(steps[0]))
    if recorded is None or recorded not in settings:
        return Choice(settings[best], settings[best], False, None, None)
    kept, gain, err = keep_rule(steps, settings.index(recorded), best)
    return Choice(recorded if kept else settings[best], settings[best], kept, gain, err)

"""Every prediction's uncertainty, and the recommendation that respects it.

Row 0 of every replayed result is the estimate from all recorded steps; rows 1..B replay a resample of
the steps (drawn with replacement, fixed seed) with the model's parameters refitted on that resample
alone. The spread of the replicates is the uncertainty of each prediction (sampling noise of the recorded
steps and of the fitted parameters together), given as the half-width of a 95 % interval. The replicates
are paired across candidates, so the gain of one candidate over another has its own, smaller, spread:
the recorded setting is kept unless the best candidate's gain exceeds it, and kept as well when the gain
is within the noise of the run's own mean step (`step_noise_ms`: Z95 x its step-to-step spread / sqrt of
its steps): a change smaller than what the recorded run's measured step is known to cannot be told from
noise. (The spread of single steps, the rule before, is no such bound: a CPU run whose steps varied by 9 %
under nsys kept its setting where unprofiled sweeps measured another 13 % faster.)
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


def step_spread_ms(step_ns: np.ndarray) -> float:
    """The run's step-to-step spread: the standard deviation (ms) of the steps' lengths, each step's the mean
    over its ranks (step_ns: (S, R) or (S,)); 0 with fewer than two steps."""
    per_step = np.asarray(step_ns, dtype=float).reshape(len(step_ns), -1).mean(axis=1)
    return float(per_step.std(ddof=1) / NS_PER_MS) if per_step.size > 1 else 0.0


def step_noise_ms(step_ns: np.ndarray) -> float:
    """The noise of the run's mean step: Z95 x the step-to-step spread / sqrt(steps), the half-width of a
    95 % interval of the mean (step_ns: (S, R) or (S,)); 0 with fewer than two steps."""
    steps = len(step_ns)
    return Z95 * step_spread_ms(step_ns) / float(np.sqrt(steps)) if steps > 1 else 0.0


def changes(steps: np.ndarray, own: int) -> tuple[np.ndarray, np.ndarray]:
    """Each candidate's change from column `own` (1 + B, C) -> (estimate (C,), 95 % half-width (C,)),
    paired by replicate row, so what every candidate shares cancels."""
    diff = steps - steps[:, own : own + 1]
    return diff[0], half_width(diff)


@dataclass(frozen=True)
class Choice:
    """The setting chosen; `kept` when the best candidate's gain over the recorded one is within its error
    or within the noise of the run's mean step `noise_ms` (gain None: no recorded setting among the
    candidates). `beyond_noise`: some candidate's predicted change exceeds that noise."""

    setting: Any
    best: Any
    kept: bool
    gain_ms: float | None
    gain_ms_err: float | None
    noise_ms: float | None = None
    beyond_noise: bool = True

    @property
    def within_noise(self) -> bool:
        """The best gain is within the noise of the run's mean step (and was kept for that)."""
        return self.noise_ms is not None and self.gain_ms is not None and self.gain_ms <= self.noise_ms

    def reason(self, label: Callable[[Any], str], noun: str) -> str:
        """Why, naming a setting by `label` and the knob by `noun` ("size", "setting")."""
        if self.gain_ms is None:
            return f"the fastest predicted; no recorded {noun} to keep"
        gain = f"{self.gain_ms:.3f} ± {self.gain_ms_err:.3f} ms"
        spread = f"the noise of the run's mean step (± {self.noise_ms or 0.0:.3f} ms)"
        if not self.beyond_noise:
            return f"kept: no {noun} is predicted to differ from the recorded one beyond {spread}"
        if self.best != self.setting and self.within_noise and self.gain_ms > (self.gain_ms_err or 0.0):
            return f"kept: {label(self.best)} would gain {gain}, within {spread}"
        if self.kept and self.best != self.setting:
            return f"kept: {label(self.best)} would gain {gain}, within the uncertainty"
        if self.kept:
            return f"kept: the recorded {noun} is the fastest predicted"
        return f"{gain} faster than the recorded {noun}, beyond the uncertainty"


def choose(settings: list, steps: np.ndarray, recorded: Any, noise_ms: float | None = None) -> Choice | None:
    """The recommendation from predicted steps (1 + B, C), one column per setting: keep the recorded
    setting unless the best one's gain exceeds Z95 x the spread of its paired differences and the noise of
    the run's mean step `noise_ms` (None: no such rule)."""
    if not settings:
        return None
    best = int(np.argmin(steps[0]))
    if recorded is None or recorded not in settings:
        return Choice(settings[best], settings[best], False, None, None)
    own = settings.index(recorded)
    kept, gain, err = keep_rule(steps, own, best)
    beyond = noise_ms is None or bool(np.abs(steps[0] - steps[0, own]).max() > noise_ms)
    kept = kept or (noise_ms is not None and gain <= noise_ms)
    return Choice(recorded if kept else settings[best], settings[best], kept, gain, err, noise_ms, beyond)

"""What either layout answers, in the pieces they share: a candidate's predictions in JSON (each with its `_err`,
the half-width of a 95 % interval), the recommendation's JSON, the replay's check against the measured step,
the candidate table (one row per group of settings that replay the same, the recorded one standing for its
group; the recorded and the recommended marked; changes first) and its CSV rows. A layout's own columns and
the lines above its table are its result.py's."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from analysis.advise.uncertainty import Choice

ABSOLUTE_FIGURES = "under the profiler: the recorded step plus the predicted change"
COLUMNS = {"change_ms": "step change ms", "change_pct": "step change %", "step": "step under profiler ms"}

# a group of candidates: the settings (as in the JSON's `setting`) whose replays are the same
Group = Callable[[dict], list[dict]]


def uncertainty_text(replicates: int) -> str:
    return f"95% interval, {replicates} bootstrap resamples of the recorded steps"


def plus_minus(candidate: dict, key: str) -> str:
    """A prediction and its error (the `<key>_err` beside it) as 'value ± half-width'."""
    return f"{candidate[key]:.3f} ± {candidate[key + '_err']:.3f}"


def predicted_json(name: str, value: float, err: float) -> dict:
    """`predicted_<name>` and its `_err`, rounded to the µs."""
    return {f"predicted_{name}": round(value, 3), f"predicted_{name}_err": round(err, 3)}


def change_json(candidate: Any, noise_ms: float) -> dict:
    """A candidate's change from the recorded setting (its change_ms, change_pct and their errors), and
    whether it stands out (`change_beyond_noise`, beyond_noise)."""
    c = candidate
    return {
        **predicted_json("change_ms", c.change_ms, c.change_ms_err),
        **predicted_json("change_pct", c.change_pct, c.change_pct_err),
        "change_beyond_noise": beyond_noise(c.change_ms, c.change_ms_err, noise_ms),
    }


def beyond_noise(change_ms: float, change_ms_err: float, noise_ms: float) -> bool:
    """Whether a predicted change can be told from no change: larger than its own 95 % half-width (the
    interval leaves out zero) and than the noise of the run's mean step `noise_ms`."""
    return abs(change_ms) > max(change_ms_err, noise_ms)


def choice_json(choice: Choice, label: Callable[[Any], str], noun: str, **named: Any) -> dict:
    """The recommendation: the layout's `named` keys (its setting, the best one), then whether the recorded
    setting was kept, the gain and why (naming a setting by `label` and the knob by `noun`)."""
    c = choice
    return {
        **named,
        "kept": c.kept,
        "gain_ms": None if c.gain_ms is None else round(c.gain_ms, 3),
        "gain_ms_err": None if c.gain_ms_err is None else round(c.gain_ms_err, 3),
        "reason": c.reason(label, noun),
        "beyond_noise": c.beyond_noise,
    }


def measured_step_text(run: dict) -> str:
    """'measured step 198.143 ± 11.502 ms (95 %; step-to-step spread 23.474 ms)', as both layouts' tables open."""
    return (
        f"measured step {run['measured_step_ms']:.3f} ± {run['step_noise_ms']:.3f} ms (95 %; step-to-step spread "
        f"{run['step_spread_ms']:.3f} ms)"
    )


def check_text(name: str, replayed: float, err: float, measured: float, within: bool, off_ms: float) -> str:
    """'step 735.3 ± 20.1 ms vs 773.3 measured, within its interval' or '..., NOT within its interval (off by
    -38.0 ms, -4.9 %)': the replay of the recorded setting against what was measured."""
    head = f"{name} {replayed:.3f} ± {err:.3f} ms vs {measured:.3f} measured"
    if within:
        return f"{head}, within its interval"
    pct = 100.0 * off_ms / measured if measured else float("nan")
    return f"{head}, NOT within its interval (off by {off_ms:+.3f} ms, {pct:+.1f} %)"


CHANGE_CELLS: dict[str, Callable[[dict], object]] = {
    "change_ms": lambda c: f"{c['predicted_change_ms']:+.3f} ± {c['predicted_change_ms_err']:.3f}",
    "change_pct": lambda c: f"{c['predicted_change_pct']:+.1f} ± {c['predicted_change_pct_err']:.1f}",
    "step": lambda c: plus_minus(c, "predicted_step_ms"),
}


def one_per_group(run: dict, group: Group) -> list[dict]:
    """One candidate per group, in the candidates' order: the recorded one where it is in the group, else the
    group's first."""
    rows, seen = [], []
    for c in run["candidates"]:
        same = group(c)
        if same in seen:
            continue
        seen.append(same)
        rows.append(next((d for d in run["candidates"] if d["setting"] in same and d["recorded"]), c))
    return rows


NOT_TOLD_APART = "within the noise"  # the note of a change that cannot be told from none (beyond_noise)


def marks(run: dict, candidate: dict, group: Group) -> list[str]:
    """'recorded' and 'recommended', where the candidate's group holds them; NOT_TOLD_APART for another
    setting whose predicted change cannot be told from none."""
    same = group(candidate)
    recorded = any(d["recorded"] for d in run["candidates"] if d["setting"] in same)
    chosen = (run["recommended"] or {}).get("setting")
    quiet = not recorded and not candidate.get("change_beyond_noise", True)
    return (
        (["recorded"] if recorded else [])
        + (["recommended"] if chosen in same else [])
        + ([NOT_TOLD_APART] if quiet else [])
    )


def candidate_frame(
    run: dict, cells: Mapping[str, Callable[[dict], object]], group: Group, same_note: Callable[[dict], str]
) -> pd.DataFrame:
    """One row per group of a run's JSON candidates: each cell from its function of the candidate, then the
    note (its marks and what `same_note` says of its group)."""
    rows = []
    for c in one_per_group(run, group):
        note = ", ".join(x for x in (*marks(run, c, group), same_note(c)) if x)
        rows.append({**{name: cell(c) for name, cell in cells.items()}, "note": note})
    return pd.DataFrame(rows)


def csv_rows(run: dict, run_keys: list[str]) -> list[dict]:
    """One CSV row per candidate: the run's keys, then the candidate's (its setting left out, as each knob
    has a column of its own; a nested figure flattened to `<key>_<field>`, a list of settings to one cell)."""
    rows = []
    for c in run["candidates"]:
        flat: dict = {}
        for key, value in c.items():
            if isinstance(value, dict) and key != "setting":
                flat.update({f"{key}_{field}": v for field, v in value.items()})
            elif isinstance(value, list):  # the settings of one layout, as 'a b c' (a setting's values joined by /)
                flat[key] = " ".join("/".join(map(str, v.values())) if isinstance(v, dict) else f"{v:g}" for v in value)
            elif key != "setting":
                flat[key] = value
        rows.append({**{k: run[k] for k in run_keys}, **flat})
    return rows

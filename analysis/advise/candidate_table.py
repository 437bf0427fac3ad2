"""The candidates of either layout as a table and as CSV rows: each prediction as 'value ± 95 % half-width',
the recorded and the recommended candidate marked. The lines above a run's table are its layout's."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pandas as pd


def plus_minus(candidate: dict, key: str) -> str:
    """A prediction and its error (the `<key>_err` beside it) as 'value ± half-width'."""
    return f"{candidate[key]:.3f} ± {candidate[key + '_err']:.3f}"


def marks(run: dict, candidate: dict) -> str:
    """'recorded', 'recommended', both or neither."""
    chosen = (run["recommended"] or {}).get("setting")
    mark = ["recorded"] if candidate["recorded"] else []
    mark += ["recommended"] if candidate["setting"] == chosen else []
    return ", ".join(mark)


def candidate_frame(run: dict, cells: Mapping[str, Callable[[dict], object]]) -> pd.DataFrame:
    """One row per candidate of a run's JSON: each cell from its function of the candidate, then the note."""
    rows = [{**{name: cell(c) for name, cell in cells.items()}, "note": marks(run, c)} for c in run["candidates"]]
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

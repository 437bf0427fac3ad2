"""One rank's step, call by call: the longest calls on their own rows, the rest on one "others" row, on
an axis in ms from the step's start, with backward highlighted and a title that quotes the same
per-step figures as the report's table (the analysis' per-step frame)."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from analysis.measure import intervals as iv
from analysis.render import palette
from analysis.render.figure_dicts import ordered_figure
from analysis.trace.frames import NS_PER_MS, RANGES

TOP_CALLS = 20  # calls drawn on their own row; the rest share the "others" row
ROW_PX = 22
SYMBOL, ISSUE = "line-ns-open", palette.ISSUE  # a call's issue: a tick on its row


def is_range_source(source: object) -> bool:
    """Whether calls were measured from CPU comm ranges (CPU traces, gloo) rather than GPU kernels."""
    return source == RANGES


def call_noun(calls: pd.DataFrame) -> str:
    """What one call's span is in these rows: 'kernel' or 'comm range'."""
    return "comm range" if len(calls) and is_range_source(calls["source"].iloc[0]) else "kernel"


def longest_calls(mine: pd.DataFrame, top: int = TOP_CALLS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the `top` longest calls in start order, the rest): ties broken by start so the split is stable."""
    start, duration = mine["start_ns"].to_numpy(), mine["duration_ms"].to_numpy(float)
    ranked = np.lexsort((start, -duration))  # longest first, then by start; stable (numpy: per drop-down choice)
    kept = ranked[:top][np.argsort(start[ranked[:top]], kind="stable")]
    return mine.iloc[kept], mine.iloc[ranked[top:]]


def row_names(calls: pd.DataFrame) -> list[str]:
    """A distinct row name per call: its tag (else op), numbered when two calls share one."""
    names = [str(t or o) for t, o in zip(calls["tag"], calls["op"], strict=True)]
    seen: dict[str, int] = {}
    out = []
    for name in names:  # one per drawn call: at most TOP_CALLS
        n = seen.get(name, 0)
        seen[name] = n + 1
        out.append(name if n == 0 else f"{name} #{n + 1}")
    return out


def _bars(calls: pd.DataFrame, names: list[str], t0: int, noun: str) -> list[dict]:
    """Each call's wait (sand) then transfer (its collective's colour), one legend entry per kind."""
    start = (calls["start_ns"].to_numpy(float) - t0) / NS_PER_MS
    wait = calls["wait_ms"].fillna(0).to_numpy(float)
    transfer = calls["duration_ms"].to_numpy(float) - wait
    family = calls["op"].map(palette.collective_of).to_numpy()
    y = np.asarray(names, dtype=object)
    bars = [
        _bar(y, wait, start, palette.WAITING, "#8C7A2B", 1, f"{noun}: waiting for the last rank", "waiting %{x:.3f} ms")
    ]
    for fam in dict.fromkeys(family):  # a handful of collective families
        m = family == fam
        name = f"{noun}: {palette.COLLECTIVE_LABELS[fam]} transfer (or unpaired)"
        colour = palette.COLLECTIVE_COLOURS[fam]
        bars.append(_bar(y[m], transfer[m], start[m] + wait[m], colour, "#333333", 0.5, name, "transfer %{x:.3f} ms"))
    return bars


def _bar(
    y: np.ndarray, x: np.ndarray, base: np.ndarray, colour: str, edge: str, width: float, name: str, what: str
) -> dict:
    """One horizontal bar trace as plotly's validation writes it (its keys in plotly's order)."""
    return {
        "base": base.tolist(),  # plotly's check makes a list of it (a data array stays an array)
        "hovertemplate": "%{y}<br>" + what + "<extra></extra>",
        "marker": {"color": colour, "line": {"color": edge, "width": width}},
        "name": name,
        "orientation": "h",
        "x": x,
        "y": y,
        "type": "bar",
    }


def _others_bar(rest: pd.DataFrame, t0: int, noun: str) -> tuple[list[dict], str | None]:
    """The calls not drawn on their own row, merged where they overlap, on one row."""
    if rest.empty:
        return [], None
    name = f"others ({len(rest)} {noun}{'' if len(rest) == 1 else 's'})"
    s, e = iv.union(rest["start_ns"].to_numpy(np.int64), rest["end_ns"].to_numpy(np.int64))
    total = float(rest["duration_ms"].sum())
    bar = {
        "base": ((s - t0) / NS_PER_MS).tolist(),
        "hovertemplate": f"{len(rest)} shorter {noun}s, {total:.2f} ms in all<extra></extra>",
        "marker": {"color": palette.OTHER_CALLS},
        "name": f"other {noun}s (merged where they overlap)",
        "orientation": "h",
        "x": (e - s) / NS_PER_MS,
        "y": [name] * len(s),
        "type": "bar",
    }
    return [bar], name


def step_sentence(
    label: str, step: int, rank: int, row: pd.Series | None, mean: pd.Series | None, tail_ms: float | None, noun: str
) -> str:
    """The chart's title: the step's figures from the analysis (the table's source) and the tail after backward."""
    head = f"{html.escape(label)}: step {step}, rank {rank}"
    if row is None:
        return head
    text = (
        f"{head}: {row['exposed_comm_ms']:.2f} ms of communication exposed, {row['overlap_ms']:.2f} ms hidden "
        f"under compute, step {row['step_ms']:.2f} ms"
    )
    if mean is not None:
        text += f" (table, mean per step: {mean['exposed_comm_ms']:.2f} ms exposed)"
    if tail_ms is not None:
        text += (
            f"<br>the last {noun} ends {tail_ms:.2f} ms after backward ends"
            if tail_ms > 0
            else f"<br>every {noun} ends before backward does"
        )
    return text


def calls_figure(
    calls: pd.DataFrame,
    step: int,
    rank: int,
    label: str,
    step_start_ns: int | None,
    backward: tuple[int, int] | None,
    steps: pd.DataFrame | None = None,
    top: int = TOP_CALLS,
) -> go.Figure:
    """One rank's step: the `top` longest calls (wait and transfer), the rest merged on an "others" row,
    CPU issue marks, backward shaded; x is ms from the step's start (the first call's issue without one).

    `backward`: (start_ns, end_ns) of that step's backward pass; `steps`: the analysis' per-step frame,
    whose row for (rank, step) and mean the title quotes. Calls measured from CPU comm ranges are
    called 'comm range', from GPU kernels 'kernel'."""
    mine = calls[(calls["step"] == step) & (calls["rank"] == rank)]
    mean = None if steps is None or not len(steps) else step_means(steps)
    data, layout = call_chart(mine, call_noun(calls), step, rank, label, step_start_ns, backward, steps, mean, top)
    return ordered_figure(data, layout)


def step_means(steps: pd.DataFrame) -> pd.Series:
    """The per-step figures' means a call chart's title quotes beside its step's."""
    return steps[["exposed_comm_ms", "overlap_ms", "step_ms"]].mean()


def _backward_band(b0: float, b1: float) -> tuple[dict, dict]:
    """The backward pass shaded behind the bars, labelled at its top left (what plotly's add_vrect draws)."""
    rect = {
        "fillcolor": palette.PHASE_COLOURS["backward"],
        "layer": "below",
        "opacity": 0.12,
        "type": "rect",
        "x0": b0,
        "x1": b1,
        "y0": 0,
        "y1": 1,
        "line": {"width": 0},
        "xref": "x",
        "yref": "y domain",
    }
    note = {"showarrow": False, "text": "backward", "x": b0, "xanchor": "left", "y": 1, "yanchor": "top"}
    return rect, {**note, "yref": "y domain", "xref": "x"}


def _step_end(x: float) -> tuple[dict, dict]:
    """A dotted line at the step's end, labelled above it (what plotly's add_vline draws)."""
    line = {
        "type": "line",
        "x0": x,
        "x1": x,
        "y0": 0,
        "y1": 1,
        "line": {"dash": "dot", "color": "#555555"},
        "xref": "x",
        "yref": "y domain",
    }
    note = {"showarrow": False, "text": "step end", "x": x, "xanchor": "center", "y": 1, "yanchor": "bottom"}
    return line, {**note, "yref": "y domain", "xref": "x"}


def call_chart(
    mine: pd.DataFrame,
    noun: str,
    step: int,
    rank: int,
    label: str,
    step_start_ns: int | None,
    backward: tuple[int, int] | None,
    steps: pd.DataFrame | None,
    mean: pd.Series | None,
    top: int = TOP_CALLS,
) -> tuple[list[dict], dict]:
    """calls_figure's traces and layout as plain dicts, from the step's own calls (`mine`), the runs' call
    noun and the per-step frame's `mean` (step_means): what a chart with a drop-down of steps draws per choice."""
    kept, rest = longest_calls(mine, top)
    t0 = int(step_start_ns) if step_start_ns is not None else int(mine["issue_ns"].min())
    names = row_names(kept)
    others, others_name = _others_bar(rest, t0, noun)
    issue = {
        "hovertemplate": "%{y}<br>issued at %{x:.3f} ms<extra></extra>",
        "marker": {"color": ISSUE, "line": {"color": ISSUE, "width": 1.5}, "size": 11, "symbol": SYMBOL},
        "mode": "markers",
        "name": "issue (CPU)",
        "x": (kept["issue_ns"].to_numpy(float) - t0) / NS_PER_MS,
        "y": names,
        "type": "scatter",
    }
    shapes, notes = [], []
    end_ns = int(mine["end_ns"].max()) if len(mine) else None
    tail = None
    if backward is not None:
        b0, b1 = ((np.asarray(backward, dtype=float) - t0) / NS_PER_MS).tolist()
        rect, note = _backward_band(b0, b1)
        shapes.append(rect)
        notes.append(note)
        tail = float(end_ns - backward[1]) / NS_PER_MS if end_ns is not None else None
    row = None
    if steps is not None and len(steps):
        at = steps.loc[(steps["rank"] == rank) & (steps["step"] == step)]
        row = at.iloc[0] if len(at) else None
        if row is not None and step_start_ns is not None:
            line, note = _step_end(float(row["step_ms"]))
            shapes.append(line)
            notes.append(note)
    order = names + ([others_name] if others_name else [])
    ends = [float(end_ns - t0) / NS_PER_MS if end_ns is not None else 0.0]
    if row is not None and step_start_ns is not None:
        ends.append(float(row["step_ms"]))
    layout = {
        **({"shapes": shapes, "annotations": notes} if shapes else {}),
        "barmode": "overlay",
        "height": max(300, 170 + ROW_PX * len(order)),
        "title": {"font": {"size": 14}, "text": step_sentence(label, step, rank, row, mean, tail, noun)},
        "xaxis": {
            "title": {"text": "ms from the step's start" if step_start_ns is not None else "ms from the first issue"},
            "range": [0, max(ends) * 1.02],
        },
        "margin": {"t": 90, "b": 60},
        "yaxis": {"tickfont": {"size": 10}, "categoryorder": "array", "categoryarray": order, "autorange": "reversed"},
    }
    return [*_bars(kept, names, t0, noun), *others, issue], layout

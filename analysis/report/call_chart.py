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
from analysis.render.figure_dicts import trusted_figure
from analysis.trace.frames import NS_PER_MS, RANGES

TOP_CALLS = 20  # calls drawn on their own row; the rest share the "others" row
ROW_PX = 22


def is_range_source(source: object) -> bool:
    """Whether calls were measured from CPU comm ranges (CPU traces, gloo) rather than GPU kernels."""
    return source == RANGES


def call_noun(calls: pd.DataFrame) -> str:
    """What one call's span is in these rows: 'kernel' or 'comm range'."""
    return "comm range" if len(calls) and is_range_source(calls["source"].iloc[0]) else "kernel"


def longest_calls(mine: pd.DataFrame, top: int = TOP_CALLS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the `top` longest calls in start order, the rest): ties broken by start so the split is stable."""
    ranked = mine.sort_values(["duration_ms", "start_ns"], ascending=[False, True], kind="stable")
    kept = ranked.iloc[:top].sort_values("start_ns", kind="stable")
    return kept, ranked.iloc[top:]


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


def _bars(calls: pd.DataFrame, names: list[str], t0: int, noun: str) -> list[go.Bar]:
    """Each call's wait (sand) then transfer (its collective's colour), one legend entry per kind."""
    start = (calls["start_ns"].to_numpy(float) - t0) / NS_PER_MS
    wait = calls["wait_ms"].fillna(0).to_numpy(float)
    transfer = calls["duration_ms"].to_numpy(float) - wait
    family = calls["op"].map(palette.collective_of).to_numpy()
    y = np.asarray(names, dtype=object)
    bars = [
        go.Bar(
            y=y,
            x=wait,
            base=start,
            orientation="h",
            marker=dict(color=palette.WAITING, line=dict(color="#8C7A2B", width=1)),
            name=f"{noun}: waiting for the last rank",
            hovertemplate="%{y}<br>waiting %{x:.3f} ms<extra></extra>",
        )
    ]
    for fam in dict.fromkeys(family):  # a handful of collective families
        m = family == fam
        bars.append(
            go.Bar(
                y=y[m],
                x=transfer[m],
                base=start[m] + wait[m],
                orientation="h",
                marker=dict(color=palette.COLLECTIVE_COLOURS[fam], line=dict(color="#333333", width=0.5)),
                name=f"{noun}: {palette.COLLECTIVE_LABELS[fam]} transfer (or unpaired)",
                hovertemplate="%{y}<br>transfer %{x:.3f} ms<extra></extra>",
            )
        )
    return bars


def _others_bar(rest: pd.DataFrame, t0: int, noun: str) -> tuple[list[go.Bar], str | None]:
    """The calls not drawn on their own row, merged where they overlap, on one row."""
    if rest.empty:
        return [], None
    name = f"others ({len(rest)} {noun}{'' if len(rest) == 1 else 's'})"
    s, e = iv.union(rest["start_ns"].to_numpy(np.int64), rest["end_ns"].to_numpy(np.int64))
    total = float(rest["duration_ms"].sum())
    bar = go.Bar(
        y=[name] * len(s),
        x=(e - s) / NS_PER_MS,
        base=(s - t0) / NS_PER_MS,
        orientation="h",
        marker_color=palette.OTHER_CALLS,
        name=f"other {noun}s (merged where they overlap)",
        hovertemplate=f"{len(rest)} shorter {noun}s, {total:.2f} ms in all<extra></extra>",
    )
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
    noun = call_noun(calls)
    kept, rest = longest_calls(mine, top)
    t0 = int(step_start_ns) if step_start_ns is not None else int(mine["issue_ns"].min())
    names = row_names(kept)
    others, others_name = _others_bar(rest, t0, noun)
    issue = go.Scatter(
        y=names,
        x=(kept["issue_ns"].to_numpy(float) - t0) / NS_PER_MS,
        mode="markers",
        marker=dict(symbol="line-ns-open", color=palette.ISSUE, size=11, line=dict(width=1.5, color=palette.ISSUE)),
        name="issue (CPU)",
        hovertemplate="%{y}<br>issued at %{x:.3f} ms<extra></extra>",
    )
    fig = trusted_figure([*_bars(kept, names, t0, noun), *others, issue])
    tail = None
    if backward is not None:
        b0, b1 = ((np.asarray(backward, dtype=float) - t0) / NS_PER_MS).tolist()
        fig.add_vrect(
            x0=b0,
            x1=b1,
            fillcolor=palette.PHASE_COLOURS["backward"],
            opacity=0.12,
            line_width=0,
            layer="below",
            annotation_text="backward",
            annotation_position="top left",
        )
        tail = float(mine["end_ns"].max() - backward[1]) / NS_PER_MS if len(mine) else None
    row = mean = None
    if steps is not None and len(steps):
        at = steps.loc[(steps["rank"] == rank) & (steps["step"] == step)]
        row = at.iloc[0] if len(at) else None
        mean = steps[["exposed_comm_ms", "overlap_ms", "step_ms"]].mean()
        if row is not None and step_start_ns is not None:
            fig.add_vline(
                x=float(row["step_ms"]),
                line_dash="dot",
                line_color="#555555",
                annotation_text="step end",
                annotation_position="top",
            )
    order = names + ([others_name] if others_name else [])
    ends = [float(mine["end_ns"].max() - t0) / NS_PER_MS if len(mine) else 0.0]
    if row is not None and step_start_ns is not None:
        ends.append(float(row["step_ms"]))
    fig.update_layout(
        barmode="overlay",
        height=max(300, 170 + ROW_PX * len(order)),
        title=dict(text=step_sentence(label, step, rank, row, mean, tail, noun), font=dict(size=14)),
        xaxis=dict(
            title=dict(text="ms from the step's start" if step_start_ns is not None else "ms from the first issue"),
            range=[0, max(ends) * 1.02],
        ),
        margin=dict(t=90, b=60),
        yaxis=dict(categoryorder="array", categoryarray=order, autorange="reversed", tickfont=dict(size=10)),
    )
    return fig

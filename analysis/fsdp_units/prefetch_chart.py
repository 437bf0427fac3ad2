"""The prefetch chart of one step and rank: each sharded module's forward all-gather from issue to
end, the part of it compute waited for, and when the module's forward began (where the trace says),
in forward order, times from the step's first issue. Rows: fsdp_units/gather_rows.py (PREFETCH_COLUMNS)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from analysis.render import palette
from analysis.render.figure_dicts import top_left_title
from analysis.trace.frames import NS_PER_MS

GATHER = palette.COLLECTIVE_COLOURS["all_gather"]
STEP_CHART_UNITS = 40
# under the axis when the trace does not say when each module's forward began (gather_rows.py: needed_ns -1)
NO_TICKS = (
    "<br><span style='font-size:12px'>No 'forward began' ticks: this trace does not mark where each module's "
    "forward began (FSDP2 marks it; this project's fsdp marks only its collectives),<br>so the pink part, the "
    "time compute waited for the gather, says how late each one was.</span>"
)


def pick_step(rows: pd.DataFrame) -> tuple[int, int] | None:
    """(step, rank) to draw: rank 0 (else the lowest), its median step by total wait; None without rows."""
    if rows.empty:
        return None
    rank = int(rows["rank"].min())
    waits = rows[rows["rank"] == rank].groupby("step")["waited_ns"].sum().sort_values(kind="stable")
    return int(waits.index[len(waits) // 2]), rank


def prefetch_figure(
    rows: pd.DataFrame, step: int, rank: int, label: str, held: str = "compute waited for it"
) -> go.Figure:
    """The chart of `rows` (the view's prefetch) for one step and rank; `held`: the name of the part
    compute was held for."""
    mine = rows[(rows["step"] == step) & (rows["rank"] == rank)].sort_values("issue_ns", kind="stable")
    t0 = int(mine["issue_ns"].min()) if len(mine) else 0
    ms = lambda ns: (ns - t0) / NS_PER_MS
    y = [f"{i + 1}. {t}" for i, t in enumerate(mine["tag"])]
    height = max(360, 170 + 34 * len(mine))
    fig = go.Figure()
    fig.add_bar(
        y=y,
        x=(mine["end_ns"] - mine["issue_ns"]) / NS_PER_MS,
        base=ms(mine["issue_ns"]),
        orientation="h",
        marker_color=GATHER,
        name="all-gather, issue to end",
        hovertemplate="%{y}: issued %{base:.3f} ms, took %{x:.3f} ms<extra></extra>",
    )
    waited = mine["waited_ns"] > 0
    fig.add_bar(
        y=[v for v, w in zip(y, waited, strict=True) if w],
        x=mine.loc[waited, "waited_ns"] / NS_PER_MS,
        base=ms(mine.loc[waited, "end_ns"] - mine.loc[waited, "waited_ns"]),
        orientation="h",
        marker_color=palette.EXPOSED_COMM,
        width=0.35,
        name=held,
        hovertemplate="%{y}: " + held + " %{x:.3f} ms<extra></extra>",
    )
    known = mine["needed_ns"] >= 0
    if known.any():
        fig.add_scatter(
            y=[v for v, k in zip(y, known, strict=True) if k],
            x=ms(mine.loc[known, "needed_ns"]),
            mode="markers",
            marker={"symbol": "line-ns-open", "size": 18, "line": {"width": 3}, "color": palette.ISSUE},
            name="module's forward began",
            hovertemplate="%{y}: forward reached at %{x:.3f} ms<extra></extra>",
        )
    fig.update_layout(
        title=top_left_title(f"{label}: forward all-gathers of step {step}, rank {rank}"),
        barmode="overlay",
        template="plotly_white",  # as every other page
        xaxis_title="ms from the step's first all-gather issue" + ("" if known.any() else NO_TICKS),
        yaxis={"autorange": "reversed", "title": "module (forward order)"},
        height=height,
        legend={"orientation": "h", "x": 0, "y": 1 - 45 / height, "yanchor": "top", "yref": "container"},
        margin={"l": 200, "t": 110, **({} if known.any() else {"b": 110})},
    )
    return fig

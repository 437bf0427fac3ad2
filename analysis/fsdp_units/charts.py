"""The FSDP units' two charts.

The per-unit all-gather chart: for every sharded unit, in forward order, the mean time per rank and
step its gather held the unit's compute (GPU) or the rank waited for it (CPU), stacked by cause, forward
above backward (`units_figure(gathers, label)`; rows: fsdp_units/gather_rows.py). One bar per unit keeps
170 units on one screen; the hover names the unit, its late and host-bound gathers; the worst units of
each phase are labelled.

The prefetch chart of one step and rank: each sharded module's forward all-gather from issue to
end, the part of it compute waited for, and when the module's forward began (where the trace says),
in forward order, times from the step's first issue. Rows: fsdp_units/gather_rows.py (PREFETCH_COLUMNS).
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.fsdp_units.gather_cause import CAUSE_TEXT, CPU_LATE, HOST, LATE_CAUSES, UNMARKED
from analysis.render import palette
from analysis.render.figure_dicts import top_left_title
from analysis.trace.frames import NS_PER_MS

PHASES = ("forward", "backward")
LABELLED = 3  # the worst units of each phase named on the chart
GATHER = palette.COLLECTIVE_COLOURS["all_gather"]
STEP_CHART_UNITS = 40
# under the axis when the trace does not say when each module's forward began (gather_rows.py: needed_ns -1)
NO_TICKS = (
    "<br><span style='font-size:12px'>No 'forward began' ticks: this trace does not mark where each module's "
    "forward began (FSDP2 marks it; this project's fsdp marks only its collectives),<br>so the pink part, the "
    "time compute waited for the gather, says how late each one was.</span>"
)


def _per_unit(gathers: pd.DataFrame) -> pd.DataFrame:
    """phase, unit, order (forward order from 1), cause, ms: held per rank-step by cause; plus per
    (phase, unit) `late` and `host` counts and `gathers`."""
    first = gathers[gathers["phase"] == "forward"].groupby("unit", sort=False)["issue_ns"].min()
    order = pd.Series(np.arange(1, len(first) + 1), index=first.sort_values(kind="stable").index)
    rank_steps = gathers.groupby("phase")[["rank", "step"]].apply(lambda f: len(f.drop_duplicates()))
    g = gathers.assign(
        order=gathers["unit"].map(order).fillna(0).astype(int),
        late=gathers["cause"].isin([*LATE_CAUSES, CPU_LATE]),
        host=gathers["cause"] == HOST,
    )
    counts = g.groupby(["phase", "unit"], sort=False).agg(
        late=("late", "sum"), host=("host", "sum"), n=("late", "size")
    )
    held = g[g["late"]].groupby(["phase", "unit", "cause"], sort=False)["held_ms"].sum().rename("ms").reset_index()
    held["ms"] = held["ms"] / held["phase"].map(rank_steps).to_numpy()
    keys = g[["phase", "unit", "order"]].drop_duplicates(["phase", "unit"])
    return keys.merge(counts.reset_index(), on=["phase", "unit"]).merge(held, on=["phase", "unit"], how="left")


def units_figure(gathers: pd.DataFrame, label: str) -> go.Figure:
    """The chart of one trace's gather rows (one definition: GPU held or CPU waited)."""
    per = _per_unit(gathers)
    definition = str(gathers["definition"].iloc[0]) if len(gathers) else ""
    what = "held ms per step" if "GPU" in definition else "waited ms per step"
    phases = [p for p in PHASES if (per["phase"] == p).any()]
    height, shown = 260 + 300 * len(phases), set()
    titles = [f"{p}: {what} (mean over ranks and steps); {_counts(per[per['phase'] == p])}" for p in phases]
    fig = make_subplots(rows=len(phases), cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=titles)
    for row, phase in enumerate(phases, start=1):
        mine = per[per["phase"] == phase]
        units = mine.drop_duplicates("unit").sort_values("order")
        hover = [
            f"{html.escape(u)} (#{o})<br>{late} of {n} gathers late, {host} host-bound"
            for u, o, late, host, n in zip(
                units["unit"], units["order"], units["late"], units["host"], units["n"], strict=True
            )
        ]
        for cause in (*LATE_CAUSES, CPU_LATE):
            part = units[["unit", "order"]].merge(mine[mine["cause"] == cause][["unit", "ms"]], on="unit", how="left")
            if part["ms"].notna().any():
                fig.add_bar(
                    x=part["order"],
                    y=part["ms"].fillna(0),
                    name=CAUSE_TEXT[cause],
                    legendgroup=cause,
                    marker_color=palette.GATHER_CAUSE_COLOURS[cause],
                    showlegend=cause not in shown,
                    customdata=hover,
                    hovertemplate="%{customdata}<br>%{y:.3f} ms/step<extra>" + cause + "</extra>",
                    row=row,
                    col=1,
                )
                shown.add(cause)
        if mine["ms"].isna().all():  # nothing late in this phase: zero bars, so the units are still drawn
            fig.add_bar(
                x=units["order"],
                y=np.zeros(len(units)),
                name="no late gather",
                marker_color=palette.IDLE,
                customdata=hover,
                hovertemplate="%{customdata}<extra></extra>",
                row=row,
                col=1,
            )
        _label_worst(fig, mine, row)
    fig.update_layout(
        title=top_left_title(f"{html.escape(label)}: all-gathers per unit, {html.escape(definition)}"),
        barmode="stack",
        bargap=0.1,
        template="plotly_white",
        height=height,
        margin={"t": 130, "l": 70, "r": 30},
        legend={"orientation": "h", "x": 0, "y": 1 - 50 / height, "yanchor": "top", "yref": "container"},
        hovermode="closest",
    )
    fig.update_xaxes(title_text="unit, in forward order (hover for its name)", row=len(phases), col=1)
    fig.update_yaxes(title_text="ms/step", rangemode="tozero")
    return fig


def measured(gathers: pd.DataFrame) -> bool:
    """Whether any gather row has a held (or waited) time: not every one `unmarked`."""
    return bool((gathers["cause"] != UNMARKED).any())


def _counts(mine: pd.DataFrame) -> str:
    """'829 of 1700 gathers late, 871 host-bound' of one phase's per-unit rows."""
    units = mine.drop_duplicates("unit")
    out = f"{int(units['late'].sum())} of {int(units['n'].sum())} gathers late"
    return out + (f", {int(units['host'].sum())} host-bound (held 0)" if units["host"].sum() else "")


def in_time_blocks(gathers: pd.DataFrame, sentences: list[str], label: str, stem: str) -> list:
    """The report's blocks for one trace's all-gathers: its sentences and the per-unit chart ([] when
    the trace has no sharded units' gathers)."""
    if not measured(gathers):
        return []
    text = "<br>".join(html.escape(s) for s in sentences)
    note = f'<p class="note">Did the all-gathers arrive in time? {text}</p>' if text else ""
    fig = units_figure(gathers, label).update_layout(meta={"image": f"{stem}_gathers_per_unit"})
    return [b for b in (note, fig) if b]


def _label_worst(fig: go.Figure, mine: pd.DataFrame, row: int) -> None:
    """Name the LABELLED units with the most held time of this phase above their bars."""
    total = mine.groupby(["unit", "order"], sort=False)["ms"].sum().reset_index()
    worst = total[total["ms"] > 0].sort_values("ms", ascending=False, kind="stable").head(LABELLED)
    for unit, order, ms in zip(worst["unit"], worst["order"], worst["ms"], strict=True):
        fig.add_annotation(
            x=order,
            y=ms,
            text=html.escape(str(unit)),
            showarrow=True,
            arrowhead=0,
            ax=0,
            ay=-18,
            font={"size": 11},
            row=row,
            col=1,
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

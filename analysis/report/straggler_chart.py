"""The report's chart of who held each step: per step, the rank the others waited for (collectives_view's
`stragglers`), the wait it cost them and why it was late (collectives/straggler_cause.py), with one
sentence per rank that held steps (its `straggler_summary`)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go

from analysis.collectives.straggler_cause import CAUSE_TEXT, RECURRENT_RULE
from analysis.render import palette
from analysis.render.figure_dicts import trusted_figure

if TYPE_CHECKING:
    from analysis.collectives.collectives_view import CollectivesView

LABELLED_STEPS = 40  # more steps than this: the bars lose their rank labels (the hover keeps them)


def straggler_figure(stragglers: pd.DataFrame, label: str) -> go.Figure:
    """One bar per step with a straggler: its height the others' wait it caused, its colour the cause, its
    label the rank."""
    held = stragglers.dropna(subset=["straggler"]).sort_values("step")
    cause = held["cause"].fillna("unknown")
    fig = trusted_figure()
    for name, colour in palette.STRAGGLER_CAUSE_COLOURS.items():
        mine = held[cause == name]
        if mine.empty:
            continue
        fig.add_trace(
            go.Bar(
                name=CAUSE_TEXT.get(name, "cause unknown"),
                x=mine["step"],
                y=mine["wait_caused_ms"],
                marker_color=colour,
                text=[f"rank {int(r)}" for r in mine["straggler"]] if len(held) <= LABELLED_STEPS else None,
                textposition="outside",
                customdata=mine[["straggler", "late_ms", "cause_ms"]].to_numpy(float),
                hovertemplate="step %{x}: rank %{customdata[0]} held the others<br>their wait %{y:.1f} ms"
                "<br>it arrived %{customdata[1]:.1f} ms after their median, %{customdata[2]:.1f} ms of it in "
                + html.escape(CAUSE_TEXT.get(name, "an unknown part"))
                + "<extra></extra>",
            )
        )
    fig.update_layout(
        height=380,
        title=dict(text=f"{html.escape(label)}: who held each step, and why"),
        # categories in step order: plotly orders them as the traces (one per cause) first give them
        xaxis=dict(
            title=dict(text="step"), type="category", categoryorder="array", categoryarray=held["step"].tolist()
        ),
        yaxis=dict(title=dict(text="the others' wait, ms (sum over them)"), rangemode="tozero"),
        showlegend=True,  # the colours' meaning, also when every step has one cause
        legend=dict(title=dict(text="why it was late")),
        margin=dict(t=60, b=60),
        uniformtext=dict(minsize=9, mode="show"),
    )
    return fig


def summary_sentences(summary: pd.DataFrame) -> list[str]:
    """One sentence per rank that held steps, most steps first."""
    out = []
    for row in summary.sort_values(["steps_held", "rank"], ascending=[False, True]).itertuples():
        causes = ", ".join(f"{CAUSE_TEXT.get(c, 'cause unknown')} in {n}" for c, n in row.causes.items())
        late = " <b>Recurrently late.</b>" if row.recurrently_late else ""
        out.append(
            f"rank {row.rank} held {row.steps_held} of {row.steps} steps, costing the others "
            f"{row.wait_caused_ms:,.1f} ms of waiting: {html.escape(causes)}.{late}"
        )
    return out


def straggler_blocks(view: CollectivesView, label: str, stem: str) -> list:
    """The chart and its sentences for one trace's view; nothing when no step had a straggler."""
    stragglers = view.stragglers
    if not stragglers["straggler"].notna().any():
        return []
    sentences = summary_sentences(view.straggler_summary)
    if not view.straggler_summary["recurrently_late"].astype(bool).any():
        sentences.append("No rank is recurrently late.")
    note = (
        f'<p class="note">{html.escape(label)}: {"<br>".join(sentences)}<br>A rank is {html.escape(RECURRENT_RULE)}. '
        "The cause is where the straggler's lateness at the collective it held most came from: a phase that ran "
        "longer, late data, a host that launched late with its compute done, or a slower transfer.</p>"
    )
    return [note, straggler_figure(stragglers, label).update_layout(meta=dict(image=f"{stem}_stragglers"))]

"""The report's view of communication per process group, for a run with more than one group: per rank and group,
the communication hidden under compute and the exposed rest over the whole capture (measure/comm_breakdown.py,
the figures of `analysis.overlap`'s `groups`), grouped by the parallel dimension the group says (shard,
replicate, tp, ...; its name where it says none), with one sentence per group over its ranks. Nothing for a run
with one group."""

from __future__ import annotations

import html

import pandas as pd
import plotly.graph_objects as go

from analysis.render import palette
from analysis.render.figure_dicts import trusted_figure
from contract import dimension_of

HIDDEN_COLOUR, EXPOSED_COLOUR = palette.HIDDEN_COMM, palette.EXPOSED_COMM


def with_dimension(groups: pd.DataFrame) -> pd.DataFrame:
    """The rows (comm_breakdown.GROUP_OVERLAP_COLUMNS) with `dimension`: what the group's name or description
    says (contract.dimension_of), else its name; "(inferred)" for a group nothing in the trace named."""
    said = [
        "(inferred)" if inferred else (dimension_of(name, desc) or str(name))
        for name, desc, inferred in zip(groups["group"], groups["group_desc"], groups["group_inferred"], strict=True)
    ]  # one per (rank, group) row: a handful per rank
    return groups.assign(dimension=said)


def group_figure(groups: pd.DataFrame, label: str) -> go.Figure:
    """Per dimension and rank, stacked: its group's communication hidden under compute and exposed (ms)."""
    rows = with_dimension(groups).sort_values(["dimension", "rank"], kind="stable")
    x = [rows["dimension"].tolist(), [f"rank {int(r)}" for r in rows["rank"]]]
    hover = (
        "%{customdata[0]}, rank %{customdata[1]}: %{customdata[2]} calls<br>communication %{customdata[3]:.1f} ms, "
        "%{customdata[4]:.1f} ms hidden under compute (%{customdata[5]:.0f}%)<extra></extra>"
    )
    custom = rows[["label", "rank", "calls", "comm_ms", "overlap_ms", "overlap_pct"]].to_numpy(dtype=object)
    fig = trusted_figure(
        [
            go.Bar(name=name, x=x, y=rows[column], marker_color=colour, customdata=custom, hovertemplate=hover)
            for name, column, colour in (
                ("hidden under compute", "overlap_ms", HIDDEN_COLOUR),
                ("exposed", "exposed_comm_ms", EXPOSED_COLOUR),
            )
        ]
    )
    fig.update_layout(
        barmode="stack",
        height=380,
        title=dict(text=f"{html.escape(label)}: communication per process group and rank (whole capture)"),
        yaxis=dict(title=dict(text="ms of communication"), rangemode="tozero"),
        xaxis=dict(title=dict(text="parallel dimension of the group, rank")),
        legend=dict(title=dict(text="the group's communication")),
        margin=dict(t=60, b=80),
    )
    return fig


def group_sentences(groups: pd.DataFrame) -> list[str]:
    """Per dimension: its groups (their members) and their communication summed over their ranks, the part hidden
    under compute and the part exposed."""
    rows = with_dimension(groups).assign(members=lambda f: f["group_ranks"].astype(str).replace("", "all ranks"))
    sums = rows.groupby("dimension", sort=True).agg(
        comm=("comm_ms", "sum"), hidden=("overlap_ms", "sum"), exposed=("exposed_comm_ms", "sum")
    )
    members = rows.groupby("dimension", sort=True)["members"].unique()
    out = []
    for dim, s in sums.iterrows():  # one per dimension
        share = f"{100 * s['hidden'] / s['comm']:.0f}%" if s["comm"] > 0 else "n/a"
        which = " and ".join(f"{{{m}}}" for m in members[dim])
        noun = "group" if len(members[dim]) == 1 else "groups"
        out.append(
            f"{html.escape(str(dim))} ({noun} {html.escape(which)}): {s['comm']:,.1f} ms of communication over its "
            f"ranks, {share} hidden under compute, {s['exposed']:,.1f} ms exposed"
        )
    return out


def group_blocks(groups: pd.DataFrame | None, label: str, stem: str) -> list:
    """The chart and its sentences for one run's per-group rows; nothing for a run with fewer than two groups."""
    if groups is None or groups.empty or groups["label"].nunique() < 2:
        return []
    note = (
        f'<p class="note">{html.escape(label)}, per process group: {"; ".join(group_sentences(groups))}. '
        "A rank's calls of two groups in flight at once count in both.</p>"
    )
    return [note, group_figure(groups, label).update_layout(meta=dict(image=f"{stem}_groups"))]

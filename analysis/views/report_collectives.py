"""The report's "Collectives" section: bus bandwidth vs message size, wait vs transfer per step, and
one step's backward pass with each bucket's issue, kernel span and the exposed tail after backward.

`collectives_section(entries, peak_busbw)` returns page blocks (HTML strings and plotly figures) for
html_page.write_page; each entry is (label, trace, CollectivesView of that trace).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from analysis.frames.patterns import Patterns
from analysis.frames.trace import GPU_KERNEL, NS_PER_MS, Trace
from analysis.measures.collective_calls import step_at
from analysis.measures.phases import codes, launched_inside, ranges_named
from analysis.views import palette

if TYPE_CHECKING:
    from analysis.engine.collectives_view import CollectivesView

WAIT_COLOUR, TRANSFER_COLOUR, ISSUE_COLOUR = palette.WAITING, palette.TRANSFER, palette.ISSUE
PALETTE = ("#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f")


def backward_spans(trace: Trace, patterns: Patterns | None = None) -> pd.DataFrame:
    """rank, step, start_ns, end_ns of each step's backward pass: on GPU traces the first start to last end
    of the compute kernels launched inside `backward` ranges; on CPU traces the backward ranges."""
    patterns = patterns or Patterns()
    backward = ranges_named(trace.nvtx, patterns.regex("backward"))
    ops = trace.gpu_ops
    if len(ops):
        mine = (codes(ops["kind"]) == GPU_KERNEL) & ~ops["is_comm"].to_numpy() & launched_inside(ops, backward)
        work = ops.loc[mine, ["part", "pid", "device", "start", "end", "launch_start"]]
        when, keys = work["launch_start"].to_numpy(), ["part", "pid", "device"]
    else:
        work = backward[["part", "pid", "start", "end"]]
        when, keys = work["start"].to_numpy(), ["part", "pid"]
    work = work.assign(step=step_at(trace, patterns, work["part"], work["pid"], when))
    work = work[work["step"] >= 0].merge(trace.ranks[["rank", *keys]].drop_duplicates(keys), on=keys)
    spans = work.groupby(["rank", "step"]).agg(start_ns=("start", "min"), end_ns=("end", "max"))
    return spans.reset_index()


def busbw_figure(calls: pd.DataFrame, peak_busbw: float | None = None) -> go.Figure:
    """Every call with known bytes and transfer: busbw against message size, log-log, colour per trace."""
    known = calls[calls["busbw_gbps"].notna()]
    fig = go.Figure()
    for i, (label, group) in enumerate(known.groupby("label", sort=False)):
        fig.add_trace(
            go.Scatter(
                x=group["bytes"],
                y=group["busbw_gbps"],
                mode="markers",
                name=str(label),
                marker=dict(size=5, color=PALETTE[i % len(PALETTE)], opacity=0.6),
                text=group["tag"],
                hovertemplate="%{text}<br>%{x:,} bytes<br>%{y:.1f} GB/s",
            )
        )
    if peak_busbw:
        fig.add_hline(y=peak_busbw, line_dash="dash", annotation_text=f"peak {peak_busbw:g} GB/s")
    fig.update_layout(
        template="plotly_white",
        height=420,
        title="Bus bandwidth vs message size (each call, each rank)",
        xaxis=dict(type="log", title="bytes"),
        yaxis=dict(type="log", title="busbw GB/s"),
        margin=dict(t=60, b=60),
    )
    return fig


def wait_transfer_figure(calls: pd.DataFrame, label: str) -> go.Figure:
    """Per step and rank, stacked: time waiting for the last rank, and transfer time (paired calls)."""
    paired = calls[calls["paired"] & (calls["step"] >= 0)]
    per = paired.groupby(["step", "rank"])[["wait_ms", "transfer_ms"]].sum().reset_index()
    x = [f"step {s} · rank {r}" for s, r in zip(per["step"], per["rank"], strict=True)]
    fig = go.Figure(
        [
            go.Bar(name="waiting for the last rank", x=x, y=per["wait_ms"], marker_color=WAIT_COLOUR),
            go.Bar(name="transfer (every rank in)", x=x, y=per["transfer_ms"], marker_color=TRANSFER_COLOUR),
        ]
    )
    fig.update_layout(
        barmode="stack",
        template="plotly_white",
        height=360,
        yaxis_title="ms of collectives",
        title=f"{label}: wait vs transfer per step",
        margin=dict(t=60, b=80),
    )
    return fig


def bucket_timeline_figure(calls: pd.DataFrame, spans: pd.DataFrame, step: int, rank: int, label: str) -> go.Figure:
    """One rank's step: the backward pass, each call's issue (dot) and kernel span split into wait and
    transfer, and the tail of communication after backward ends (ms from the backward start)."""
    mine = calls[(calls["step"] == step) & (calls["rank"] == rank)].sort_values("start_ns")
    span = spans[(spans["step"] == step) & (spans["rank"] == rank)]
    t0 = int(span["start_ns"].iloc[0]) if len(span) else int(mine["issue_ns"].min())
    ms = lambda ns: (np.asarray(ns, dtype=float) - t0) / NS_PER_MS
    names = [t or o for t, o in zip(mine["tag"], mine["op"], strict=True)]
    wait = mine["wait_ms"].fillna(0).to_numpy()
    fig = go.Figure(
        [
            go.Bar(
                y=names,
                x=wait,
                base=ms(mine["start_ns"]),
                orientation="h",
                marker_color=WAIT_COLOUR,
                name="kernel: waiting",
            ),
            go.Bar(
                y=names,
                x=mine["duration_ms"].to_numpy() - wait,
                base=ms(mine["start_ns"]) + wait,
                orientation="h",
                marker_color=TRANSFER_COLOUR,
                name="kernel: transfer (or unpaired)",
            ),
            go.Scatter(
                y=names,
                x=ms(mine["issue_ns"]),
                mode="markers",
                marker=dict(color=ISSUE_COLOUR, size=5),
                name="issue (CPU)",
            ),
        ]
    )
    title = f"{label}: step {step}, rank {rank}"
    if len(span):
        bwd_end = float(ms(span["end_ns"].iloc[0]))
        fig.add_vrect(
            x0=0,
            x1=bwd_end,
            fillcolor=palette.PHASE_COLOURS["backward"],
            opacity=0.12,
            line_width=0,
            annotation_text="backward",
            annotation_position="top left",
        )
        tail = max(0.0, float(ms(mine["end_ns"].max())) - bwd_end) if len(mine) else 0.0
        if tail > 0:
            fig.add_vrect(x0=bwd_end, x1=bwd_end + tail, fillcolor=TRANSFER_COLOUR, opacity=0.08, line_width=0)
        title += f": communication runs {tail:.2f} ms past the end of backward"
    fig.update_layout(
        template="plotly_white",
        barmode="overlay",
        height=min(1600, 160 + 14 * len(mine)),
        title=title,
        xaxis_title="ms from the start of backward",
        margin=dict(t=60, b=60),
        yaxis=dict(autorange="reversed", tickfont=dict(size=9)),
    )
    return fig


def collectives_section(
    entries: list[tuple[str, Trace, CollectivesView]], peak_busbw: float | None = None, patterns: Patterns | None = None
) -> list:
    """Blocks of the report's Collectives section for the traces given."""
    if not entries:
        return []
    calls = pd.concat([view.calls.assign(label=label) for label, _, view in entries], ignore_index=True)
    blocks: list = [
        '<h2>Collectives</h2><p class="note">Each collective call per rank, paired across ranks '
        "(python -m analysis.collectives): <b>waiting</b> is the part of a call before the last rank "
        "arrived, <b>transfer</b> the rest. When ranks share one GPU, waiting includes time the "
        "partner's kernel could not start because the GPU was busy; on separate GPUs it is rank "
        "imbalance.</p>"
    ]
    if calls["busbw_gbps"].notna().any():
        blocks.append(busbw_figure(calls, peak_busbw))
    else:
        blocks.append(
            '<p class="note">No bus bandwidth: these traces carry no byte counts (the ddp wrappers '
            "record them as the comm:&lt;op&gt;:&lt;tag&gt; ranges' payloads; older traces lack them).</p>"
        )
    for label, trace, view in entries:
        for _, head in view.traces.iterrows():
            if head["note"]:
                blocks.append(f'<p class="note">{html.escape(label)}: {html.escape(head["note"])}</p>')
        if (view.calls["paired"] & (view.calls["step"] >= 0)).any():
            blocks.append(wait_transfer_figure(view.calls, label))
        steps = sorted(view.calls.loc[view.calls["step"] >= 0, "step"].unique())
        if steps:
            step = int(steps[len(steps) // 2])
            rank = int(view.calls["rank"].min())
            blocks.append(bucket_timeline_figure(view.calls, backward_spans(trace, patterns), step, rank, label))
    return blocks

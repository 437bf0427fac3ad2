"""The report's "Collectives" section: bus bandwidth vs message size, wait vs transfer per step,
one step's backward pass with each bucket's issue, kernel span and the exposed tail after backward,
and for sharded runs whether each unit's all-gathers arrived in time and why not (fsdp_units/charts.py).

`collectives_section(entries, peak_busbw)` returns page blocks (HTML strings and plotly figures) for
html_page.write_page; each entry (CollectivesEntry) is one run: its label, LoadedRun, CollectivesView,
the analysis' per-step frame and its implementation colour. Entries come fastest first.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from analysis.fsdp_units.charts import in_time_blocks
from analysis.measure import intervals as iv
from analysis.measure.collective_calls import OUTSIDE_STEPS
from analysis.render import palette
from analysis.render.drop_downs import switched_figure
from analysis.render.export import image_name
from analysis.render.figure_dicts import trusted_figure
from analysis.render.html_page import notes_html
from analysis.render.units import rate_unit
from analysis.report.call_chart import call_chart, call_noun, step_means
from analysis.report.group_chart import group_blocks
from analysis.report.straggler_chart import straggler_blocks
from analysis.timeline.representative import RULE, representative_step
from analysis.trace.frames import NS_PER_MS

if TYPE_CHECKING:
    from analysis.collectives.collectives_view import CollectivesView
    from analysis.run.loaded_run import LoadedRun

WAIT_COLOUR = palette.WAITING


@dataclass(frozen=True)
class CollectivesEntry:
    """One trace of the section: `steps` is its analysis' per-step frame (the table's figures come from
    it, and so do the sentences); `colour` its implementation colour (palette.trace_colours); `groups` its
    communication per rank and process group (the chart of group_chart.py when it has several groups)."""

    label: str
    run: LoadedRun
    view: CollectivesView
    steps: pd.DataFrame | None = None
    colour: str | None = None
    groups: pd.DataFrame | None = None  # the analysis' `by_group` (measure/comm_breakdown.py); None: not shown


def busbw_figure(
    calls: pd.DataFrame, peak_busbw: float | None = None, colours: dict[str, str] | None = None
) -> go.Figure:
    """Every call with known bytes and transfer: busbw against message size, log-log, one colour per
    trace (`colours` by label; the spare implementation colours where not given)."""
    known = calls[calls["busbw_gbps"].notna()]
    labels = list(dict.fromkeys(known["label"]))
    colours = colours or palette.implementation_colours(labels)
    unit, per_unit = rate_unit(known["busbw_gbps"].to_numpy(float) * 1e9)  # units.py: what fits the values
    in_unit = 1e9 / per_unit
    fig = trusted_figure()
    for label, group in known.groupby("label", sort=False):
        fig.add_trace(
            go.Scatter(
                x=group["bytes"],
                y=group["busbw_gbps"] * in_unit,
                mode="markers",
                name=str(label),
                marker=dict(size=5, color=colours.get(str(label), palette.IDLE), opacity=0.6),
                text=group["tag"],
                hovertemplate="%{text}<br>%{x:,} bytes<br>%{y:.3g} " + unit,
            )
        )
    if peak_busbw:
        fig.add_hline(y=peak_busbw * in_unit, line_dash="dash", annotation_text=f"peak {peak_busbw:g} GB/s")
    fig.update_layout(
        height=420,
        title=dict(text="Bus bandwidth vs message size (each call, each rank)"),
        meta=dict(image="busbw"),
        xaxis=dict(type="log", title=dict(text="bytes")),
        yaxis=dict(type="log", title=dict(text=f"busbw {unit}"), exponentformat="none"),
        margin=dict(t=60, b=60),
    )
    return fig


def step_time_split(calls: pd.DataFrame) -> pd.DataFrame:
    """Per (step, rank), in ms of the step: `busy_ms`, the time at least one call ran (overlapping calls
    counted once), split into `transfer_ms` (some call moving data, or unpaired) and `waiting_ms` (calls
    running, all of them still waiting for the last rank). `transfer_ms` is split again by collective
    family (palette.collective_of) into `transfer_<family>_ms`, in COLLECTIVE_COLOURS' order, time when
    two families move data at once going to the first (so the parts add up to `transfer_ms`)."""
    mine = calls[calls["step"] >= 0]
    keys, index = np.unique(mine[["step", "rank"]].to_numpy(np.int64), axis=0, return_inverse=True)
    index = index.reshape(-1)
    start, end = mine["start_ns"].to_numpy(np.int64), mine["end_ns"].to_numpy(np.int64)
    wait_ns = np.rint(np.nan_to_num(mine["wait_ms"].to_numpy(float)) * NS_PER_MS).astype(np.int64)
    moving = np.minimum(start + wait_ns, end)
    busy = _union_ms(index, start, end, len(keys))
    transfer = _union_ms(index, moving, end, len(keys))
    out = pd.DataFrame(
        {
            "step": keys[:, 0],
            "rank": keys[:, 1],
            "busy_ms": busy,
            "transfer_ms": transfer,
            "waiting_ms": busy - transfer,
        }
    )
    family = mine["op"].map(palette.collective_of).to_numpy()
    so_far, before = np.zeros(len(family), dtype=bool), np.zeros(len(keys))
    for fam in palette.COLLECTIVE_COLOURS:  # five families: each adds what the ones before did not cover
        if not (family == fam).any():
            continue
        so_far |= family == fam
        covered = _union_ms(index[so_far], moving[so_far], end[so_far], len(keys))
        out[f"transfer_{fam}_ms"] = covered - before
        before = covered
    return out


def _union_ms(keys: np.ndarray, starts: np.ndarray, ends: np.ndarray, n: int) -> np.ndarray:
    k, s, e = iv.keyed_union(keys, starts, ends)
    return iv.sum_by_key(k, e - s, n) / NS_PER_MS


def wait_transfer_figure(calls: pd.DataFrame, label: str, steps: pd.DataFrame | None = None) -> go.Figure:
    """Per step and rank, stacked in ms of the step: time some call moved data (by collective, in its
    colour), and time calls only waited for the last rank (overlapping calls counted once); the step's
    length beside them when `steps` is given."""
    per = step_time_split(calls)
    x = [f"step {s} · rank {r}" for s, r in zip(per["step"], per["rank"], strict=True)]
    noun = call_noun(calls)
    moving = [
        go.Bar(
            name=f"{noun}s moving data: {palette.COLLECTIVE_LABELS[fam]} (or unpaired)",
            x=x,
            y=per[f"transfer_{fam}_ms"],
            marker_color=palette.COLLECTIVE_COLOURS[fam],
        )
        for fam in palette.COLLECTIVE_COLOURS
        if f"transfer_{fam}_ms" in per
    ]
    waiting = go.Bar(name=f"{noun}s only waiting for the last rank", x=x, y=per["waiting_ms"], marker_color=WAIT_COLOUR)
    fig = trusted_figure([*moving, waiting])
    if steps is not None and len(steps):
        length = per.merge(steps[["step", "rank", "step_ms"]], on=["step", "rank"], how="left")["step_ms"]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=length,
                mode="markers",
                marker=dict(symbol="line-ew-open", size=28, color="#555555", line_width=2),
                name="the step's length",
                hovertemplate="step %{y:.2f} ms<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        height=360,
        yaxis=dict(title=dict(text="ms of the step"), rangemode="tozero"),
        title=dict(text=f"{html.escape(label)}: collectives per step, in ms of the step"),
        margin=dict(t=60, b=80),
    )
    return fig


def chosen_step(calls: pd.DataFrame, steps: pd.DataFrame | None) -> tuple[int, int] | None:
    """(step, rank) the per-call chart shows: the timelines' representative step (representative.py) when
    the analysis has it and calls there, else the middle step of the lowest rank with calls."""
    if steps is not None:
        chosen = representative_step(steps)
        if chosen is not None and ((calls["step"] == chosen[0]) & (calls["rank"] == chosen[1])).any():
            return chosen
    have = sorted(calls.loc[calls["step"] >= 0, "step"].unique())
    if not have:
        return None
    step = int(have[len(have) // 2])
    return step, int(calls.loc[calls["step"] == step, "rank"].min())


def call_chart_rule(entry: CollectivesEntry) -> str:
    """The line under the per-call chart: which step and rank it opens on, by which rule, and what its
    drop-down offers."""
    step, rank = chosen_step(entry.view.calls, entry.steps) or (None, None)
    if entry.steps is not None and representative_step(entry.steps) == (step, rank):
        head = f"Call by call: step {step}, rank {rank}, {RULE}."
    else:
        head = f"Call by call: step {step}, rank {rank}: the middle step with calls of the lowest rank that has them."
    if step is None or rank is None or len(call_choices(entry.view.calls, (step, rank))) < 2:
        return head
    return head + f" The drop-down shows every step of rank {rank} and every rank in step {step}."


def call_choices(calls: pd.DataFrame, chosen: tuple[int, int]) -> list[tuple[int, int]]:
    """(step, rank) the per-call chart can switch to: every step of the chosen rank with calls, then every
    other rank's call in the chosen step (not every step of every rank: the page would grow with both)."""
    step, rank = chosen
    numbered = calls.loc[calls["step"] >= 0, ["step", "rank"]].drop_duplicates()
    mine = sorted(int(k) for k in numbered.loc[numbered["rank"] == rank, "step"])
    others = sorted(int(r) for r in numbered.loc[(numbered["step"] == step) & (numbered["rank"] != rank), "rank"])
    return [(k, rank) for k in mine] + [(step, r) for r in others]


def _first(frame: pd.DataFrame, groups: dict, key: tuple[int, int], column: str) -> int | None:
    """`column` of the first row of the (step, rank) group `key` of `frame` (groups: its groupby indices)."""
    rows = groups.get(key)
    return None if rows is None else int(frame[column].iloc[rows[0]])


def per_call_figure(entry: CollectivesEntry) -> go.Figure | None:
    """The per-call chart of one trace, opened on chosen_step's step and rank with a drop-down to the others
    of call_choices (render/drop_downs.py), or None without numbered steps."""
    calls = entry.view.calls
    chosen = chosen_step(calls, entry.steps)
    if chosen is None:
        return None
    choices = call_choices(calls, chosen)
    # Each frame split by (step, rank) once, not filtered again per choice; of the calls, only the columns
    # call_chart reads are taken per choice (the rows carry thirty-odd, strings among them).
    by_call = calls.groupby(["step", "rank"]).indices
    read = calls[["start_ns", "end_ns", "issue_ns", "duration_ms", "wait_ms", "op", "tag"]]
    spans, starts = entry.run.backward_spans, entry.run.step_starts
    by_span, by_start = spans.groupby(["step", "rank"]).indices, starts.groupby(["step", "rank"]).indices
    steps = entry.steps if entry.steps is not None and len(entry.steps) else None
    mean = None if steps is None else step_means(steps)
    noun = call_noun(calls)
    figures = []
    for k, r in choices:  # the per-call chart of one step and rank (report/call_chart.py)
        b0, b1 = _first(spans, by_span, (k, r), "start_ns"), _first(spans, by_span, (k, r), "end_ns")
        backward = None if b0 is None or b1 is None else (b0, b1)
        first = _first(starts, by_start, (k, r), "start_ns")
        mine = read.iloc[by_call[(k, r)]]
        data, layout = call_chart(mine, noun, k, r, entry.label, first, backward, steps, mean)
        figures.append((f"step {k}, rank {r}", data, layout))
    return switched_figure(figures, active=choices.index(chosen))


def collectives_section(entries: list[CollectivesEntry], peak_busbw: float | None = None) -> list:
    """Blocks of the report's Collectives section for the traces given (in the order given: fastest first)."""
    if not entries:
        return []
    calls = pd.concat([e.view.calls.assign(label=e.label) for e in entries], ignore_index=True)
    calls = calls[calls["phase"] != OUTSIDE_STEPS]  # the closing barrier is no training collective
    colours = {e.label: e.colour for e in entries if e.colour is not None} or None
    blocks: list = [
        '<h2>Collectives</h2><p class="note">Each collective call per rank, paired across ranks '
        "(python -m analysis.collectives): <b>waiting</b> is the part of a call before the last rank "
        "arrived, <b>transfer</b> the rest. When ranks share one GPU, waiting includes time the "
        "partner's kernel could not start because the GPU was busy; on separate GPUs it is rank "
        "imbalance. Per step, overlapping calls count once, so the bars are ms of the step.</p>"
    ]
    if calls["busbw_gbps"].notna().any():
        blocks.append(busbw_figure(calls, peak_busbw, colours))
    else:
        blocks.append(
            '<p class="note">No bus bandwidth: these traces carry no byte counts (the ddp wrappers '
            "record them as the comm:&lt;op&gt;:&lt;tag&gt; ranges' payloads; older traces lack them).</p>"
        )
    for e in entries:
        name = (palette.swatch_html(e.colour) if e.colour else "") + html.escape(e.label)
        blocks.append(f'<h3 class="impl">{name}</h3>')
        for _, head in e.view.traces.iterrows():
            if head["note"]:
                blocks.append(f'<p class="note">{html.escape(e.label)}: {html.escape(head["note"])}</p>')
        stem = image_name(e.label)
        if (e.view.calls["step"] >= 0).any():
            fig = wait_transfer_figure(e.view.calls, e.label, e.steps)
            blocks.append(fig.update_layout(meta=dict(image=f"{stem}_collectives_per_step")))
            blocks += straggler_blocks(e.view, e.label, stem)
        blocks += group_blocks(e.groups, e.label, stem)
        fig = per_call_figure(e)
        if fig is not None:
            blocks += [fig.update_layout(meta=dict(image=f"{stem}_calls")), notes_html([call_chart_rule(e)])]
        sentences = [s for t in e.view.traces["in_time"] for s in (t or [])] if "in_time" in e.view.traces else []
        blocks += in_time_blocks(e.view.gathers, sentences, e.label, stem)
    return blocks

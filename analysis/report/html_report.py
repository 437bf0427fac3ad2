"""The comparison page (reports/index.html): ranking table, per-step time breakdown, step spread, links.

Input is the report's summary frame (one row per trace, analysis metrics averaged per step) and
the per-step frame of the analysis; output is one self-contained HTML page.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from analysis.render import palette
from analysis.render.figure_dicts import trusted_figure
from analysis.render.html_page import BESIDE_THE_PAGE, PlotlyJs, notes_html, write_page
from analysis.trace.run_info import labelled, nccl_label, summary_notes

TABLE_COLUMNS = {  # summary column -> heading, format
    "implementation": ("implementation", "{}"),
    "trace": ("trace", "{}"),
    "ranks": ("ranks", "{:.0f}"),
    "steps": ("steps", "{:.0f}"),
    "step_ms": ("step ms", "{:.2f}"),
    "comm_ms": ("comm ms", "{:.2f}"),
    "exposed_comm_ms": ("exposed comm ms", "{:.2f}"),
    "overlap_pct": ("overlap %", "{:.1f}"),
    "speedup_vs_naive": ("speedup over naive", "{:.2f}x"),
}
BREAKDOWN = (  # stacked bar parts per step: column, label, colour
    ("compute_only_ms", "compute (no comm under it)", palette.COMPUTE_ONLY),
    ("overlap_ms", "comm hidden under compute", palette.HIDDEN_COMM),
    ("exposed_comm_ms", "comm exposed", palette.EXPOSED_COMM),
    ("idle_ms", "idle (neither)", palette.IDLE),
)


def breakdown(summary: pd.DataFrame) -> pd.DataFrame:
    """Mean step split into compute only, overlapped comm, exposed comm and idle (ms).

    Idle is the analysis' idle_ms (the step window minus the time the rank computed or
    communicated, whichever step launched that work) when the summary has it, else the step minus
    the busy parts, clipped at 0. Compute and comm are the work launched in the step, which may run
    past its window (comm hidden behind the next step's compute), so the parts add up to the mean
    step only when each step's work fits in its own window.
    """
    compute_only = (summary["compute_ms"] - summary["overlap_ms"]).clip(lower=0)
    busy = compute_only + summary["overlap_ms"] + summary["exposed_comm_ms"]
    idle = summary["idle_ms"] if "idle_ms" in summary else (summary["step_ms"] - busy).clip(lower=0)
    return pd.DataFrame(
        {
            "label": summary["label"],
            "compute_only_ms": compute_only,
            "overlap_ms": summary["overlap_ms"],
            "exposed_comm_ms": summary["exposed_comm_ms"],
            "idle_ms": idle,
        }
    )


def _cell(value: object, fmt: str) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return "-"
    return html.escape(fmt.format(value))


def label_colours(summary: pd.DataFrame) -> dict[str, str]:
    """Each trace label's colour (palette.trace_colours), the same on every chart and page of the report."""
    return palette.trace_colours(summary["label"].tolist(), summary["implementation"].tolist())


def label_ticks(labels: list[str], colours: dict[str, str]) -> dict:
    """Axis settings that write each label after a square of its implementation's colour."""
    return dict(tickvals=labels, ticktext=[palette.coloured_name(html.escape(x), colours[x]) for x in labels])


def table_html(summary: pd.DataFrame, links: dict[str, str]) -> str:
    """The ranking table; each implementation after its colour's square, linking to its trace's timeline."""
    colours = label_colours(summary)
    head = "".join(f"<th>{html.escape(h)}</th>" for h, _ in TABLE_COLUMNS.values())
    rows = []
    for rec in summary.to_dict("records"):  # one row per trace: a handful
        cells = []
        for col, (_, fmt) in TABLE_COLUMNS.items():
            text = _cell(rec.get(col), fmt)
            if col == "implementation" and rec["trace"] in links:
                text = f'<a href="{html.escape(links[rec["trace"]])}">{text}</a>'
            if col == "implementation":
                text = palette.swatch_html(colours[rec["label"]]) + text
            cells.append(f"<td>{text}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def breakdown_figure(summary: pd.DataFrame) -> go.Figure:
    """Stacked bars: where a mean step's time goes, per implementation."""
    parts = breakdown(summary)
    fig = trusted_figure(
        [
            go.Bar(
                name=label,
                x=parts["label"],
                y=parts[col],
                marker_color=colour,
                hovertemplate="%{x}<br>" + label + ": %{y:.2f} ms<extra></extra>",
            )
            for col, label, colour in BREAKDOWN
        ]
    )
    fig.update_layout(
        barmode="stack",
        height=420,
        yaxis=dict(title=dict(text="ms per step (mean)")),
        title=dict(text="Where a step's time goes"),
        meta=dict(image="step_breakdown"),
        margin=dict(t=60, b=60),
        xaxis=label_ticks(parts["label"].tolist(), label_colours(summary)),
    )
    return fig


def spread_figure(steps: pd.DataFrame, summary: pd.DataFrame) -> go.Figure:
    """Step time of every (rank, step) per implementation: the spread behind the means, in the
    summary's order (fastest first) and the implementations' colours."""
    colours = label_colours(summary)
    groups = dict(tuple(steps.groupby("label", sort=False)))
    fig = trusted_figure(
        [
            go.Box(
                y=groups[label]["step_ms"],
                name=label,
                boxpoints="all",
                jitter=0.4,
                pointpos=0,
                marker=dict(size=4, color=colours[label]),
                line_color=colours[label],
                hovertemplate="%{y:.2f} ms<extra>" + html.escape(label) + "</extra>",
            )
            for label in summary["label"]
            if label in groups
        ]
    )
    fig.update_layout(
        height=380,
        yaxis=dict(title=dict(text="step ms (each rank and step)")),
        title=dict(text="Per-step spread"),
        meta=dict(image="step_spread"),
        showlegend=False,
        margin=dict(t=60, b=60),
        xaxis=label_ticks([x for x in summary["label"] if x in groups], colours),
    )
    return fig


RUN_COLUMNS = {
    "label": "implementation",
    "step_ms": "step ms",
    "gpus": "GPU",
    "driver": "driver",
    "cuda_driver": "CUDA (driver)",
    "cuda": "CUDA (torch)",
    "nccl": "NCCL",  # the library loaded, torch's build beside it when they differ (run_info.nccl_label)
    "torch": "torch",
    "backend": "backend",
    "world_size": "world size",
    "model": "model",
    "profiler": "profiler",
    "phases": "steps and phases from",
    "shared_gpus": "ranks sharing a GPU",
}
# ddp.meta's memory, the largest rank's (run_info.MEMORY_COLUMNS), beside the step time; shown when a trace has it
MEMORY_PARTS_CELL = "memory_parts"  # not a summary column: the parts, drawn into one cell
MEMORY_RUN_COLUMNS = {
    "mem_peak_mib": "memory peak MiB/rank",
    MEMORY_PARTS_CELL: "its parts MiB (zeros left out)",
    "cuda_max_allocated_mib": "CUDA max allocated MiB",
}
MEMORY_RECORDED = "mem_parameters_mib"  # every run that recorded memory knows its parameters' bytes
MEMORY_PARTS = {  # summary column -> its short name in the one-line parts cell, and the full name on hover
    "mem_parameters_mib": ("params", "parameters"),
    "mem_gradients_mib": ("grads", "gradients"),
    "mem_optimizer_state_mib": ("optim", "optimizer state"),
    "mem_gathered_mib": ("gathered", "gathered parameters"),
    "mem_comm_buffers_mib": ("comm", "communication buffers"),
    "mem_activations_mib": ("act", "activations"),
}


def runs_html(summary: pd.DataFrame) -> str:
    """What each trace ran on (run_info.trace_metadata): the facts a reader needs to trust its figures (those
    no trace has are left out), and its step time beside its memory (ddp.meta's, when recorded; CUDA's max
    allocated n/a off CUDA)."""
    titles = {**RUN_COLUMNS, **MEMORY_RUN_COLUMNS}
    if "nccl" in summary:
        builds = summary["nccl_build"] if "nccl_build" in summary else [None] * len(summary)
        nccl = [nccl_label(a, b) for a, b in zip(summary["nccl"], builds, strict=True)]  # one per run
        summary = summary.assign(nccl=pd.Series(nccl, index=summary.index, dtype=object))
    has_memory = MEMORY_RECORDED in summary and summary[MEMORY_RECORDED].notna().any()
    # a fact no trace has (a CPU run's GPU, driver, CUDA, NCCL) is left out rather than shown as a column of dashes
    columns = [c for c in RUN_COLUMNS if c in summary and (c in ("label", "step_ms") or summary[c].notna().any())]
    after = columns.index("step_ms") + 1 if "step_ms" in columns else 1
    memory = [c for c in MEMORY_RUN_COLUMNS if c in summary or c == MEMORY_PARTS_CELL]
    columns[after:after] = memory if has_memory else []  # beside the time
    head = "".join(f"<th>{html.escape(titles[c])}</th>" for c in columns)
    whole = lambda v: int(v) if isinstance(v, float) and v.is_integer() else v  # world size 2, not 2.0
    colours = label_colours(summary)
    formats = {"step_ms": "{:.2f}"}
    cell = lambda rec, c: (
        (palette.swatch_html(colours[rec["label"]]) if c == "label" else "")
        + _run_cell(rec, c, formats.get(c, "{}"), whole)
    )
    rows = [
        "<tr>" + "".join(f"<td>{cell(rec, c)}</td>" for c in columns) + "</tr>" for rec in summary.to_dict("records")
    ]
    note = (
        "<p>Ranks sharing a GPU: their compute and idle are not exclusive GPU time, and one rank's kernels "
        "slow the other's.</p>"
        if "shared_gpus" in summary and summary["shared_gpus"].notna().any()
        else ""
    )
    return (
        f'<h2>Runs</h2><table class="data"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>{note}'
    )


def _known(value: object) -> bool:
    return value is not None and value is not pd.NA and not (isinstance(value, float) and np.isnan(value))


def _run_cell(rec: dict, column: str, fmt: str, whole: Callable[[object], object]) -> str:
    # memory recorded, a figure missing: CUDA's off CUDA (no allocator to ask), a part the strategy could not
    # count (torch_fsdp's gathered buffers on some torch) and so the peak
    recorded = _known(rec.get(MEMORY_RECORDED))
    shown = lambda c, f: "n/a" if recorded and not _known(rec.get(c)) else _cell(whole(rec.get(c)), f)
    if column == MEMORY_PARTS_CELL:  # one short line (three figures a part), every part exact on hover
        kept = [(c, short) for c, (short, _) in MEMORY_PARTS.items() if not (_known(rec.get(c)) and rec[c] == 0)]
        line = " · ".join(f"{short} {shown(c, '{:.3g}')}" for c, short in kept)
        exact = "; ".join(f"{full} {shown(c, '{:g}')} MiB" for c, (_, full) in MEMORY_PARTS.items())
        return f'<span style="white-space:nowrap" title="{html.escape(exact)}">{line}</span>'
    if column == "nccl" and isinstance(rec.get(column), str):  # the version, then what torch was built with
        version, _, beside = rec[column].partition(" ")
        small = f'<br><span style="white-space:nowrap;font-size:smaller">{html.escape(beside)}</span>'
        return html.escape(version) + (small if beside else "")
    if column in MEMORY_RUN_COLUMNS:
        return shown(column, fmt)
    return _cell(whole(rec.get(column)), fmt)


def design_lines(summary: pd.DataFrame) -> list[str]:
    """The runs' design notes (trace/run_info.py), each once after the labels of the runs it applies to:
    figures their strategy or backend decides."""
    return labelled(list(summary["label"]), summary_notes(summary))


def link_list(links: dict[str, str], side_by_side: tuple[str, str] | None, summary: pd.DataFrame) -> str:
    """Links to the timeline pages (paths relative to index.html), fastest first, each after its colour."""
    colours = label_colours(summary)
    items = [
        f"<li>{palette.swatch_html(colours[label])}{html.escape(label)}: "
        f'<a href="{html.escape(links[trace])}">{html.escape(Path(trace).name)}</a></li>'
        for trace, label in zip(summary["trace"], summary["label"], strict=True)
        if trace in links
    ]
    compare = ""
    if side_by_side:
        href, title = side_by_side
        compare = (
            f'<p><a href="{html.escape(href)}"><b>{html.escape(title)}</b></a> (one step of each, fastest '
            "first, on one time scale, backward outlined)</p>"
        )
    return f"<h2>Timelines</h2>{compare}<ul>{''.join(items)}</ul>"


def write_index(
    path: Path,
    summary: pd.DataFrame,
    steps: pd.DataFrame,
    links: dict[str, str],
    side_by_side: tuple[str, str] | None,
    sections: Sequence[str | go.Figure] = (),
    plotly_js: PlotlyJs = BESIDE_THE_PAGE,
) -> tuple[Path, list[go.Figure]]:
    """Write reports/index.html; `sections`: further blocks (the Collectives section) before the links.
    Returns the page and its figures in page order (for --png/--svg; each names its image in layout.meta)."""
    intro = (
        "Each figure is a mean per step over the ranks of a trace (analysis.overlap). A step lasts from its "
        "start to the next step's start on GPU traces (its CPU range on CPU-only traces). Exposed comm is "
        "communication with no compute under it; idle is neither; speedup over naive compares mean step times."
    )
    blocks = [
        "<h2>Implementations, fastest first</h2>" + table_html(summary, links) + notes_html(design_lines(summary)),
        breakdown_figure(summary),
        spread_figure(steps, summary),
        runs_html(summary),
        *sections,
        link_list(links, side_by_side, summary),
    ]
    page = write_page(path, "Data-parallel overlap report", blocks, intro=intro, plotly_js=plotly_js)
    return page, [b for b in blocks if isinstance(b, go.Figure)]

"""The text and CSV of `analysis.advise` for a sharded run (advise/sharded/shard_advice.py's JSON), in the look
of the DDP advice: the recorded figures, the model's parameters, one row per candidate setting (each
prediction as 'value ± 95 % half-width', recorded / recommended marked), the recommendation and why."""

from __future__ import annotations

import pandas as pd

from analysis.render.table import format_table

SHARD_KNOB = "prefetch, separate_reduce_scatter"
COLUMNS = {
    "prefetch": "prefetch",
    "rs": "reduce-scatters",
    "step": "predicted step ms",
    "forward": "forward wait ms",
    "backward": "backward wait ms",
    "worst": "worst unit (wait ms)",
    "note": "note",
}
RUN_KEYS = ["implementation", "trace", "measured_step_ms", "replayed_step_ms", "ideal_step_ms"]


def _communicator(separate: bool) -> str:
    return "separate" if separate else "shared"


def candidate_frame(run: dict) -> pd.DataFrame:
    """One row per candidate, predictions as 'value ± err', with 'recorded' / 'recommended' marks."""
    chosen = run["recommended"]["setting"]
    rows = []
    for c in run["candidates"]:
        marks = ["recorded"] if c["recorded"] else []
        marks += ["recommended"] if c["setting"] == chosen else []
        pm = lambda k, c=c: f"{c[k]:.3f} ± {c[k + '_err']:.3f}"
        w = c["worst_unit"]
        rows.append(
            {
                "prefetch": c["prefetch"],
                "rs": _communicator(c["separate_reduce_scatter"]),
                "step": pm("predicted_step_ms"),
                "forward": pm("predicted_forward_wait_ms"),
                "backward": pm("predicted_backward_wait_ms"),
                "worst": f"{w['phase']} {w['unit']} ({w['wait_ms']:.3f})" if w["wait_ms"] > 0 else "-",
                "note": ", ".join(marks),
            }
        )
    return pd.DataFrame(rows)


def table_lines(run: dict) -> list[str]:
    """The lines for one sharded run."""
    rec = run["recorded_setting"]
    bandwidth = lambda c: "n/a" if c["bandwidth_gb_s"] is None else format(c["bandwidth_gb_s"], ".3f")
    cost = "; ".join(
        f"{op} {c['latency_us']:.1f} us + {bandwidth(c)} GB/s ({c['calls']} calls)"
        for op, c in run["comm_cost"].items()
    )
    chosen = run["recommended"]["setting"]
    lanes = "one stream per communicator" if run["lanes"] == 1 else f"{run['lanes']} collectives at once per group"
    return [
        f"{run['trace']}: {run['implementation']}, {run['units']} units, prefetch {rec['prefetch']}, "
        f"reduce-scatters {_communicator(rec['separate_reduce_scatter'])} ({run['recorded_setting_source']}), "
        f"{run['steps']} rank-steps",
        f"  measured step {run['measured_step_ms']:.3f} ms, of which waiting for weights and the tail "
        f"{run['measured_wait_ms']:.3f} ms; the replay at the recorded setting: {run['replayed_step_ms']:.3f} ± "
        f"{run['replayed_step_ms_err']:.3f} ms",
        f"  perfect overlap (every collective free): {run['ideal_step_ms']:.3f} ms",
        f"  model: {run['model']}, {lanes}; collective cost (all calls) {cost}; compute slowdown "
        f"{run['compute_slowdown']:.3f} ± {run['compute_slowdown_err']:.3f} ms per ms of communication beside it",
        f"  ±: {run['uncertainty']}; waits: ms per rank-step, summed over units",
        format_table(candidate_frame(run), COLUMNS),
        f"recommended: prefetch {chosen['prefetch']}, reduce-scatters "
        f"{_communicator(chosen['separate_reduce_scatter'])} ({run['recommended']['reason']})",
        "",
    ]


def csv_rows(run: dict) -> list[dict]:
    """One CSV row per candidate: the run's keys, then the candidate's (its worst unit flattened)."""
    rows = []
    for c in run["candidates"]:
        flat = {k: v for k, v in c.items() if k not in ("setting", "worst_unit")}
        worst = {f"worst_unit_{k}": v for k, v in c["worst_unit"].items()}
        rows.append({**{k: run[k] for k in RUN_KEYS}, **flat, **worst})
    return rows

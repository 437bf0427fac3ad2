"""What-if for DDP's bucket size: the step predicted at other bucket sizes (each ± its 95 % interval),
the bound with perfect overlap, the floor, and the recommended size (the recorded one kept unless a
gain exceeds its uncertainty), from one recorded run; for a sharded run (fsdp, torch_fsdp), the step
and the per-unit waits at prefetch depths 1-4 with reduce-scatters shared or separate (advise/sharded/shard_advice.py).

    python -m analysis.advise traces/overlap_bucket.sqlite [--bucket-mb 1 5 25 ...] [--format table|csv|json]
    python -m analysis.advise --merge traces/torch.rank0.json.gz traces/torch.rank1.json.gz
    python -m analysis.advise traces/fsdp.sqlite [--prefetch 1 2 3 4]

Python API: `analysis.advise.advice.advise(paths, bucket_mb, prefetch=...) -> list[Advice | ShardAdvice]`.
The models and their assumptions: docs/advise.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from analysis import cli
from analysis.cache.answers import answered
from analysis.errors import TraceError
from analysis.options import PATTERNS, add_options

if TYPE_CHECKING:  # the library loads after the answer cache is asked (answer_cache.py): start-up stays light
    import pandas as pd

TABLE_COLUMNS = {
    "bucket_mb": "bucket MiB",
    "buckets": "buckets",
    "step": "predicted step ms",
    "exposed": "predicted exposed comm ms",
    "note": "note",
}
RUN_KEYS = ["implementation", "trace", "measured_step_ms", "ideal_step_ms", "floor_step_ms", "recommended_bucket_mb"]
CSV_DROP = ["setting"]  # the same as bucket_mb in a column of its own


def candidate_frame(run: dict) -> pd.DataFrame:
    """One row per candidate of a run's JSON: predictions as 'value ± 95 % half-width', with
    'recorded' / 'recommended' marks."""
    import pandas as pd

    frame = pd.DataFrame(run["candidates"])
    marks = []
    for mb in frame["bucket_mb"]:
        mark = ["recorded"] if mb == run["recorded_bucket_mb"] else []
        mark += ["recommended"] if mb == run["recommended_bucket_mb"] else []
        marks.append(", ".join(mark))
    pm = lambda v, e: [f"{a:.3f} ± {b:.3f}" for a, b in zip(frame[v], frame[e], strict=True)]
    return pd.DataFrame(
        {
            "bucket_mb": frame["bucket_mb"],
            "buckets": frame["buckets"],
            "step": pm("predicted_step_ms", "predicted_step_ms_err"),
            "exposed": pm("predicted_exposed_comm_ms", "predicted_exposed_comm_ms_err"),
            "note": marks,
        }
    )


def render_table(runs: list[dict]) -> str:
    from analysis.advise.sharded import shard_advice_table as shard_view
    from analysis.render.table import format_table

    out = []
    for run in runs:
        if run.get("knob") == shard_view.SHARD_KNOB:
            out += shard_view.table_lines(run)
            continue
        recorded = run["recorded_bucket_mb"]
        size = f"{recorded:g} MiB buckets" if recorded else "one collective per parameter"
        lines = "; ".join(
            f"{_bytes(c['min_bytes'])}-{_bytes(c['max_bytes'])}: {c['latency_us']:.1f} us + "
            f"{'n/a' if c['bandwidth_gb_s'] is None else format(c['bandwidth_gb_s'], '.3f')} GB/s"
            for c in _distinct_lines(run["comm_cost"])
        )
        wait = run["call_wait_ms"]
        model = (
            f"GPU kernels: compute loses {run['compute_slowdown']:.3f} ± {run['compute_slowdown_err']:.3f} of its "
            f"progress while the rank's collectives are in flight; each call waits {wait:.3f} ms for the other ranks"
            if run["model"] == "stalls"
            else f"compute slowdown {run['compute_slowdown']:.3f} ± {run['compute_slowdown_err']:.3f} ms per ms of "
            "communication under backward"
        )
        rec = run["recommended"]
        out += [
            f"{run['trace']}: {run['implementation']}, {size}, {run['steps']} rank-steps",
            f"  measured step {run['measured_step_ms']:.3f} ms, exposed communication "
            f"{run['measured_exposed_comm_ms']:.3f} ms",
            f"  perfect overlap (step - exposed): {run['ideal_step_ms']:.3f} ms; floor (max of compute, "
            f"communication): {run['floor_step_ms']:.3f} ms",
            f"  model: collective cost (overall, then per message-size range) {lines}; {model}",
            f"  ±: {run['uncertainty']}",
            format_table(candidate_frame(run), TABLE_COLUMNS),
            f"recommended bucket size: {run['recommended_bucket_mb']:g} MiB ({rec['reason']})",
            "",
        ]
    return "\n".join(out).rstrip()


def _distinct_lines(lines: list[dict]) -> list[dict]:
    """The overall line, then the per-range lines that are not the overall one again (one range over every size)."""
    overall = lines[0]
    same = lambda c: (c["min_bytes"], c["max_bytes"]) == (overall["min_bytes"], overall["max_bytes"])
    return [overall, *(c for c in lines[1:] if not same(c))]


def _bytes(n: float | None) -> str:
    if n is None:
        return "inf"
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def render_csv(runs: list[dict]) -> str:
    import pandas as pd

    from analysis.advise.sharded import shard_advice_table as shard_view

    rows = [
        {**{k: run[k] for k in RUN_KEYS}, **{k: v for k, v in c.items() if k not in CSV_DROP}}
        for run in runs
        if run.get("knob") != shard_view.SHARD_KNOB
        for c in run["candidates"]
    ]
    rows += [row for run in runs if run.get("knob") == shard_view.SHARD_KNOB for row in shard_view.csv_rows(run)]
    return pd.DataFrame(rows).to_csv(index=False)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.advise",
        description="Predict a DDP run's step time and exposed communication at other bucket sizes "
        "from one recorded run (per-parameter overlap, overlap_bucket or torch; nsys export or "
        "torch.profiler JSON, CPU or GPU), each with its 95% interval, the bound under perfect overlap and "
        "the floor; the recorded size is kept unless another's gain exceeds its uncertainty. A sharded run "
        "(fsdp, torch_fsdp) gets the step and per-unit waits at prefetch depths 1-4, reduce-scatters shared or "
        "separate, likewise.",
        epilog="Exit status: 0 ok, 2 bad input (message on stderr). The model: docs/advise.md.",
    )
    inputs = {
        "paths": "nsys SQLite export(s) or torch.profiler JSON trace(s)",
        "merge": "treat all PATHs as one run (one rank per file, clocks aligned)",
    }
    add_options(p, ["paths", "merge"], helps=inputs, metavars={"paths": "PATH"})  # files, not TRACE runs
    p.add_argument(
        "--bucket-mb",
        type=float,
        nargs="+",
        default=None,
        metavar="MB",
        help="candidate bucket sizes in MiB (default: 1 2 5 10 25 50 100 and the recorded size)",
    )
    p.add_argument(
        "--prefetch",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="sharded runs (fsdp, torch_fsdp): candidate prefetch depths, each with reduce-scatters shared and "
        "separate (default: 1 2 3 4 and the recorded depth)",
    )
    add_options(p, ["format", *PATTERNS, "no_cache"])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return answered("advise", args, lambda: cli.run(lambda: _run(args)))


def _run(args: argparse.Namespace) -> int:
    from analysis.advise.advice import advise

    bad = [mb for mb in args.bucket_mb or [] if not mb > 0 or mb != mb or mb == float("inf")]
    if bad:
        raise TraceError(f"--bucket-mb {bad[0]:g}: bucket sizes must be positive and finite")
    if any(d < 1 for d in args.prefetch or []):
        raise TraceError(f"--prefetch {min(args.prefetch)}: prefetch depths must be integers >= 1")
    found = advise(args.paths, args.bucket_mb, args.merge, cli.patterns_from(args), args.prefetch)
    runs = [a.to_json() for a in found]
    if args.format == "json":
        cli.emit(lambda: print(json.dumps({"runs": runs})))
    elif args.format == "csv":
        cli.emit(lambda: print(render_csv(runs), end=""))
    else:
        cli.emit(lambda: print(render_table(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

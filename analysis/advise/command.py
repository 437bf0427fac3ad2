"""What-if for DDP's bucket size: the step predicted at other bucket sizes (each ± its 95 % interval),
the bound with perfect overlap, the floor, and the recommended size (the recorded one kept unless a
gain exceeds its uncertainty), from one recorded run; for a sharded run (fsdp, torch_fsdp), the step
and the per-unit waits at prefetch depths 1-4 with reduce-scatters shared or separate (advise/sharded/).

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

from analysis import cli
from analysis.cache.answers import answered
from analysis.errors import TraceError
from analysis.options import PATTERNS, add_options


def render_table(runs: list[dict]) -> str:
    from analysis.advise.buckets import result as buckets
    from analysis.advise.sharded import result as sharded

    out = []
    for run in runs:
        out += sharded.table_lines(run) if run.get("knob") == sharded.KNOB else buckets.table_lines(run)
    return "\n".join(out).rstrip()


def render_csv(runs: list[dict]) -> str:
    """One row per candidate: the DDP runs' rows, then the sharded runs' (each layout's own columns)."""
    import pandas as pd

    from analysis.advise.buckets import result as buckets
    from analysis.advise.candidate_table import csv_rows
    from analysis.advise.sharded import result as sharded

    is_sharded = lambda run: run.get("knob") == sharded.KNOB
    rows = [row for run in runs if not is_sharded(run) for row in csv_rows(run, buckets.RUN_KEYS)]
    rows += [row for run in runs if is_sharded(run) for row in csv_rows(run, sharded.RUN_KEYS)]
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

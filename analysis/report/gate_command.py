"""`python -m analysis.report NEW... --baseline OLD... [--fail-if METRIC:LIMIT ...]`: the CI gate.

Prints the per-metric deltas of the new run against the baseline (table, csv or json), a warning line
when the runs differ in model or world size, and a one-line verdict. Exit codes: 0 no limit passed,
1 a --fail-if limit passed, 2 bad input. The API: `open_runs(new, merge=True).compare(baseline, rules)`.
"""

from __future__ import annotations

import argparse
import json

import pandas as pd

from analysis import cli
from analysis.errors import TraceError
from analysis.render.table import format_table

COLUMNS = {
    "metric": "metric",
    "baseline": "baseline",
    "new": "new",
    "delta": "delta",
    "delta_pct": "delta %",
    "limit": "limit",
    "failed": "failed",
}


def run_gate(args: argparse.Namespace) -> int:
    from analysis.api import open_runs
    from analysis.report.compare import check_apart, rules_of

    if args.baseline is None:
        raise TraceError("--fail-if needs --baseline OLD...: the run to compare against")
    rules = rules_of(args.fail_if)
    check_apart(args.paths, args.baseline)
    result = open_runs(args.paths, merge=True, patterns=cli.patterns_from(args)).compare(args.baseline, rules)
    rows = result.rows()
    if args.format == "json":
        cli.emit(lambda: print(json.dumps(result.to_json())))
    elif args.format == "csv":
        cli.emit(lambda: print(pd.DataFrame(rows).to_csv(index=False), end=""))
    else:
        about = lambda r: ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in r.about.items())
        lines = [
            f"new:      {' '.join(result.new.paths)} ({about(result.new)})",
            f"baseline: {' '.join(result.baseline.paths)} ({about(result.baseline)})",
            format_table(pd.DataFrame(rows).assign(failed=[("FAIL" if r["failed"] else "") for r in rows]), COLUMNS),
            *result.warnings(),
            result.verdict(),
        ]
        cli.emit(lambda: print("\n".join(lines)))
    return 1 if result.failed else 0

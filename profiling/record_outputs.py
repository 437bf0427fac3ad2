"""What `run_nsys.sh` wrote: one Output per trace file (the .sqlite export and its .nsys-rep report),
and the closing summary of them as a table, CSV or JSON."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Output:
    """One trace file written by this call."""

    impl: str
    report: Path
    sqlite: Path
    sqlite_bytes: int
    report_bytes: int
    wall_s: float


def written_output(impl: str, report: Path, wall_s: float) -> Output:
    sqlite = report.with_suffix(".sqlite")
    return Output(impl, report, sqlite, sqlite.stat().st_size, report.stat().st_size, wall_s)


def print_summary(outputs: list[Output], fmt: str) -> None:
    rows: list[dict[str, Any]] = [
        {
            "impl": o.impl,
            "sqlite": str(o.sqlite),
            "sqlite_bytes": o.sqlite_bytes,
            "report": str(o.report),
            "report_bytes": o.report_bytes,
            "wall_s": round(o.wall_s, 2),
        }
        for o in outputs
    ]
    print_rows(
        rows,
        fmt,
        f"{'impl':<15} {'sqlite':<40} {'sqlite KB':>10} {'nsys-rep KB':>12} {'wall s':>7}",
        lambda r: (
            f"{r['impl']:<15} {r['sqlite']:<40} {r['sqlite_bytes'] / 1024:>10.0f} "
            f"{r['report_bytes'] / 1024:>12.0f} {r['wall_s']:>7.1f}"
        ),
    )


def print_rows(rows: list[dict[str, Any]], fmt: str, header: str, line: Callable[[dict[str, Any]], str]) -> None:
    """The closing summary's rows as JSON, CSV, or a table of `header` and one `line` per row."""
    if fmt == "json":
        print(json.dumps(rows, indent=2))
    elif fmt == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]) if rows else ["impl"])
        writer.writeheader()
        writer.writerows(rows)
    else:
        print(header)
        for r in rows:
            print(line(r))

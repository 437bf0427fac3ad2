"""Copy an nsys SQLite export keeping only what the analysis reads: `python scripts/slim_export.py IN OUT`.

Made for the exports shipped in examples/: the tables, columns and rows that analysis/trace/readers/
(nsys_db.py, nsys_nvtx.py, nsys.py) read, nothing else, then VACUUMed. The analysis of the
copy prints the same bytes as the analysis of the original (examples/README.md says how that was checked).

    python scripts/slim_export.py run.sqlite slim.sqlite && xz -9e -T1 slim.sqlite

What is kept:
  - CUPTI_ACTIVITY_KIND_KERNEL / _MEMCPY / _MEMSET: every row; start, end, deviceId, streamId,
    correlationId, globalPid and the name (kernel shortName, copy copyKind);
  - CUPTI_ACTIVITY_KIND_RUNTIME: start, globalTid, correlationId of the calls that launched a kept GPU op
    (the reader uses runtime calls only to find each op's launch);
  - NVTX_EVENTS: the marks, push/pop and start/end ranges and domain creations, with their text, thread,
    domain and integer payload columns;
  - StringIds, ThreadNames (globalTid, nameId), META_DATA_EXPORT, TARGET_INFO_SESSION_START_TIME,
    TARGET_INFO_GPU (id, name, uuid) and TARGET_INFO_SYSTEM_ENV's driver, CUDA and host rows.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

GPU = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
GPU_COLUMNS = ["start", "end", "deviceId", "streamId", "correlationId", "globalPid"]
NVTX_EVENT_TYPES = "34, 59, 60, 75"  # mark, push/pop, start/end, domain create (nsys_db.py)
ENV_NAMES = "'NvDriverVersion', 'CudaDriverVersion', 'Hostname'"

# table -> (columns kept, WHERE on the original's rows or None)
KEEP: dict[str, tuple[list[str], str | None]] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ([*GPU_COLUMNS, "shortName"], None),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ([*GPU_COLUMNS, "copyKind"], None),
    "CUPTI_ACTIVITY_KIND_MEMSET": (GPU_COLUMNS, None),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        ["start", "globalTid", "correlationId"],
        "correlationId IN (" + " UNION ".join(f"SELECT correlationId FROM src.{t}" for t in GPU) + ")",
    ),
    "NVTX_EVENTS": (
        [
            "start",
            "end",
            "eventType",
            "text",
            "globalTid",
            "endGlobalTid",
            "textId",
            "domainId",
            "int64Value",
            "uint64Value",
            "int32Value",
            "uint32Value",
        ],
        f"eventType IN ({NVTX_EVENT_TYPES})",
    ),
    "StringIds": (["id", "value"], None),
    "ThreadNames": (["nameId", "globalTid"], None),
    "META_DATA_EXPORT": (["name", "value"], None),
    "TARGET_INFO_SESSION_START_TIME": (["utcEpochNs", "systemClockNs"], None),
    "TARGET_INFO_GPU": (["id", "name", "uuid"], None),
    "TARGET_INFO_SYSTEM_ENV": (["name", "value"], f"name IN ({ENV_NAMES})"),
}


def slim(source: Path, target: Path) -> None:
    """Write the kept tables of `source` to a new SQLite file `target` (rows in their original order)."""
    if target.exists():
        raise SystemExit(f"error: {target} exists")
    conn = sqlite3.connect(target)
    conn.execute("ATTACH DATABASE ? AS src", (source.resolve().as_uri() + "?mode=ro",))
    for table, (columns, where) in KEEP.items():
        declared = {r[1]: (r[2], r[3]) for r in conn.execute(f'PRAGMA src.table_info("{table}")')}
        present = [c for c in columns if c in declared]
        if not present:
            continue
        defs = ", ".join(f'"{c}" {declared[c][0]}{" NOT NULL" if declared[c][1] else ""}' for c in present)
        names = ", ".join(f'"{c}"' for c in present)
        conn.execute(f'CREATE TABLE "{table}" ({defs})')
        conn.execute(
            f'INSERT INTO "{table}" ({names}) SELECT {names} FROM src."{table}"'
            + (f" WHERE {where}" if where else "")
            + " ORDER BY rowid"
        )
    conn.commit()
    conn.execute("DETACH DATABASE src")
    conn.execute("VACUUM")
    conn.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, help="an nsys SQLite export")
    ap.add_argument("target", type=Path, help="the slimmed copy to write (must not exist)")
    args = ap.parse_args(argv)
    if not args.source.is_file():
        print(f"error: {args.source}: no such file", file=sys.stderr)
        return 2
    slim(args.source, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())

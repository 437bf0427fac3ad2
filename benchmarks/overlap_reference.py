"""A plain-Python reference for the speed benchmarks: each rank's whole-capture compute, communication,
overlap and backward overlap (ms) of an nsys export, computed with sqlite3, dicts and lists only by
tests/analysis/overlap/gpu_reference.py (the tests' independent computation, no project code), so
`analysis.overlap` can be timed against a loop that computes the same figures.

    python benchmarks/overlap_reference.py /tmp/bench/ddp_1000000k8r.sqlite   # prints JSON {rank: figures}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.analysis.overlap.gpu_reference import inside, intersect, length, mark_comm, read

NS_PER_MS = 1e6


def whole_capture(path: str) -> dict[int, dict[str, float]]:
    """{rank: compute_ms, comm_ms, overlap_ms, backward_overlap_ms} over the whole capture, by the README's
    rules as gpu_reference.reference states them (its whole-capture row, without the per-step rows)."""
    ops, ranges, rank, backend = read(path)
    by_pid: dict[int, list[dict]] = {}
    for o in ops:
        by_pid.setdefault(o["pid"], []).append(o)
    nv_by_pid: dict[int, list[dict]] = {}
    for x in ranges:
        nv_by_pid.setdefault(x["pid"], []).append(x)
    out = {}
    for pid, r in rank.items():
        mine, nv = by_pid.get(pid, []), nv_by_pid.get(pid, [])
        comm_ranges, backward = mark_comm(mine, nv)
        compute = [(o["start"], o["end"]) for o in mine if not o["copy"] and not o["comm"]]
        backward_compute = [
            (o["start"], o["end"]) for o in mine if not o["copy"] and not o["comm"] and inside(backward, o["launch"][0])
        ]
        comm = (
            [(x["start"], x["end"]) for x in comm_ranges]
            if backend[pid] == "gloo"
            else [(o["start"], o["end"]) for o in mine if o["comm"]]
        )
        out[r] = {
            "compute_ms": length(compute) / NS_PER_MS,
            "comm_ms": length(comm) / NS_PER_MS,
            "overlap_ms": length(intersect(comm, compute)) / NS_PER_MS,
            "backward_overlap_ms": length(intersect(comm, backward_compute)) / NS_PER_MS,
        }
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python benchmarks/overlap_reference.py EXPORT.sqlite", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(whole_capture(sys.argv[1])))

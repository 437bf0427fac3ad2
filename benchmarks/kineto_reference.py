"""A plain-Python reference for `python -m analysis.overlap` on torch.profiler (Kineto) traces: the
standard library only (json, gzip), one loop over the events, no numpy, no code of this project.

Per file: the `step N` user_annotation ranges are the steps; each kernel (cat kernel, gpu_memcpy,
gpu_memset) belongs to the step in whose launch span its cudaLaunchKernel (same args.correlation)
started: step k's span is [its start, step k+1's start), the last step's its own CPU range, which
lasts until the later of its end and its work's end (its kernels, the `comm:*` ranges started in
it). Kernels whose name holds "nccl" are
communication, the others compute. Per step: comm = the length of the union of its communication
kernels, compute likewise, overlap = the length of their intersection, exposed = comm - overlap.
Prints the totals over all steps and files as JSON (ms), the figures the benchmark holds the CLI's
against.

    python benchmarks/kineto_reference.py TRACE.json [TRACE.rank1.json.gz ...]
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import sys

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
STEP = re.compile(r"^step (\d+)$")


def load(path: str) -> list:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return json.load(f)["traceEvents"]


def union(intervals: list) -> list:
    """Sorted, disjoint [start, end) intervals covering the given ones."""
    merged: list = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        elif e > s:
            merged.append([s, e])
    return merged


def length(intervals: list) -> int:
    return sum(e - s for s, e in intervals)


def intersection(a: list, b: list) -> int:
    """Length of the intersection of two sorted disjoint interval lists."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def ns(us: float) -> int:
    return round(us * 1000)


def figures(events: list) -> dict:
    """Totals over the steps of one file (ns)."""
    steps, launches, kernels, ranges = [], {}, [], []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, args = e.get("cat"), e.get("args") or {}
        start, end = ns(e["ts"]), ns(e["ts"]) + max(0, ns(e.get("dur", 0)))
        if cat == "user_annotation" and STEP.match(e["name"]):
            steps.append((start, end))
        elif cat == "user_annotation" and e["name"].startswith("comm:"):
            ranges.append((start, end))
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launches[args["correlation"]] = start
        elif cat in GPU_CATS:
            kernels.append((args.get("correlation"), start, end, "nccl" in e["name"].lower()))
    steps.sort()
    starts = [s for s, _ in steps]
    spans = [(s, starts[i + 1] if i + 1 < len(steps) else e) for i, (s, e) in enumerate(steps)]
    comm: list = [[] for _ in steps]
    compute: list = [[] for _ in steps]
    for corr, start, end, is_comm in kernels:
        launch = launches.get(corr)
        if launch is None:
            continue
        i = bisect.bisect_right(starts, launch) - 1
        if i >= 0 and launch < spans[i][1]:
            (comm if is_comm else compute)[i].append((start, end))
    total = {"steps": len(steps), "step": 0, "comm": 0, "compute": 0, "overlap": 0}
    for i, (s, e) in enumerate(steps):
        c, k = union(comm[i]), union(compute[i])
        if i + 1 < len(steps):
            last_end = spans[i][1]
        else:  # the last step lasts until its work (kernels, comm:* ranges started in it) is done
            last_end = max([e] + [b for _, b in c + k] + [b for a, b in ranges if s <= a < e])
        total["step"] += last_end - s
        total["comm"] += length(c)
        total["compute"] += length(k)
        total["overlap"] += intersection(c, k)
    return total


def main(paths: list[str]) -> int:
    totals = [figures(load(p)) for p in paths]
    out = {key: sum(t[key] for t in totals) for key in ("steps", "step", "comm", "compute", "overlap")}
    print(
        json.dumps(
            {
                "steps": out["steps"],
                "step_ms": out["step"] / 1e6,
                "comm_ms": out["comm"] / 1e6,
                "compute_ms": out["compute"] / 1e6,
                "overlap_ms": out["overlap"] / 1e6,
                "exposed_comm_ms": (out["comm"] - out["overlap"]) / 1e6,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

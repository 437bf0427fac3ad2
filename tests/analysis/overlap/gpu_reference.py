"""An independent computation of the per-step figures, in plain Python from the raw SQLite tables.

Written for the tests from the rules stated in the README ("On GPUs"), sharing no code with
`analysis`: sqlite3, re, json and lists only. Times are integer ns.
"""

from __future__ import annotations

import json
import re
import sqlite3
from bisect import bisect_right

STEP = re.compile(r"^step (\d+)$")
COMM_RANGE = re.compile(r"^comm:|^nccl[A-Z]")  # the project's ranges and NCCL's own


def union(pieces):
    out: list[list[int]] = []
    for s, e in sorted(p for p in pieces if p[1] > p[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(pieces):
    return sum(e - s for s, e in union(pieces))


def intersect(a, b):
    a, b, i, j, out = union(a), union(b), 0, 0, []
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def pieces(intervals):
    """Union as (starts, ends) lists, for `inside`."""
    merged = union(intervals)
    return [s for s, _ in merged], [e for _, e in merged]


def inside(merged, t):
    """t lies in the (starts, ends) pieces."""
    i = bisect_right(merged[0], t) - 1
    return i >= 0 and t < merged[1][i]


def read(path):
    """Per pid: kernels/copies with launch time and thread, NVTX ranges, rank from ddp.meta."""
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    pid = lambda g: (g >> 24) & 0xFFFFFF
    launch = {}
    for start, gtid, corr in db.execute(
        "SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IS NOT NULL"
    ):
        launch[(pid(gtid), corr)] = (start, gtid & 0xFFFFFF)
    ops = []
    for start, end, stream, corr, gpid, name in db.execute(
        "SELECT start, end, streamId, correlationId, globalPid, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL"
    ):
        ops.append(
            dict(
                pid=pid(gpid),
                start=start,
                end=end,
                stream=stream,
                name=strings[name],
                copy=False,
                launch=launch.get((pid(gpid), corr), (-1, -1)),
            )
        )
    for start, end, stream, corr, gpid in db.execute(
        "SELECT start, end, streamId, correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMCPY"
    ):
        ops.append(
            dict(
                pid=pid(gpid),
                start=start,
                end=end,
                stream=stream,
                name="memcpy",
                copy=True,
                launch=launch.get((pid(gpid), corr), (-1, -1)),
            )
        )
    ranges, rank, backend = [], {}, {}
    for start, end, kind, text, text_id, gtid in db.execute(
        "SELECT start, end, eventType, text, textId, globalTid FROM NVTX_EVENTS WHERE eventType IN (34, 59, 60)"
    ):
        text = text if text is not None else strings.get(text_id, "")
        if kind == 34 and text.startswith("ddp.meta "):
            meta = json.loads(text[len("ddp.meta ") :])
            rank[pid(gtid)], backend[pid(gtid)] = meta["rank"], meta["backend"]
        elif kind != 34 and end is not None:
            ranges.append(
                dict(pid=pid(gtid), tid=gtid & 0xFFFFFF, start=start, end=end, text=text, blocking=kind == 59)
            )
    db.close()
    return ops, ranges, rank, backend


def mark_comm(mine, nv):
    """Set o["comm"] on one rank's ops by the README's rules (NCCL kernels and work launched inside a
    blocking comm range; a copy also when on a communication stream or launched inside any comm range);
    returns the rank's comm ranges and its backward ranges as pieces."""
    comm_ranges = [x for x in nv if COMM_RANGE.match(x["text"])]
    blocking: dict[int, list] = {}
    for x in comm_ranges:
        if x["blocking"]:
            blocking.setdefault(x["tid"], []).append((x["start"], x["end"]))
    blocking = {tid: pieces(v) for tid, v in blocking.items()}
    any_comm = pieces([(x["start"], x["end"]) for x in comm_ranges])
    backward = pieces([(x["start"], x["end"]) for x in nv if x["text"] == "backward"])
    in_blocking = lambda o: inside(blocking.get(o["launch"][1], ([], [])), o["launch"][0])
    for o in mine:
        o["comm"] = not o["copy"] and (o["name"].startswith("nccl") or in_blocking(o))
    compute_streams = {o["stream"] for o in mine if not o["copy"] and not o["comm"]}
    nccl_streams = {o["stream"] for o in mine if not o["copy"] and o["comm"]}
    for o in mine:
        if o["copy"]:
            o["comm"] = in_blocking(o) or (
                o["stream"] not in compute_streams and (o["stream"] in nccl_streams or inside(any_comm, o["launch"][0]))
            )
    return comm_ranges, backward


def reference(path):
    """{rank: [whole-capture dict of compute/comm/overlap/backward overlap, then per step a dict of
    step/compute/comm/comm kernel/comm copy/overlap/backward overlap (ns)]} by the README's rules."""
    ops, ranges, rank, backend = read(path)
    out = {}
    for pid, r in rank.items():
        mine = [o for o in ops if o["pid"] == pid]
        nv = [x for x in ranges if x["pid"] == pid]
        comm_ranges, backward = mark_comm(mine, nv)
        host = backend[pid] == "gloo"
        compute = [o for o in mine if not o["copy"] and not o["comm"]]
        compute_all = [(o["start"], o["end"]) for o in compute]
        backward_all = [(o["start"], o["end"]) for o in compute if inside(backward, o["launch"][0])]
        steps = sorted((x["start"], x["end"]) for x in nv if STEP.match(x["text"]))
        # the last step's work: its GPU work, and its comm ranges only where they are the communication
        # (gloo): an NCCL collective's async range ends where the host noticed its completion
        work = [(o["launch"][0], o["end"]) for o in mine] + [(x["start"], x["end"]) for x in comm_ranges if host]
        comm_all = (
            [(x["start"], x["end"]) for x in comm_ranges]
            if host
            else [(o["start"], o["end"]) for o in mine if o["comm"]]
        )
        rows = [
            {
                "compute_ms": length(compute_all),
                "comm_ms": length(comm_all),  # whole capture first
                "overlap_ms": length(intersect(comm_all, compute_all)),
                "backward_overlap_ms": length(intersect(comm_all, backward_all)),
            }
        ]
        for k, (s, cpu_end) in enumerate(steps):
            last = k == len(steps) - 1
            launch_end = cpu_end if last else steps[k + 1][0]
            launched = lambda t, s=s, launch_end=launch_end: s <= t < launch_end
            end = launch_end
            if last:
                end = max([cpu_end] + [e for t, e in work if launched(t)])
            if host:
                comm = [(x["start"], x["end"]) for x in comm_ranges if launched(x["start"])]
            else:
                comm = [(o["start"], o["end"]) for o in mine if o["comm"] and launched(o["launch"][0])]
            mine_comm = [o for o in mine if o["comm"] and launched(o["launch"][0])]
            rows.append(
                {
                    "step_ms": end - s,
                    "comm_kernel_ms": length([(o["start"], o["end"]) for o in mine_comm if not o["copy"]]),
                    "comm_copy_ms": length([(o["start"], o["end"]) for o in mine_comm if o["copy"]]),
                    "compute_ms": length([(o["start"], o["end"]) for o in compute if launched(o["launch"][0])]),
                    "comm_ms": length(comm),
                    "overlap_ms": length(intersect(comm, compute_all)),
                    "backward_overlap_ms": length(intersect(comm, backward_all)),
                }
            )
        out[r] = rows
    return out

"""Load torch.profiler (Kineto) traces into the frames nsys exports load into: `load_kineto(paths) -> Trace`.

`analysis.trace.readers.read.read_trace` hands JSON files (`.json`, `.json.gz`, recognised from their content)
here, so every CLI and metric reads both formats. One file per rank (what torch.profiler writes);
several files are one job's ranks, each on its own clock (baseTimeNanoseconds recorded per part).

What goes where (see trace/frames.py for the frames):
`gpu_ops`   kernel / gpu_memcpy / gpu_memset events: device and stream from args, names as Kineto
            writes them (demangled kernel names; "Memcpy DtoD (...)" -> "memcpy DtoD", "Memset (...)"
            -> "memset"); launch_start / launch_tid / pid from the cuda_runtime (or cuda_driver) event
            with the same `args.correlation` (the `ac2g` flows link the same pairs).
`nvtx`      the CPU ranges: `user_annotation` events (record_function ranges, `ProfilerStep#N`, and
            this project's step / forward / backward / grad_sync / optimizer / comm:* ranges) as
            push_pop ranges, except those our torch.profiler recorder marked `ddp.kind: start_end`
            (async ranges that end on another thread). PyTorch's own collective annotations
            (`gloo:all_reduce`, `nccl:broadcast`, ...: recorded by the process group, on its worker
            threads for gloo) are start/end ranges too: they do not block the calling thread. In
            traces of this project's runner (`ddp.meta` present) they are left out: its `comm:*`
            ranges are the ones nsys records, so both profilers measure the same ranges.
            Steps and phases marked only PyTorch's way (`ProfilerStep#N`, the autograd engine's
            `autograd::engine::evaluate_function: ...` cpu_ops, `DistributedDataParallel.forward`,
            `Optimizer.step#...`) get ranges of their own: trace/phase_markers.py.
`ranks`     one per file and device; rank and world size from `distributedInfo` (or our `ddp.meta`).
`collectives` one row per `record_param_comms` op with its message sizes (`_collectives`).
Traces without GPU events (CPU-only runs) are measured from the ranges alone (source "ranges"), as
CPU-only nsys exports are.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.errors import TraceError
from analysis.trace.build_frames import number_ranks, nvtx_frame, ops_frame, row_lookup
from analysis.trace.frames import (
    CLOCK_OFFSET_KEY,
    KERNELS,
    NVTX_KIND_NAMES,
    NVTX_PUSH_POP,
    NVTX_START_END,
    RANGES,
    Trace,
    empty_collectives,
)
from analysis.trace.patterns import Patterns, matches
from analysis.trace.phase_markers import PHASES_KEY, RANGE_COLUMNS, derive_phases
from analysis.trace.readers.kineto_columns import count, sizes
from analysis.trace.readers.kineto_json import KinetoFile, read_kineto
from analysis.trace.run_info import recorded

TORCH_COMM_ANNOTATION = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):")


def _gpu_names(names: pd.Categorical) -> pd.Categorical:
    """Kineto's names (categories in order of appearance), copies and sets named as the nsys loader names them."""
    renamed = [
        "memcpy " + u.split()[1]
        if u.startswith("Memcpy ") and len(u.split()) > 1
        else "memset"
        if u.startswith("Memset")
        else u
        for u in names.categories
    ]
    new_codes, categories = pd.factorize(np.array(renamed, dtype=object))
    return pd.Categorical.from_codes(
        new_codes[names.codes] if names.codes.size else names.codes, categories=pd.Index(categories, dtype=object)
    )


def _launches(f: KinetoFile, host_pid: int) -> dict[str, np.ndarray]:
    """Per GPU event of one file: pid, start and tid of the runtime call that launched it (the one with the
    same correlation id: unique within a file's process); host_pid, -1 and -1 where none did."""
    g, rt = f.gpu, f.runtime
    n = len(g["start"])
    usable = rt["correlation"] > 0
    defaults = {"pid": host_pid, "start": -1, "tid": -1}
    if not (n and usable.any()):
        return {k: np.full(n, v, dtype=np.int64) for k, v in defaults.items()}
    row = row_lookup(
        np.zeros(int(usable.sum()), np.int64), rt["correlation"][usable], np.zeros(n, np.int64), g["correlation"]
    )
    found, row = row >= 0, np.maximum(row, 0)
    return {k: np.where(found, rt[k][usable][row], v) for k, v in defaults.items()}


def _gpu_part(f: KinetoFile, part: int, host_pid: int) -> dict:
    """The gpu_ops columns of one file (see the module docstring)."""
    g = f.gpu
    launch = _launches(f, host_pid)
    return {
        "part": np.full(len(g["start"]), part, dtype=np.int64),
        "pid": launch["pid"],
        "device": g["device"],
        "stream": g["stream"],
        "start": g["start"],
        "end": g["end"],
        "correlation_id": g["correlation"],
        "launch_start": launch["start"],
        "launch_tid": launch["tid"],
        "kind": g["kind"],
        "name": _gpu_names(g["name"]),
        "comm_bytes": g["comm_bytes"],
    }


def _autograd_ops(f: KinetoFile, part: int) -> pd.DataFrame:
    """The autograd engine's ops of one file (phase_markers.RANGE_COLUMNS)."""
    ag = f.autograd
    return pd.DataFrame({"part": np.int64(part), **{k: np.asarray(ag[k], dtype=np.int64) for k in RANGE_COLUMNS[1:]}})


def _nvtx_part(f: KinetoFile, part: int) -> pd.DataFrame:
    """The ranges of one file as an nvtx frame: push_pop, or start_end where our recorder said so and for
    PyTorch's own collective annotations (see the module docstring)."""
    r = f.ranges
    kind = np.where(r["async"], NVTX_START_END, NVTX_PUSH_POP).astype(np.int8)
    torch_comm = matches(pd.Series(r["text"], dtype=object), TORCH_COMM_ANNOTATION)
    # in our runner's traces its comm:* ranges are the calls (as nsys records them): PyTorch's are left out
    keep = ~torch_comm if f.meta else np.ones(len(kind), dtype=bool)
    if not f.meta:
        kind[torch_comm] = NVTX_START_END
    n = int(keep.sum())
    return pd.DataFrame(
        {
            "part": np.int64(part),
            "pid": r["pid"][keep],
            "tid": r["tid"][keep],
            "end_tid": r["tid"][keep],
            "start": r["start"][keep],
            "end": r["end"][keep],
            "text": np.array(r["text"], dtype=object)[keep],
            "kind": pd.Categorical.from_codes(kind[keep], categories=NVTX_KIND_NAMES),
            "domain": pd.Categorical.from_codes(np.zeros(n, np.int8), categories=pd.Index([""], dtype=object)),
            "payload": r["payload"][keep],  # our recorder's args[PAYLOAD_KEY], else -1
        }
    )


def _identity(f: KinetoFile) -> tuple[object, object]:
    """(rank, world size) as the file records them (distributedInfo first, then our ddp.meta)."""
    d, m = f.distributed, f.meta
    return d.get("rank", m.get("rank")), d.get("world_size", m.get("world_size"))


def _implementation(files: list[KinetoFile], first: Path) -> str:
    named = [f.meta["implementation"] for f in files if f.meta.get("implementation")]
    if named:
        return str(named[0])
    return first.name.removesuffix(".gz").removesuffix(".json")


def load_kineto(paths: list[Path], patterns: Patterns | None = None) -> Trace:
    """Load one Kineto file, or one job's per-rank files; each part's times stay on its own clock,
    its baseTimeNanoseconds in info[part][CLOCK_OFFSET_KEY] (run/clocks.py aligns them)."""
    patterns = patterns or Patterns()
    files = [read_kineto(p) for p in paths]
    gpu_parts, nvtx_parts, autograd, meta = [], [], [], {}
    for part, f in enumerate(files):
        host_pid = int(f.host_pids[0]) if f.host_pids.size else 0
        gpu_parts.append(_gpu_part(f, part, host_pid))
        nvtx_parts.append(_nvtx_part(f, part))
        autograd.append(_autograd_ops(f, part))
        rank, world = _identity(f)
        meta[(part, host_pid)] = {
            **f.meta,
            **({"rank": rank} if rank is not None else {}),
            **({"world_size": world} if world is not None else {}),
        }
    ops = ops_frame(gpu_parts)
    nvtx, phases = derive_phases(nvtx_frame(nvtx_parts), patterns, pd.concat(autograd, ignore_index=True))
    label = ", ".join(str(p) for p in paths)
    if len(ops) == 0 and len(nvtx) == 0:
        raise TraceError(
            f"{label}: torch.profiler trace holds neither GPU kernels nor user_annotation "
            "(record_function) ranges: nothing to measure"
        )
    implementation = _implementation(files, paths[0])
    meta = {k: v for k, v in meta.items() if v}
    torch_version = recorded(meta.values(), ("versions", "torch"))  # torch.profiler ships with torch
    return Trace(
        path=label,
        profiler="torch.profiler",
        profiler_version=None if torch_version is None else str(torch_version),
        source=KERNELS if len(ops) else RANGES,
        gpu_ops=ops,
        nvtx=nvtx,
        ranks=number_ranks(ops, nvtx, meta, implementation),
        meta=meta,
        implementation=implementation,
        collectives=_collectives(files),
        info={
            part: {**f.info, CLOCK_OFFSET_KEY: f.clock_offset, **({PHASES_KEY: phases} if part == 0 else {})}
            for part, f in enumerate(files)
        },
    )


def _collectives(files: list[KinetoFile]) -> pd.DataFrame:
    """The `collectives` frame (trace/frames.py COLLECTIVE_COLUMNS) of the files' `record_param_comms` ops:
    one row per op, the c10d collective PyTorch wraps in it, its element counts, dtype and process group
    from the op's args. `bytes` is max(in_bytes, out_bytes) (nccl-tests' "size": the full buffer, i.e. the
    gathered output of all_gather, the input of reduce_scatter); `wait` rows (PyTorch records its waits the
    same way) have 0 bytes. One Python pass per collective call: a trace holds thousands of them, not
    millions of events."""
    args = [a for f in files for a in f.comms["args"]]
    if not args:
        return empty_collectives()
    found = sizes(args)
    frame = pd.DataFrame(
        {
            "part": np.repeat(np.arange(len(files), dtype=np.int64), [len(f.comms["args"]) for f in files]),
            **{k: np.concatenate([f.comms[k] for f in files]) for k in ("pid", "tid", "start", "end")},
            "collective": pd.Series(
                [str(a.collective) if a.collective is not None else "" for a in args], dtype=object
            ),
            "dtype": pd.Series(found["dtype"], dtype=object),
            "element_bytes": found["size"],
            "in_nelems": found["n_in"],
            "out_nelems": found["n_out"],
            "in_bytes": found["b_in"],
            "out_bytes": found["b_out"],
            "bytes": np.maximum(found["b_in"], found["b_out"]),
            "group_size": np.array([count(a.group_size) for a in args], dtype=np.int64),
            "process_group": pd.Series([_group_name(a.pg_name, a.pg_desc) for a in args], dtype=object),
            "group_name": pd.Series(["" if a.pg_name is None else str(a.pg_name) for a in args], dtype=object),
            "group_desc": pd.Series(["" if a.pg_desc is None else str(a.pg_desc) for a in args], dtype=object),
            "group_ranks": pd.Series([_group_ranks(a.pg_ranks) for a in args], dtype=object),
        }
    )
    return frame.sort_values(["part", "pid", "start"], kind="stable").reset_index(drop=True)


def _group_ranks(ranks: object) -> str:
    """The group's members as "0,1,2" from the recorded "[0, 1, 2]" (a list in some versions); "" when not recorded
    or not a list of integers."""
    if ranks is None:
        return ""
    text = ",".join(str(r) for r in ranks) if isinstance(ranks, list) else str(ranks).strip().strip("[]")
    members = [m.strip() for m in text.split(",") if m.strip()]
    return ",".join(members) if members and all(m.isdigit() for m in members) else ""


def _group_name(name: object, desc: object) -> str:
    name = "" if name is None else str(name)
    return f"{name}:{desc}" if desc not in (None, "") else name

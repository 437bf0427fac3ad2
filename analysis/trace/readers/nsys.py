"""Read nsys SQLite exports into the frames (trace/frames.py): `load_nsys(paths) -> Trace`.

Schema-tolerant (nsys 2022.4 .. 2026.x): every table and nullable column may be missing; rows may
come in any order. The file is opened read-only and nothing is written beside it. Several one-rank
exports of one run keep their own clocks; each part's TARGET_INFO_SESSION_START_TIME offset is
recorded in info[part][CLOCK_OFFSET_KEY] for run/clocks.py to align them.

Where the columns come from: gpu_ops from CUPTI_ACTIVITY_KIND_KERNEL / MEMCPY / MEMSET (name: the
kernel's shortName, "memcpy <copy kind>", "memset"), launch_start / launch_tid from the
CUPTI_ACTIVITY_KIND_RUNTIME call with the same correlationId in the same process; nvtx from
NVTX_EVENTS (nsys_nvtx.py) (push/pop, start/end ranges and marks; domain names from domain-create events; payload
from int64Value/uint64Value/int32Value/uint32Value, whichever is set); meta from `ddp.meta {json}`
marks; info from the export's target description (nsys_db.NsysExport.target_info).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from pandas.api.types import union_categoricals

from analysis.errors import TraceError
from analysis.trace.build_frames import (
    GPU_INT_COLUMNS,
    LaunchJoin,
    categorical_names,
    number_ranks,
    nvtx_frame,
    ops_frame,
)
from analysis.trace.frames import (
    CLOCK_OFFSET_KEY,
    GPU_KERNEL,
    GPU_MEMCPY,
    GPU_MEMSET,
    KERNELS,
    RANGES,
    Trace,
)
from analysis.trace.patterns import Patterns
from analysis.trace.phase_markers import PHASES_KEY, derive_phases
from analysis.trace.readers.nsys_db import KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE, TID_MASK, NsysExport, pid_of
from analysis.trace.readers.nsys_nvtx import read_nvtx, shape_nvtx
from analysis.trace.readers.sqlite_read import narrowed
from contract import META_PREFIX, decode_meta

COPY_KINDS = {
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "UVM HtoD",
    12: "UVM DtoH",
    13: "UVM DtoD",
}


def _read_gpu_table(ex: NsysExport, table: str, kind: int) -> dict | None:
    """One CUPTI activity table as columns (numpy arrays, `name` a categorical)."""
    select = ex.gpu_select(table)
    if select is None:
        return None
    data = ex.read_table(*select)
    data["pid"] = narrowed(pid_of(data.pop("global_pid")), np.int32)  # 24-bit: always fits
    strings = {
        KERNEL_TABLE: ex.strings,
        MEMCPY_TABLE: lambda: {k: f"memcpy {v}" for k, v in COPY_KINDS.items()},
        MEMSET_TABLE: lambda: {0: "memset"},
    }[table]()
    names = (
        categorical_names(data.pop("name_id"), strings)
        if table != MEMSET_TABLE
        else pd.Categorical.from_codes(
            np.zeros(len(data["start"]), dtype=np.int8), categories=pd.Index(["memset"], dtype=object)
        )
    )
    return {**data, "name": names, "kind": np.full(len(data["start"]), kind, dtype=np.int8)}


def _launches(ex: NsysExport, pid: np.ndarray, corr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(launch_start, launch_tid): the runtime call with the same correlationId in the same process, else
    -1; the runtime table is read in chunks, each folded into the join (trace/build_frames.LaunchJoin)."""
    select = ex.runtime_select()
    if select is None or len(pid) == 0:
        return np.full(len(pid), -1, dtype=np.int64), np.full(len(pid), -1, dtype=np.int32)
    join = LaunchJoin(pid, corr)
    for rt in ex.chunks(*select):
        join.add(pid_of(rt["tid"]), rt["corr"], rt["start"], (rt["tid"] & TID_MASK).astype(np.int32))
    return join.result()


def _read_gpu_ops(ex: NsysExport) -> dict:
    """All GPU activity of one export as columns (see the module docstring for their meaning)."""
    parts = [
        f
        for f in (
            _read_gpu_table(ex, KERNEL_TABLE, GPU_KERNEL),
            _read_gpu_table(ex, MEMCPY_TABLE, GPU_MEMCPY),
            _read_gpu_table(ex, MEMSET_TABLE, GPU_MEMSET),
        )
        if f is not None
    ]
    if not parts:
        cols = {c: np.zeros(0, dtype=np.int64) for c in GPU_INT_COLUMNS}
        return {**cols, "name": pd.Categorical([]), "kind": np.zeros(0, dtype=np.int8)}
    names = union_categoricals([p["name"] for p in parts]) if len(parts) > 1 else parts[0]["name"]
    parts = [p for p in parts if len(p["start"])] or parts[:1]  # joining empty tables would copy every column
    cols = {c: _joined([p.pop(c) for p in parts]) for c in list(parts[0]) if c != "name"}
    cols["name"] = names  # every table's names among the categories, as before, even those of empty tables
    cols["launch_start"], cols["launch_tid"] = _launches(ex, cols["pid"], cols["correlation_id"])
    return cols


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _run_metadata(nvtx: pd.DataFrame) -> dict:
    """{(part, pid): dict} from `ddp.meta {json}` marks; marks whose JSON is malformed or not an object
    are ignored (they only cost the rank numbering from metadata)."""
    marks = nvtx[(nvtx["kind"] == "mark") & nvtx["text"].str.startswith(META_PREFIX)]
    meta = {}
    for part, pid, text in zip(marks["part"], marks["pid"], marks["text"], strict=True):
        value = decode_meta(text)
        if value is not None:
            meta[(int(part), int(pid))] = value
    return meta


AUTOGRAD_THREAD = r"^pt_autograd_\d+$"  # PyTorch's autograd engine names its device threads so


@dataclass(frozen=True)
class _Part:
    """What one export of a run holds: its GPU activity as columns, its NVTX frame, the nsys version
    that wrote it, its session-start clock offset, its target info and its autograd engine threads
    (part, pid, tid)."""

    ops: dict
    nvtx: pd.DataFrame
    version: str
    clock_offset: int
    info: dict
    autograd_threads: pd.DataFrame


def _load_part(path: Path, part: int, head: bytes | None = None, started: NsysExport | None = None) -> _Part:
    """One file read (`head`: its first bytes, when sniffed; `started`: the file opened already, its reads
    started, when it is this one); the file is closed after."""
    ex = started if started is not None and started.path == path else NsysExport(path, head)
    try:
        ops = _read_gpu_ops(ex)
        ops["part"] = np.full(len(ops["start"]), part, dtype=np.int32)
        nvtx = shape_nvtx(read_nvtx(ex))
        nvtx.insert(0, "part", np.int64(part))
        pid, tid = ex.threads_named(AUTOGRAD_THREAD)
        threads = pd.DataFrame({"part": np.full(pid.size, part, np.int64), "pid": pid, "tid": tid})
        return _Part(ops, nvtx, ex.version(), ex.clock_offset(), ex.target_info(), threads)
    except (sqlite3.DatabaseError, ValueError, TypeError, OverflowError) as e:
        # a damaged file can fail anywhere: in SQLite, or as values of the wrong type
        raise TraceError(f"{path}: corrupt or unreadable nsys export ({type(e).__name__}: {e})") from None
    finally:
        ex.close()


def _launches_by_thread(ops: pd.DataFrame, autograd_threads: pd.DataFrame) -> pd.DataFrame | None:
    """The GPU launches (part, pid, tid, t, autograd: whether its thread is an autograd engine thread)
    that derive_phases needs, sorted by (part, pid, t): of each process's runs of launches from autograd
    threads and from other threads, the run's first and last launch (what its ranges and each process's
    last launch are made of); None when the export names no autograd thread."""
    if len(autograd_threads) == 0 or len(ops) == 0:
        return None
    part, pid = ops["part"].to_numpy(), ops["pid"].to_numpy()
    tid, t = ops["launch_tid"].to_numpy(), ops["launch_start"].to_numpy()
    known = _thread_keys(autograd_threads["part"], autograd_threads["pid"], autograd_threads["tid"])
    # gpu_ops is sorted by (part, pid, ...): each process is one block of rows, taken one at a time
    edges = np.flatnonzero((part[1:] != part[:-1]) | (pid[1:] != pid[:-1])) + 1
    pieces = []
    for lo, hi in zip(np.r_[0, edges], np.r_[edges, len(ops)], strict=True):  # one pass per process
        rows = lo + np.flatnonzero(t[lo:hi] >= 0)
        if rows.size == 0:
            continue
        rows = rows[np.argsort(t[rows], kind="stable")]
        autograd = np.isin(_thread_keys(part[rows], pid[rows], tid[rows]), known)
        change = autograd[1:] != autograd[:-1]
        keep = np.r_[True, change] | np.r_[change, True]  # the first and last launch of each run
        pieces.append((rows[keep], autograd[keep]))
    rows = np.concatenate([r for r, _ in pieces]) if pieces else np.zeros(0, dtype=np.int64)
    return pd.DataFrame(
        {
            "part": part[rows].astype(np.int64),
            "pid": pid[rows].astype(np.int64),
            "tid": tid[rows].astype(np.int64),
            "t": t[rows],
            "autograd": np.concatenate([a for _, a in pieces]) if pieces else np.zeros(0, dtype=bool),
        }
    )


def _thread_keys(part: ArrayLike, pid: ArrayLike, tid: ArrayLike) -> np.ndarray:
    """One int64 per (part, process, thread): ids are 24-bit in nsys."""
    as64 = lambda a: np.asarray(a, dtype=np.int64)
    return (as64(part) << 48) | (as64(pid) << 24) | (as64(tid) & TID_MASK)


def load_nsys(
    paths: list[Path],
    patterns: Patterns | None = None,
    *,
    heads: Sequence[bytes | None] | None = None,
    started: NsysExport | None = None,
) -> Trace:
    """Load one export, or several one-rank exports of the same run; each part's times stay on its
    own clock, its session-start offset in info[part][CLOCK_OFFSET_KEY] (run/clocks.py aligns them).
    Steps and phases PyTorch marks its own way are added as ranges (trace/phase_markers.py), where
    they came from in info[0][PHASES_KEY]. `started`: the first file, opened and reading already
    (NsysExport.start_reading), which its part takes."""
    heads = heads or [None] * len(paths)  # the files' first bytes, when read.read_trace sniffed them
    firsts = [started] + [None] * (len(paths) - 1)  # the started export is the first file's
    loaded = [_load_part(*args) for args in zip(paths, range(len(paths)), heads, firsts, strict=True)]
    ops = ops_frame([part.ops for part in loaded])
    nvtx = nvtx_frame([part.nvtx for part in loaded])
    label = ", ".join(str(p) for p in paths)
    if len(ops) == 0 and not (nvtx["kind"] != "mark").any():
        raise TraceError(
            f"{label}: export holds neither GPU kernels nor NVTX ranges: nothing to measure (PyTorch writes "
            "NVTX ranges only under `nsys profile --pytorch=autograd-nvtx` or torch.autograd.profiler.emit_nvtx, "
            "both of which need a CUDA build of torch; on the CPU record with torch.profiler)"
        )
    threads = pd.concat([part.autograd_threads for part in loaded], ignore_index=True)
    nvtx, phases = derive_phases(nvtx, patterns or Patterns(), launches=_launches_by_thread(ops, threads))
    meta = _run_metadata(nvtx)
    implementation = next((str(m["implementation"]) for m in meta.values() if m.get("implementation")), paths[0].stem)
    return Trace(
        path=label,
        profiler="nsys",
        profiler_version=loaded[0].version,
        source=KERNELS if len(ops) else RANGES,
        gpu_ops=ops,
        nvtx=nvtx,
        ranks=number_ranks(ops, nvtx, meta, implementation),
        meta=meta,
        implementation=implementation,
        info={
            i: {**part.info, CLOCK_OFFSET_KEY: part.clock_offset, **({PHASES_KEY: phases} if i == 0 else {})}
            for i, part in enumerate(loaded)
        },
    )

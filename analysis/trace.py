"""Load nsys SQLite exports into typed frames: `load_trace(paths) -> Trace`.

Schema-tolerant (nsys 2022.4 .. 2026.x): every table and nullable column may be missing; rows may
come in any order. The file is opened read-only and nothing is written beside it.

Frames (all times int64 ns on the trace's clock; merged files are shifted onto the first file's
clock using TARGET_INFO_SESSION_START_TIME):

`gpu_ops`  one row per kernel / memcpy / memset, sorted by (part, pid, device, start):
    part (int, index of the source file), pid, device, stream, start, end,
    name (categorical: kernel short name, "memcpy HtoD", "memset", ...),
    kind (categorical: kernel | memcpy | memset), correlation_id (-1 if NULL),
    launch_start, launch_tid (the CUDA runtime call with the same correlationId in the same
    process: its start and OS thread id; -1 when none matched), is_comm (bool: see phases.py).
`nvtx`     one row per NVTX range or mark (push/pop, start/end, mark), sorted by (part, pid, start):
    part, pid, tid (OS thread that opened it), end_tid (thread that closed it), start, end
    (end == start for marks), text, kind (categorical: push_pop | start_end | mark),
    domain (domain name, "" for the default domain), payload (the range's integer payload from
    NVTX_EVENTS' int64Value/uint64Value/int32Value/uint32Value, whichever is set; -1 when none).
`ranks`    one row per rank, sorted by rank: rank, part, pid, device (-1 for NVTX-only traces),
    implementation. A rank is a (process, device) pair with GPU work; rank numbers come from the
    `ddp.meta {json}` mark of our runner when present, else from device order.
`meta`     {(part, pid): dict parsed from the `ddp.meta` mark}.
`info`     {part: what the export says about its machine (nsys_db.NsysExport.target_info): GPUs by
    device id with name and uuid, driver, CUDA driver, hostname, nsys version}.
`collectives` one row per collective call with its message sizes (kineto_comms.py); empty for nsys.

torch.profiler (Kineto) JSON files are recognised from their content and read by kineto.py into
the same frames.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from analysis.errors import TraceError
from analysis.intervals import factorize
from analysis.kineto_comms import empty_collectives
from analysis.kineto_json import is_kineto
from analysis.nsys_db import KERNEL, MEMCPY, MEMSET, NVTX, RUNTIME, TID_MASK, NsysExport, pid_of, tid_of
from analysis.patterns import Patterns
from analysis.phases import communication_mask
from contract import META_PREFIX, decode_meta

NVTX_KINDS = {34: "mark", 59: "push_pop", 60: "start_end"}
GPU_KINDS = pd.Index(["kernel", "memcpy", "memset"], dtype=object)  # kind codes 0, 1, 2
NVTX_KIND_NAMES = pd.Index(["push_pop", "start_end", "mark"], dtype=object)  # kind codes 0, 1, 2
NVTX_DOMAIN_CREATE = 75
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
              9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH", 13: "UVM DtoD"}


@dataclass(frozen=True)
class Trace:
    """One analysed unit: a single export, or several one-rank exports merged (see module docstring)."""

    path: str
    nsys_version: str
    source: str  # "gpu" when there is GPU activity, else "nvtx"
    gpu_ops: pd.DataFrame
    nvtx: pd.DataFrame
    ranks: pd.DataFrame
    meta: dict = field(default_factory=dict)
    implementation: str = ""
    info: dict = field(default_factory=dict)
    collectives: pd.DataFrame = field(default_factory=empty_collectives)


def _categorical_names(ids: np.ndarray, strings: dict[int, str], missing: str | None = None) -> pd.Categorical:
    """Map string ids to a categorical (plain object categories) without a per-row Python loop."""
    if ids.dtype == object:  # inline strings (rare): nothing to look up
        uniq, inverse = np.unique(ids.astype(str), return_inverse=True)
    else:
        uniq, inverse = factorize(ids)
    texts = [strings.get(int(u), f"<string {u}>" if missing is None else missing) if not isinstance(u, str) else u
             for u in uniq]
    codes_of_uniq, categories = pd.factorize(np.array(texts, dtype=object))
    return pd.Categorical.from_codes(codes_of_uniq[inverse.reshape(-1)],
                                     categories=pd.Index(categories, dtype=object))


def _read_gpu_table(ex: NsysExport, table: str, kind: int) -> dict | None:
    """One CUPTI activity table as columns (numpy arrays, `name` a categorical)."""
    if not ex.has(table, "start", "end"):
        return None
    name_col = {KERNEL: ex.column(KERNEL, "shortName", ex.column(KERNEL, "demangledName", "0")),
                MEMCPY: ex.column(MEMCPY, "copyKind", "0"), MEMSET: "0"}[table]
    cols = ["start", "end", "device", "stream", "correlation_id", "global_pid", "name_id"]
    exprs = ["start", '"end"', ex.column(table, "deviceId", "0"), ex.column(table, "streamId", "0"),
             ex.column(table, "correlationId"), ex.column(table, "globalPid"), name_col]
    data = ex.read(f'SELECT {", ".join(exprs)} FROM "{table}"', cols)
    strings = {KERNEL: ex.strings, MEMCPY: lambda: {k: f"memcpy {v}" for k, v in COPY_KINDS.items()},
               MEMSET: lambda: {0: "memset"}}[table]()
    names = _categorical_names(data.pop("name_id"), strings) if table != MEMSET else \
        pd.Categorical.from_codes(np.zeros(len(data["start"]), dtype=np.int8),
                                  categories=pd.Index(["memset"], dtype=object))
    data["pid"] = pid_of(data.pop("global_pid"))
    return {**data, "name": names, "kind": np.full(len(data["start"]), kind, dtype=np.int8)}


def _row_lookup(rt_pid: np.ndarray, rt_corr: np.ndarray, pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """For each (pid, corr): index of the runtime row with the same pair, else -1.

    CUDA correlation ids are dense counters, so a direct-address table over (process, id) is usually
    small and beats sorting 1M keys; when the ids are too sparse, fall back to sort + binary search.
    """
    pids = pd.Index(pd.unique(rt_pid))
    rt_p, op_p = pids.get_indexer(rt_pid), pids.get_indexer(pid)
    lo, hi = int(rt_corr.min()), int(rt_corr.max())
    span = hi - lo + 1
    valid = (op_p >= 0) & (corr >= lo) & (corr <= hi)
    if len(pids) * span <= 4 * (len(rt_pid) + len(pid)) + 4096:
        table = np.full(len(pids) * span, -1, dtype=np.int64)
        table[rt_p * span + (rt_corr - lo)] = np.arange(len(rt_pid))
        return np.where(valid, table[np.where(valid, op_p * span + (corr - lo), 0)], -1)
    rt_key = (rt_p.astype(np.int64) << 32) | (rt_corr & 0xFFFFFFFF)  # pid index, 32-bit id
    order = np.argsort(rt_key, kind="stable")
    op_key = (op_p.astype(np.int64) << 32) | (corr & 0xFFFFFFFF)
    pos = np.minimum(np.searchsorted(rt_key[order], op_key), len(order) - 1)
    return np.where(valid & (rt_key[order][pos] == op_key), order[pos], -1)


def _launches(ex: NsysExport, pid: np.ndarray, corr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(launch_start, launch_tid): the runtime call with the same correlationId in the same process, else -1."""
    none = np.full(len(pid), -1, dtype=np.int64)
    if not ex.has(RUNTIME, "start", "correlationId", "globalTid") or len(pid) == 0:
        return none, none.copy()
    rt = ex.read(f'SELECT start, globalTid, correlationId FROM "{RUNTIME}" WHERE correlationId IS NOT NULL',
                 ["start", "tid", "corr"])
    if len(rt["start"]) == 0:
        return none, none.copy()
    row = _row_lookup(pid_of(rt["tid"]), rt["corr"], pid, corr)
    found = row >= 0
    row = np.where(found, row, 0)
    return np.where(found, rt["start"][row], -1), np.where(found, rt["tid"][row] & TID_MASK, -1)


GPU_INT_COLUMNS = ["pid", "start", "end", "device", "stream", "correlation_id", "launch_start", "launch_tid"]


def _read_gpu_ops(ex: NsysExport) -> dict:
    """All GPU activity of one export as columns (see the module docstring for their meaning)."""
    parts = [f for f in (_read_gpu_table(ex, KERNEL, 0), _read_gpu_table(ex, MEMCPY, 1),
                         _read_gpu_table(ex, MEMSET, 2)) if f is not None]
    if not parts:
        cols = {c: np.zeros(0, dtype=np.int64) for c in GPU_INT_COLUMNS}
        return {**cols, "name": pd.Categorical([]), "kind": np.zeros(0, dtype=np.int8)}
    cols = {c: np.concatenate([p[c] for p in parts]) for c in parts[0] if c != "name"}
    cols["name"] = union_categoricals([p["name"] for p in parts])
    cols["launch_start"], cols["launch_tid"] = _launches(ex, cols["pid"], cols["correlation_id"])
    return cols


def _read_nvtx(ex: NsysExport) -> pd.DataFrame:
    """Raw NVTX rows (ranges, marks, domain creations); `text` is always a string ('' when NULL)."""
    cols = ["start", "end", "event_type", "text", "tid", "end_tid", "domain_id", "payload"]
    if not ex.has(NVTX, "start", "eventType"):
        return pd.DataFrame({c: pd.Series(dtype=object if c == "text" else np.int64) for c in cols})
    text = ex.column(NVTX, "text")
    if ex.has(NVTX, "textId") and ex.has("StringIds", "id", "value"):
        text = f"COALESCE({text}, (SELECT value FROM StringIds s WHERE s.id = n.textId), '')"
    else:
        text = f"COALESCE({text}, '')"
    exprs = ["start", ex.column(NVTX, "end"), "eventType", text, ex.column(NVTX, "globalTid"),
             ex.column(NVTX, "endGlobalTid"), ex.column(NVTX, "domainId", "0"), _payload_expr(ex)]
    kinds = ", ".join(str(k) for k in [*NVTX_KINDS, NVTX_DOMAIN_CREATE])
    data = ex.read(f'SELECT {", ".join(exprs)} FROM "{NVTX}" n WHERE eventType IN ({kinds})', cols)
    return pd.DataFrame(data)


PAYLOAD_COLUMNS = ("int64Value", "uint64Value", "int32Value", "uint32Value")


def _payload_expr(ex: NsysExport) -> str:
    """SQL for a range's integer payload: the first non-NULL integer value column (NULL when none)."""
    present = [f'"{c}"' for c in PAYLOAD_COLUMNS if ex.has(NVTX, c)]
    return f"COALESCE({', '.join(present)}, NULL)" if present else "NULL"


def _texts(column: pd.Series) -> pd.Series:
    """NVTX texts as an object column of str: a column the reader typed as integers (no text in any
    row) becomes empty strings."""
    if pd.api.types.is_numeric_dtype(column.dtype):
        return pd.Series(np.full(len(column), "", dtype=object), dtype=object)
    return pd.Series(column.to_numpy(dtype=object, na_value=""), dtype=object)


def _shape_nvtx(raw: pd.DataFrame) -> pd.DataFrame:
    """Typed NVTX frame: domain names resolved, marks end where they start, open ranges dropped."""
    is_domain = raw["event_type"].to_numpy() == NVTX_DOMAIN_CREATE
    # domain ids are handed out per process: key them by (pid, id); id 0 is the default domain
    domain_key = (pid_of(raw["tid"].to_numpy()) << 32) | np.maximum(raw["domain_id"].to_numpy(), 0)
    domains = dict(zip(domain_key[is_domain].tolist(), raw["text"][is_domain].tolist(), strict=True))
    ev = raw[~is_domain]
    event_type = ev["event_type"].to_numpy()
    start, end = ev["start"].to_numpy(), ev["end"].to_numpy()
    end = np.where(event_type == 34, start, end)
    keep = end >= start  # a range never closed (end NULL -> -1) has no extent to measure
    tid = ev["tid"].to_numpy()
    end_tid = np.where(ev["end_tid"].to_numpy() >= 0, ev["end_tid"].to_numpy(), tid)
    frame = pd.DataFrame({
        "pid": pid_of(tid), "tid": tid_of(tid), "end_tid": tid_of(end_tid), "start": start, "end": end,
        "text": _texts(ev["text"]),
        "kind": pd.Categorical.from_codes(np.select([event_type == 59, event_type == 60], [0, 1], 2),
                                          categories=NVTX_KIND_NAMES),
        "domain": _categorical_names(domain_key[~is_domain], domains, missing=""),
        "payload": ev["payload"].to_numpy(),
    })
    return frame[keep].reset_index(drop=True)


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


def _load_part(path: Path, part: int) -> tuple[dict, pd.DataFrame, str, int, dict]:
    """(gpu columns, nvtx frame, nsys version, clock offset, target info) of one file; the file is
    closed after."""
    ex = NsysExport(path)
    try:
        ops = _read_gpu_ops(ex)
        ops["part"] = np.full(len(ops["start"]), part, dtype=np.int64)
        nvtx = _shape_nvtx(_read_nvtx(ex))
        nvtx.insert(0, "part", np.int64(part))
        return ops, nvtx, ex.version(), ex.clock_offset(), ex.target_info()
    except (sqlite3.DatabaseError, ValueError, TypeError, OverflowError) as e:
        # a damaged file can fail anywhere: in SQLite, or as values of the wrong type
        raise TraceError(f"{path}: corrupt or unreadable nsys export ({type(e).__name__}: {e})") from None
    finally:
        ex.conn.close()


def _shifted(values: np.ndarray, delta: int) -> np.ndarray:
    return np.where(values >= 0, values + delta, values) if delta else values


def _ops_frame(parts: list[dict]) -> pd.DataFrame:
    """The gpu_ops frame: columns of every file joined, sorted by (part, pid, device, start)."""
    cols = {c: np.concatenate([p[c] for p in parts]) for c in ["part", *GPU_INT_COLUMNS, "kind"]}
    names = union_categoricals([p["name"] for p in parts]) if len(parts) > 1 else parts[0]["name"]
    order = np.lexsort((cols["start"], cols["device"], cols["pid"], cols["part"]))
    frame = pd.DataFrame({c: cols[c][order] for c in ["part", "pid", "device", "stream", "start", "end",
                                                        "correlation_id", "launch_start", "launch_tid"]},
                         copy=False)  # the arrays are fresh: consolidating them would copy 1M rows again
    frame.insert(7, "name", pd.Categorical.from_codes(names.codes[order], categories=names.categories))
    frame.insert(8, "kind", pd.Categorical.from_codes(cols["kind"][order], categories=GPU_KINDS))
    return frame


def _number_ranks(ops: pd.DataFrame, nvtx: pd.DataFrame, meta: dict, implementation: str) -> pd.DataFrame:
    """One row per (part, pid, device); rank from `ddp.meta` when every rank has a distinct one, else device order."""
    if len(ops):
        ranks = ops[["part", "pid", "device"]].drop_duplicates()
    else:
        ranks = nvtx.loc[nvtx["kind"] != "mark", ["part", "pid"]].drop_duplicates().assign(device=-1)
    ranks = ranks.sort_values(["device", "part", "pid"]).reset_index(drop=True)
    from_meta = [meta.get((int(p), int(q)), {}).get("rank") for p, q in zip(ranks["part"], ranks["pid"], strict=True)]
    usable = all(isinstance(r, int) for r in from_meta) and len(set(from_meta)) == len(from_meta)
    ranks.insert(0, "rank", from_meta if usable else range(len(ranks)))
    ranks["implementation"] = implementation
    return ranks.sort_values("rank").reset_index(drop=True).astype({"rank": np.int64})


def load_trace(paths: str | Path | Iterable[str | Path], patterns: Patterns | None = None) -> Trace:
    """Load one export, or several one-rank exports of the same run merged onto one clock."""
    files = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not files:
        raise TraceError("no trace path given")
    patterns = patterns or Patterns()
    kineto = [is_kineto(p) for p in files]
    if any(kineto):  # torch.profiler JSON: its own reader, the same frames
        if not all(kineto):
            raise TraceError(f"{', '.join(map(str, files))}: cannot merge torch.profiler JSON with nsys exports")
        from analysis.kineto import load_kineto  # deferred: kineto.py builds on this module
        return load_kineto(files, patterns)
    loaded = [_load_part(p, i) for i, p in enumerate(files)]
    offsets = [part[3] for part in loaded]
    for (ops, nvtx, *_), offset in zip(loaded, offsets, strict=True):
        for c in ("start", "end", "launch_start"):
            ops[c] = _shifted(ops[c], offset - offsets[0])
        for c in ("start", "end"):
            nvtx[c] = _shifted(nvtx[c].to_numpy(), offset - offsets[0])
    ops = _ops_frame([part[0] for part in loaded])
    nvtx = pd.concat([part[1] for part in loaded], ignore_index=True) if len(loaded) > 1 else loaded[0][1]
    nvtx = nvtx.take(np.lexsort((nvtx["start"].to_numpy(), nvtx["pid"].to_numpy(), nvtx["part"].to_numpy())))
    nvtx = nvtx.reset_index(drop=True)
    label = ", ".join(str(p) for p in files)
    if len(ops) == 0 and not (nvtx["kind"] != "mark").any():
        raise TraceError(f"{label}: export holds neither GPU kernels nor NVTX ranges: nothing to measure")
    ops["is_comm"] = communication_mask(ops, nvtx, patterns)
    meta = _run_metadata(nvtx)
    implementation = next((str(m["implementation"]) for m in meta.values() if m.get("implementation")),
                          files[0].stem)
    return Trace(path=label, nsys_version=loaded[0][2], source="gpu" if len(ops) else "nvtx",
                 gpu_ops=ops, nvtx=nvtx, ranks=_number_ranks(ops, nvtx, meta, implementation),
                 meta=meta, implementation=implementation, info={i: part[4] for i, part in enumerate(loaded)})

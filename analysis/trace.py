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
    domain (domain name, "" for the default domain).
`ranks`    one row per rank, sorted by rank: rank, part, pid, device (-1 for NVTX-only traces),
    implementation. A rank is a (process, device) pair with GPU work; rank numbers come from the
    `ddp.meta {json}` mark of our runner when present, else from device order.
`meta`     {(part, pid): dict parsed from the `ddp.meta` mark}.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from analysis.errors import TraceError
from analysis.patterns import META_PREFIX, Patterns
from analysis.phases import communication_mask
from analysis.sqlite_read import check_sqlite_file, connect_readonly, read_columns, table_columns

KERNEL, MEMCPY, MEMSET = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME, NVTX = "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"
NSYS_TABLES = {KERNEL, MEMCPY, MEMSET, RUNTIME, NVTX, "StringIds", "ThreadNames", "PROCESSES",
               "META_DATA_EXPORT", "EXPORT_META_DATA", "TARGET_INFO_SESSION_START_TIME"}
NVTX_KINDS = {34: "mark", 59: "push_pop", 60: "start_end"}
NVTX_DOMAIN_CREATE = 75
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
              9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH", 13: "UVM DtoD"}
PID_MASK, TID_MASK = 0xFFFFFF, 0xFFFFFF


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


def pid_of(global_id: np.ndarray) -> np.ndarray:
    """Process id from an nsys globalTid/globalPid: <HW:8><VM:8><PID:24><TID:24>."""
    return np.where(global_id >= 0, (global_id >> 24) & PID_MASK, -1)


def tid_of(global_tid: np.ndarray) -> np.ndarray:
    return np.where(global_tid >= 0, global_tid & TID_MASK, -1)


class _Export:
    """An open export: its connection, tables and string table."""

    def __init__(self, path: Path):
        check_sqlite_file(path)
        self.path = path
        self.conn = connect_readonly(path)
        self.tables = table_columns(self.conn)
        if not self.tables:
            raise TraceError(f"{path}: empty SQLite database, not an nsys export")
        if not NSYS_TABLES & set(self.tables):
            raise TraceError(f"{path}: SQLite file but not an nsys export (none of its tables: {', '.join(sorted(NSYS_TABLES)[:4])}, ...)")
        self._strings: dict[int, str] | None = None

    def has(self, table: str, *columns: str) -> bool:
        return table in self.tables and all(c in self.tables[table] for c in columns)

    def column(self, table: str, name: str, fallback: str = "NULL") -> str:
        return f'"{name}"' if name in self.tables.get(table, ()) else fallback

    def read(self, sql: str, names: list[str]) -> dict[str, np.ndarray]:
        return read_columns(self.path, self.conn, sql, names)

    def strings(self) -> dict[int, str]:
        if self._strings is None:
            self._strings = {}
            if self.has("StringIds", "id", "value"):
                cols = self.read('SELECT id, value FROM StringIds', ["id", "value"])
                self._strings = dict(zip(cols["id"].tolist(), cols["value"].tolist()))
        return self._strings

    def version(self) -> str:
        for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            if self.has(table, "name", "value"):
                rows = dict(self.conn.execute(f'SELECT name, value FROM "{table}"').fetchall())
                for key in ("EXPORT_PRODUCT_VERSION", "EXPORT_PRODUCT_DATE"):
                    if rows.get(key):
                        return str(rows[key])
                versions = [str(v) for k, v in rows.items() if "VERSION" in str(k).upper() and v]
                if versions:
                    return versions[0]
        return "unknown"

    def clock_offset(self) -> int:
        """UTC ns minus trace-clock ns at session start (0 when the export does not say)."""
        table = "TARGET_INFO_SESSION_START_TIME"
        if not self.has(table, "utcEpochNs"):
            return 0
        clock = self.column(table, "systemClockNs", "0")
        row = self.conn.execute(f'SELECT utcEpochNs, {clock} FROM "{table}" LIMIT 1').fetchone()
        return 0 if row is None or row[0] is None else int(row[0]) - int(row[1] or 0)


def _categorical_names(ids: np.ndarray, strings: dict[int, str], prefix: str = "") -> pd.Categorical:
    """Map string ids (or inline strings) to a categorical without a per-row Python loop."""
    uniq, inverse = np.unique(ids, return_inverse=True)
    texts = [prefix + (strings.get(int(u), f"<string {u}>") if not isinstance(u, str) else u) for u in uniq]
    codes_of_uniq, categories = pd.factorize(pd.Series(texts, dtype=object))
    return pd.Categorical.from_codes(codes_of_uniq[inverse], categories=pd.Index(categories, dtype=object))


def _read_gpu_table(ex: _Export, table: str, kind: str) -> pd.DataFrame | None:
    if not ex.has(table, "start", "end"):
        return None
    name_col = {KERNEL: ex.column(KERNEL, "shortName", ex.column(KERNEL, "demangledName", "0")),
                MEMCPY: ex.column(MEMCPY, "copyKind", "0"), MEMSET: "0"}[table]
    cols = ["start", "end", "device", "stream", "correlation_id", "global_pid", "name_id"]
    exprs = ["start", '"end"', ex.column(table, "deviceId", "0"), ex.column(table, "streamId", "0"),
             ex.column(table, "correlationId"), ex.column(table, "globalPid"), name_col]
    data = ex.read(f'SELECT {", ".join(exprs)} FROM "{table}"', cols)
    if kind == "kernel":
        names = _categorical_names(data.pop("name_id"), ex.strings())
    elif kind == "memcpy":
        names = _categorical_names(data.pop("name_id"), {k: f"memcpy {v}" for k, v in COPY_KINDS.items()})
    else:
        data.pop("name_id")
        names = pd.Categorical(["memset"] * len(data["start"]))
    frame = pd.DataFrame({"pid": pid_of(data["global_pid"]), **{k: data[k] for k in cols[:5]}})
    frame["name"] = names
    frame["kind"] = kind
    return frame


def _attach_launches(ex: _Export, ops: pd.DataFrame) -> None:
    """launch_start/launch_tid: the runtime call with the same correlationId in the same process."""
    launch_start = np.full(len(ops), -1, dtype=np.int64)
    launch_tid = np.full(len(ops), -1, dtype=np.int64)
    if ex.has(RUNTIME, "start", "correlationId", "globalTid") and len(ops):
        rt = ex.read(f'SELECT start, globalTid, correlationId FROM "{RUNTIME}" WHERE correlationId IS NOT NULL',
                     ["start", "tid", "corr"])
        # one int64 key per (pid, correlationId): pid < 2^24, correlationId < 2^32
        rt_key = (pid_of(rt["tid"]) << 32) | (rt["corr"] & 0xFFFFFFFF)
        order = np.argsort(rt_key, kind="stable")
        rt_key = rt_key[order]
        op_key = (ops["pid"].to_numpy() << 32) | (ops["correlation_id"].to_numpy() & 0xFFFFFFFF)
        pos = np.minimum(np.searchsorted(rt_key, op_key), max(len(rt_key) - 1, 0))
        found = (len(rt_key) > 0) & (rt_key[pos] == op_key) & (ops["correlation_id"].to_numpy() >= 0)
        if len(rt_key):
            launch_start = np.where(found, rt["start"][order][pos], -1)
            launch_tid = np.where(found, tid_of(rt["tid"][order][pos]), -1)
    ops["launch_start"] = launch_start
    ops["launch_tid"] = launch_tid


def _read_gpu_ops(ex: _Export) -> pd.DataFrame:
    parts = [f for f in (_read_gpu_table(ex, KERNEL, "kernel"), _read_gpu_table(ex, MEMCPY, "memcpy"),
                         _read_gpu_table(ex, MEMSET, "memset")) if f is not None]
    if not parts:
        cols = ["pid", "start", "end", "device", "stream", "correlation_id", "name", "kind"]
        ops = pd.DataFrame({c: pd.Series(dtype=np.int64) for c in cols})
        ops["name"] = pd.Categorical([])
    else:
        ops = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        ops["name"] = ops["name"].astype("category")
    ops["kind"] = pd.Categorical(ops["kind"], categories=["kernel", "memcpy", "memset"])
    _attach_launches(ex, ops)
    return ops


def _read_nvtx(ex: _Export) -> pd.DataFrame:
    cols = ["start", "end", "event_type", "text", "tid", "end_tid", "domain_id"]
    if not ex.has(NVTX, "start", "eventType"):
        return pd.DataFrame({c: pd.Series(dtype=object if c == "text" else np.int64) for c in cols})
    text = ex.column(NVTX, "text")
    if ex.has(NVTX, "textId") and ex.has("StringIds", "id", "value"):
        text = f"COALESCE({text}, (SELECT value FROM StringIds s WHERE s.id = n.textId))"
    exprs = ["start", ex.column(NVTX, "end"), "eventType", text, ex.column(NVTX, "globalTid"),
             ex.column(NVTX, "endGlobalTid"), ex.column(NVTX, "domainId", "0")]
    kinds = ", ".join(str(k) for k in [*NVTX_KINDS, NVTX_DOMAIN_CREATE])
    data = ex.read(f'SELECT {", ".join(exprs)} FROM "{NVTX}" n WHERE eventType IN ({kinds})', cols)
    return pd.DataFrame(data)


def _shape_nvtx(raw: pd.DataFrame) -> pd.DataFrame:
    """Typed NVTX frame: domain names resolved, marks end where they start, open ranges dropped."""
    is_domain = raw["event_type"].to_numpy() == NVTX_DOMAIN_CREATE
    domains = dict(zip(raw["domain_id"][is_domain].tolist(), raw["text"][is_domain].tolist()))
    ev = raw[~is_domain]
    event_type = ev["event_type"].to_numpy()
    start, end = ev["start"].to_numpy(), ev["end"].to_numpy()
    end = np.where(event_type == 34, start, end)
    keep = end >= start  # a range never closed (end NULL -> -1) has no extent to measure
    tid = ev["tid"].to_numpy()
    end_tid = np.where(ev["end_tid"].to_numpy() >= 0, ev["end_tid"].to_numpy(), tid)
    frame = pd.DataFrame({
        "pid": pid_of(tid), "tid": tid_of(tid), "end_tid": tid_of(end_tid), "start": start, "end": end,
        "text": ev["text"].fillna("").astype(object).to_numpy(),
        "kind": pd.Categorical.from_codes(np.select([event_type == 59, event_type == 60], [0, 1], 2),
                                          categories=["push_pop", "start_end", "mark"]),
        "domain": pd.Categorical(ev["domain_id"].map(domains).fillna("").astype(object).to_numpy()),
    })
    return frame[keep].reset_index(drop=True)


def _run_metadata(nvtx: pd.DataFrame) -> dict:
    marks = nvtx[(nvtx["kind"] == "mark") & nvtx["text"].str.startswith(META_PREFIX)]
    meta = {}
    for part, pid, text in zip(marks["part"], marks["pid"], marks["text"]):
        try:
            meta[(int(part), int(pid))] = json.loads(text[len(META_PREFIX):])
        except json.JSONDecodeError:
            continue  # a malformed mark only costs us the rank numbering from metadata
    return meta


def _load_part(path: Path, part: int) -> tuple[_Export, pd.DataFrame, pd.DataFrame]:
    ex = _Export(path)
    ops = _read_gpu_ops(ex)
    nvtx = _shape_nvtx(_read_nvtx(ex))
    ops.insert(0, "part", np.int64(part))
    nvtx.insert(0, "part", np.int64(part))
    return ex, ops, nvtx


def _shift(frame: pd.DataFrame, columns: tuple[str, ...], delta: int) -> None:
    for c in columns:
        values = frame[c].to_numpy()
        frame[c] = np.where(values >= 0, values + delta, values)


def _number_ranks(ops: pd.DataFrame, nvtx: pd.DataFrame, meta: dict, implementation: str) -> pd.DataFrame:
    """One row per (part, pid, device); rank from `ddp.meta` when every rank has a distinct one, else device order."""
    if len(ops):
        ranks = ops[["part", "pid", "device"]].drop_duplicates()
    else:
        ranks = nvtx.loc[nvtx["kind"] != "mark", ["part", "pid"]].drop_duplicates().assign(device=-1)
    ranks = ranks.sort_values(["device", "part", "pid"]).reset_index(drop=True)
    from_meta = [meta.get((int(p), int(q)), {}).get("rank") for p, q in zip(ranks["part"], ranks["pid"])]
    usable = all(isinstance(r, int) for r in from_meta) and len(set(from_meta)) == len(from_meta)
    ranks.insert(0, "rank", from_meta if usable else range(len(ranks)))
    ranks["implementation"] = implementation
    return ranks.sort_values("rank").reset_index(drop=True).astype({"rank": np.int64})


def _sorted(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    order = np.lexsort([frame[k].to_numpy() for k in reversed(keys)])
    return frame.take(order).reset_index(drop=True)


def load_trace(paths: str | Path | Iterable[str | Path], patterns: Patterns | None = None) -> Trace:
    """Load one export, or several one-rank exports of the same run merged onto one clock."""
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not paths:
        raise TraceError("no trace path given")
    patterns = patterns or Patterns()
    loaded = [_load_part(p, i) for i, p in enumerate(paths)]
    offsets = [ex.clock_offset() for ex, _, _ in loaded]
    for (ex, ops, nvtx), offset in zip(loaded[1:], offsets[1:]):
        _shift(ops, ("start", "end", "launch_start"), offset - offsets[0])
        _shift(nvtx, ("start", "end"), offset - offsets[0])
    ops = pd.concat([o for _, o, _ in loaded], ignore_index=True) if len(loaded) > 1 else loaded[0][1]
    nvtx = pd.concat([n for _, _, n in loaded], ignore_index=True) if len(loaded) > 1 else loaded[0][2]
    label = ", ".join(str(p) for p in paths)
    if len(ops) == 0 and not (nvtx["kind"] != "mark").any():
        raise TraceError(f"{label}: export holds neither GPU kernels nor NVTX ranges: nothing to measure")
    ops = _sorted(ops, ["part", "pid", "device", "start"])
    nvtx = _sorted(nvtx, ["part", "pid", "start"])
    ops["is_comm"] = communication_mask(ops, nvtx, patterns)
    meta = _run_metadata(nvtx)
    implementation = next((str(m["implementation"]) for m in meta.values() if m.get("implementation")),
                          paths[0].stem)
    return Trace(path=label, nsys_version=loaded[0][0].version(), source="gpu" if len(ops) else "nvtx",
                 gpu_ops=ops, nvtx=nvtx, ranks=_number_ranks(ops, nvtx, meta, implementation),
                 meta=meta, implementation=implementation)

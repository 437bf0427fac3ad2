"""Write schema-true nsys SQLite exports for tests and benchmarks (no GPU, no nsys needed).

`NsysWriter` writes rows into the tables nsys 2022.4 ("2022") or 2026.2 ("2026") exports hold, with
their real column lists, NOT NULL defaults and id conventions (globalTid = <HW:8><VM:8><PID:24><TID:24>,
kernel names via StringIds, NVTX text inline or registered, 2022.4's EXPORT_META_DATA vs
META_DATA_EXPORT). `write_ddp_trace` builds a DDP-shaped multi-rank trace of any size, vectorised.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from analysis.trace.readers.nsys_db import (
    NVTX_EVENT_DOMAIN_CREATE,
    NVTX_EVENT_MARK,
    NVTX_EVENT_PUSH_POP,
    NVTX_EVENT_START_END,
)
from contract import META_PREFIX

GLOBAL_ID_BASE = 1 << 48  # hardware/VM bits as in real exports
SHARED = {
    "StringIds": [("id", "INTEGER NOT NULL PRIMARY KEY"), ("value", "TEXT NOT NULL")],
    "ThreadNames": [("nameId", "INTEGER NOT NULL"), ("priority", "INTEGER"), ("globalTid", "INTEGER")],
    "PROCESSES": [("globalPid", "INTEGER"), ("pid", "INTEGER"), ("name", "TEXT")],
    "CUPTI_ACTIVITY_KIND_RUNTIME": [
        ("start", "INTEGER NOT NULL"),
        ("end", "INTEGER NOT NULL"),
        ("eventClass", "INTEGER NOT NULL"),
        ("globalTid", "INTEGER"),
        ("correlationId", "INTEGER"),
        ("nameId", "INTEGER NOT NULL"),
        ("returnValue", "INTEGER NOT NULL"),
        ("callchainId", "INTEGER"),
    ],
}
_NVTX = [
    ("start", "INTEGER NOT NULL"),
    ("end", "INTEGER"),
    ("eventType", "INTEGER NOT NULL"),
    ("rangeId", "INTEGER"),
    ("category", "INTEGER"),
    ("color", "INTEGER"),
    ("text", "TEXT"),
    ("globalTid", "INTEGER"),
    ("endGlobalTid", "INTEGER"),
    ("textId", "INTEGER"),
    ("domainId", "INTEGER"),
    ("uint64Value", "INTEGER"),
    ("int64Value", "INTEGER"),
    ("doubleValue", "REAL"),
    ("uint32Value", "INTEGER"),
    ("int32Value", "INTEGER"),
    ("floatValue", "REAL"),
    ("jsonTextId", "INTEGER"),
    ("jsonText", "TEXT"),
]
_GPU_HEAD = [
    ("start", "INTEGER NOT NULL"),
    ("end", "INTEGER NOT NULL"),
    ("deviceId", "INTEGER NOT NULL"),
    ("contextId", "INTEGER NOT NULL"),
]
_GPU_IDS = [("streamId", "INTEGER NOT NULL"), ("correlationId", "INTEGER"), ("globalPid", "INTEGER")]
_LAUNCH = [
    ("registersPerThread", "INTEGER NOT NULL"),
    *[(f"{a}{d}", "INTEGER NOT NULL") for a in ("grid", "block") for d in "XYZ"],
    ("staticSharedMemory", "INTEGER NOT NULL"),
    ("dynamicSharedMemory", "INTEGER NOT NULL"),
    ("localMemoryPerThread", "INTEGER NOT NULL"),
    ("localMemoryTotal", "INTEGER NOT NULL"),
    ("gridId", "INTEGER NOT NULL"),
    ("sharedMemoryExecuted", "INTEGER"),
]
_COPY = [
    ("bytes", "INTEGER NOT NULL"),
    ("copyKind", "INTEGER NOT NULL"),
    ("deprecatedSrcId", "INTEGER"),
    ("srcKind", "INTEGER"),
    ("dstKind", "INTEGER"),
    ("srcDeviceId", "INTEGER"),
    ("srcContextId", "INTEGER"),
    ("dstDeviceId", "INTEGER"),
    ("dstContextId", "INTEGER"),
    ("migrationCause", "INTEGER"),
    ("graphNodeId", "INTEGER"),
    ("virtualAddress", "INTEGER"),
]
_SET = [
    ("value", "INTEGER NOT NULL"),
    ("bytes", "INTEGER NOT NULL"),
    ("graphNodeId", "INTEGER"),
    ("memKind", "INTEGER"),
]
_META = [("name", "TEXT NOT NULL"), ("value", "TEXT")]
SCHEMAS = {
    "2022": {
        **SHARED,
        "NVTX_EVENTS": _NVTX,
        "CUPTI_ACTIVITY_KIND_KERNEL": [
            *_GPU_HEAD,
            *_GPU_IDS,
            ("demangledName", "INTEGER NOT NULL"),
            ("shortName", "INTEGER NOT NULL"),
            ("launchType", "INTEGER"),
            ("cacheConfig", "INTEGER"),
            *_LAUNCH,
            ("graphNodeId", "INTEGER"),
            ("sharedMemoryLimitConfig", "INTEGER"),
        ],
        "CUPTI_ACTIVITY_KIND_MEMCPY": [*_GPU_HEAD, *_GPU_IDS, *_COPY],
        "CUPTI_ACTIVITY_KIND_MEMSET": [*_GPU_HEAD, *_GPU_IDS, *_SET],
        "TARGET_INFO_SESSION_START_TIME": [("utcEpochNs", "INTEGER"), ("utcTime", "TEXT"), ("localTime", "TEXT")],
        "EXPORT_META_DATA": _META,
    },
    "2026": {
        **SHARED,
        "NVTX_EVENTS": [*_NVTX, ("binaryData", "TEXT")],
        "CUPTI_ACTIVITY_KIND_KERNEL": [
            *_GPU_HEAD,
            ("greenContextId", "INTEGER"),
            *_GPU_IDS,
            ("demangledName", "INTEGER NOT NULL"),
            ("shortName", "INTEGER NOT NULL"),
            ("mangledName", "INTEGER"),
            ("launchType", "INTEGER"),
            ("cacheConfig", "INTEGER"),
            *_LAUNCH,
            ("graphNodeId", "INTEGER"),
            ("sharedMemoryLimitConfig", "INTEGER"),
            ("graphId", "INTEGER"),
            ("tensorSizeMinusOneElements", "TEXT NOT NULL"),
        ],
        "CUPTI_ACTIVITY_KIND_MEMCPY": [
            *_GPU_HEAD,
            ("greenContextId", "INTEGER"),
            *_GPU_IDS,
            *_COPY,
            ("copyCount", "INTEGER"),
        ],
        "CUPTI_ACTIVITY_KIND_MEMSET": [*_GPU_HEAD, ("greenContextId", "INTEGER"), *_GPU_IDS, *_SET],
        "TARGET_INFO_SESSION_START_TIME": [
            ("utcEpochNs", "INTEGER"),
            ("utcTime", "TEXT"),
            ("localTime", "TEXT"),
            ("systemClockNs", "INTEGER"),
        ],
        "META_DATA_EXPORT": _META,
    },
}
VERSIONS = {"2022": "2022.4.2.1", "2026": "2026.2.1.210"}
CUPTI = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
)
# NVTX_EVENTS.eventType values, as the nsys reader names them
MARK, PUSH_POP, START_END = NVTX_EVENT_MARK, NVTX_EVENT_PUSH_POP, NVTX_EVENT_START_END
DOMAIN_CREATE = NVTX_EVENT_DOMAIN_CREATE
CUDA_LAUNCH_KERNEL, CUDA_MEMCPY_ASYNC = "cudaLaunchKernel", "cudaMemcpyAsync"


def global_tid(pid: ArrayLike, tid: ArrayLike | None = None) -> np.ndarray:
    """nsys serialized id: <HW:8><VM:8><PID:24><TID:24> (globalPid when tid is None)."""
    pid = np.asarray(pid, dtype=np.int64)
    return GLOBAL_ID_BASE + (pid << 24) + (0 if tid is None else np.asarray(tid, dtype=np.int64))


class NsysWriter:
    """Buffers rows per table (scalars broadcast, arrays vectorised) and writes them on `close()`.

    flavour "2022" or "2026"; cupti=False leaves out the CUPTI tables like a CPU-only export;
    shuffle=True writes rows in random order (nsys does not promise any order).
    """

    def __init__(
        self,
        path: str | Path,
        flavour: str = "2026",
        cupti: bool = True,
        shuffle: bool = False,
        session_start_utc_ns: int = 1_779_782_330_176_752_435,
        system_clock_ns: int = 0,
        seed: int = 0,
    ):
        if flavour not in SCHEMAS:
            raise ValueError(f"flavour={flavour!r}: expected one of {sorted(SCHEMAS)}")
        self.path, self.flavour, self.shuffle = Path(path), flavour, shuffle
        self.tables = {t: cols for t, cols in SCHEMAS[flavour].items() if cupti or t not in CUPTI}
        self._rows: dict[str, list[dict[str, np.ndarray]]] = {t: [] for t in self.tables}
        self._strings: dict[str, int] = {}
        self._next_corr: dict[int, int] = {}
        self._rng = np.random.default_rng(seed)
        clock = {"systemClockNs": system_clock_ns} if flavour == "2026" else {}
        self.add("TARGET_INFO_SESSION_START_TIME", utcEpochNs=session_start_utc_ns, **clock)
        meta = "EXPORT_META_DATA" if flavour == "2022" else "META_DATA_EXPORT"
        self.add(
            meta,
            name=np.array(["EXPORT_PRODUCT_NAME", "EXPORT_PRODUCT_VERSION"], dtype=object),
            value=np.array(["NVIDIA Nsight Systems", VERSIONS[flavour]], dtype=object),
        )

    def string_id(self, text: str) -> int:
        if text not in self._strings:
            self._strings[text] = len(self._strings) + 1
        return self._strings[text]

    def add(self, table: str, **columns: ArrayLike | None) -> None:
        """Append rows: each column a scalar or an array (all arrays the same length)."""
        given = {k: v for k, v in columns.items() if v is not None}  # None: leave the column NULL
        n = max([np.size(v) for v in given.values() if np.ndim(v) > 0] or [1])
        self._rows[table].append(
            {
                k: np.broadcast_to(np.asarray(v, dtype=object if isinstance(v, str) else None), (n,))
                for k, v in given.items()
            }
        )

    def correlation_ids(self, pid: int, n: int) -> np.ndarray:
        first = self._next_corr.get(pid, 1)
        self._next_corr[pid] = first + n
        return np.arange(first, first + n, dtype=np.int64)

    def process(self, pid: int, name: str = "python3", threads: dict[int, str] | None = None) -> None:
        self.add("PROCESSES", globalPid=int(global_tid(pid)), pid=pid, name=name)
        for tid, thread in (threads or {pid: name}).items():
            self.add("ThreadNames", nameId=self.string_id(thread), priority=0, globalTid=int(global_tid(pid, tid)))

    def kernels(
        self,
        pid: int,
        tid: ArrayLike,
        device: ArrayLike,
        stream: ArrayLike,
        start: ArrayLike,
        end: ArrayLike,
        name: ArrayLike,
        launch: ArrayLike | None = None,
        launch_api: str = CUDA_LAUNCH_KERNEL,
    ) -> np.ndarray:
        """Kernels and, where launch (CPU start time of the launch call) is given (>= 0), their runtime rows."""
        names = np.broadcast_to(np.asarray(name, dtype=object), np.shape(start))
        uniq, inverse = np.unique(names, return_inverse=True)
        ids = np.array([self.string_id(str(u)) for u in uniq], dtype=np.int64)[inverse.reshape(-1)]
        corr = self.correlation_ids(pid, np.size(start))
        extra = {"tensorSizeMinusOneElements": ""} if self.flavour == "2026" else {}
        self.add(
            "CUPTI_ACTIVITY_KIND_KERNEL",
            start=start,
            end=end,
            deviceId=device,
            contextId=1,
            streamId=stream,
            correlationId=corr,
            globalPid=int(global_tid(pid)),
            demangledName=ids,
            shortName=ids,
            gridId=corr,
            **extra,
        )
        self._runtime(pid, tid, corr, launch, launch_api)
        return corr

    def memcpy(
        self,
        pid: int,
        tid: ArrayLike,
        device: ArrayLike,
        stream: ArrayLike,
        start: ArrayLike,
        end: ArrayLike,
        copy_kind: int = 8,
        launch: ArrayLike | None = None,
    ) -> np.ndarray:
        corr = self.correlation_ids(pid, np.size(start))
        self.add(
            "CUPTI_ACTIVITY_KIND_MEMCPY",
            start=start,
            end=end,
            deviceId=device,
            contextId=1,
            streamId=stream,
            correlationId=corr,
            globalPid=int(global_tid(pid)),
            bytes=1024,
            copyKind=copy_kind,
        )
        self._runtime(pid, tid, corr, launch, CUDA_MEMCPY_ASYNC)
        return corr

    def memset(
        self,
        pid: int,
        tid: ArrayLike,
        device: ArrayLike,
        stream: ArrayLike,
        start: ArrayLike,
        end: ArrayLike,
        launch: ArrayLike | None = None,
    ) -> None:
        corr = self.correlation_ids(pid, np.size(start))
        self.add(
            "CUPTI_ACTIVITY_KIND_MEMSET",
            start=start,
            end=end,
            deviceId=device,
            contextId=1,
            streamId=stream,
            correlationId=corr,
            globalPid=int(global_tid(pid)),
            value=0,
            bytes=1024,
        )
        self._runtime(pid, tid, corr, launch, "cudaMemsetAsync")

    def _runtime(self, pid: int, tid: ArrayLike, corr: np.ndarray, launch: ArrayLike | None, api: str) -> None:
        if launch is None:
            return
        launch = np.broadcast_to(np.asarray(launch, dtype=np.int64), corr.shape)
        has = launch >= 0
        tids = np.broadcast_to(np.asarray(tid, dtype=np.int64), corr.shape)[has]
        self.add(
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            start=launch[has],
            end=launch[has] + 2_000,
            eventClass=0,
            globalTid=global_tid(pid, tids),
            correlationId=corr[has],
            nameId=self.string_id(api),
            returnValue=0,
        )

    def nvtx(
        self,
        pid: int,
        tid: ArrayLike,
        start: ArrayLike,
        end: ArrayLike | None,
        text: ArrayLike,
        kind: int = PUSH_POP,
        end_tid: ArrayLike | None = None,
        registered: bool = False,
        domain_id: int = 0,
        payload: ArrayLike | None = None,
        payload_column: str = "int64Value",
    ) -> None:
        """NVTX ranges/marks; registered=True stores text in StringIds (textId) like nsys 2022.4 does.

        payload (scalar or array, None: no payload) goes into `payload_column` (int64Value or uint64Value),
        the value column nsys fills for an integer NVTX payload."""
        texts = np.broadcast_to(np.asarray(text, dtype=object), np.shape(start) or (1,))
        if registered:
            uniq, inverse = np.unique(texts, return_inverse=True)
            ids = np.array([self.string_id(str(u)) for u in uniq], dtype=np.int64)[inverse.reshape(-1)]
            text_cols = {"textId": ids}
        else:
            text_cols = {"text": texts}
        end_gtid = None if end_tid is None else global_tid(pid, end_tid)
        if payload is not None:
            text_cols[payload_column] = np.asarray(payload, dtype=np.int64)
        self.add(
            "NVTX_EVENTS",
            start=start,
            end=None if kind == MARK else end,
            eventType=kind,
            globalTid=global_tid(pid, tid),
            endGlobalTid=end_gtid,
            domainId=domain_id,
            **text_cols,
        )

    def domain(self, pid: int, tid: int, t: int, name: str, domain_id: int) -> None:
        self.add(
            "NVTX_EVENTS",
            start=t,
            end=None,
            eventType=DOMAIN_CREATE,
            globalTid=int(global_tid(pid, tid)),
            text=name,
            domainId=domain_id,
        )

    def meta_mark(self, pid: int, tid: int, t: int, **meta: object) -> None:
        """Our runner's `ddp.meta {json}` mark."""
        self.nvtx(pid, tid, t, None, META_PREFIX + json.dumps(meta), kind=MARK)

    def close(self) -> Path:
        """Create the tables and write every buffered row (an existing file at path is replaced)."""
        if self.path.exists():
            self.path.unlink()
        if self._strings:
            self.add(
                "StringIds",
                id=np.array(list(self._strings.values()), dtype=np.int64),
                value=np.array(list(self._strings), dtype=object),
            )
        conn = sqlite3.connect(self.path)
        try:
            for table, cols in self.tables.items():
                conn.execute(f'CREATE TABLE "{table}" ({", ".join(f"{c} {t}" for c, t in cols)})')
                self._write_table(conn, table, cols)
            conn.commit()
        finally:
            conn.close()
        return self.path

    def _write_table(self, conn: sqlite3.Connection, table: str, cols: list[tuple[str, str]]) -> None:
        rows: list[tuple] = []
        for chunk in self._rows[table]:
            n = len(next(iter(chunk.values())))
            values = [
                chunk[name].tolist()
                if name in chunk
                else [0] * n
                if decl.startswith("INTEGER NOT NULL")
                else [""] * n
                if "NOT NULL" in decl
                else [None] * n
                for name, decl in cols
            ]
            rows.extend(zip(*values, strict=True))
        if self.shuffle:
            rows = [rows[i] for i in self._rng.permutation(len(rows))]
        conn.executemany(f'INSERT INTO "{table}" VALUES ({", ".join("?" * len(cols))})', rows)

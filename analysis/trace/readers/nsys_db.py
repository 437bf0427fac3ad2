"""An open nsys SQLite export: which tables and columns it has, its strings, version and clock.

Knows the nsys conventions shared by every schema version from 2022.4 on: table names, the
serialized globalTid/globalPid (<HW:8><VM:8><PID:24><TID:24>), StringIds, the export metadata table
(META_DATA_EXPORT, or EXPORT_META_DATA in 2022.4), TARGET_INFO_SESSION_START_TIME and the
target description (TARGET_INFO_GPU, TARGET_INFO_SYSTEM_ENV) where the export has them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from analysis.errors import TraceError
from analysis.trace.readers.sqlite_chunks import read_table, read_workers, start_chunks, table_chunks
from analysis.trace.readers.sqlite_read import check_sqlite_file, connect_readonly, read_columns, table_columns

KERNEL_TABLE, MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE, RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX_TABLE = "NVTX_EVENTS"
# NVTX_EVENTS.eventType values read (NvtxEventType in the nsys export schema)
NVTX_EVENT_MARK, NVTX_EVENT_PUSH_POP, NVTX_EVENT_START_END, NVTX_EVENT_DOMAIN_CREATE = 34, 59, 60, 75
NSYS_TABLES = {
    KERNEL_TABLE,
    MEMCPY_TABLE,
    MEMSET_TABLE,
    RUNTIME_TABLE,
    NVTX_TABLE,
    "StringIds",
    "ThreadNames",
    "PROCESSES",
    "META_DATA_EXPORT",
    "EXPORT_META_DATA",
    "TARGET_INFO_SESSION_START_TIME",
}
PID_MASK, TID_MASK = 0xFFFFFF, 0xFFFFFF
GPU_TABLES = (KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE)
Select = tuple[str, list[str], list[str], "str | None", dict]  # table, expressions, names, where, narrow


def pid_of(global_id: np.ndarray) -> np.ndarray:
    """Process id from an nsys globalTid/globalPid: <HW:8><VM:8><PID:24><TID:24> (-1 stays -1)."""
    pid = (global_id >> 24) & PID_MASK
    return pid if global_id.size == 0 or global_id.min() >= 0 else np.where(global_id >= 0, pid, -1)


def tid_of(global_tid: np.ndarray) -> np.ndarray:
    return np.where(global_tid >= 0, global_tid & TID_MASK, -1)


class NsysExport:
    """An open export: read-only connection, its tables and columns, string table, version and clock.
    `start_reading` starts its large tables' first chunks on threads of its own, which its reads take."""

    def __init__(self, path: Path, head: bytes | None = None):
        check_sqlite_file(path, head)  # head: the first bytes, when the file was sniffed (trace/readers/sniff.py)
        self.path, self.head = path, head
        self.conn = connect_readonly(path)
        self.tables = table_columns(self.conn)
        if not self.tables:
            raise TraceError(f"{path}: empty SQLite database, not an nsys export")
        if not NSYS_TABLES & set(self.tables):
            raise TraceError(
                f"{path}: an SQLite file but not an nsys export (no NVTX_EVENTS, CUPTI_* or StringIds tables)"
            )
        self._strings: dict[int, str] | None = None
        self._ahead: dict[str, Future] = {}  # chunk reads started by start_reading, by query
        self._ahead_pool: ThreadPoolExecutor | None = None

    def start_reading(self) -> None:
        """Start reading the first chunks of the tables that grow with the trace (large_selects), on
        threads of this export's, so that they read while the caller does other work (the commands
        import the analysis meanwhile: cli.open_from_args); the reads below take them."""
        if self._ahead_pool is None:
            self._ahead_pool = ThreadPoolExecutor(read_workers(), thread_name_prefix="sqlite-ahead")
            for select in self.large_selects():
                self._ahead.update(start_chunks(self._ahead_pool, self.path, self.conn, *select))

    def close(self) -> None:
        """Close the connection; chunks started and never taken are dropped (one still reading ends first)."""
        if self._ahead_pool is not None:
            self._ahead_pool.shutdown(wait=True, cancel_futures=True)
            self._ahead_pool = None
            self._ahead.clear()
        self.conn.close()

    def has(self, table: str, *columns: str) -> bool:
        return table in self.tables and all(c in self.tables[table] for c in columns)

    def column(self, table: str, name: str, fallback: str = "NULL") -> str:
        return f'"{name}"' if name in self.tables.get(table, ()) else fallback

    def read(self, sql: str, names: list[str], narrow: dict[str, type] | None = None) -> dict[str, np.ndarray]:
        return read_columns(self.path, self.conn, sql, names, narrow=narrow)

    def read_table(
        self, table: str, exprs: list[str], names: list[str], where: str | None = None, narrow: dict | None = None
    ) -> dict[str, np.ndarray]:
        """A large table's SELECT, read in rowid chunks on several threads (sqlite_chunks.py)."""
        return read_table(self.path, self.conn, table, exprs, names, where, narrow, ahead=self._ahead)

    def chunks(
        self, table: str, exprs: list[str], names: list[str], where: str | None = None, narrow: dict | None = None
    ) -> Iterator[dict]:
        """The same, chunk by chunk in rowid order, for a reader that folds each into its result."""
        return table_chunks(self.path, self.conn, table, exprs, names, where, narrow, ahead=self._ahead)

    def gpu_select(self, table: str) -> Select | None:
        """How a CUPTI activity table (GPU_TABLES) is read: start, end, device, stream, correlation_id,
        global_pid (-1 where NULL: pid_of makes it the pid) and name_id (a kernel's shortName StringId, a
        copy's copyKind, 0 for a memset); None when the export lacks the table."""
        if not self.has(table, "start", "end"):
            return None
        name = {
            KERNEL_TABLE: self.column(KERNEL_TABLE, "shortName", self.column(KERNEL_TABLE, "demangledName", "0")),
            MEMCPY_TABLE: self.column(MEMCPY_TABLE, "copyKind", "0"),
            MEMSET_TABLE: "0",
        }[table]
        exprs = [
            "start",
            '"end"',
            self.column(table, "deviceId", "0"),
            self.column(table, "streamId", "0"),
            self.column(table, "correlationId"),
            # read raw, its pid cut out by pid_of in numpy: a CASE expression per row cost SQLite 28% more
            self.column(table, "globalPid", "-1"),
            name,
        ]
        names = ["start", "end", "device", "stream", "correlation_id", "global_pid", "name_id"]
        return table, exprs, names, None, dict.fromkeys(["device", "stream", "correlation_id", "name_id"], np.int32)

    def runtime_select(self) -> Select | None:
        """How the CUDA runtime calls are read for the launch join: start, tid (globalTid), corr; None
        when the export lacks them."""
        if not self.has(RUNTIME_TABLE, "start", "correlationId", "globalTid"):
            return None
        exprs = ["start", "globalTid", "correlationId"]
        return RUNTIME_TABLE, exprs, ["start", "tid", "corr"], "correlationId IS NOT NULL", {}

    def large_selects(self) -> list[Select]:
        """The reads of the tables that grow with the trace, in the order the reader makes them."""
        found = [self.gpu_select(t) for t in GPU_TABLES] + [self.runtime_select()]
        return [s for s in found if s is not None]

    def strings(self) -> dict[int, str]:
        if self._strings is None:
            self._strings = {}
            if self.has("StringIds", "id", "value"):
                cols = self.read("SELECT id, value FROM StringIds", ["id", "value"])
                self._strings = dict(zip(cols["id"].tolist(), cols["value"].tolist(), strict=True))
        return self._strings

    def threads_named(self, regex: str) -> tuple[np.ndarray, np.ndarray]:
        """(pid, tid) of the threads whose ThreadNames name matches (re.search); empty when none or no table."""
        if not self.has("ThreadNames", "nameId", "globalTid"):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        cols = self.read("SELECT globalTid, nameId FROM ThreadNames", ["globalTid", "nameId"])
        strings, pattern = self.strings(), re.compile(regex)
        names = np.array([strings.get(int(i), "") for i in cols["nameId"].tolist()], dtype=object)
        hit = np.array([pattern.search(str(n)) is not None for n in names], dtype=bool)  # a few dozen threads
        gtid = cols["globalTid"].astype(np.int64)[hit]
        return pid_of(gtid), tid_of(gtid)

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

    def target_info(self) -> dict:
        """What the export says about the machine: {"gpus": {device id: {name, uuid}}, "driver",
        "cuda_driver", "hostname", "nsys_version"}; keys the export lacks are left out. Without an NVIDIA
        driver (NvDriverVersion 0 on a machine with no GPU) there is no driver and no CUDA driver: the
        CudaDriverVersion nsys reports there is its own bundled CUDA's, not the machine's."""
        info: dict = {"nsys_version": self.version()}
        if self.has("TARGET_INFO_GPU", "id", "name"):
            uuid = self.column("TARGET_INFO_GPU", "uuid")
            rows = self.conn.execute(f"SELECT id, name, {uuid} FROM TARGET_INFO_GPU").fetchall()
            info["gpus"] = {int(i): {"name": str(n), "uuid": u} for i, n, u in rows if i is not None}
        if self.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
            env = dict(
                self.conn.execute(
                    "SELECT name, value FROM TARGET_INFO_SYSTEM_ENV WHERE name IN "
                    "('NvDriverVersion', 'CudaDriverVersion', 'Hostname')"
                ).fetchall()
            )
            driver = str(env.get("NvDriverVersion") or "")
            if driver not in ("", "0"):
                info["driver"] = driver
                cuda = str(env.get("CudaDriverVersion") or "")
                if cuda.isdigit():  # CUDA's encoding: 1000 * major + 10 * minor
                    info["cuda_driver"] = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"
            if env.get("Hostname"):
                info["hostname"] = str(env["Hostname"])
        return info

"""The NVTX rows of an nsys export (NVTX_EVENTS): `read_nvtx` reads push/pop and start/end ranges, marks
and domain creations; `shape_nvtx` turns them into the typed `nvtx` frame (trace/frames.py) of one part:
domain names resolved per process, marks ending where they start, ranges never closed dropped, the
integer payload from whichever value column is set. `declared_implementations(path)`: the implementations
an export's `ddp.meta` marks declare, without reading the trace (for commands that accept only some
strategies and should say so before loading a whole file).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.errors import TraceError
from analysis.trace.build_frames import categorical_names
from analysis.trace.frames import NVTX_KIND_NAMES, NVTX_MARK, NVTX_PUSH_POP, NVTX_START_END
from analysis.trace.readers.nsys_db import (
    NVTX_EVENT_DOMAIN_CREATE,
    NVTX_EVENT_MARK,
    NVTX_EVENT_PUSH_POP,
    NVTX_EVENT_START_END,
    NVTX_TABLE,
    NsysExport,
    pid_of,
    tid_of,
)
from analysis.trace.readers.sqlite_read import connect_readonly, table_columns
from contract import META_PREFIX, decode_meta

NVTX_EVENTS_READ = (NVTX_EVENT_MARK, NVTX_EVENT_PUSH_POP, NVTX_EVENT_START_END, NVTX_EVENT_DOMAIN_CREATE)


def read_nvtx(ex: NsysExport) -> pd.DataFrame:
    """Raw NVTX rows (ranges, marks, domain creations); `text` is always a string ('' when NULL)."""
    cols = ["start", "end", "event_type", "text", "tid", "end_tid", "domain_id", "payload"]
    if not ex.has(NVTX_TABLE, "start", "eventType"):
        return pd.DataFrame({c: pd.Series(dtype=object if c == "text" else np.int64) for c in cols})
    text = ex.column(NVTX_TABLE, "text")
    if ex.has(NVTX_TABLE, "textId") and ex.has("StringIds", "id", "value"):
        text = f"COALESCE({text}, (SELECT value FROM StringIds s WHERE s.id = n.textId), '')"
    else:
        text = f"COALESCE({text}, '')"
    exprs = [
        "start",
        ex.column(NVTX_TABLE, "end"),
        "eventType",
        text,
        ex.column(NVTX_TABLE, "globalTid"),
        ex.column(NVTX_TABLE, "endGlobalTid"),
        ex.column(NVTX_TABLE, "domainId", "0"),
        _payload_expr(ex),
    ]
    kinds = ", ".join(str(k) for k in NVTX_EVENTS_READ)
    data = ex.read(f'SELECT {", ".join(exprs)} FROM "{NVTX_TABLE}" n WHERE eventType IN ({kinds})', cols)
    return pd.DataFrame(data)


PAYLOAD_COLUMNS = ("int64Value", "uint64Value", "int32Value", "uint32Value")


def _payload_expr(ex: NsysExport) -> str:
    """SQL for a range's integer payload: the first non-NULL integer value column, else -1 (what the
    reader makes of a NULL anyway; a NULL would leave connectorx no type to infer from a first row
    without a payload, and the whole read would fall back to sqlite3, 3x slower)."""
    present = [f'"{c}"' for c in PAYLOAD_COLUMNS if ex.has(NVTX_TABLE, c)]
    return f"COALESCE({', '.join(present)}, -1)" if present else "-1"


def _texts(column: pd.Series) -> pd.Series:
    """NVTX texts as an object column of str: a column the reader typed as integers (no text in any
    row) becomes empty strings."""
    if pd.api.types.is_numeric_dtype(column.dtype):
        return pd.Series(np.full(len(column), "", dtype=object), dtype=object)
    return pd.Series(column.to_numpy(dtype=object, na_value=""), dtype=object)


def shape_nvtx(raw: pd.DataFrame) -> pd.DataFrame:
    """Typed NVTX frame: domain names resolved, marks end where they start, open ranges dropped."""
    is_domain = raw["event_type"].to_numpy() == NVTX_EVENT_DOMAIN_CREATE
    # domain ids are handed out per process: key them by (pid, id); id 0 is the default domain
    domain_key = (pid_of(raw["tid"].to_numpy()) << 32) | np.maximum(raw["domain_id"].to_numpy(), 0)
    domains = dict(zip(domain_key[is_domain].tolist(), raw["text"][is_domain].tolist(), strict=True))
    ev = raw[~is_domain]
    event_type = ev["event_type"].to_numpy()
    start, end = ev["start"].to_numpy(), ev["end"].to_numpy()
    end = np.where(event_type == NVTX_EVENT_MARK, start, end)
    kind = np.select(
        [event_type == NVTX_EVENT_PUSH_POP, event_type == NVTX_EVENT_START_END],
        [NVTX_PUSH_POP, NVTX_START_END],
        NVTX_MARK,
    )
    keep = end >= start  # a range never closed (end NULL -> -1) has no extent to measure
    tid = ev["tid"].to_numpy()
    end_tid = np.where(ev["end_tid"].to_numpy() >= 0, ev["end_tid"].to_numpy(), tid)
    frame = pd.DataFrame(
        {
            "pid": pid_of(tid),
            "tid": tid_of(tid),
            "end_tid": tid_of(end_tid),
            "start": start,
            "end": end,
            "text": _texts(ev["text"]),
            "kind": pd.Categorical.from_codes(kind, categories=NVTX_KIND_NAMES),
            "domain": categorical_names(domain_key[~is_domain], domains, missing=""),
            "payload": ev["payload"].to_numpy(),
        }
    )
    return frame[keep].reset_index(drop=True)


MARKS = """
SELECT COALESCE(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
WHERE COALESCE(e.text, s.value) LIKE ? LIMIT 64
"""


def declared_implementations(path: str | Path) -> set[str]:
    """The `implementation` of every `ddp.meta` mark of an nsys SQLite export; empty for other files
    (torch.profiler JSON, a file that is not SQLite) or an export without such marks."""
    path = Path(path)
    if path.suffix != ".sqlite" or not path.is_file():
        return set()
    try:
        conn = connect_readonly(path)
    except (TraceError, sqlite3.Error, OSError):
        return set()  # the reader says what is wrong with the file when it is loaded
    try:
        tables = table_columns(conn)
        if "NVTX_EVENTS" not in tables or "StringIds" not in tables:
            return set()
        rows = conn.execute(MARKS, (META_PREFIX + "%",)).fetchall()
    except (TraceError, sqlite3.Error):
        return set()
    finally:
        conn.close()
    metas = (decode_meta(text) for (text,) in rows)
    return {str(m["implementation"]) for m in metas if m and m.get("implementation")}

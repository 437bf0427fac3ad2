"""The implementations an nsys SQLite export declares in its `ddp.meta` marks, without reading the trace:
for commands that accept only some strategies and should say so before loading a whole file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from analysis.errors import TraceError
from analysis.trace.readers.sqlite_read import connect_readonly, table_columns
from contract import META_PREFIX, decode_meta

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

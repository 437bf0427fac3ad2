"""A Trace written to a folder and read back as it was: `save_trace(trace, folder)`, `read_saved(folder)`.

Generic over the Trace's fields, so a frame or column added to `Trace` is stored with no change here:
every DataFrame field is an Arrow IPC file `<field>.arrow` (pyarrow, zstd-compressed, read back
memory-mapped), every other field goes to `fields.json`, its dicts with their key types (meta is keyed by
(part, pid) tuples, info by int parts) written as tagged pairs. Each column's pandas dtype (object or
str, a categorical's categories) is recorded and restored, so a frame read back equals the one written,
dtypes included. No pickle: a folder beside a shared export must not be able to run code in whoever
reads it.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from analysis.machine import release_free_memory
from analysis.trace.frames import Trace

FIELDS = "fields.json"
# zstd: the 1M-kernel 8-rank export's gpu_ops in 10.6 MB instead of 82 MB, read back in no more CPU time
# (0.10 s against 0.20 s uncompressed, pyarrow 26)
COMPRESSION = "zstd"


def _encode(value: Any) -> Any:
    """value as JSON that _decode turns back into it: dicts and tuples tagged, numpy scalars as Python's."""
    if isinstance(value, dict):
        return {"__dict__": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} in the trace cache")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "__dict__" in value:
            return {_decode(k): _decode(v) for k, v in value["__dict__"]}
        return tuple(_decode(v) for v in value["__tuple__"])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _dtypes(frame: pd.DataFrame) -> dict[str, Any]:
    """Each column's dtype as text; a categorical's as its categories' dtype and whether ordered."""
    out: dict[str, Any] = {}
    for name, dtype in frame.dtypes.items():
        if isinstance(dtype, pd.CategoricalDtype):
            out[str(name)] = {"categories": str(dtype.categories.dtype), "ordered": bool(dtype.ordered)}
        else:
            out[str(name)] = str(dtype)
    return out


def _restore(frame: pd.DataFrame, dtypes: dict[str, Any]) -> pd.DataFrame:
    """frame with each column cast back to its recorded dtype where Arrow read it as another."""
    for name, want in dtypes.items():
        col = frame[name]
        if isinstance(want, dict):
            cats = col.cat.categories
            if str(cats.dtype) != want["categories"]:
                col = col.cat.set_categories(cats.astype(want["categories"]))
            frame[name] = col
        elif str(col.dtype) != want:
            frame[name] = col.astype(want)
    return frame


def save_trace(trace: Trace, folder: Path) -> None:
    """Write every field of `trace` into `folder` (which must exist and be empty)."""
    small: dict[str, Any] = {}
    dtypes: dict[str, Any] = {}
    for f in fields(trace):
        value = getattr(trace, f.name)
        if isinstance(value, pd.DataFrame):
            if not isinstance(value.index, pd.RangeIndex) or value.index.start != 0 or value.index.step != 1:
                raise TypeError(f"cannot store the trace's {f.name}: its index is not 0..n-1")
            table = pa.Table.from_pandas(value, preserve_index=False)
            options = pa.ipc.IpcWriteOptions(compression=COMPRESSION if pa.Codec.is_available(COMPRESSION) else None)
            with (
                pa.OSFile(str(folder / f"{f.name}.arrow"), "wb") as sink,
                pa.ipc.new_file(sink, table.schema, options=options) as w,
            ):
                w.write_table(table)
            dtypes[f.name] = _dtypes(value)
        else:
            small[f.name] = _encode(value)
    (folder / FIELDS).write_text(json.dumps({"fields": small, "dtypes": dtypes}))
    _release_buffers()


def _release_buffers() -> None:
    """Hand back what writing the tables freed: a pool that keeps freed pages for its next allocations
    (mimalloc, pyarrow's default, or jemalloc) is told to release them, which the analysis after the
    store would never reuse (about 200 MB on the 10M-kernel export); then glibc's free heap
    (machine.release_free_memory)."""
    pa.default_memory_pool().release_unused()
    release_free_memory()


def read_saved(folder: Path) -> Trace:
    """The Trace save_trace wrote into `folder` (an OSError or ValueError when it is not all there)."""
    doc = json.loads((folder / FIELDS).read_text())
    values = {name: _decode(v) for name, v in doc["fields"].items()}
    for name, dtypes in doc["dtypes"].items():
        with pa.memory_map(str(folder / f"{name}.arrow")) as source:
            # a column at a time, each Arrow buffer let go once converted, numeric ones taken as they are: reading
            # a 10M-kernel load back held it twice (1.75 GB at its peak, now 1.12 GB; the export read afresh, 1.13)
            table = pa.ipc.open_file(source).read_all()
            frame = table.to_pandas(split_blocks=True, self_destruct=True)
            del table
        values[name] = _restore(frame, dtypes)
    return Trace(**values)

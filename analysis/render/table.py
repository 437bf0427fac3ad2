"""One printer for every CLI: result frames as an aligned table, CSV or JSON (plain Python values)."""

from __future__ import annotations

import json
import math

import pandas as pd


def plain_records(frame: pd.DataFrame, columns: list[str] | None = None) -> list[dict]:
    """Result rows as dicts of plain Python values (JSON- and sqlite3-safe: numpy scalars -> Python,
    NaN/NA -> None), for `columns` (default all) in that order; one pass over the (few) result rows."""
    columns = list(frame.columns) if columns is None else columns
    return [
        {c: _plain(v) for c, v in zip(columns, row, strict=True)}
        for row in frame[columns].itertuples(index=False, name=None)
    ]


def _plain(value):
    """JSON-safe scalar: numpy -> Python, NaN/NA -> None."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def heading(column: str) -> str:
    """A column's table heading: step_ms -> "step ms", busbw_gbps -> "busbw GB/s"."""
    return column.replace("_gbps", " GB/s").replace("_ms", " ms").replace("_", " ")


def format_table(frame: pd.DataFrame, names: dict[str, str] | None = None, headings: bool = True) -> str:
    """An aligned text table: floats with 3 decimals, missing values as '-', "(none)" for no rows;
    columns named by `names`, else (headings) by `heading`, else as they are."""
    if frame.empty:
        return "(none)"
    names = names or {}
    if headings or names:
        frame = frame.rename(columns={c: names.get(c, heading(c) if headings else c) for c in frame})
    return _dashed(frame).to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-")


def _dashed(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with the missing values of nullable columns (Int64, boolean: to_string prints <NA>)
    as '-', like na_rep does for float and object columns."""
    nullable = [c for c in frame if pd.api.types.is_extension_array_dtype(frame[c]) and frame[c].isna().any()]
    if not nullable:
        return frame
    return frame.assign(**{c: frame[c].astype(object).where(frame[c].notna(), "-") for c in nullable})


def print_frame(
    frame: pd.DataFrame, fmt: str, names: dict[str, str] | None = None, headings: bool = True, indent: int | None = None
) -> None:
    """The frame on stdout as `fmt`: table (format_table), csv (every column), json (a list of records)."""
    if fmt == "json":
        print(json.dumps(plain_records(frame), indent=indent))
    elif fmt == "csv":
        print(frame.to_csv(index=False), end="")
    else:
        print(format_table(frame, names, headings))

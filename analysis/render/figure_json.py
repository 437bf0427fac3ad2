"""A figure as the dict plotly.io serialises, made without Figure.to_dict's cost.

to_dict deep-copies the whole figure, then walks it replacing every array with plotly.js's typed-array
spec (base64), passing each array through narwhals on the way: for a report's figures that cost more
than the JSON encoding itself. plotly_dict builds the same dict (same keys, same order, same values)
as new containers around the figure's own values, never modifying them, and converts plain numeric
numpy arrays directly; any other array goes through plotly's own conversion. A test compares the HTML
with plotly's for figures holding every kind of value the report draws.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import plotly.graph_objects as go
from _plotly_utils.basevalidators import is_homogeneous_array
from _plotly_utils.utils import is_skipped_key, plotlyjsShortTypes, to_typed_array_spec

_SCALARS = frozenset({str, int, float, bool, type(None)})  # never arrays, nothing inside to convert
# The narrowest signed/unsigned type a 64-bit integer array fits in, as to_typed_array_spec picks it.
_NARROWER = {
    "int64": (np.int8, np.int16, np.int32),
    "uint64": (np.uint8, np.uint16, np.uint32),
}


def plotly_dict(fig: go.Figure) -> dict[str, Any]:
    """What fig.to_dict() returns, as fresh containers sharing the figure's leaves (read-only use)."""
    res: dict[str, Any] = {"data": [_converted(t) for t in fig._data], "layout": _converted(fig._layout)}
    frames = [_converted(frame._props) for frame in fig._frame_objs]
    if frames:
        res["frames"] = frames
    return res


def _converted(obj: Any) -> Any:
    """obj with each dict value that is an array (outside plotly's skipped keys) as its typed-array spec,
    as _plotly_utils.utils.convert_to_base64 leaves it; containers are new, leaves shared."""
    if type(obj) in _SCALARS:
        return obj
    if isinstance(obj, dict):
        return {k: v if is_skipped_key(k) else _value(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_converted(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_converted(v) for v in obj)
    return obj


def _value(v: Any) -> Any:
    """A dict's value converted: an array (as plotly's is_homogeneous_array sees it) typed, else walked."""
    if type(v) in _SCALARS:
        return v
    if isinstance(v, np.ndarray) or is_homogeneous_array(v):
        return _typed(v)
    return _converted(v)


def _typed(v: Any) -> Any:
    """to_typed_array_spec(v), computed directly for a non-empty numpy array of numbers or of strings
    (strings: the array itself, which the JSON encoder writes as its tolist(), as it writes the object
    array plotly makes of it)."""
    if not isinstance(v, np.ndarray) or v.dtype.kind not in "uifUO" or v.size == 0:
        return to_typed_array_spec(v)
    if v.dtype.kind in "UO":
        return v
    dtype = str(v.dtype)
    if dtype in _NARROWER:
        low, high = v.min(), v.max()
        fits = [t for t in _NARROWER[dtype] if np.iinfo(t).min <= low and high <= np.iinfo(t).max]
        if not fits:
            return v.copy()
        v = v.astype(fits[0])
        dtype = str(v.dtype)
    if dtype not in plotlyjsShortTypes:
        return v.copy()
    spec = {"dtype": plotlyjsShortTypes[dtype], "bdata": base64.b64encode(np.ascontiguousarray(v)).decode("ascii")}
    if v.ndim > 1:
        spec["shape"] = str(v.shape)[1:-1]
    return spec

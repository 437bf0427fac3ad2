"""The run's metadata: nsys traces carry it in an NVTX mark `ddp.meta {json}` (one per rank, at the start of
the captured region), torch.profiler traces in the top-level JSON key `ddp.meta`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

META_PREFIX = "ddp.meta "  # the mark's text: this prefix, then one line of JSON (an object)
META_KEY = "ddp.meta"  # the top-level key of a torch.profiler (Kineto) JSON trace
# torch.profiler traces: our recorder's async ranges are `user_annotation` events with args {ddp.kind: start_end}
ASYNC_KIND_KEY = "ddp.kind"
ASYNC_KIND = "start_end"


def encode_meta(meta: Mapping[str, Any]) -> str:
    """The text of the metadata mark: `ddp.meta ` then compact, key-sorted JSON (non-JSON values as str)."""
    return META_PREFIX + json.dumps(dict(meta), sort_keys=True, separators=(",", ":"), default=str)


def decode_meta(text: str) -> dict | None:
    """The metadata of a mark's text; None when it is not a `ddp.meta` mark, its JSON is malformed or not an object."""
    if not isinstance(text, str) or not text.startswith(META_PREFIX):
        return None
    try:
        value = json.loads(text[len(META_PREFIX) :])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None

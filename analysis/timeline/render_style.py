"""Categories of timeline segments, their colours (from palette.py) and legend labels, shared by every
panel and page.

A colour belongs to a category, never to a trace or a panel. Compute (GPU kernels and the CPU's
phase ranges) is coloured by its phase, so backward work is orange on every lane; communication
(GPU kernels and CPU comm ranges) by its collective; the overlap strip by hidden or exposed.
"""

from __future__ import annotations

from collections.abc import Collection

from analysis.render import palette
from contract import BACKWARD, FORWARD, GRAD_SYNC, OPTIMIZER

PHASE_CATEGORIES = (FORWARD, BACKWARD, OPTIMIZER, GRAD_SYNC)
COMM_CATEGORIES = tuple(f"comm:{c}" for c in palette.COLLECTIVE_COLOURS)
HIDDEN, EXPOSED = "hidden", "exposed"

# Draw order and legend order are list order.
CATEGORY_COLOURS: dict[str, str] = {
    "step": palette.STEP,  # CPU: the step range
    **{p: palette.PHASE_COLOURS[p] for p in PHASE_CATEGORIES},  # CPU phases; GPU compute launched in them
    "compute": palette.PHASE_COLOURS["other"],  # GPU compute launched outside the phases
    "memory": palette.MEMORY,  # GPU: memcpy / memset
    **{f"comm:{c}": colour for c, colour in palette.COLLECTIVE_COLOURS.items()},  # CPU comm ranges, GPU comm
    "nvtx": palette.OTHER_NVTX,  # CPU: any other NVTX range (framework ops, library ranges)
    HIDDEN: palette.HIDDEN_COMM,  # overlap strip: communication with compute under it
    EXPOSED: palette.EXPOSED_COMM,  # overlap strip: communication with no compute under it
}

CATEGORY_LABELS: dict[str, str] = {
    "step": "step",
    FORWARD: FORWARD,
    BACKWARD: BACKWARD,
    OPTIMIZER: OPTIMIZER,
    GRAD_SYNC: f"{GRAD_SYNC} (CPU wait)",
    "compute": "compute outside the phases",
    "memory": "memcpy/memset",
    **{f"comm:{c}": label for c, label in palette.COLLECTIVE_LABELS.items()},
    "nvtx": "other NVTX range",
    HIDDEN: "comm hidden under compute",
    EXPOSED: "comm exposed",
}


def comm_category(name: str) -> str:
    """The comm category of a collective's op, range or kernel name (comm:all_reduce, ...)."""
    return f"comm:{palette.collective_of(name)}"


def category_colour(category: str) -> str:
    """Colour of a category; unknown categories fall back to the 'other NVTX' grey."""
    return CATEGORY_COLOURS.get(category, CATEGORY_COLOURS["nvtx"])


def category_order(categories: Collection[str]) -> list[str]:
    """Categories sorted into draw order (known ones first, in the table's order)."""
    known = [c for c in CATEGORY_COLOURS if c in set(categories)]
    return known + sorted(set(categories) - set(known))

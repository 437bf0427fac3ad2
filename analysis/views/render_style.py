"""Categories of timeline segments and their fixed colours, shared by every panel and page.

A colour belongs to a category, never to a trace or a panel, so "red" means communication in
every timeline and every report this project writes.
"""

from __future__ import annotations

from collections.abc import Collection

from contract import BACKWARD, FORWARD, GRAD_SYNC, OPTIMIZER

# Draw order is list order: later categories are drawn on top.
CATEGORY_COLOURS: dict[str, str] = {
    "step": "#9e9e9e",  # CPU: the step range
    FORWARD: "#4e79a7",  # CPU: forward phase (categories named after the contract's ranges)
    BACKWARD: "#f28e2b",  # CPU: backward phase
    OPTIMIZER: "#59a14f",  # CPU: optimizer phase
    GRAD_SYNC: "#b07aa1",  # CPU: finish_gradient_synchronization()
    "comm": "#e15759",  # CPU: comm:<op>:<tag> ranges (blocking or in-flight async)
    "nvtx": "#c9c9c9",  # CPU: any other NVTX range (framework ops, library ranges)
    "compute": "#1f77b4",  # GPU: compute kernels
    "comm_kernel": "#d62728",  # GPU: communication kernels (NCCL and friends)
    "memory": "#8c564b",  # GPU: memcpy / memset
}
OVERLAP_COLOUR = "rgba(44, 160, 44, 0.28)"  # shading where communication overlaps compute
OVERLAP_LINE = "rgba(44, 160, 44, 0.9)"

CATEGORY_LABELS: dict[str, str] = {
    "step": "step (CPU)",
    FORWARD: f"{FORWARD} (CPU)",
    BACKWARD: f"{BACKWARD} (CPU)",
    OPTIMIZER: f"{OPTIMIZER} (CPU)",
    GRAD_SYNC: f"{GRAD_SYNC} (CPU)",
    "comm": "comm range (CPU)",
    "nvtx": "other NVTX (CPU)",
    "compute": "compute kernel (GPU)",
    "comm_kernel": "comm kernel (GPU)",
    "memory": "memcpy/memset (GPU)",
}

PHASE_CATEGORIES = (FORWARD, BACKWARD, OPTIMIZER, GRAD_SYNC)


def category_colour(category: str) -> str:
    """Colour of a category; unknown categories fall back to the 'other NVTX' grey."""
    return CATEGORY_COLOURS.get(category, CATEGORY_COLOURS["nvtx"])


def category_order(categories: Collection[str]) -> list[str]:
    """Categories sorted into draw order (known ones first, in the table's order)."""
    known = [c for c in CATEGORY_COLOURS if c in set(categories)]
    return known + sorted(set(categories) - set(known))

"""Whether a multi-rank trace's communication was recognised, and if not, what might be it.

A run of several ranks communicates; when no kernel matched the comm-kernel pattern and no host range
the comm-range pattern, the figures would silently say `comm 0`. `unrecognised_comm_note` says so
instead, naming the kernel families (a kernel's name up to its last `::`, or up to its template and
argument list) with the most GPU time, those whose names sound like communication first, and the option
that names them.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from analysis.frames.patterns import Patterns
from analysis.frames.trace import GPU_KERNEL, NS_PER_MS, Trace
from analysis.measures.phases import codes, ranges_named

SHOWN = 3  # kernel families named in the note
# words in kernel names of communication libraries we have no pattern for (EP dispatch/combine, p2p, ...)
COMM_WORDS = re.compile(
    r"(?i)dispatch|combine|send|recv|comm|p2p|all_?to_?all|gather|scatter|all_?reduce|barrier|broadcast|exchange|shmem"
)
_STEM = re.compile(r"^(?:void\s+)?([^<(]*)")


def kernel_family(name: str) -> str:
    """`void deep_ep::internode::dispatch<...>(...)` -> `deep_ep::internode`; `ampere_sgemm_128x64_tn` stays."""
    stem = _STEM.match(name.strip())
    text = (stem.group(1) if stem else name).strip() or name
    return text.rsplit("::", 1)[0] if "::" in text else text


def kernel_time_by_family(ops: pd.DataFrame) -> pd.Series:
    """GPU time (ns) of the kernels per kernel family, largest first; each distinct name is parsed once."""
    kernels = ops[codes(ops["kind"]) == GPU_KERNEL]
    names = kernels["name"].astype("category")
    family = np.array([kernel_family(str(c)) for c in names.cat.categories] or [""], dtype=object)
    per_kernel = family[np.maximum(names.cat.codes.to_numpy(), 0)]
    duration = (kernels["end"] - kernels["start"]).to_numpy()
    return pd.Series(duration, index=per_kernel).groupby(level=0).sum().sort_values(ascending=False, kind="stable")


def suspects(time_by_family: pd.Series, n: int = SHOWN) -> pd.Series:
    """The n families to name: those whose names sound like communication first, then by time."""
    commish = np.array([COMM_WORDS.search(f) is not None for f in time_by_family.index], dtype=bool)
    ordered = pd.concat([time_by_family[commish], time_by_family[~commish]])
    return ordered.iloc[:n]


def unrecognised_comm_note(trace: Trace, patterns: Patterns, world: int) -> str:
    """'' when the run has one rank or its communication was recognised; else the note (module docstring)."""
    if max(world, len(trace.ranks)) <= 1:
        return ""
    ops = trace.gpu_ops
    if len(ops) and bool(ops["is_comm"].to_numpy().any()):
        return ""
    if len(ranges_named(trace.nvtx, patterns.regex("comm_range"))):
        return ""
    head = f"no communication recognised in a run of {max(world, len(trace.ranks))} ranks"
    named = suspects(kernel_time_by_family(ops)) if len(ops) else pd.Series(dtype=np.int64)
    if not len(named):
        return f"{head}: no comm range matched; name the ranges of its collectives with --comm-range-pattern REGEX"
    listed = ", ".join(f"{family} ({ns / NS_PER_MS:.3f} ms)" for family, ns in named.items())
    return (
        f"{head}; kernel families with the most time that might be communication: {listed}; "
        "if they are, name them with --comm-pattern REGEX"
    )

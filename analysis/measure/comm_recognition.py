"""Whether a multi-rank trace's communication was recognised, and if not, what might be it.

A run of several ranks communicates; when no kernel matched the comm-kernel pattern and no host range
the comm-range pattern, the figures would silently say `comm 0`. `comm_note` says so
instead, naming the kernel families (a kernel's name up to its last `::`, or up to its template and
argument list) with the most GPU time, those whose names sound like communication first, and the option
that names them. It is written from a CommEvidence: a loaded trace's (`comm_evidence`), or a run's files'
merged (`merged_evidence`, for files analysed one by one), so every mode says the same.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.measure.phases import codes, ranges_named
from analysis.trace.frames import GPU_KERNEL, NS_PER_MS, Trace
from analysis.trace.patterns import Patterns

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


@dataclass(frozen=True)
class CommEvidence:
    """What the note is written from, for a trace or a run's files together: how many ranks, whether any
    communication kernel or range was recognised, and (when none was) the GPU time per kernel family."""

    ranks: int
    recognised: bool
    family_ns: pd.Series


def comm_evidence(trace: Trace, patterns: Patterns) -> CommEvidence:
    """The trace's CommEvidence; the kernel families are only summed when nothing was recognised."""
    ops = trace.gpu_ops
    recognised = bool(len(ops) and ops["is_comm"].to_numpy().any())
    recognised = recognised or bool(len(ranges_named(trace.nvtx, patterns.regex("comm_range"))))
    families = kernel_time_by_family(ops) if len(ops) and not recognised else pd.Series(dtype=np.int64)
    return CommEvidence(len(trace.ranks), recognised, families)


def merged_evidence(parts: Sequence[CommEvidence]) -> CommEvidence:
    """The evidence of one run's files together (each file read alone): their ranks, recognised when any
    file's communication was, the families' times summed across files (what a one-piece load sums)."""
    recognised = any(p.recognised for p in parts)
    times = [p.family_ns for p in parts if len(p.family_ns)]
    families = pd.Series(dtype=np.int64)
    if times and not recognised:
        summed = pd.concat(times).groupby(level=0).sum()
        families = summed.sort_values(ascending=False, kind="stable")
    return CommEvidence(sum(p.ranks for p in parts), recognised, families)


def comm_note(evidence: CommEvidence, world: int) -> str:
    """'' when the run has one rank or its communication was recognised; else the note (module docstring).
    The one wording of the note, for a run loaded in one piece or merged from its files' evidence."""
    ranks = max(world, evidence.ranks)
    if ranks <= 1 or evidence.recognised:
        return ""
    head = f"no communication recognised in a run of {ranks} ranks"
    named = suspects(evidence.family_ns) if len(evidence.family_ns) else pd.Series(dtype=np.int64)
    if not len(named):
        return f"{head}: no comm range matched; name the ranges of its collectives with --comm-range-pattern REGEX"
    listed = ", ".join(f"{family} ({ns / NS_PER_MS:.3f} ms)" for family, ns in named.items())
    return (
        f"{head}; kernel families with the most time that might be communication: {listed}; "
        "if they are, name them with --comm-pattern REGEX"
    )


def unrecognised_comm_note(trace: Trace, patterns: Patterns, world: int) -> str:
    """comm_note of the trace's own evidence ('' for one rank or recognised communication)."""
    if max(world, len(trace.ranks)) <= 1:
        return ""  # no families to sum
    return comm_note(comm_evidence(trace, patterns), world)

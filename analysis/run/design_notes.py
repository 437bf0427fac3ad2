"""Notes on figures a run's strategy or backend decides before anything is measured.

A 0% overlap reads as a failure unless the reader knows it is by construction: naive and flat
communicate after backward by design, FSDP2 on gloo issues its collectives synchronously, ranks that
share a GPU do not own its time. The notes come from the run's own metadata (the implementation, the
backend and the ranks sharing a GPU that ddp.meta and the export record), one line each, and every page
and table that shows the figures prints them beside the figures.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

AFTER_BACKWARD = {
    "naive": "naive all-reduces each gradient after backward, one blocking call at a time",
    "flat": "flat all-reduces one flat buffer of every gradient after backward, in one blocking call",
}


def design_notes(implementation: object, backend: object, shared_gpus: object) -> list[str]:
    """The notes for one run: `implementation` and `backend` as ddp.meta recorded them, `shared_gpus` the
    summary's 'ranks,sharing; ...' text (None/NaN when no ranks share a GPU)."""
    notes = []
    if implementation in AFTER_BACKWARD:
        notes.append(f"{AFTER_BACKWARD[implementation]}: no overlap with backward, by design")
    if implementation == "torch_fsdp" and isinstance(backend, str) and backend.lower() == "gloo":
        notes.append(
            "torch_fsdp on gloo: FSDP2 issues its all-gathers and reduce-scatters synchronously there (its "
            "streams are CUDA's), so none of its communication can overlap compute; on NCCL it can"
        )
    if isinstance(shared_gpus, str) and shared_gpus:
        notes.append(
            f"ranks {shared_gpus} share one GPU: their compute and idle are not exclusive GPU time, and one "
            "rank's kernels slow the other's"
        )
    return notes


def summary_notes(summary: pd.DataFrame) -> list[list[str]]:
    """design_notes for each row of an analysis summary (one row per run)."""
    return [
        design_notes(row.get("implementation"), row.get("backend"), row.get("shared_gpus"))
        for row in summary.to_dict("records")
    ]


def labelled(labels: Sequence[str], notes: Sequence[Sequence[str]]) -> list[str]:
    """One line per distinct note, after the labels of every run it applies to ("a, b: note"), in the
    order of their first run: five runs of ranks sharing one GPU read as one line, not five."""
    runs: dict[str, list[str]] = {}
    for label, said in zip(labels, notes, strict=True):
        for note in said:
            runs.setdefault(note, []).append(label)
    return [f"{', '.join(names)}: {note}" for note, names in runs.items()]

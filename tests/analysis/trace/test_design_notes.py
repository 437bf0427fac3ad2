"""Design notes: the figures a run's strategy, backend or shared GPUs decide, from its metadata."""

from __future__ import annotations

import pandas as pd

from analysis.trace.run_info import design_notes, labelled, summary_notes


def test_after_backward_strategies_say_so_and_the_overlapping_ones_say_nothing():
    for impl in ("naive", "flat"):
        (note,) = design_notes(impl, "gloo", None)
        assert note.startswith(impl) and "after backward" in note and "by design" in note
    for impl in ("overlap", "overlap_bucket", "torch", "fsdp"):
        assert design_notes(impl, "gloo", None) == [] and design_notes(impl, "nccl", None) == []


def test_torch_fsdp_is_synchronous_on_gloo_only():
    (note,) = design_notes("torch_fsdp", "gloo", None)
    assert "synchronously" in note and "gloo" in note
    assert design_notes("torch_fsdp", "nccl", None) == [] and design_notes("torch_fsdp", None, None) == []


def test_shared_gpus_from_the_summary_text_and_every_run_its_own():
    notes = design_notes("overlap", "nccl", "0,1; 2,3")
    assert len(notes) == 1 and notes[0].startswith("ranks 0,1; 2,3 share one GPU")
    summary = pd.DataFrame(
        [
            {"implementation": "flat", "backend": "gloo", "shared_gpus": None},
            {"implementation": "torch_fsdp", "backend": "gloo", "shared_gpus": "0,1"},
            {"implementation": "torch", "backend": "nccl", "shared_gpus": float("nan")},
        ]
    )
    flat, fsdp, torch = summary_notes(summary)
    assert len(flat) == 1 and len(fsdp) == 2 and torch == []


def test_a_note_every_run_shares_is_one_line_naming_them_all():
    """Five runs on one shared GPU read as one line after the five labels; a run's own note stays its own."""
    notes = summary_notes(
        pd.DataFrame(
            [
                {"implementation": impl, "backend": "nccl", "shared_gpus": "0,1"}
                for impl in ("flat", "torch", "naive", "overlap_bucket", "overlap")
            ]
        )
    )
    lines = labelled(["flat", "torch", "naive", "overlap_bucket", "overlap"], notes)
    shared = [line for line in lines if "share one GPU" in line]
    assert shared == ["flat, torch, naive, overlap_bucket, overlap: " + notes[0][-1]]
    assert [line.split(":")[0] for line in lines if "by design" in line] == ["flat", "naive"]
    assert len(lines) == 3

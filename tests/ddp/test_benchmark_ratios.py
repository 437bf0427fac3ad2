"""ddp.benchmark's closing ratio lines: ours against PyTorch's, for each pair present in the sweep."""

from __future__ import annotations

from ddp.benchmark_rows import summary_line


def _row(impl: str, ms: float, bucket: float | None, batch: int = 16) -> dict:
    return {
        "implementation": impl,
        "collective": "torch",
        "batch_size": batch,
        "context_length": 128,
        "bucket_mb": bucket,
        "avg_step_time_ms": ms,
    }


def test_one_line_per_pair_with_matching_rows():
    rows = [_row("overlap_bucket", 300.0, 25), _row("torch", 200.0, 25), _row("fsdp", 90.0, None)]
    rows += [_row("torch_fsdp", 60.0, None), _row("torch_fsdp", 50.0, None, batch=32)]  # no fsdp at batch 32
    assert summary_line(rows).splitlines() == [
        "overlap_bucket / torch step time: 1.50 (batch 16, context 128, bucket 25 MiB)",
        "fsdp / torch_fsdp step time: 1.50 (batch 16, context 128)",
    ]


def test_nothing_when_no_pair_ran():
    assert summary_line([_row("fsdp", 90.0, None), _row("torch", 1.0, 25)]) == ""

"""A small real recording through `run_nsys.sh`, as the end-to-end tests make it: CPU ranks, batch 8 x 64."""

from __future__ import annotations

from pathlib import Path

from tests.support import owned

REPO = Path(__file__).resolve().parents[1]


def record(impls: list[str], out: Path, steps: int, warmup: int, *extra: str, timeout_s: float = 400):
    """Run `bash run_nsys.sh IMPLS... EXTRA... --gpus 0 -o OUT` for a small run; return the finished process
    (every process it started ended, whatever happened: tests/support/owned.py)."""
    cmd = ["bash", str(REPO / "run_nsys.sh"), *impls, *extra, "--gpus", "0", "-o", str(out)]
    cmd += ["--steps", str(steps), "--warmup", str(warmup), "--batch-size", "8", "--context-length", "64"]
    return owned.run([*cmd, "--format", "json"], timeout=timeout_s, capture_output=True, text=True, cwd=REPO)

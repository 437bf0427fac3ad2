"""A small real recording through `run_nsys.sh`, as the end-to-end tests make it: CPU ranks, batch 8 x 64."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def record(impls: list[str], out: Path, steps: int, warmup: int, *extra: str, timeout_s: float = 400):
    """Run `bash run_nsys.sh IMPLS... EXTRA... --gpus 0 -o OUT` for a small run; return the finished process."""
    cmd = ["bash", str(REPO / "run_nsys.sh"), *impls, *extra, "--gpus", "0", "-o", str(out)]
    cmd += ["--steps", str(steps), "--warmup", str(warmup), "--batch-size", "8", "--context-length", "64"]
    return subprocess.run([*cmd, "--format", "json"], capture_output=True, text=True, timeout=timeout_s, cwd=REPO)

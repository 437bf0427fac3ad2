"""What the two what-if validation scripts (advise_validation.py, shard_advise_validation.py) share: running
a recording or a benchmark from the repository root, and the run options both take."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def say(line: str) -> None:
    """A progress line on stderr, prefixed with the running script's name."""
    print(f"[{Path(sys.argv[0]).stem}] {line}", file=sys.stderr, flush=True)


def run(cmd: list[str], timeout_s: float = 3600) -> str:
    """`cmd`'s stdout, run from the repository root; exits naming the command and its stderr's end when it fails."""
    say(" ".join(cmd))
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"failed (exit {done.returncode}): {' '.join(cmd)}\n{done.stderr[-2000:]}")
    return done.stdout


def shape(args: argparse.Namespace) -> list[str]:
    """The run's options, the same for the recording and the benchmark."""
    return [
        "--model", args.model, "--world-size", str(args.world_size), "--steps", str(args.steps),
        "--warmup", str(args.warmup), "--batch-size", str(args.batch_size),
        "--context-length", str(args.context_length),
    ]  # fmt: skip

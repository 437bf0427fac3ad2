"""The real H100 traces of ../shared/data/gpu_h100/ (xz), decompressed once and kept between test runs.

Tests take the `gpu_trace` fixture (tests/conftest.py) and call it with a file name such as
"naive.sqlite"; the test is skipped when ../shared/data/gpu_h100 is absent (a clone without it).
"""

from __future__ import annotations

import lzma
import os
import shutil
from pathlib import Path

GPU_H100 = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "gpu_h100"
GPU_H200 = GPU_H100.parent / "gpu_h200"  # fsdp_bf16 and torch on one H200 (PROVENANCE.md)

# ms/step printed by each run's own timer (PROVENANCE.md, section gpu_h100): the truth for step times.
RUN_TIMER_MS = {
    "naive.sqlite": 165.7,
    "flat.sqlite": 151.8,
    "overlap.sqlite": 232.8,
    "overlap_bucket.sqlite": 203.2,
    "torch.sqlite": 153.1,
    "naive.rank0.sqlite": 175.4,
    "naive.rank1.sqlite": 175.4,
    "overlap.rank0.sqlite": 226.6,
    "overlap.rank1.sqlite": 226.6,
    "gloo_cuda_overlap.sqlite": 291.0,
}


# ms/step printed by the H200 runs' own timers (PROVENANCE.md, section gpu_h200).
H200_RUN_TIMER_MS = {"fsdp_bf16.sqlite": 413.9, "torch.sqlite": 147.0}


def available(folder: Path = GPU_H100) -> bool:
    return folder.is_dir() and any(folder.glob("*.sqlite.xz"))


def decompress(name: str, into: Path, folder: Path = GPU_H100) -> Path:
    """Decompress <folder>/<name>.xz (default GPU_H100) into `into` and return the path of the SQLite
    file. A copy already there is used when it is newer than its .xz; the copy is made read-only, so no
    test changes it."""
    source = folder / f"{name}.xz"
    target = into / name
    if not source.exists():
        raise FileNotFoundError(source)
    if not target.exists() or target.stat().st_mtime < source.stat().st_mtime:
        partial = target.with_suffix(f".partial{os.getpid()}")  # xdist workers may decompress it at once
        with lzma.open(source) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        partial.chmod(0o444)
        partial.replace(target)  # whole or not at all
    return target

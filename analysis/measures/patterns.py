"""Which names mean communication, steps and phases: regular expressions, all overridable.

Defaults match this project's NVTX contract (README) and common names in other people's traces:
NCCL kernels of every era (`ncclKernel_*`, `ncclDevKernel_*`, `ncclDevKernel_Generic`), RCCL/MSCCL,
custom all-reduce kernels; `step N` and PyTorch's `ProfilerStep#N`; `backward`, `backward pass`,
`## backward ##`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.errors import TraceError

COMM_KERNEL = r"(?i)^(nccl|rccl|msccl)|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|cross_device_reduce"
COMM_RANGE = r"^comm:|^nccl[A-Z]|^gloo|^c10d::|^ProcessGroup"
STEP = r"(?i)^(?:step|profilerstep|iteration|iter|train_step)[ _#:]*(\d+)$"
BACKWARD = r"(?i)^\W*backward(?:[ _]pass)?\W*$"
FORWARD = r"(?i)^\W*forward(?:[ _]pass)?\W*$"
OPTIMIZER = r"(?i)^\W*optim(?:izer)?(?:[ _.]step)?\W*$"
# Where a rank waits for gradient synchronisation; on CPU-only traces this is never compute, even
# when it lies inside backward (PyTorch DDP waits for its buckets at the end of backward).
SYNC_WAIT = r"^grad_sync$"
META_PREFIX = "ddp.meta "


@dataclass(frozen=True)
class Patterns:
    """Regexes (re.search) for kernel and NVTX range names. The step pattern's first group, if any, is the step number."""

    comm_kernel: str = COMM_KERNEL
    comm_range: str = COMM_RANGE
    step: str = STEP
    backward: str = BACKWARD
    forward: str = FORWARD
    optimizer: str = OPTIMIZER
    sync_wait: str = SYNC_WAIT

    def __post_init__(self) -> None:
        for field, value in vars(self).items():
            if not isinstance(value, str) or not value:
                raise TraceError(f"pattern {field}={value!r}: expected a non-empty regular expression")
            try:
                re.compile(value)
            except re.error as e:
                raise TraceError(f"pattern {field}={value!r} is not a valid regular expression: {e}") from None

    def regex(self, field: str) -> re.Pattern:
        return re.compile(getattr(self, field))


def matches(names: pd.Series, regex: re.Pattern) -> np.ndarray:
    """Boolean array: which of `names` (a categorical or string Series) match; each distinct name is tested once."""
    cat = names.astype("category") if not isinstance(names.dtype, pd.CategoricalDtype) else names
    hits = np.array([regex.search(str(c)) is not None for c in cat.cat.categories], dtype=bool)
    codes = cat.cat.codes.to_numpy()
    return np.where(codes >= 0, hits[np.maximum(codes, 0)] if hits.size else False, False)

"""Which names mean communication, steps and phases: regular expressions, all overridable.

The defaults are `contract.patterns` (this project's NVTX contract and common names in other people's traces:
PyTorch's `ProfilerStep#N`, `backward pass`, ...) and, for communication kernels, the union of the library
table in comm_families.py (NCCL of every era, RCCL, DeepEP, NVSHMEM, MSCCL/MSCCL++, SymmetricMemory, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analysis.errors import TraceError
from analysis.trace.comm_families import COMM_KERNEL
from contract.patterns import (
    BACKWARD_PHASE as BACKWARD,
    COMM_RANGE,
    FORWARD_PHASE as FORWARD,
    OPTIMIZER_PHASE as OPTIMIZER,
    STEP,
    SYNC_WAIT,
)

if TYPE_CHECKING:  # numpy and pandas load when first used: the CLIs' options need this module
    import numpy as np
    import pandas as pd


@dataclass(frozen=True)
class Patterns:
    """Regexes (re.search) for kernel and NVTX range names.

    The step pattern's first group, if any, is the step number."""

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
    import numpy as np
    import pandas as pd

    if isinstance(names.dtype, pd.CategoricalDtype):
        codes, distinct = names.cat.codes.to_numpy(), names.cat.categories
    else:  # factorize: a few times cheaper than a cast to category, which also sorts the names
        codes, distinct = pd.factorize(names)
    hits = np.array([regex.search(str(c)) is not None for c in distinct], dtype=bool)
    return np.where(codes >= 0, hits[np.maximum(codes, 0)] if hits.size else False, False)

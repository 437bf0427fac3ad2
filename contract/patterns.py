"""The analysis' default patterns (regular expressions for re.search), built from the contract's names and
widened to common names in other people's traces: PyTorch's `ProfilerStep#N`; `backward pass`,
`## backward ##`. Communication kernels are not ours to name: their patterns, one per library, are the table
in analysis/trace/comm_families.py. `analysis.trace.patterns.Patterns` takes them as its defaults; every
one is overridable there.
"""

from __future__ import annotations

import re

from contract.names import BACKWARD, COMM_PREFIX, COMM_WAIT_PREFIX, FORWARD, GRAD_SYNC, OPTIMIZER, STEP_PREFIX

COMM_RANGE = rf"^{re.escape(COMM_PREFIX)}|^nccl[A-Z]|^gloo|^c10d::|^ProcessGroup"
# the first group is the step number
STEP = rf"(?i)^(?:{re.escape(STEP_PREFIX.strip())}|profilerstep|iteration|iter|train_step)[ _#:]*(\d+)$"
FORWARD_PHASE = rf"(?i)^\W*{FORWARD}(?:[ _]pass)?\W*$"
BACKWARD_PHASE = rf"(?i)^\W*{BACKWARD}(?:[ _]pass)?\W*$"
OPTIMIZER_PHASE = rf"(?i)^\W*(?:{OPTIMIZER}|optim)(?:[ _.]step)?\W*$"
# Where a rank waits for gradient synchronisation; on CPU-only traces this is never compute, even
# when it lies inside backward (PyTorch DDP waits for its buckets at the end of backward).
SYNC_WAIT = rf"^{re.escape(GRAD_SYNC)}$"
# A rank blocked on one in-flight collective inside a phase (names.COMM_WAIT_PREFIX): never compute either.
COMM_WAIT = rf"^{re.escape(COMM_WAIT_PREFIX)}"

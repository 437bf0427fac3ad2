"""Which library each communication kernel or host range belongs to: one table of patterns.

`FAMILIES` lists every communication library the analysis recognises by default, most specific first
(the first family whose pattern matches a name names it). The default comm-kernel pattern
(`Patterns.comm_kernel`, `--comm-pattern`) is the union of the kernel patterns here; a kernel matched
only by a user's `--comm-pattern` belongs to the family CUSTOM. Host-range families name the
collectives that run on the CPU (their GPU sees only staging copies).

To add a library: one `CommFamily` line below (its name as users know it, a regular expression for
re.search over the kernel name as the profiler writes it, demangled; flags scoped, `(?i:...)`, as the
patterns are joined into one), and a test in
tests/analysis/trace/test_comm_families.py with kernel names taken from the library's source. See
docs/own-job.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy and pandas load when first used: the CLIs' options need this module
    import numpy as np
    import pandas as pd

CUSTOM = "custom (--comm-pattern)"


@dataclass(frozen=True)
class CommFamily:
    """A communication library: its name, and a regex over kernel names ("" for host-only families)
    and over host range names ("" when it has none of its own)."""

    name: str
    kernel: str = ""
    host_range: str = ""


FAMILIES: tuple[CommFamily, ...] = (
    # DeepEP (deep_ep::intranode / internode / internode_ll kernels: notify_dispatch, dispatch, combine, ...);
    # `ep::` also takes forks that renamed the namespace (uccl's `uccl::ep::`, ...)
    CommFamily("DeepEP low-latency", r"\bep::internode_ll::|(?:^|\W)deep_ep\w*::internode_ll::"),
    CommFamily("DeepEP internode", r"(?:^|[\W_])ep::internode::"),
    CommFamily("DeepEP intranode", r"(?:^|[\W_])ep::intranode::"),
    # PyTorch SymmetricMemory (c10d symm_mem): one-shot/two-shot/multimem all-reduce, all-gather, ...
    CommFamily(
        "PyTorch SymmetricMemory",
        r"(?:^|\W)(?:multimem_\w+_kernel|one_shot_all_reduce_kernel|two_shot_all_reduce_kernel\w*)"
        r"|c10d::symmetric_memory::\w+",
    ),
    # MSCCL++ (the executor's executionKernel, mscclpp:: kernels) and MSCCL (mscclKernel_<op>_<type>_<proto>)
    CommFamily("MSCCL++", r"mscclpp::|(?:^|\W)executionKernel\b"),
    CommFamily("MSCCL", r"(?i:(?:^|\W)msccl(?:kernel)?_?)"),
    # RCCL: NCCL's kernels built for AMD GPUs carry the unroll factor (ncclDevKernel_Generic_4) or Debug
    CommFamily("RCCL", r"(?:^|\W)ncclDevKernel(?:Debug)?_Generic_\d|(?i:(?:^|\W)rccl)"),
    # NCCL, every era: ncclKernel_AllReduce_RING_LL_Sum_float (<2.12), ncclDevKernel_AllReduce_Sum_f32_RING_LL,
    # ncclDevKernel_Generic, ncclDevKernel_SendRecv, ncclSymk (symmetric kernels)
    CommFamily("NCCL", r"(?:^|\W)nccl\w*(?:Kernel|Symk)\w*|^nccl"),
    # NVSHMEM collectives launched on a stream (barrier_on_stream_kernel, ...) and nvshmem(i|x) kernels
    CommFamily("NVSHMEM", r"(?i:(?:^|\W)nvshmem)|_on_stream_kernel"),
    # custom all-reduce kernels named after their collective (vLLM's cross_device_reduce_1stage, ...)
    CommFamily(
        "other collective kernels", r"(?i:all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|cross_device_reduce)"
    ),
    # gloo: collectives on the host (gloo:all_reduce, c10d::allreduce_ ranges); CUDA tensors staged by copies
    CommFamily("gloo (host ranges)", host_range=r"^gloo|ProcessGroupGloo"),
)


def kernel_union(families: tuple[CommFamily, ...] = FAMILIES) -> str:
    """One regex matching every family's kernel names: the default comm-kernel pattern."""
    return "|".join(f"(?:{f.kernel})" for f in families if f.kernel)


COMM_KERNEL = kernel_union()
_KERNEL_FAMILIES = tuple((f.name, re.compile(f.kernel)) for f in FAMILIES if f.kernel)
_RANGE_FAMILIES = tuple((f.name, re.compile(f.host_range)) for f in FAMILIES if f.host_range)


def family_of_kernel(name: str) -> str:
    """The family of one communication kernel name; CUSTOM when no family's pattern matches it."""
    return next((family for family, regex in _KERNEL_FAMILIES if regex.search(name)), CUSTOM)


def family_of_range(text: str) -> str:
    """The family of one host comm range; '' when no family names it (the project's own comm: ranges)."""
    return next((family for family, regex in _RANGE_FAMILIES if regex.search(text)), "")


def kernel_families(names: pd.Series | np.ndarray | list) -> np.ndarray:
    """Per communication kernel name, its family (object array); each distinct name is tested once."""
    import numpy as np
    import pandas as pd

    cat = pd.Categorical(np.asarray(names, dtype=object))
    per_name = np.array([family_of_kernel(str(c)) for c in cat.categories] or [CUSTOM], dtype=object)
    return per_name[np.maximum(cat.codes, 0)]

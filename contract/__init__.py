"""The NVTX contract between `ddp/`, `profiling/` and `analysis/`: range names, the `ddp.meta` mark and the
default patterns that recognise them. Torch-free and dependency-free, so every package can import it.

`names`    the range names (`step N`, `forward`, `backward`, `optimizer`, `grad_sync`, `profile`,
           `comm:<op>:<tag>` with the collective's byte count as payload (ops: all_reduce, broadcast, all_gather,
           reduce_scatter), the point-to-point phases).
`meta`     the `ddp.meta {json}` mark (nsys) and `ddp.meta` key (torch.profiler JSON): encode/decode, and
           the `sharded` entries of sharded strategies.
`patterns` the analysis' default regular expressions, built from the names.
`nsys_cli` finding nsys and its complete-or-absent SQLite export (recording and analysis both run it).
"""

from contract.meta import (
    ASYNC_KIND,
    ASYNC_KIND_KEY,
    META_KEY,
    META_PREFIX,
    SHARDED_FIELDS,
    SHARDED_KEY,
    decode_meta,
    encode_meta,
    sharded_entry,
)
from contract.names import (
    ALL_GATHER,
    ALL_REDUCE,
    BACKWARD,
    BROADCAST,
    COMM_FORM,
    COMM_PAYLOAD,
    COMM_PREFIX,
    COMPUTE_PHASES,
    FORWARD,
    GRAD_SYNC,
    OPTIMIZER,
    P2P_PHASES,
    PROFILE,
    REDUCE_BROADCAST_BROADCAST,
    REDUCE_BROADCAST_REDUCE,
    REDUCE_SCATTER,
    RING_ALL_GATHER,
    RING_REDUCE_SCATTER,
    SHARDED_OPS,
    STEP_PREFIX,
    comm_range,
    is_comm_range,
    step_range,
)

__all__ = [
    "ALL_GATHER",
    "ALL_REDUCE",
    "ASYNC_KIND",
    "ASYNC_KIND_KEY",
    "BACKWARD",
    "BROADCAST",
    "COMM_FORM",
    "COMM_PAYLOAD",
    "COMM_PREFIX",
    "COMPUTE_PHASES",
    "FORWARD",
    "GRAD_SYNC",
    "META_KEY",
    "META_PREFIX",
    "OPTIMIZER",
    "P2P_PHASES",
    "PROFILE",
    "REDUCE_BROADCAST_BROADCAST",
    "REDUCE_BROADCAST_REDUCE",
    "REDUCE_SCATTER",
    "RING_ALL_GATHER",
    "RING_REDUCE_SCATTER",
    "SHARDED_FIELDS",
    "SHARDED_KEY",
    "SHARDED_OPS",
    "STEP_PREFIX",
    "comm_range",
    "decode_meta",
    "encode_meta",
    "is_comm_range",
    "sharded_entry",
    "step_range",
]

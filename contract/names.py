"""The NVTX range names every rank records (README, "NVTX ranges"); all in NVTX's default domain."""

from __future__ import annotations

from contract.groups import with_group

PROFILE = "profile"  # push/pop around the measured steps; nsys's capture range (--nvtx-capture=profile)
STEP_PREFIX = "step "  # push/pop `step N`, one per training step, N from 0 at the run's first step
FORWARD = "forward"  # push/pop phases inside a step
BACKWARD = "backward"
OPTIMIZER = "optimizer"
# finish_gradient_synchronization(): blocking collectives and the final wait for async ones (push/pop;
# TorchDDP also marks DDP's wait inside backward() as a start/end range of this name).
GRAD_SYNC = "grad_sync"
COMPUTE_PHASES = (FORWARD, BACKWARD, OPTIMIZER)
# push/pop `data` around the making of a step's batch, just before that step's `step N` range (outside it)
DATA = "data"
# The places `--slow-rank RANK:PLACE:MS` can stall a rank at (ddp/training/slow_rank.py): a phase, the data, or
# `issue`: after backward, before the gradient synchronisation issues its collectives (inside no range).
ISSUE = "issue"
SLOW_PLACES = (FORWARD, BACKWARD, OPTIMIZER, DATA, ISSUE)
# push/pop `comm_wait:<op>:<tag>` around a rank blocking on one in-flight async collective mid-phase (fsdp waits
# for a unit's all-gather inside forward/backward): the rank is not computing there, whatever phase holds it.
COMM_WAIT_PREFIX = "comm_wait:"
# push/pop `comm_issue:<op>:<tag>` around the host work a bucketed strategy does to issue one collective (dividing
# the bucket, writing its flags, the issue itself): the per-call host time besides the transfer (analysis.advise).
COMM_ISSUE_PREFIX = "comm_issue:"

# One range per collective call, `comm:<op>:<tag>`: push/pop when blocking, start/end when async (it may end on
# another thread). Its integer payload (NVTX_EVENTS.int64Value in nsys exports) is the collective's byte count.
COMM_PREFIX = "comm:"
COMM_FORM = "comm:<op>:<tag>"  # how messages name the family
COMM_PAYLOAD = "bytes"  # what a comm range's payload counts
ALL_REDUCE = "all_reduce"
BROADCAST = "broadcast"
# Sharded data parallelism (FSDP): one range per sharded module and call, tagged with the module's name, e.g.
# `comm:all_gather:layers.0.attn.wq`. Payloads follow nccl-tests' convention: an all-gather counts the gathered
# output (the whole module, every rank's slice, padding included), a reduce-scatter its input (the same size).
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
SHARDED_OPS = (ALL_GATHER, REDUCE_SCATTER)

# Phases of the point-to-point all-reduces (ddp/comm/ring_allreduce.py, ddp/comm/reduce_broadcast.py), push/pop on the
# `p2p-collectives` thread, inside the caller's `comm:all_reduce:<tag>` range in time.
RING_REDUCE_SCATTER = "ring:reduce_scatter"
RING_ALL_GATHER = "ring:all_gather"
REDUCE_BROADCAST_REDUCE = "reduce_broadcast:reduce"
REDUCE_BROADCAST_BROADCAST = "reduce_broadcast:broadcast"
P2P_PHASES = (RING_REDUCE_SCATTER, RING_ALL_GATHER, REDUCE_BROADCAST_REDUCE, REDUCE_BROADCAST_BROADCAST)


def step_range(n: int) -> str:
    """The name of training step `n`'s range: `step 17`."""
    return f"{STEP_PREFIX}{n}"


def comm_range(op: str, tag: str, group: str | None = None) -> str:
    """The name of one collective call's range: `comm:all_reduce:bucket3`; of a collective of a process group
    other than the default one, `comm:all_reduce:bucket3@replicate` (contract/groups.py)."""
    if not op or ":" in op:
        raise ValueError(f"collective op {op!r}: expected a non-empty name without ':'")
    return with_group(f"{COMM_PREFIX}{op}:{tag}", group)


def comm_wait_range(op: str, tag: str) -> str:
    """The name of a rank's wait for one in-flight collective: `comm_wait:all_gather:layers.0.attn`."""
    return COMM_WAIT_PREFIX + comm_range(op, tag)[len(COMM_PREFIX) :]


def comm_issue_range(op: str, tag: str) -> str:
    """The name of the host work that issues one collective: `comm_issue:all_reduce:bucket3`."""
    return COMM_ISSUE_PREFIX + comm_range(op, tag)[len(COMM_PREFIX) :]


def is_comm_range(name: str) -> bool:
    """Whether `name` is one of the contract's collective ranges."""
    return name.startswith(COMM_PREFIX)

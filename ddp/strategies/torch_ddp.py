"""TorchDDP: PyTorch's DistributedDataParallel behind the same protocol as the hand-written wrappers."""

# No `from __future__ import annotations` here: DDP checks the hook's annotations as real objects.
import inspect
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from contract import ALL_REDUCE, GRAD_SYNC, comm_issue_range
from ddp.comm import nvtx_ranges
from ddp.memory.accounting import MemoryParts
from ddp.strategies.base import DataParallelBase, nbytes

# bucket_cap_mb_list arrived in recent PyTorch; older DDP gets one cap for every bucket.
_DDP_TAKES_CAP_LIST = "bucket_cap_mb_list" in inspect.signature(DistributedDataParallel.__init__).parameters


class TorchDDP(DataParallelBase):
    """torch.nn.parallel.DistributedDataParallel with a comm hook that names and counts its all-reduces.

    DDP already waits for its buckets at the end of `loss.backward()`, so
    `finish_gradient_synchronization()` has nothing left to do but accounting. Backward's end, for
    the timing of ddp.comm.timing, is when the last bucket becomes ready (the end of gradient
    computation); each bucket is in flight from its hook's issue to its future's completion. DDP needs
    `find_unused_parameters=True` for models where a parameter can get no gradient in a step.
    Buckets get OverlapBucketDDP's caps: `first_bucket_mb` for the first, then `bucket_size_mb` each (DDP
    closes a bucket after the parameter that reaches the cap, OverlapBucketDDP before it, so small caps
    give DDP fewer buckets). DDP's wait happens inside `backward()`: it is marked by an NVTX start/end
    range `grad_sync` from the last bucket's issue to its completion, so a CPU-only trace can tell
    the waiting from the backward computation around it.
    """

    ddp: DistributedDataParallel  # set in __init__ through __dict__ (see there), declared for the type checker

    def __init__(
        self,
        module: nn.Module,
        bucket_size_mb: float | None = 25,
        collective: str = "torch",
        find_unused_parameters: bool = False,
        first_bucket_mb: float | None = 1.0,
    ):
        if collective != "torch":
            raise ValueError(f"TorchDDP runs PyTorch's own all-reduce: collective must be 'torch', got {collective!r}")
        if bucket_size_mb is not None and not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be positive or None, got {bucket_size_mb!r}")
        super().__init__(module, collective)  # broadcasts rank 0's state; DDP does it again, cheaply
        self.bucket_size_mb = bucket_size_mb
        device_ids = [module_device(module).index] if module_device(module).type == "cuda" else None
        # Kept out of the submodule registry so `.module` stays the only owner of the parameters.
        self.__dict__["ddp"] = DistributedDataParallel(
            module,
            device_ids=device_ids,
            find_unused_parameters=find_unused_parameters,
            **bucket_caps(bucket_size_mb, first_bucket_mb),
        )
        # DDP's reducer keeps the hook's state in C++, out of the cyclic collector's sight: `self` there
        # would keep this wrapper, its model and gradients alive for good; a weak proxy does not.
        self.ddp.register_comm_hook(weakref.proxy(self), _timed_all_reduce_hook)
        # DDP rebuilds its buckets once, in the second step's forward, from the first step's
        # gradient order: the hook records the layout in the first two steps (then it is final).
        self._layout: dict[int, dict] = {}  # the last finished step's
        self._layout_next: dict[int, dict] = {}
        self._layout_steps = 0
        self._name_by_ptr = {p.data_ptr(): n for n, p in zip(self.param_names, self.params, strict=True)}

    def forward(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def memory_parts(self) -> MemoryParts:
        """As the base counts, plus DDP's bucket buffers (its reducer's, not reachable as tensors: their
        sizes from the buckets its hook saw; the gradients are copied out of them, not views)."""
        parts = super().memory_parts()
        parts.comm_buffers += sum(entry["bytes"] for entry in self.comm_layout())
        return parts

    def comm_layout(self) -> list[dict]:
        """DDP's buckets as its hook saw them (empty before the first backward)."""
        return [self._layout[i] for i in sorted(self._layout)]

    def _synchronize(self) -> None:
        # DDP waited for its buckets inside backward: the step only needs closing (in the base).
        if self._layout_steps < 2:
            self._layout_steps += 1
            self._layout, self._layout_next = self._layout_next, {}

    def _record_bucket(self, bucket: dist.GradBucket, size: int) -> None:
        self._layout_next[bucket.index()] = {
            "name": f"bucket{bucket.index()}",
            "bytes": size,
            "params": [self._name_by_ptr[p.data_ptr()] for p in bucket.parameters()],
        }


def bucket_caps(bucket_size_mb: float | None, first_bucket_mb: float | None) -> dict[str, Any]:
    """DDP arguments for the same bucket caps as OverlapBucketDDP: a smaller first bucket, then the cap.

    DDP only shrinks its first bucket (to 1 MiB) when bucket_cap_mb is left at its default, so an
    explicit size goes through `bucket_cap_mb_list` (first bucket, then the cap for the rest).
    """
    if bucket_size_mb is None:
        return {"bucket_cap_mb": 2**20}  # "unbounded": larger than any model here
    if first_bucket_mb is None or first_bucket_mb >= bucket_size_mb or not _DDP_TAKES_CAP_LIST:
        return {"bucket_cap_mb": bucket_size_mb}
    return {"bucket_cap_mb_list": [first_bucket_mb, bucket_size_mb]}


def module_device(module: nn.Module) -> torch.device:
    first = next(module.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def _timed_all_reduce_hook(state: "TorchDDP", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average one DDP bucket inside a `comm:all_reduce:bucket<i>` start/end range (payload: its bytes); the
    hook's host work inside a `comm_issue:all_reduce:bucket<i>` push/pop range."""
    tag = f"bucket{bucket.index()}"
    with nvtx_ranges.range(comm_issue_range(ALL_REDUCE, tag)):
        return _issue_bucket(state, bucket, tag)


def _issue_bucket(state: "TorchDDP", bucket: dist.GradBucket, tag: str) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    buffer.div_(state.world_size)
    size = nbytes(buffer)
    if state._layout_steps < 2:
        state._record_bucket(bucket, size)
    last = bucket.is_last()
    if last:  # backward has no gradient left to compute: DDP waits from here
        state.comm.backward_ended()
    flight = state.collectives.start(
        state._range_name(tag),
        size,
        lambda: state._sum(buffer, async_op=True),
        also=GRAD_SYNC if last else None,  # the last bucket's issue to its completion: DDP's wait
        then=lambda fut: fut.value()[0],  # the completion is recorded in the future DDP gets back
    )
    return flight.future

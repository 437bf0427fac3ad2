"""TorchDDP: PyTorch's DistributedDataParallel behind the same protocol as the hand-written wrappers."""
# No `from __future__ import annotations` here: DDP checks the hook's annotations as real objects.
import inspect
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp import nvtx_ranges
from ddp.base import DataParallelBase

# bucket_cap_mb_list arrived in recent PyTorch; older DDP gets one cap for every bucket.
_DDP_TAKES_CAP_LIST = "bucket_cap_mb_list" in inspect.signature(DistributedDataParallel.__init__).parameters


class TorchDDP(DataParallelBase):
    """torch.nn.parallel.DistributedDataParallel with a comm hook that names and counts its all-reduces.

    DDP already waits for its buckets at the end of `loss.backward()`, so
    `finish_gradient_synchronization()` has nothing left to do but accounting. The time blocked on
    communication is estimated as the span from the last bucket becoming ready (the end of
    gradient computation) to the last bucket's all-reduce completing. DDP needs
    `find_unused_parameters=True` for models where a parameter can get no gradient in a step.
    Buckets get BucketedDDP's caps: `first_bucket_mb` for the first, then `bucket_size_mb` each (DDP
    closes a bucket after the parameter that reaches the cap, BucketedDDP before it, so small caps
    give DDP fewer buckets). DDP's wait happens inside `backward()`: it is marked by an NVTX start/end
    range `grad_sync` from the last bucket's issue to its completion, so a CPU-only trace can tell
    the waiting from the backward computation around it.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float | None = 25, collective: str = "torch",
                 find_unused_parameters: bool = False, first_bucket_mb: float | None = 1.0):
        if collective != "torch":
            raise ValueError(f"TorchDDP runs PyTorch's own all-reduce: collective must be 'torch', "
                             f"got {collective!r}")
        if bucket_size_mb is not None and not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be positive or None, got {bucket_size_mb!r}")
        super().__init__(module, collective)  # broadcasts rank 0's state; DDP does it again, cheaply
        self.bucket_size_mb = bucket_size_mb
        device_ids = [module_device(module).index] if module_device(module).type == "cuda" else None
        # Kept out of the submodule registry so `.module` stays the only owner of the parameters.
        self.__dict__["ddp"] = DistributedDataParallel(module, device_ids=device_ids,
                                                       find_unused_parameters=find_unused_parameters,
                                                       **bucket_caps(bucket_size_mb, first_bucket_mb))
        self.ddp.register_comm_hook(self, _timed_all_reduce_hook)
        self._last_ready = 0.0
        self._last_done = 0.0

    def forward(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def _synchronize(self) -> None:
        # Buckets that complete before the last one is ready were hidden behind backward.
        self.comm_stats.comm_time_s += max(0.0, self._last_done - self._last_ready)
        self._last_ready = self._last_done = 0.0


def bucket_caps(bucket_size_mb: float | None, first_bucket_mb: float | None) -> dict:
    """DDP arguments for the same bucket caps as BucketedDDP: a smaller first bucket, then the cap.

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
    """Average one DDP bucket; record an NVTX start/end range and its issue/complete times."""
    buffer = bucket.buffer()
    buffer.div_(state.world_size)
    range_id = nvtx_ranges.start(f"comm:all_reduce:bucket{bucket.index()}")
    # Once the last bucket is issued, backward has no gradient left to compute: DDP waits from here.
    wait_id = nvtx_ranges.start("grad_sync") if bucket.is_last() else None
    state._last_ready = time.perf_counter()
    state.comm_stats.num_ops += 1
    work = dist.all_reduce(buffer, group=state.group, async_op=True)

    def done(fut: torch.futures.Future) -> torch.Tensor:
        nvtx_ranges.end(range_id)
        if wait_id is not None:
            nvtx_ranges.end(wait_id)
        state._last_done = max(state._last_done, time.perf_counter())
        return fut.value()[0]

    return work.get_future().then(done)

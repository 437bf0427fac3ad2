"""OverlapBucketDDP: gradients gathered into size-capped buckets, each all-reduced asynchronously when full."""

from __future__ import annotations

import torch
from torch import nn

from contract.buckets import plan_buckets
from ddp.comm.instrumented import broadcast_from_rank0
from ddp.grads.buckets import Bucket
from ddp.grads.grad_flags import ACCUMULATION_ERROR
from ddp.strategies.base import DataParallelBase, check_same_dtype_and_device, nbytes, weak_method


class OverlapBucketDDP(DataParallelBase):
    """Async bucketed all-reduces overlapping backward.

    Buckets hold up to `bucket_size_mb` MiB each (None: one bucket of unbounded size; a larger
    parameter gets a bucket of its own). Like DDP, the first bucket is capped at `first_bucket_mb`
    (default 1 MiB, None to turn off) so that the first all-reduce starts as early in backward as
    possible instead of waiting for a whole bucket. A bucket is launched once all its gradients are
    in and all earlier buckets are launched, so every rank issues the same collectives in the same
    order; the rest are launched at finish.

    The first step fills buckets in reverse order of `module.parameters()`; at its end, like DDP,
    the buckets are rebuilt once in the order its gradients arrived (rank 0's order, broadcast so
    that every rank buckets alike; parameters without a gradient go last), so that each bucket
    fills as early as backward allows. Gradients are views into the bucket buffers (see Bucket).
    """

    def __init__(
        self,
        module: nn.Module,
        bucket_size_mb: float | None = 25,
        collective: str = "torch",
        first_bucket_mb: float | None = 1.0,
    ):
        if bucket_size_mb is not None and not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be positive or None, got {bucket_size_mb!r}")
        if first_bucket_mb is not None and not first_bucket_mb > 0:
            raise ValueError(f"first_bucket_mb must be positive or None, got {first_bucket_mb!r}")
        super().__init__(module, collective)
        check_same_dtype_and_device(self.params, type(self).__name__)
        self.bucket_size_mb = bucket_size_mb
        self._cap = None if bucket_size_mb is None else bucket_size_mb * 2**20
        self._first_cap = (
            None if first_bucket_mb is None or self._cap is None else min(first_bucket_mb * 2**20, self._cap)
        )
        self._build(list(range(len(self.params)))[::-1])
        self._arrival: list[int] | None = []  # first step only: parameter indices as their hooks fire
        self._next_launch = 0
        ready = weak_method(self._on_gradient_ready)  # not `self`: the hooks would keep the wrapper alive
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda _p, i=i: ready(i))

    def _build(self, order: list[int]) -> None:
        """Buckets over the parameters taken in `order`, and each parameter's (bucket, slot)."""
        sizes = [nbytes(self.params[i]) for i in order]
        self.buckets = [
            Bucket(b, [self.params[order[k]] for k in run], [self.param_names[order[k]] for k in run])
            for b, run in enumerate(plan_buckets(sizes, self._cap, self._first_cap))
        ]
        self.order = order
        index_of = {id(p): i for i, p in enumerate(self.params)}
        self._slot_of: list[tuple[Bucket, int]] = [None] * len(self.params)  # type: ignore[list-item]
        for bucket in self.buckets:
            for slot, p in enumerate(bucket.params):
                self._slot_of[index_of[id(p)]] = (bucket, slot)

    def comm_buffers(self) -> list[torch.Tensor]:
        return [b.buffer for b in self.buckets]

    def comm_layout(self) -> list[dict]:
        return [bucket.layout() for bucket in self.buckets]

    def _on_gradient_ready(self, i: int) -> None:
        bucket, slot = self._slot_of[i]
        if bucket.ready[slot]:
            raise RuntimeError(ACCUMULATION_ERROR)
        if self._arrival is not None:
            self._arrival.append(i)
        if bucket.mark_ready(slot):
            self._launch_full_buckets_in_order()

    def _launch_full_buckets_in_order(self) -> None:
        while self._next_launch < len(self.buckets) and self.buckets[self._next_launch].is_full:
            self.buckets[self._next_launch].launch(self.world_size, self.async_all_reduce)
            self._next_launch += 1

    @torch.no_grad()
    def _synchronize(self) -> None:
        for bucket in self.buckets[self._next_launch :]:  # buckets with a gradient that never came
            bucket.fill_missing()
            bucket.launch(self.world_size, self.async_all_reduce)
        for bucket in self.buckets:
            bucket.wait()
            bucket.reset()
        self._next_launch = 0
        if self._arrival is not None:
            self._rebuild_in_arrival_order(self._arrival)

    def _rebuild_in_arrival_order(self, arrival: list[int]) -> None:
        """Once, after the first step: buckets in the order rank 0's gradients arrived."""
        arrived = list(dict.fromkeys(arrival))
        local = arrived + [i for i in self.order if i not in set(arrived)]
        self._arrival = None
        ref = self.params[0]
        agreed = torch.tensor(local, dtype=torch.int64, device=ref.device)
        broadcast_from_rank0([agreed], "bucket_order", self.group)
        order = agreed.tolist()  # one device-to-host copy, once
        if order != self.order:
            self._build(order)
            for bucket in self.buckets:
                bucket.adopt_gradients()  # this step's means move into the new buffers

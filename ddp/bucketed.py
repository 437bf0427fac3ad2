"""BucketedDDP: gradients gathered into size-capped buckets, each all-reduced asynchronously when full."""
from __future__ import annotations

from torch import nn

from ddp.base import ACCUMULATION_ERROR, DataParallelBase, check_same_dtype_and_device
from ddp.buckets import Bucket, plan_buckets


class BucketedDDP(DataParallelBase):
    """Async bucketed all-reduces overlapping backward.

    Buckets are filled in reverse order of `module.parameters()` up to `bucket_size_mb` MiB each
    (None: one bucket of unbounded size; a larger parameter gets a bucket of its own). Like DDP, the
    first bucket is capped at `first_bucket_mb` (default 1 MiB, None to turn off) so that the first
    all-reduce starts as early in backward as possible instead of waiting for a whole bucket. A
    bucket is launched once all its gradients are in and all earlier buckets are launched, so every
    rank issues the same collectives in the same order; the rest are launched at finish.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float | None = 25, collective: str = "torch",
                 first_bucket_mb: float | None = 1.0):
        if bucket_size_mb is not None and not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be positive or None, got {bucket_size_mb!r}")
        if first_bucket_mb is not None and not first_bucket_mb > 0:
            raise ValueError(f"first_bucket_mb must be positive or None, got {first_bucket_mb!r}")
        super().__init__(module, collective)
        check_same_dtype_and_device(self.params, type(self).__name__)
        self.bucket_size_mb = bucket_size_mb
        order = list(range(len(self.params)))[::-1]
        sizes = [self.params[i].numel() * self.params[i].element_size() for i in order]
        cap = None if bucket_size_mb is None else bucket_size_mb * 2**20
        first = None if first_bucket_mb is None or cap is None else min(first_bucket_mb * 2**20, cap)
        self.buckets = [Bucket(b, [self.params[order[k]] for k in run],
                               [self.param_names[order[k]] for k in run])
                        for b, run in enumerate(plan_buckets(sizes, cap, first))]
        self._next_launch = 0
        for bucket in self.buckets:
            for slot, p in enumerate(bucket.params):
                p.register_post_accumulate_grad_hook(
                    lambda _p, bucket=bucket, slot=slot: self._on_gradient_ready(bucket, slot))

    def _on_gradient_ready(self, bucket: Bucket, slot: int) -> None:
        if bucket.ready[slot]:
            raise RuntimeError(ACCUMULATION_ERROR)
        if bucket.mark_ready(slot):
            self._launch_full_buckets_in_order()

    def _launch_full_buckets_in_order(self) -> None:
        while self._next_launch < len(self.buckets) and self.buckets[self._next_launch].is_full:
            self.buckets[self._next_launch].launch(self)
            self._next_launch += 1

    def _synchronize(self) -> None:
        for bucket in self.buckets[self._next_launch:]:  # buckets with a gradient that never came
            bucket.fill_missing()
            bucket.launch(self)
        self._next_launch = len(self.buckets)
        for bucket in self.buckets:
            bucket.wait(self.world_size)
            bucket.reset()
        self._next_launch = 0

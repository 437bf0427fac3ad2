"""Bucket planning: order kept, caps respected, oversized parameters alone."""

from __future__ import annotations

import itertools

from hypothesis import given, strategies as st

from ddp.grads.buckets import plan_buckets


def test_unbounded_cap_is_one_bucket():
    assert plan_buckets([4, 8, 1000], None) == [[0, 1, 2]]
    assert plan_buckets([], None) == []


def test_parameter_larger_than_cap_gets_its_own_bucket():
    assert plan_buckets([10, 500, 10, 10], 100) == [[0], [1], [2, 3]]


@given(st.lists(st.integers(1, 1000), max_size=40), st.integers(1, 2000))
def test_plan_covers_every_item_in_order_within_cap(sizes, cap):
    plan = plan_buckets(sizes, cap)
    assert [i for bucket in plan for i in bucket] == list(range(len(sizes)))
    for bucket in plan:
        assert sum(sizes[i] for i in bucket) <= cap or len(bucket) == 1
    for left, right in itertools.pairwise(plan):  # greedy: the next item did not fit
        assert sum(sizes[i] for i in left) + sizes[right[0]] > cap


def test_first_bucket_can_have_its_own_smaller_cap():
    assert plan_buckets([60, 60, 60, 60, 60], 150, first_cap_bytes=70) == [[0], [1, 2], [3, 4]]
    assert plan_buckets([60, 60], None, first_cap_bytes=70) == [[0, 1]]


def test_bucketed_first_bucket_is_capped_and_never_above_bucket_size(one_rank_group):
    from ddp import OverlapBucketDDP
    from ddp.training.models import build_model

    def layout(**kwargs):
        return [list(b.names) for b in OverlapBucketDDP(build_model("tiny"), **kwargs).buckets]

    default = layout()  # 25 MiB buckets, 1 MiB first bucket
    assert default[0] == ["lm_head.weight"] and len(default) == 2  # the 5 MiB head starts alone
    assert layout(first_bucket_mb=None) == [[n for b in default for n in b]]  # plain filling: one bucket
    assert layout(bucket_size_mb=None) == [[n for b in default for n in b]]
    small = OverlapBucketDDP(build_model("tiny"), bucket_size_mb=0.25).buckets
    assert all(b.buffer.numel() * 4 <= 0.25 * 2**20 + 4 * len(b.params) or len(b.params) == 1 for b in small)


def test_bucket_sizes_must_be_positive(one_rank_group):
    import pytest

    from ddp import OverlapBucketDDP
    from ddp.training.models import build_model

    with pytest.raises(ValueError, match="bucket_size_mb must be positive or None, got 0"):
        OverlapBucketDDP(build_model("toy"), bucket_size_mb=0)
    with pytest.raises(ValueError, match="first_bucket_mb must be positive or None, got -1"):
        OverlapBucketDDP(build_model("toy"), first_bucket_mb=-1)

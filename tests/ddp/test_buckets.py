"""Bucket planning: order kept, caps respected, oversized parameters alone."""
from __future__ import annotations

from hypothesis import given, strategies as st

from ddp.buckets import plan_buckets


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
    for left, right in zip(plan, plan[1:]):  # greedy: the next item did not fit
        assert sum(sizes[i] for i in left) + sizes[right[0]] > cap

"""Bucket planning (contract.buckets), shared by ddp's buckets and the advisor: order kept, caps respected,
oversized parameters alone, and the two strategies' rules for where a bucket closes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, strategies as st

from contract.buckets import MIB, plan_buckets

SIZES = [0.6 * MIB, 0.6 * MIB, 1.5 * MIB, 1.0 * MIB, 1.0 * MIB, 3 * MIB]


def planned(sizes, cap_mb, rule):
    """The advisor's call: caps in MiB, the first bucket capped at 1 MiB (or the cap, if smaller)."""
    return plan_buckets(sizes, cap_mb * MIB, min(1.0, cap_mb) * MIB, rule)


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


def test_overlap_bucket_closes_before_the_parameter_that_would_pass_the_cap():
    # first bucket capped at 1 MiB: 0.6 alone (0.6+0.6 > 1); then 2 MiB caps
    assert planned(SIZES, 2, "before") == [[0], [1], [2], [3, 4], [5]]


def test_torch_closes_after_the_parameter_that_reaches_the_cap():
    # DDP: 0.6+0.6 reaches the 1 MiB first cap -> closes after; 1.5+1.0 >= 2 closes; 1.0+3 >= 2 closes
    assert planned(SIZES, 2, "after") == [[0, 1], [2, 3], [4, 5]]


def test_a_cap_under_the_first_bucket_cap_applies_to_the_first_bucket_too():
    sizes = [0.3 * MIB] * 4
    assert planned(sizes, 0.5, "before") == [[0], [1], [2], [3]]
    assert planned(sizes, 0.5, "after") == [[0, 1], [2, 3]]


def test_a_huge_cap_gives_the_first_bucket_then_one_more():
    assert planned([0.4 * MIB] * 5, 100, "before") == [[0, 1], [2, 3, 4]]


def test_bad_bucket_arguments_are_refused():
    with pytest.raises(ValueError, match="rule"):
        plan_buckets([1], 1, rule="sideways")
    with pytest.raises(ValueError, match="positive"):
        plan_buckets([1], 0)

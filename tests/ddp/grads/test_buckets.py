"""Bucket layouts of OverlapBucketDDP (the planning itself: tests/contract/test_buckets.py)."""

from __future__ import annotations


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

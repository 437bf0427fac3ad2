"""A real 4-rank CPU run of `flat` under nsys with `--slow-rank 2:issue:1000`: the analysis names the slowed
rank and the place. (`data`: the hsdp recording, tests/analysis/collectives/test_hsdp_recording.py, carries
it: one recording less. `issue` needs a strategy that issues its collectives after backward: on a sharded
one, whose reduce-scatters run during backward, the stall holds the next step's gathers instead.)"""

from __future__ import annotations

import shutil

import pytest

from tests import small_run
from tests.support.slow_rank import assert_the_slowed_rank_is_named_with_its_place_as_cause, slow_rank_args

WORLD, SLOW, PLACE, MS = 4, 2, "issue", 1000
STEPS = 5  # 5 steps held of 5 is past the recurrence rule's chance (0.25^5 < 1% / 4)


@pytest.mark.ranks
@pytest.mark.nsys
@pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys not installed")
def test_the_slowed_rank_is_named_with_issue_as_cause(tmp_path):
    extra = ["-n", str(WORLD), *slow_rank_args(SLOW, PLACE, MS)]
    done = small_run.record(["flat"], tmp_path, STEPS, 1, *extra, timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_the_slowed_rank_is_named_with_its_place_as_cause(tmp_path / "flat.sqlite", WORLD, STEPS, SLOW, PLACE, MS)

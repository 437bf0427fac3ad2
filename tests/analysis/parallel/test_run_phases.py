"""Where a merged run's phases came from: one sentence when its files agree, else each file's with its ranks."""

import pandas as pd

from analysis.parallel.rank_merge import run_phases


def summary(words):
    return pd.DataFrame({"phases": [words]})


def test_files_that_agree_give_one_sentence():
    said = run_phases([summary("our NVTX ranges"), summary("our NVTX ranges")], [[0], [1]])
    assert said == "our NVTX ranges"


def test_files_that_differ_are_named_by_their_ranks():
    said = run_phases([summary("A"), summary("B"), summary("A")], [[0, 1], [2], [3]])
    assert said == "rank 0, 1, 3: A; rank 2: B"

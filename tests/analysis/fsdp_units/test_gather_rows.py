"""gather_rows of calls without an all-gather in a step (a DDP run) is no row, without the lookups: the
columns the lookups give, numbers as numbers."""

from __future__ import annotations

import numpy as np

from analysis import analyze_collectives
from analysis.collectives.collectives_view import run_call_rows
from analysis.fsdp_units.gather_rows import GATHER_COLUMNS, gather_rows, no_gather_rows
from analysis.run.loaded_run import load_run
from tests.analysis.measure.test_comm_breakdown import write_fsdp_shaped


def test_no_gather_has_the_looked_up_columns_and_their_numeric_dtypes(tmp_path):
    looked_up = analyze_collectives(write_fsdp_shaped(tmp_path / "fsdp.sqlite")).gathers[GATHER_COLUMNS]
    assert len(looked_up) and list(no_gather_rows().columns) == GATHER_COLUMNS and no_gather_rows().empty
    numeric = [c for c in GATHER_COLUMNS if looked_up[c].dtype.kind in "if"]
    assert numeric and all(no_gather_rows()[c].dtype == looked_up[c].dtype for c in numeric)


def test_calls_without_a_gather_in_a_step_give_no_row(tmp_path):
    run = load_run(write_fsdp_shaped(tmp_path / "fsdp.sqlite"))
    rows = run_call_rows(run)[0]
    no_gathers = rows[rows["op"] != "all_gather"]
    phases = np.full(len(no_gathers), "forward", dtype=object)
    out = gather_rows(run.trace, no_gathers, phases)
    assert out.empty and list(out.columns) == GATHER_COLUMNS

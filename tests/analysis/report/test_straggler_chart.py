"""The who-held-each-step chart."""

import pandas as pd

from analysis.report.straggler_chart import straggler_figure


def test_steps_read_in_step_order_whatever_their_causes():
    """One trace per cause: the x axis still reads the steps in order (step 2 first, not after the other cause's)."""
    held = pd.DataFrame(
        {
            "step": [4, 2, 3, 6, 5],
            "straggler": [1, 1, 0, 1, 1],
            "cause": ["forward", "backward", "forward", "forward", "forward"],
            "wait_caused_ms": [4.4, 18.2, 3.0, 7.7, 4.5],
            "late_ms": [1.0] * 5,
            "cause_ms": [1.0] * 5,
        }
    )
    fig = straggler_figure(held, "flat")
    assert len(fig.data) == 2  # two causes, two traces
    assert list(fig.layout.xaxis.categoryarray) == [2, 3, 4, 5, 6]
    assert sorted(x for trace in fig.data for x in trace.x) == [2, 3, 4, 5, 6]

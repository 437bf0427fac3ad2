"""A figure's dict made without plotly's copy (render/figure_json.py) writes the HTML plotly.io writes for the
figure itself, for every kind of value the report's figures hold, and leaves the figure unchanged."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.io as pio

from analysis.render.figure_dicts import trusted_figure
from analysis.render.figure_json import plotly_dict
from analysis.render.html_page import PLOT_CONFIG, figure_block


def plotly_html(fig, div_id: str) -> str:
    """The block as plotly.io writes it from the figure object (to_dict's copy and conversion)."""
    return pio.to_html(
        fig, include_plotlyjs=False, full_html=False, div_id=div_id, config=PLOT_CONFIG, include_mathjax=False
    )


def mixed_figure():
    """Traces holding numeric arrays of each width, strings, objects, NaN, a Series, nested lists and a
    skipped key ('range')."""
    data = [
        {"type": "scatter", "x": np.arange(5, dtype=np.int64), "y": np.linspace(0, 1, 5, dtype=np.float32)},
        {"type": "bar", "x": np.array([1e3, 2e6, 3e9]), "y": np.array([70000, -2, 3], dtype=np.int64)},
        {"type": "bar", "x": np.array([2**40, 1], dtype=np.int64), "y": np.array([300, 2], dtype=np.uint64)},
        {"type": "scatter", "x": np.array(["a", "b<"]), "text": np.array(["x", None], dtype=object)},
        {"type": "scatter", "x": pd.Series([1.5, np.nan]), "y": [1, 2], "customdata": [[1, "a"], [2, "b"]]},
        {"type": "heatmap", "z": np.arange(6, dtype=np.float64).reshape(2, 3), "x": np.array([], dtype=float)},
        {"type": "scatter", "x": np.array([True, False]), "y": (np.arange(2.0), 3)},
    ]
    layout = {"xaxis": {"range": np.array([0.0, 2.0])}, "shapes": [{"type": "line", "x0": np.float64(1)}]}
    return trusted_figure(data, layout)


def test_the_block_is_plotlys_html_byte_for_byte():
    fig = mixed_figure()
    assert figure_block(fig, "plot0") == plotly_html(fig, "plot0")


def test_the_dict_is_to_dicts_and_the_figure_is_left_as_it_was():
    fig = mixed_figure()
    before = plotly_html(fig, "p")
    made = plotly_dict(fig)
    assert pio.to_json(made, validate=False) == pio.to_json(fig.to_dict(), validate=False)
    assert made["data"][0]["x"] == {"dtype": "i1", "bdata": "AAECAwQ="}  # int64 narrowed as plotly narrows it
    assert isinstance(fig._data[0]["x"], np.ndarray) and plotly_html(fig, "p") == before

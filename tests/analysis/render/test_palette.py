"""The palette keeps the colours a figure shows together apart, also for colour-blind readers, and keeps
implementation colours away from every category colour."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from analysis.render import palette
from analysis.timeline.style import CATEGORY_COLOURS

# Machado, Oliveira & Fernandes (2009), severity 1.0, on linear RGB.
SIMULATIONS = {
    "normal": np.eye(3),
    "deuteranopia": np.array(
        [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.01182, 0.04294, 0.968881]]
    ),
    "protanopia": np.array(
        [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]]
    ),
    "tritanopia": np.array(
        [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.3039]]
    ),
}


def lab(hex_colour: str, vision: str = "normal") -> np.ndarray:
    """CIELAB (D65) of an sRGB colour as seen with `vision`."""
    rgb = np.array([int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    linear = np.clip(SIMULATIONS[vision] @ linear, 0, 1)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    f = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(f > 0.008856, np.cbrt(f), 7.787 * f + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def closest_pair(colours: dict[str, str], vision: str) -> tuple[float, tuple[str, str]]:
    return min(
        (float(np.linalg.norm(lab(a, vision) - lab(b, vision))), (x, y))
        for (x, a), (y, b) in itertools.combinations(colours.items(), 2)
    )


SHOWN_TOGETHER = {  # colours one figure shows side by side, and the least CIELAB distance they keep
    "compute by phase": (dict(palette.PHASE_COLOURS.items()) | {"memory": palette.MEMORY}, 10),
    "collectives": (palette.COLLECTIVE_COLOURS, 15),
    "comm lanes and the overlap strip": (
        palette.COLLECTIVE_COLOURS | {"hidden": palette.HIDDEN_COMM, "exposed": palette.EXPOSED_COMM},
        15,
    ),
    "step breakdown": (
        {
            "compute": palette.COMPUTE_ONLY,
            "hidden": palette.HIDDEN_COMM,
            "exposed": palette.EXPOSED_COMM,
            "idle": palette.IDLE,
        },
        15,
    ),
    "registry implementations": (
        {k: palette.IMPLEMENTATION_COLOURS[k] for k in ("naive", "flat", "overlap", "overlap_bucket", "torch")},
        20,
    ),
    "all seven (bash run.sh's report)": (palette.IMPLEMENTATION_COLOURS, 15),
    "straggler causes": (palette.STRAGGLER_CAUSE_COLOURS, 10),
}


@pytest.mark.parametrize("vision", list(SIMULATIONS))
@pytest.mark.parametrize("group", list(SHOWN_TOGETHER))
def test_colours_shown_together_stay_apart(group, vision):
    colours, least = SHOWN_TOGETHER[group]
    distance, pair = closest_pair(colours, vision)
    assert distance >= least, f"{group}: {pair} only {distance:.1f} apart for {vision}"


def test_implementation_colours_are_no_category_colour():
    categories = [*list(CATEGORY_COLOURS.values()), palette.COMPUTE_ONLY, palette.IDLE, palette.WAITING]
    for name, colour in palette.IMPLEMENTATION_COLOURS.items():
        nearest = min(float(np.linalg.norm(lab(colour) - lab(c))) for c in categories)
        assert nearest >= 15, f"{name} {colour} is {nearest:.1f} from a category colour"


def test_every_meaning_has_its_own_colour():
    meanings = {**CATEGORY_COLOURS, **{f"impl:{k}": v for k, v in palette.IMPLEMENTATION_COLOURS.items()}}
    meanings |= {"compute only": palette.COMPUTE_ONLY, "idle": palette.IDLE, "waiting": palette.WAITING}
    colours = [v.lower() for v in meanings.values()]
    assert len(set(colours)) == len(colours)


@pytest.mark.parametrize(
    "name, family",
    [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "all_reduce"),
        ("ncclKernel_ReduceScatter_RING_LL_Sum_float", "reduce_scatter"),
        ("comm:all_gather:layer3", "all_gather"),
        ("comm:broadcast:params", "broadcast"),
        ("ncclDevKernel_SendRecv", "other"),
        ("reduce-scatter", "reduce_scatter"),
    ],
)
def test_collective_families(name, family):
    assert palette.collective_of(name) == family


def test_unknown_implementations_take_spare_colours_in_order():
    colours = palette.implementation_colours(["torch", "mine", "theirs", "mine"])
    assert colours == {"torch": "#000000", "mine": "#5E4FA2", "theirs": "#72190E"}

"""Every colour the pages use, one meaning each: categories of work and time, collectives, implementations.

Built from Okabe & Ito's and Paul Tol's colour-blind-safe schemes. The colours a figure shows
together (the phases of the compute lanes, the collectives of the comm lanes, the two overlap
states, the parts of a step) stay apart under simulated deuteranopia, protanopia and tritanopia
(tests/analysis/render/test_palette.py measures it), and implementation colours are kept away from
every category colour, so a colour never means a kind of work in one chart and a run in the next.
"""

from __future__ import annotations

from contract import BACKWARD, FORWARD, GRAD_SYNC, OPTIMIZER

# Phase that launched the work (GPU compute kernels) or ran on the CPU (phase lanes).
PHASE_COLOURS: dict[str, str] = {
    FORWARD: "#0072B2",  # blue
    BACKWARD: "#E69F00",  # orange
    OPTIMIZER: "#009E73",  # bluish green
    GRAD_SYNC: "#CC79A7",  # reddish purple: waiting for gradient sync
    "other": "#7A7A7A",  # compute launched outside the phases
}

# Communication by collective: GPU comm kernels and CPU comm ranges alike.
COLLECTIVE_COLOURS: dict[str, str] = {
    "all_reduce": "#D55E00",  # vermillion
    "all_gather": "#882255",  # wine
    "reduce_scatter": "#AA4499",  # purple
    "broadcast": "#332288",  # indigo
    "other": "#661100",  # dark brown: send/recv, all-to-all, unnamed kernels
}
COLLECTIVE_LABELS: dict[str, str] = {
    "all_reduce": "all-reduce",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "broadcast": "broadcast",
    "other": "other collective",
}

# Communication against compute: the overlap strip of a timeline and the report's step breakdown.
HIDDEN_COMM = "#44AA99"  # teal: communication with compute under it
EXPOSED_COMM = "#EE3377"  # magenta: communication with nothing under it
COMPUTE_ONLY = "#4477AA"  # compute with no communication under it (report breakdown)
IDLE = "#DDDDDD"  # neither

# Timeline lanes other than phases and collectives.
STEP = "#BBBBBB"
OTHER_NVTX = "#E5E5E5"
MEMORY = "#999933"  # olive: memcpy / memset

# A collective call split at the last rank's arrival (report's Collectives section).
WAITING = "#DDCC77"  # sand: before the last rank arrived
# why an all-gather held its unit's compute (fsdp_units/gather_cause.py); `late` is a CPU trace's, no cause
GATHER_CAUSE_COLOURS = {
    "queued": "#AA4499",  # purple, as the reduce-scatters it mostly queues behind
    "partner": WAITING,
    "slow": "#117733",  # green
    "issued late": "#882255",  # wine, the all-gather's own colour
    "late": "#EE3377",  # magenta, as exposed communication
}
ISSUE = "#222222"  # the CPU issue mark
# why a step's straggler was late (collectives/straggler_cause.py): a phase in its phase colour, the host's
# late launch in the issue mark's colour, a slower transfer in the all-reduce's
STRAGGLER_CAUSE_COLOURS = {
    "data": "#56B4E9",  # sky blue
    FORWARD: PHASE_COLOURS[FORWARD],
    BACKWARD: PHASE_COLOURS[BACKWARD],
    OPTIMIZER: PHASE_COLOURS[OPTIMIZER],
    "transfer": COLLECTIVE_COLOURS["all_reduce"],
    "issue": ISSUE,
    "unknown": STEP,
}
OTHER_CALLS = "#888888"  # grey: the shorter calls merged on a per-call chart's "others" row
BACKWARD_SPAN = "rgba(230, 159, 0, 0.14)"  # the backward pass behind per-call charts (backward, faint)

# One colour per implementation, the same on every chart and page (the registry's names; fsdp's two).
IMPLEMENTATION_COLOURS: dict[str, str] = {
    "naive": "#997700",  # ochre (navy read as torch's black in a table swatch)
    "flat": "#66CCEE",  # cyan
    "overlap": "#225522",  # dark green
    "overlap_bucket": "#EE8866",  # salmon
    "torch": "#000000",  # black: the reference
    "fsdp": "#994F88",  # plum
    "torch_fsdp": "#BB5566",  # rose (light blue was flat's cyan to a colour-blind eye)
}
# Implementations not named above take these in order of first appearance.
SPARE_IMPLEMENTATION_COLOURS = ("#5E4FA2", "#72190E", "#225555", "#666633", "#AAAA00")


def collective_of(op: str) -> str:
    """The colour family of a collective op name (all_reduce, all-gather, ReduceScatter...): one of
    COLLECTIVE_COLOURS' keys."""
    flat = op.lower().replace("-", "").replace("_", "")
    for key in ("reduce_scatter", "all_reduce", "all_gather", "broadcast"):
        if key.replace("_", "") in flat:
            return key
    return "other"


def implementation_colours(names: list[str]) -> dict[str, str]:
    """Colour of each implementation name: its own when known, else the next spare (stable for the list)."""
    spare = iter(SPARE_IMPLEMENTATION_COLOURS * (1 + len(names) // len(SPARE_IMPLEMENTATION_COLOURS)))
    out: dict[str, str] = {}
    for name in names:
        if name not in out:
            out[name] = IMPLEMENTATION_COLOURS.get(name) or next(spare)
    return out


def trace_colours(labels: list[str], implementations: list[str]) -> dict[str, str]:
    """Colour of each trace label: its implementation's colour for the first trace of that implementation,
    a spare colour for a second trace of the same one (two naive runs stay apart)."""
    spare = iter(SPARE_IMPLEMENTATION_COLOURS * (1 + len(labels) // len(SPARE_IMPLEMENTATION_COLOURS)))
    taken: set[str] = set()
    out: dict[str, str] = {}
    for label, implementation in zip(labels, implementations, strict=True):
        if label in out:
            continue
        own = IMPLEMENTATION_COLOURS.get(implementation)
        out[label] = own if own is not None and implementation not in taken else next(spare)
        taken.add(implementation)
    return out


def swatch_html(colour: str) -> str:
    """A small square of `colour` to put before a name in HTML text (tables, notes)."""
    return f'<span class="swatch" style="background:{colour}"></span>'


def coloured_name(name: str, colour: str) -> str:
    """`name` after a square of its colour, in plotly's text markup (titles, tick labels)."""
    return f'<span style="color:{colour}">■</span> {name}'

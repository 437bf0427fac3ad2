"""The collectives CLI's per-unit all-gather table: `units_text(view, limit)`, each trace's units worst
first (fsdp_units/in_time.unit_table over the view's gather rows), headed by the definition they use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysis.fsdp_units.in_time import unit_table
from analysis.render.table import format_table

if TYPE_CHECKING:
    from analysis.collectives.collectives_view import CollectivesView

UNIT_NAMES = {
    "phase": "phase",
    "unit": "unit",
    "order": "order",
    "held_ms_per_step": "held ms/step",
    "late": "late",
    "gathers": "gathers",
    "cause": "cause (most late)",
    "host": "host",
    "queued_behind": "queued behind (most)",
}


def units_text(view: CollectivesView, limit: int, rank: int | None = None) -> list[str]:
    """Lines: per trace with gather rows, its `limit` worst (phase, unit) rows (all when limit < 0),
    only `rank`'s gathers when given."""
    out: list[str] = []
    for head in view.traces.itertuples():
        mine = view.gathers[view.gathers["path"] == head.path]
        if rank is not None:
            mine = mine[mine["rank"] == rank]
        if mine.empty or limit == 0:
            continue
        table = unit_table(mine)
        shown = table if limit < 0 else table.head(limit)
        what = "all" if len(shown) == len(table) else f"the {len(shown)} worst of {len(table)}"
        definition = mine["definition"].iloc[0]
        gpu = "GPU" in definition
        names = UNIT_NAMES if gpu else {**UNIT_NAMES, "held_ms_per_step": "waited ms/step"}
        out += [
            f"\n{head.implementation}: all-gathers per unit and phase, worst first ({what}; {definition}; "
            f"{'held' if gpu else 'waited'} ms/step: mean per rank and step; order: forward order):",
            format_table(shown, names),
        ]
    return out

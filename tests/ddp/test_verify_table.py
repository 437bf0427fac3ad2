"""`python -m ddp.verify`'s table: within 120 columns by default, every column with --wide."""

from __future__ import annotations

from ddp import cli
from ddp.strategies.registry import IMPLEMENTATIONS, SHARDED
from ddp.training.config import RunConfig
from ddp.verify import COLUMNS, how_compared
from ddp.verify_table import verify_table


def _records() -> list[dict]:
    """One PASS row per implementation, compared as the CLI describes it, 3 ranks (the longest texts)."""
    rows = []
    for impl in IMPLEMENTATIONS:
        cfg = RunConfig(
            impl=impl,
            world_size=3,
            batch_size=12,
            warmup=0,
            steps=5,
            model="toy",
            prefetch=2 if impl in SHARDED else None,
        )
        skipped = "3 ranks: gloo may add the 3 gradients in another order" if impl in SHARDED else None
        rows.append(
            {
                "implementation": impl,
                "compared": how_compared(cfg, 1e-5, 1e-8, "cpu", skipped),
                "max_abs_diff_vs_single": 1.16e-10,
                "elements_not_close": 0,
                "steps_bit_identical": "5/5" if impl in SHARDED else None,
                "max_abs_diff_between_ranks": 0.0,
                "sharded_equals_unsharded": None,
                "result": "PASS",
            }
        )
    return rows


def test_the_default_table_fits_120_columns_and_names_each_way_of_comparing_once():
    records = _records()
    wide = verify_table(records, COLUMNS, wide=True)
    assert wide == cli.format_records(records, "table", COLUMNS, float_digits=3)
    assert max(map(len, wide.splitlines())) > 120  # what the narrow table is for
    narrow = verify_table(records, COLUMNS).splitlines()
    assert max(map(len, narrow)) <= 120
    texts = list(dict.fromkeys(r["compared"] for r in records))
    legend = "\n".join(narrow[narrow.index("compared (--wide: in the table):") + 1 :])
    assert " ".join(legend.split()).count("[") == len(texts)
    for i, text in enumerate(texts, start=1):  # each text once, under its number, whole (wrapped)
        assert " ".join(text.split()) in " ".join(legend.split())
        assert f"[{i}] " in legend
    rows = narrow[2 : 2 + len(records)]
    for row, record in zip(rows, records, strict=True):
        assert row.startswith(record["implementation"]) and "PASS" in row
        assert row.rstrip().endswith(f"[{texts.index(record['compared']) + 1}]")

"""`python -m ddp.verify`'s table within a terminal: short headings, and each distinct way the rows were
compared (the long `compared` text) written once under the table, the rows pointing at it by number.
`--wide` prints every column in full, as CSV and JSON always do."""

from __future__ import annotations

import textwrap

from ddp import cli

WIDTH = 120  # the narrow table's lines stay within this many characters
SHORT = {  # record key -> narrow heading
    "implementation": "implementation",
    "max_abs_diff_vs_single": "diff vs single",
    "elements_not_close": "not close",
    "steps_bit_identical": "bit-identical",
    "max_abs_diff_between_ranks": "rank diff",
    "sharded_equals_unsharded": "sharded=unsharded",
    "result": "result",
    "compared": "compared",
}


def verify_table(records: list[dict], columns: list[str], wide: bool = False, float_digits: int = 3) -> str:
    """The records as a table: every column in full when `wide`, else the narrow form (module docstring)."""
    if wide:
        return cli.format_records(records, "table", columns, float_digits=float_digits)
    texts = list(dict.fromkeys(str(r.get("compared", "")) for r in records))
    rows = [
        {SHORT[c]: r.get(c) for c in columns if c != "compared"}
        | {"compared": f"[{texts.index(str(r.get('compared', ''))) + 1}]"}
        for r in records
    ]
    shown = [SHORT[c] for c in columns if c != "compared"] + ["compared"]
    table = cli.format_records(rows, "table", shown, float_digits=float_digits)
    legend = ["compared (--wide: in the table):"]
    for i, text in enumerate(texts, start=1):
        legend += textwrap.wrap(text, WIDTH, initial_indent=f"[{i}] ", subsequent_indent="    ")
    return "\n".join([*(line.rstrip() for line in table.splitlines()), *legend])

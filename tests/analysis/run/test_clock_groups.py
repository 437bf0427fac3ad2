"""Clock alignment matches calls within their process group: a 2 x 2 HSDP run in one file per rank, rank 2's clock
skewed. Rank 0 shares its shard group with rank 1 and its replicate group with rank 2, and no group with rank 3:
each file is checked on the collectives it shares with rank 0's (their members end together, so they give the
skew exactly), and calls of two groups are never matched. Against plain Python over the exports' raw tables."""

from __future__ import annotations

import re
import sqlite3
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from analysis.collectives.collective_rows import call_rows
from analysis.run.loaded_run import load_trace
from analysis.trace.frames import CLOCK_NOTE_KEY
from tests.analysis.collectives.test_groups import raw_calls
from tests.support.synthetic_groups import write_hsdp_trace

SKEW_NS = 5_000_000  # rank 2's clock runs this far ahead
NOTE = re.compile(
    r"offset (-?[\d.]+) ms, collectives' estimate (-?[\d.]+) ms ± [\d.]+ µs, residual [\d.]+ µs over (\d+)"
)


def _skewed(path: Path, ns: int) -> Path:
    """The export with every event time moved by ns (its session clock left as recorded)."""
    con = sqlite3.connect(path)
    tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        columns = {row[1] for row in con.execute(f"PRAGMA table_info({table})")}
        if {"start", "end"} <= columns:
            con.execute(
                f"UPDATE {table} SET start = start + ?, end = CASE WHEN end IS NULL THEN NULL ELSE end + ? END",
                (ns, ns),
            )
    con.commit()
    con.close()
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, list[Path]]:
    """(the whole run in one file, the same run as one file per rank, rank 2's skewed)."""
    folder = tmp_path_factory.mktemp("clk")
    shape = {"shard": 2, "replicas": 2, "steps": 3, "calls": 4}
    whole = write_hsdp_trace(folder / "whole.sqlite", **shape)
    files = [write_hsdp_trace(folder / f"rank{r}.sqlite", **shape, ranks=[r]) for r in range(4)]
    return whole, [*files[:2], _skewed(files[2], SKEW_NS), files[3]]


def file_collectives(path: Path, grouped: bool) -> dict[tuple, tuple[float, float]]:
    """{key: (median start, median end) over the file's ranks}: key (group, members, op, step, k) for the k-th
    call of the op in the step of the group on a rank (grouped) or (op, step, k) (not)."""
    calls, _ = raw_calls(path)
    per_rank: dict[tuple, int] = defaultdict(int)
    times: dict[tuple, list] = defaultdict(list)
    for c in sorted(calls, key=lambda c: (c["rank"], c["start"])):
        group = (c["group"], c["members"]) if grouped else ()
        k = per_rank[(c["rank"], *group, c["op"], c["step"])]
        per_rank[(c["rank"], *group, c["op"], c["step"])] += 1
        times[(*group, c["op"], c["step"], k)].append((c["start"], c["end"]))
    return {k: (statistics.median(s for s, _ in v), statistics.median(e for _, e in v)) for k, v in times.items()}


def test_each_file_is_aligned_on_the_calls_of_the_groups_it_shares(run):
    _, files = run
    ref = file_collectives(files[0], True)
    said = dict(
        re.findall(r"rank (\d): ([^;]*(?:;[^;]*)?)(?:; |$)", load_trace(files, cache=False).info[0][CLOCK_NOTE_KEY])
    )
    for rank, shared_group, skew in ((1, "shard", 0), (2, "replicate", SKEW_NS), (3, None, 0)):
        other = file_collectives(files[rank], True)
        shared = [k for k in ref if k in other]
        assert {k[0] for k in shared} == ({shared_group} if shared_group else set())
        assert {ref[k][1] - other[k][1] for k in shared} == ({-skew} if shared else set())
        if not shared:
            assert said[str(rank)].startswith("session clock (no shared collectives")
            continue
        offset, estimate, samples = NOTE.search(said[str(rank)]).groups()  # type: ignore[union-attr]
        assert (float(offset), float(estimate), int(samples)) == (-skew / 1e6, -skew / 1e6, len(shared))
        assert ("aligned on the collectives" in said[str(rank)]) == bool(skew)
    # matched by op, step and order alone, rank 3's calls (no group in common with rank 0) would give samples
    pooled_ref, pooled_other = file_collectives(files[0], False), file_collectives(files[3], False)
    assert [k for k in pooled_ref if k in pooled_other]


def test_aligned_files_pair_as_the_one_file_run(run):
    whole, files = run
    key = ["rank", "group", "group_ranks", "op", "step", "seq"]
    one = call_rows(load_trace(whole, cache=False))[0].sort_values(key).reset_index(drop=True)
    two = call_rows(load_trace(files, cache=False))[0].sort_values(key).reset_index(drop=True)
    assert len(one) == len(two) and one[key].equals(two[key])
    for column in ("wait_ms", "transfer_ms", "last_rank", "partners"):
        assert two[column].to_numpy() == pytest.approx(one[column].to_numpy(), abs=1e-9), column

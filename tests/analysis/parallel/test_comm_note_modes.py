"""The "no communication recognised" note of a run merged from per-rank files is written in one place
(comm_recognition.comm_note), so a run loaded in one piece, analysed file by file in --jobs processes
or on Dask says the same words and the same figures: the kernel families' GPU time over every rank."""

from __future__ import annotations

import re
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from analysis.measure.comm_recognition import COMM_WORDS
from analysis.overlap import command as overlap
from tests.support.synthetic_ddp import write_rank_files

T0 = 1_779_782_330_000_000_000
NOTHING = ["--comm-pattern", "^matches-no-kernel$", "--comm-range-pattern", "^matches-no-range$"]


@pytest.fixture(scope="module")
def rank_files(tmp_path_factory):
    """run.rank<N>.sqlite of a 3-rank run whose files hold different numbers of kernels."""
    folder = tmp_path_factory.mktemp("comm_note")
    return write_rank_files(folder, "run", [6_000, 2_000, 3_000], n_steps=4, t0=T0)


def cli(capsys, *argv) -> tuple[int, str]:
    code = overlap.main([str(a) for a in argv])
    return code, capsys.readouterr().out


def kernel_ns_by_name(paths: list[Path]) -> dict[str, int]:
    """GPU time per kernel name over every file, from the raw kernel tables."""
    total: dict[str, int] = defaultdict(int)
    for path in paths:
        with sqlite3.connect(path) as db:
            rows = db.execute(
                "SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                "JOIN StringIds s ON s.id = k.shortName"
            )
            for name, ns in rows:
                total[name] += ns
    return dict(total)


@pytest.mark.pool  # --jobs 2: a process pool
def test_serial_and_jobs_give_the_same_note_over_every_rank(rank_files, capsys):
    for fmt in ("table", "json"):
        serial = cli(capsys, *rank_files, "--format", fmt, "--jobs", "1", *NOTHING)
        jobs = cli(capsys, *rank_files, "--format", fmt, "--jobs", "2", *NOTHING)
        assert serial[0] == jobs[0] == 0 and serial[1] == jobs[1], fmt
        assert "no communication recognised in a run of 3 ranks" in serial[1]
    note = re.search(r"note: (no communication recognised[^\n]*)", serial_table(rank_files, capsys)).group(1)
    named = dict(re.findall(r"([\w:]+) \((\d+\.\d{3}) ms\)", note))
    times = kernel_ns_by_name(rank_files)  # the synthetic names have no template or namespace: a name is its family
    commish = sorted((n for n in times if COMM_WORDS.search(n)), key=lambda n: -times[n])
    others = sorted((n for n in times if not COMM_WORDS.search(n)), key=lambda n: -times[n])
    expected = (commish + others)[:3]
    assert list(named) == expected
    assert {n: float(ms) for n, ms in named.items()} == {n: pytest.approx(times[n] / 1e6, abs=6e-4) for n in expected}


def serial_table(rank_files: list[Path], capsys) -> str:
    return cli(capsys, *rank_files, "--jobs", "1", *NOTHING)[1]


@pytest.mark.pool  # starts a Dask cluster
def test_dask_gives_the_serial_note(rank_files, dask_cluster, capsys):
    for fmt in ("table", "json"):
        serial = cli(capsys, *rank_files, "--format", fmt, "--jobs", "1", *NOTHING)
        on_dask = cli(capsys, *rank_files, "--format", fmt, "--dask", dask_cluster, *NOTHING)
        assert serial[0] == on_dask[0] == 0 and serial[1] == on_dask[1], fmt
        assert "no communication recognised in a run of 3 ranks" in on_dask[1]

"""`python -m ddp.collectives_bench`: size parsing, config validation, the correctness check, the CLI."""

from __future__ import annotations

import datetime
import json

import pytest
import torch
import torch.distributed as dist

from ddp import cli
from ddp.collectives_bench import BenchConfig, build_parser, bus_bandwidth, check_result, format_size, main, parse_size
from ddp.comm import collectives
from ddp.launch.launcher import free_port


@pytest.mark.parametrize(
    "text, nbytes", [("1000", 1000), ("1K", 1024), ("64k", 65536), ("16M", 16 << 20), ("1G", 1 << 30)]
)
def test_parse_size_reads_powers_of_1024(text: str, nbytes: int) -> None:
    assert parse_size(text) == nbytes
    assert parse_size(format_size(nbytes)) == nbytes


@pytest.mark.parametrize("text", ["", "0", "-1K", "1X", "K", "1.5M"])
def test_parse_size_rejects_bad_sizes_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="bad size"):
        parse_size(text)


def test_bus_bandwidth_is_the_nccl_tests_factor() -> None:
    assert bus_bandwidth(3.0, 4) == pytest.approx(4.5)
    assert bus_bandwidth(3.0, 2) == pytest.approx(3.0)
    assert bus_bandwidth(3.0, 1) == 0.0


@pytest.mark.parametrize(
    "kwargs, bad",
    [
        ({"world_size": 0}, "0"),
        ({"sizes": (6,)}, "6"),
        ({"collectives": ("tree",)}, "'tree'"),
        ({"dtype": "int8"}, "'int8'"),
        ({"seconds_per_case": 0.0}, "0.0"),
        ({"max_iters": 0}, "0"),
    ],
)
def test_config_names_the_bad_value(kwargs: dict, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        BenchConfig(**{"world_size": 2, "sizes": (1024,), **kwargs})


@pytest.fixture
def single_rank_group():
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )
    yield
    dist.destroy_process_group()


def test_check_result_catches_a_wrong_sum(single_rank_group, monkeypatch) -> None:
    cpu = torch.device("cpu")
    assert check_result("ring", 1000, torch.float32, cpu)
    monkeypatch.setitem(collectives.COLLECTIVES, "off_by_one", lambda t, group=None, async_op=False: t.add_(1))
    assert not check_result("off_by_one", 1000, torch.float32, cpu)


@pytest.mark.ranks  # spawns ranks
def test_cli_reports_every_collective_and_size_with_consistent_bandwidths(capfd) -> None:
    """`python -m ddp.collectives_bench` in this process, through the wrapper its `__main__` calls (a CLI's
    start as a process: tests/ddp/test_cli.py); the ranks' output is captured at the file descriptors."""
    args = ["--world-size", "3", "--sizes", "1K", "12K", "--seconds-per-case", "0.02", "--max-iters", "3"]
    with pytest.raises(SystemExit) as stop:
        cli.run_main(main, [*args, "--format", "json"])
    stdout, stderr = capfd.readouterr()
    assert stop.value.code == 0, stderr
    records = json.loads(stdout)
    assert [(r["collective"], r["size"]) for r in records] == [
        (a, s) for s in ("1K", "12K") for a in ("torch", "ring", "reduce_broadcast")
    ]
    for r in records:
        assert r["check"] == "ok" and r["ranks"] == 3 and r["count"] == r["bytes"] // 4
        assert 1 <= r["iters"] <= 3
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 4 / 3)
    assert "[collectives_bench]" in stderr  # progress goes to stderr, not into the JSON


@pytest.mark.parametrize(
    "args",
    [
        ["--sizes", "6"],
        ["--world-size", "0"],
        ["--collectives", "tree"],
        ["--sizes", "1Q"],
        ["--seconds-per-case", "-1"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(args)  # fails before any rank is spawned
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err


def test_old_flag_name_algorithms_still_selects_collectives() -> None:
    assert build_parser().parse_args(["--algorithms", "ring", "torch"]).collectives == ["ring", "torch"]


def test_cli_bad_input_has_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """What `python -m ddp.collectives_bench` runs (cli.run_main, whose exit as a process
    tests/ddp/test_cli.py checks), in this process."""
    with pytest.raises(SystemExit) as exit_info:
        cli.run_main(main, ["--sizes", "1Q"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "python -m ddp.collectives_bench: error: bad size '1Q': expected a positive integer with optional "
        "K, M or G suffix (see --help)"
    ]

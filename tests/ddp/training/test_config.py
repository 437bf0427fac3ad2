"""Run settings are declared once (RunConfig's fields) and every training CLI builds its options from them."""

from __future__ import annotations

import dataclasses

import pytest

from ddp import benchmark, cli, verify
from ddp.training import config
from ddp.training.config import SETTINGS, RunConfig, check_settings
from profiling import record, run as profiling_run


def test_every_setting_has_a_docstring_and_a_check():
    for name, fld in SETTINGS.items():
        assert fld.metadata["doc"].strip(), name
        assert fld.metadata["check"] is not None or fld.metadata["choices"], name


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("world_size", 0, "world_size=0: must be a positive integer"),
        ("batch_size", 2.5, "batch_size=2.5: must be a positive integer"),
        ("context_length", -1, "context_length=-1: must be a positive integer"),
        ("steps", True, "steps=True: must be a positive integer"),
        ("warmup", -1, "warmup=-1: must be an integer >= 0"),
        ("bucket_mb", 0, "bucket_mb=0: must be positive"),
        ("lr", 0.0, "lr=0.0: must be a positive number"),
        ("seed", "1", "seed='1': must be an integer"),
        ("impl", "fast", "unknown implementation 'fast': choose from naive, flat"),
        ("model", "huge", "unknown model 'huge'"),
        ("optimizer", "lion", "unknown optimizer 'lion': choose from sgd, adamw"),
        ("collective", "pigeon", "unknown collective 'pigeon'"),
        ("backend", "mpi", "unknown backend 'mpi': choose from gloo, nccl"),
        ("slow_rank", "1:backward", "slow_rank='1:backward': expected RANK:PLACE:MS"),
        ("slow_rank", "x:backward:5", "slow_rank='x:backward:5': RANK 'x' must be an integer >= 0"),
        ("slow_rank", "1:fwd:5", "unknown PLACE 'fwd': choose from forward, backward, optimizer, data, issue"),
        ("slow_rank", "1:data:0", "MS '0' must be a positive number of milliseconds"),
        ("slow_rank", "1:data:nan", "MS 'nan' must be a positive number of milliseconds"),
    ],
)
def test_a_bad_value_is_named(name, value, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**{name: value})
    with pytest.raises(ValueError, match=message):
        check_settings({name: value})


def test_optional_settings_take_none_and_unknown_ones_are_refused():
    assert RunConfig(backend=None, bucket_mb=None).bucket_mb is None
    with pytest.raises(ValueError, match="unknown run setting 'speed'"):
        check_settings({"speed": 1})


def option_dests(parser) -> set[str]:
    return {a.dest for a in parser._actions}


def cli_parsers():
    """Each training CLI's parser (run_nsys.sh's is profiling.record's)."""
    return {
        "ddp.verify": verify.build_parser(),
        "ddp.benchmark": benchmark.build_parser(),
        "profiling.run": _capture_parser(profiling_run.parse_args, ["--impl", "flat"]),
        "run_nsys.sh": _capture_parser(record.parse_args, ["flat"]),
    }


def _capture_parser(parse, argv):
    """The parser a parse function builds (it builds and uses one argparse.ArgumentParser)."""
    import argparse

    seen = []
    original = argparse.ArgumentParser.parse_args

    def spy(self, *args, **kwargs):
        seen.append(self)
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", spy)
        parse(argv)
    return seen[0]


def test_every_training_cli_has_an_option_per_setting():
    for name, parser in cli_parsers().items():
        missing = set(SETTINGS) - option_dests(parser) - {"impl", "warmup"}
        assert missing == set(), name
    # the help text is the field's docstring
    help_of = {a.dest: a.help for a in benchmark.build_parser()._actions}
    assert all(help_of[n].startswith(f.metadata["doc"]) for n, f in SETTINGS.items())


def test_adding_a_knob_is_one_field(monkeypatch):
    """A new field appears on every CLI, reaches RunConfig-style checking and is passed on by run_nsys.sh."""
    knob = dataclasses.field(
        default=1, metadata={"doc": "a new knob", "check": None, "choices": None, "label": None, "optional": False}
    )
    knob.name, knob.type = "new_knob", "int"
    monkeypatch.setitem(config.SETTINGS, "new_knob", knob)
    assert cli.SETTINGS is config.SETTINGS
    for name, parser in cli_parsers().items():
        assert "new_knob" in option_dests(parser), name
    args = verify.build_parser().parse_args(["--new-knob", "7"])
    assert cli.given_settings(args)["new_knob"] == 7
    plan, _ = record.parse_args(["flat", "--new-knob", "5", "--steps", "3"])
    command = plan.resolved().runner_command("flat")
    assert command[command.index("--new-knob") + 1] == "5" and command[command.index("--steps") + 1] == "3"


def test_run_nsys_passes_on_only_the_settings_given_and_checks_them():
    plan, _ = record.parse_args(["flat", "--optimizer", "adamw", "--lr", "0.5"])
    assert plan.run_settings == {"optimizer": "adamw", "lr": 0.5}
    with pytest.raises(ValueError, match=r"lr=-1\.0: must be a positive number"):
        record.parse_args(["flat", "--lr", "-1"])


def test_the_clis_build_the_same_config():
    argv = ["--optimizer", "adamw", "--lr", "0.5", "--seed", "3", "--steps", "2", "--world-size", "2"]
    from_run = profiling_run.config_from_args(profiling_run.parse_args(["--impl", "flat", "--model", "toy", *argv]))
    verify_args = verify.build_parser().parse_args(argv)
    settings = cli.given_settings(verify_args)
    assert (settings["optimizer"], settings["lr"], settings["seed"], settings["steps"]) == (
        from_run.optimizer,
        from_run.lr,
        from_run.seed,
        from_run.steps,
    )
    bench = benchmark.sweep(
        cli.given_settings(benchmark.build_parser().parse_args([*argv, "--impl", "flat", "--model", "toy"]))
    )
    # the same run but for bucket_mb, which the benchmark leaves unset where it does not apply
    assert bench == [dataclasses.replace(from_run, bucket_mb=None)]


def test_the_slow_rank_must_be_in_the_run_and_stalls_only_its_place(monkeypatch):
    from ddp.training import slow_rank

    with pytest.raises(ValueError, match="slow_rank='2:issue:5': RANK must be below the world size 2"):
        RunConfig(world_size=2, slow_rank="2:issue:5")
    slept: list[float] = []
    monkeypatch.setattr(slow_rank.time, "sleep", slept.append)
    stall = slow_rank.stall_of(RunConfig(world_size=2, slow_rank="1:issue:5").slow_rank, rank=1)
    for place in ("forward", "backward", "issue", "optimizer", "data"):
        stall(place)
    slow_rank.stall_of("1:issue:5", rank=0)("issue")
    assert slept == [0.005]
    assert slow_rank.slow_rank_meta("1:issue:5") == {"rank": 1, "place": "issue", "ms": 5.0}
    assert slow_rank.slow_rank_meta(None) is None

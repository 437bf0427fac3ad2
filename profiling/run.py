"""The profiled program: train one implementation with its measured steps inside the NVTX range `profile`.

    python -m profiling.run --impl overlap                      # 2 local ranks (spawned), tiny model
    torchrun --nproc-per-node 2 -m profiling.run --impl naive   # one process per rank, from torchrun

`run_nsys.sh` runs this under nsys; it also runs on its own (no nsys needed), printing step times.
Warm-up steps run before the range opens, so nsys (`--capture-range=nvtx --nvtx-capture=profile`)
records only the measured steps; each rank marks `ddp.meta {json}` with the run's metadata there.
With `--torch-trace STEM` each rank records the same steps with torch.profiler instead, into
STEM.rank<N>.json.gz (profiling.torch_profile).

Exit codes: 0 ok, 1 a rank failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict

from ddp import cli
from ddp.comm import nvtx_ranges
from ddp.launch.launcher import DistContext, RankFailedError, in_torchrun, launch
from ddp.training.config import RunConfig
from ddp.training.loop import TrainResult, run_metadata, run_training
from profiling.capture import measured_region, tool_versions
from profiling.session import PROFILER_ENV


def choose_model(requested: str, batch_size: int, world_size: int, context_length: int, optimizer: str) -> str:
    """`auto`: the largest model whose estimated memory fits the smallest local GPU; tiny on CPU."""
    if requested != "auto":
        return requested
    import torch

    from ddp.training.models import largest_model_that_fits

    if not torch.cuda.is_available():
        return "tiny"
    # Total (not free) memory: every rank computes the same answer, before any of them allocates.
    total = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
    return largest_model_that_fits(total, max(1, batch_size // world_size), context_length, optimizer)


def profiled_worker(ctx: DistContext, cfg: RunConfig, nvtx_on: bool, torch_trace: str | None = None) -> TrainResult:
    """One rank: train, with the measured steps inside `profile` and the `ddp.meta` mark at its start
    (or, given torch_trace, recorded by torch.profiler into <torch_trace>.rank<N>.json.gz)."""
    if not nvtx_on:
        # Baseline for overhead figures: every NVTX call in ddp becomes a no-op.
        nvtx_ranges.disable()
    meta = run_metadata(ctx, cfg)
    meta["versions"] = {**meta.get("versions", {}), **tool_versions()}
    meta["profiler"] = os.environ.get(PROFILER_ENV)  # None (JSON null): not profiled
    if torch_trace:
        from pathlib import Path

        from profiling import torch_profile

        meta["profiler"] = f"torch.profiler {meta.get('versions', {}).get('torch', '')}".strip()
        path = Path(f"{torch_trace}.rank{ctx.rank}.json.gz")
        return run_training(
            ctx, cfg, measured_region=lambda model, memory: torch_profile.measured_region(meta, path, model, memory)
        )
    return run_training(ctx, cfg, measured_region=lambda model, memory: measured_region(meta, model, memory))


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = cli.Parser(  # one-line errors, exit 2
        prog="python -m profiling.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cli.add_settings(
        p,
        defaults={"impl": None, "model": "auto", "world_size": None},
        extra_choices={"model": ["auto"]},
        notes={
            "model": "auto (default): the largest that fits the GPU, tiny on CPU",
            "world_size": "local ranks to spawn, default 2; torchrun sets its own",
        },
    )
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    p.add_argument(
        "--share-gpus",
        action="store_true",
        help="NCCL with more ranks than GPUs (NCCL >= 2.30 loaded; sets NCCL_MULTI_RANK_GPU_ENABLE=1)",
    )
    p.add_argument("--nvtx", choices=("on", "off"), default="on", help="off: no NVTX at all (overhead baseline)")
    p.add_argument(
        "--torch-trace",
        metavar="STEM",
        help="record the measured steps with torch.profiler into STEM.rank<N>.json.gz (no nsys)",
    )
    p.add_argument("--format", choices=("table", "json"), default="table")
    args = p.parse_args(argv)
    if args.impl is None:
        p.error("the following arguments are required: --impl")
    return args


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig the arguments describe (ValueError naming a bad value)."""
    settings = cli.given_settings(args)
    if in_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if args.world_size is not None and args.world_size != world:
            raise ValueError(f"--world-size {args.world_size} does not match torchrun's WORLD_SIZE={world}")
    else:
        world = 2 if args.world_size is None else args.world_size
    settings["world_size"] = world
    settings["model"] = choose_model(args.model, args.batch_size, world, args.context_length, args.optimizer)
    return RunConfig(**settings)


def run_config(argv: Sequence[str], world_size: int | None) -> RunConfig:
    """The RunConfig `python -m profiling.run ARGV` checks before it trains, checked here without running
    anything: `world_size` ranks (None: not known here, e.g. other nodes under torchrun; the batch split
    is then left to the ranks), model auto standing for any model. ValueError naming a bad value."""
    settings = cli.given_settings(parse_args(argv))
    settings["world_size"] = world_size or 1
    settings["model"] = "tiny" if settings["model"] == "auto" else settings["model"]
    return RunConfig(**settings)


def summary(result: TrainResult) -> dict:
    """The figures printed at the end (every rank's step times, slowest-rank means)."""
    return {
        "config": asdict(result.config),
        "avg_step_time_s": result.avg_step_time_s,
        "avg_comm_time_s": result.avg_comm_time_s,
        "step_time_s": result.step_time_s,
        "final_loss": result.final_loss,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before CUDA initialises, here and in spawned ranks
    try:
        cfg = config_from_args(args)
        world = None if in_torchrun() else cfg.world_size
        result = launch(
            profiled_worker,
            world,
            cfg,
            args.nvtx == "on",
            args.torch_trace,
            backend=cfg.backend,
            share_gpus=args.share_gpus,
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RankFailedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if in_torchrun() and int(os.environ["RANK"]) != 0:
        return 0
    s = summary(result)
    if args.format == "json":
        print(json.dumps(s))
    else:
        c = result.config
        print(
            f"{c.impl}: {c.world_size} ranks, model {c.model}, {c.steps} measured steps after {c.warmup} "
            f"warm-up: {1e3 * s['avg_step_time_s']:.1f} ms/step, "
            f"{1e3 * s['avg_comm_time_s']:.1f} ms of communication after backward ended (the runner's clocks, "
            "slowest rank's means; `python -m analysis.overlap` measures exposed comm per rank from the trace)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

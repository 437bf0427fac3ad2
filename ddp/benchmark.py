"""Time every chosen implementation on the same model and batches; report communication's share.

    python -m ddp.benchmark --impl all --world-size 2 --model tiny --steps 10 --warmup 3 \\
        [--batch-size ...] [--context-length ...] [--bucket-mb 1 10 100 1000] [--csv FILE] [--format table|csv|json]

List options sweep every combination (bucket sizes apply to overlap_bucket and torch). Each run
does --warmup untimed steps then --steps timed ones (--repeat N runs the whole sweep N times and
pools each config's steps, which evens out a shared machine's slow phases); a step's time is its
slowest rank's (on GPU the device is synchronised once at the end of each step, never per
collective). Each collective is in flight from its issue to its completion (ddp.comm.timing: host
clocks on CPU, CUDA events on GPU); per step, avg_comm_in_flight_ms is the union of those
intervals, comm_before_backward_end the fraction of it before backward ended (pooled over ranks and
steps; 0 for naive and flat, which communicate after backward), and avg_comm_time_ms the part after
backward: the communication the step waited for. comm_clock says which clock measured them.
comm_before_backward_end says when communication was in flight, not that compute ran meanwhile: a
collective that blocks its rank (torch_fsdp's on CPU) or forward's all-gathers count in it, while
`python -m analysis.overlap`'s overlap % is communication under compute (docs/ddp.md).
speedup_vs_naive compares step times with naive at the same batch, context length and collective;
the table adds the same ratio for communication time.

Memory (docs/memory.md): per rank, the bytes of parameters, gradients, optimizer state, gathered
full-parameter buffers (sharded strategies), the wrapper's communication buffers and activations
(what forward saved for backward, counted in the first step), from the wrappers' own accounting
(memory_parts) after the last step; mem_peak_mib is their sum, and on CUDA cuda_max_allocated_mib is
torch.cuda.max_memory_allocated beside it. The CSV/JSON columns are the rank with the largest peak's;
the table adds one row per rank, and JSON `memory_per_rank`. A part that cannot be counted (torch_fsdp's
gathered buffers on a torch whose FSDP2 hides them) and so the peak are n/a in the table, null in JSON.
"""

from __future__ import annotations

import argparse
import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ddp import cli
from ddp.benchmark_rows import (
    CSV_COLUMNS,
    MEMORY_COLUMNS,
    MEMORY_TABLE,
    TABLE_EXTRA,
    memory_records,
    percent,
    pool,
    summary_line,
    table_row,
    to_records,
    write_csv,
)
from ddp.launch.launcher import DistContext, launch
from ddp.strategies import registry
from ddp.training.config import RunConfig
from ddp.training.loop import TrainResult, run_training
from ddp.training.models import largest_model_that_fits


def default_model(batch_per_rank: int, context_length: int, optimizer: str) -> str:
    """The largest size that fits in this GPU's free memory; tiny on CPU."""
    if not torch.cuda.is_available():
        return "tiny"
    free, _ = torch.cuda.mem_get_info()
    return largest_model_that_fits(free, batch_per_rank, context_length, optimizer)


SWEPT = ("batch_size", "context_length", "collective", "impl", "bucket_mb")  # the list options, outermost first


def sweep(settings: dict[str, Any]) -> list[RunConfig]:
    """One RunConfig per combination of the list settings (`SWEPT`), naive first within each (batch,
    context, collective); bucket sizes apply to the bucketed implementations only."""
    fixed = {k: v for k, v in settings.items() if k not in SWEPT}
    configs = []
    for batch, context, collective in itertools.product(
        settings["batch_size"], settings["context_length"], settings["collective"]
    ):
        for impl in registry.resolve(settings["impl"]):
            if impl == "torch" and collective != "torch":
                continue  # PyTorch DDP only runs its own all-reduce
            for bucket in settings["bucket_mb"] if impl in registry.BUCKETED else [None]:
                swept = dict(impl=impl, batch_size=batch, context_length=context, bucket_mb=bucket)
                configs.append(RunConfig(**fixed, **swept, collective=collective))
    return configs


def benchmark_worker(ctx: DistContext, configs: list[RunConfig], repeat: int = 1) -> list[TrainResult] | None:
    """Run every config in turn on this rank, the whole list `repeat` times; rank 0 returns the results.

    Repeating the list (rather than each config) spreads slow phases of a shared machine over all
    configs; a config's repeats are pooled into one result.
    """
    results: dict[int, TrainResult] = {}  # config index -> its repeats pooled (filled in config order)
    total = len(configs) * repeat
    for r in range(repeat):
        for k, cfg in enumerate(configs):
            result = run_training(ctx, cfg)
            if ctx.is_main:
                bucket = f" bucket {cfg.bucket_mb:g} MiB" if cfg.bucket_mb and cfg.impl in registry.BUCKETED else ""
                cli.progress(
                    f"[benchmark {r * len(configs) + k + 1}/{total}] {cfg.impl}{bucket} batch "
                    f"{cfg.batch_size} context {cfg.context_length}: "
                    f"{result.avg_step_time_s * 1e3:.1f} ms/step, "
                    f"{percent(result.comm_overlap)} of communication in flight before backward ended "
                    "(not analysis.overlap's overlap %: in flight, not under compute)"
                )
            results[k] = pool(results[k], result) if k in results else result
    return list(results.values()) if ctx.is_main else None


def check_csv_target(path: Path, overwrite: bool) -> None:
    """Refuse, before any run, a CSV path that exists (without --overwrite) or is a folder."""
    if path.is_dir():
        raise ValueError(f"--csv {path} is a folder: name a file")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists: pass --overwrite to replace it")


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="python -m ddp.benchmark", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cli.add_settings(
        parser,
        defaults={"impl": ["all"], "model": None, "world_size": None},
        many=SWEPT,
        extra_choices={"impl": ["all"]},
        notes={
            "impl": "default: all",
            "model": "default: the largest that fits the GPU, tiny on CPU",
            "world_size": "default: 2, or torchrun's WORLD_SIZE",
        },
    )
    cli.add_output_arguments(parser)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the whole sweep this many times, pooling each config's steps (default 1)",
    )
    parser.add_argument("--csv", type=Path, default=None, help="also write the rows to this CSV file")
    parser.add_argument("--overwrite", action="store_true", help="let --csv replace an existing file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.csv is not None:
        check_csv_target(args.csv, args.overwrite)
    settings = cli.given_settings(args)
    world = settings["world_size"] = cli.resolve_world_size(args.world_size)
    if settings["model"] is None:  # sized for the largest batch of the sweep
        batch_per_rank = max(1, max(args.batch_size) // world)
        settings["model"] = default_model(batch_per_rank, max(args.context_length), args.optimizer)
    configs = sweep(settings)
    if not configs:
        raise ValueError("nothing to run: implementation 'torch' only runs collective 'torch'")
    if args.repeat < 1:
        raise ValueError(f"--repeat must be at least 1, got {args.repeat}")
    cli.progress(
        f"[benchmark] {len(configs)} runs x {args.repeat} of {settings['model']}; load average "
        f"{load_average()} (timings on a shared machine follow its load)"
    )
    results = launch(benchmark_worker, world, configs, args.repeat, backend=args.backend, share_gpus=args.share_gpus)
    if results is None:  # a non-zero rank under torchrun: rank 0 reports
        return cli.EXIT_OK
    cli.progress(f"[benchmark] done; load average {load_average()}")
    records = to_records(results)
    columns = CSV_COLUMNS + (TABLE_EXTRA if args.format == "table" else [])
    if args.format == "table":  # the parts go to the memory table below
        columns = [c for c in columns if c not in MEMORY_COLUMNS or c == "mem_peak_mib"]
    if len(args.collective) > 1:
        columns = [*columns, "collective"]
    shown = [table_row(r) for r in records] if args.format == "table" else records
    print(cli.format_records(shown, args.format, columns))  # first: a failing --csv loses nothing
    if args.format == "table":
        print(summary_line(records))
        print("\nmemory per rank (MiB; peak = the sum of the parts: docs/memory.md):")
        print(cli.format_records(memory_records(records), "table", MEMORY_TABLE))
    if args.csv is not None:
        write_csv(args.csv, records)
    return cli.EXIT_OK


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


if __name__ == "__main__":
    cli.run_main(main)

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
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from ddp import cli
from ddp.launch.launcher import DistContext, launch
from ddp.memory.accounting import MemoryParts, mib
from ddp.strategies import registry
from ddp.training.config import RunConfig
from ddp.training.loop import TrainResult, run_training
from ddp.training.models import MODEL_SIZES, largest_model_that_fits

PART_NAMES = [f.name for f in fields(MemoryParts)]
# MiB on the rank with the largest accounted peak (ddp.memory.accounting.MemoryParts: the parts and their sum),
# and torch.cuda.max_memory_allocated beside it (None off CUDA: the table says n/a)
MEMORY_COLUMNS = [f"mem_{part}_mib" for part in (*PART_NAMES, "peak")] + ["cuda_max_allocated_mib"]
CSV_COLUMNS = [
    "implementation",
    "model_size",
    "d_model",
    "num_layers",
    "world_size",
    "batch_size",
    "context_length",
    "bucket_mb",
    "avg_step_time_ms",
    "avg_comm_time_ms",
    "comm_fraction",
    "num_comm_ops",
    "speedup_vs_naive",
    "avg_comm_in_flight_ms",
    "comm_before_backward_end",  # was comm_overlap: not the analysis' overlap with compute
    "comm_clock",
    "shard_optimizer",
    *MEMORY_COLUMNS,
]
TABLE_EXTRA = ["comm_speedup_vs_naive"]
MEMORY_TABLE = ["implementation", "shard_optimizer", "rank", *MEMORY_COLUMNS]


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
                    f"{_percent(result.comm_overlap)} of communication in flight before backward ended"
                )
            results[k] = pool(results[k], result) if k in results else result
    return list(results.values()) if ctx.is_main else None


def pool(a: TrainResult, b: TrainResult) -> TrainResult:
    """Both runs' measured steps as one result (per rank, b's steps after a's)."""

    def join(x: list[list[Any]], y: list[list[Any]]) -> list[list[Any]]:
        return [xs + ys for xs, ys in zip(x, y, strict=True)]

    return TrainResult(
        a.config,
        join(a.step_time_s, b.step_time_s),
        join(a.comm_time_s, b.comm_time_s),
        join(a.num_ops, b.num_ops),
        b.final_loss,
        a.metadata,
        join(a.comm_in_flight_s, b.comm_in_flight_s),
        join(a.comm_hidden_s, b.comm_hidden_s),
        a.comm_clock,
        a.memory,
    )


def to_records(results: list[TrainResult]) -> list[dict]:
    """One row per run, with speedups over the naive run of the same batch/context/collective."""

    def key(cfg: RunConfig) -> tuple[int, int, str]:
        return cfg.batch_size, cfg.context_length, cfg.collective

    naive = {key(r.config): r for r in results if r.config.impl == "naive"}
    records = []
    for r in results:
        cfg, size, base = r.config, MODEL_SIZES.get(r.config.model), naive.get(key(r.config))
        records.append(
            {
                "implementation": cfg.impl,
                "model_size": cfg.model,
                "d_model": size.d_model if size else None,
                "num_layers": size.num_layers if size else None,
                "world_size": cfg.world_size,
                "batch_size": cfg.batch_size,
                "context_length": cfg.context_length,
                "bucket_mb": cfg.bucket_mb if cfg.impl in registry.BUCKETED else None,
                "avg_step_time_ms": round(r.avg_step_time_s * 1e3, 3),
                "avg_comm_time_ms": round(r.avg_comm_time_s * 1e3, 3),
                "comm_fraction": round(r.comm_fraction, 4),
                "num_comm_ops": _int_if_whole(r.avg_num_ops),
                "speedup_vs_naive": round(base.avg_step_time_s / r.avg_step_time_s, 3) if base else None,
                "comm_speedup_vs_naive": (
                    round(base.avg_comm_time_s / r.avg_comm_time_s, 3) if base and r.avg_comm_time_s > 0 else None
                ),
                "avg_comm_in_flight_ms": round(r.avg_comm_in_flight_s * 1e3, 3),
                "comm_before_backward_end": None if r.comm_overlap is None else round(r.comm_overlap, 3),
                "comm_clock": r.comm_clock,
                "shard_optimizer": cfg.shard_optimizer,
                **memory_columns(r, largest_rank(r)),
                "memory_per_rank": [memory_columns(r, rank) for rank in range(len(r.memory))],
                "collective": cfg.collective,
            }
        )
    return records


def largest_rank(result: TrainResult) -> int:
    """The rank with the largest accounted peak, the first on a tie."""
    # a peak that is unknown (a part n/a: ddp.memory.fsdp2_gathered) ranks by the parts that are known
    peaks = [m["peak"] if m["peak"] is not None else sum(m[k] or 0 for k in PART_NAMES) for m in result.memory]
    return peaks.index(max(peaks))


def memory_columns(result: TrainResult, rank: int) -> dict[str, Any]:
    """One rank's memory parts and accounted peak in MiB, and CUDA's max_memory_allocated (None off CUDA;
    a part that could not be counted and the peak then None too)."""
    figures = result.memory[rank]
    return {f"mem_{k}_mib": mib(figures[k]) for k in (*PART_NAMES, "peak")} | {
        "cuda_max_allocated_mib": mib(figures["cuda_max_allocated"])
    }


def table_row(record: dict) -> dict:
    """A record as the table shows it: an accounted peak that could not be counted reads n/a."""
    return record | {"mem_peak_mib": "n/a"} if record["mem_peak_mib"] is None else record


def memory_records(records: list[dict]) -> list[dict]:
    """One row per run and rank: the memory table (n/a for what is unknown: CUDA's figure off CUDA, a part
    that could not be counted and so the peak)."""
    return [
        {
            "implementation": r["implementation"],
            "shard_optimizer": r["shard_optimizer"],
            "rank": rank,
            **{column: "n/a" if value is None else value for column, value in per_rank.items()},
        }
        for r in records
        for rank, per_rank in enumerate(r["memory_per_rank"])
    ]


def _percent(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.0f}%"


def _int_if_whole(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(x, 2)


def check_csv_target(path: Path, overwrite: bool) -> None:
    """Refuse, before any run, a CSV path that exists (without --overwrite) or is a folder."""
    if path.is_dir():
        raise ValueError(f"--csv {path} is a folder: name a file")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists: pass --overwrite to replace it")


def write_csv(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cli.format_records(records, "csv", CSV_COLUMNS) + "\n")


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


# Ours against PyTorch's, the tuning targets: one step-time ratio line per pair found in the sweep.
RATIO_PAIRS = (("overlap_bucket", "torch"), ("fsdp", "torch_fsdp"))


def summary_line(records: list[dict]) -> str:
    """The step-time ratio of each RATIO_PAIRS pair for each matching row pair (same batch, context
    length and bucket size), one line per pair."""

    def key(r: dict) -> tuple:
        return r["batch_size"], r["context_length"], r["bucket_mb"]

    lines = []
    for ours_name, theirs_name in RATIO_PAIRS:
        ours = {key(r): r for r in records if r["implementation"] == ours_name and r["collective"] == "torch"}
        pairs = [
            (k, ours[k]["avg_step_time_ms"] / r["avg_step_time_ms"])
            for r in records
            if r["implementation"] == theirs_name and (k := key(r)) in ours
        ]
        if pairs:
            lines.append(
                f"{ours_name} / {theirs_name} step time: "
                + ", ".join(
                    f"{ratio:.2f} (batch {b}, context {c}" + (f", bucket {m:g} MiB)" if m is not None else ")")
                    for (b, c, m), ratio in pairs
                )
            )
    return "\n".join(lines)


if __name__ == "__main__":
    cli.run_main(main)

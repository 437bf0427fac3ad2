"""ddp.benchmark's rows: a run's TrainResult as a record (timings, speedups over naive, memory per rank),
the CSV columns, the memory table and the closing ratio lines."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from ddp import cli
from ddp.memory.accounting import MemoryParts, mib
from ddp.strategies import registry
from ddp.training.config import RunConfig
from ddp.training.loop import TrainResult
from ddp.training.models import MODEL_SIZES

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


def percent(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.0f}%"


def _int_if_whole(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(x, 2)


def write_csv(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cli.format_records(records, "csv", CSV_COLUMNS) + "\n")


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

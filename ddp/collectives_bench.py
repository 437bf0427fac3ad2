"""Bus-bandwidth benchmark of every all-reduce collective in `ddp.comm.collectives`, in isolation.

    python -m ddp.collectives_bench --world-size 4 --sizes 1K 64K 1M 16M [--collectives ...] [--format table|csv|json]

Per collective and message size: the time of one all-reduce (the slowest rank's mean over the
timed iterations), algorithm bandwidth algbw = bytes / time and bus bandwidth
busbw = algbw * 2(n-1)/n, the nccl-tests definition: the traffic a ring puts on each link, so
figures are comparable across world sizes. Before timing, each case checks its result against
the exact closed-form sum; exit status 1 if any case is wrong.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from ddp import cli
from ddp.comm.collectives import COLLECTIVES, all_reduce, check_collective
from ddp.launch.launcher import DistContext, cpu_count, launch
from ddp.strategies.base import synchronize_device

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32, "int64": torch.int64}
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text: str) -> int:
    """Bytes from '1000', '1K', '64K', '16M', '1G' (powers of 1024, as nccl-tests)."""
    unit = text[-1:].upper() if text[-1:].isalpha() else ""
    digits = text[: len(text) - len(unit)]
    if unit not in _UNITS or not digits.isdigit() or int(digits) <= 0:
        raise ValueError(f"bad size {text!r}: expected a positive integer with optional K, M or G suffix")
    return int(digits) * _UNITS[unit]


def format_size(nbytes: int) -> str:
    """The shortest exact spelling: 16M, 64K, 1000."""
    for unit in ("G", "M", "K"):
        if nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)


@dataclass(frozen=True)
class BenchConfig:
    """What to measure; validates itself and names the bad value."""

    world_size: int
    sizes: tuple[int, ...]
    collectives: tuple[str, ...] = field(default_factory=lambda: tuple(COLLECTIVES))
    dtype: str = "float32"
    seconds_per_case: float = 0.5
    max_iters: int = 100

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"--world-size must be >= 1, got {self.world_size}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for collective in self.collectives:
            check_collective(collective)
        itemsize = DTYPES[self.dtype].itemsize
        for size in self.sizes:
            if size <= 0 or size % itemsize:
                raise ValueError(f"size {size} bytes is not a positive multiple of {self.dtype}'s {itemsize} bytes")
        if not self.seconds_per_case > 0:
            raise ValueError(f"--seconds-per-case must be > 0, got {self.seconds_per_case}")
        if self.max_iters < 1:
            raise ValueError(f"--max-iters must be >= 1, got {self.max_iters}")


@dataclass
class BenchRow:
    """One collective at one size, as rank 0 reports it."""

    collective: str
    ranks: int
    size: str
    bytes: int
    count: int
    iters: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    correct: bool


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw * 2(n-1)/n."""
    return algbw * 2 * (world_size - 1) / world_size


def _slowest(seconds: float, device: torch.device) -> float:
    """The maximum of a per-rank number over all ranks (always through torch's collective)."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def check_result(collective: str, count: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Reduce a rank-dependent pattern whose exact sum is known; True on every rank iff all ranks match."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pattern = torch.arange(count, dtype=torch.int64, device=device) % 251  # small integers: exact in every dtype
    x = (pattern * (rank + 1)).to(dtype)
    all_reduce(x, collective)
    ok = torch.equal(x, (pattern * (world * (world + 1) // 2)).to(dtype))
    return _slowest(0.0 if ok else 1.0, device) == 0.0


def time_one(
    collective: str, count: int, dtype: torch.dtype, device: torch.device, cfg: BenchConfig
) -> tuple[int, float]:
    """(iterations, seconds per all-reduce of the slowest rank), with iterations sized to the budget."""
    # Zeros keep the repeatedly reduced buffer finite (no inf/denormal slow paths) at the same cost.
    x = torch.zeros(count, dtype=dtype, device=device)
    all_reduce(x, collective)  # warm-up: connections, buffers, the worker thread
    dist.barrier()
    t0 = time.perf_counter()
    all_reduce(x, collective)
    synchronize_device(x)
    once = _slowest(time.perf_counter() - t0, device)
    iters = max(1, min(cfg.max_iters, math.ceil(cfg.seconds_per_case / max(once, 1e-9))))
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        all_reduce(x, collective)
    synchronize_device(x)
    return iters, _slowest((time.perf_counter() - t0) / iters, device)


def run_rank(ctx: DistContext, cfg: BenchConfig) -> list[dict]:
    """Every rank runs this (through `ddp.launch.launcher.launch`); every rank returns the same records.

    Records are plain dicts: under `python -m` this module is `__main__` in the parent and
    `__mp_main__` in the ranks, so its own classes do not survive the trip back.
    """
    dtype, world = DTYPES[cfg.dtype], ctx.world_size
    rows = []
    for size in cfg.sizes:
        count = size // dtype.itemsize
        for collective in cfg.collectives:
            correct = check_result(collective, count, dtype, ctx.device)
            iters, seconds = time_one(collective, count, dtype, ctx.device, cfg)
            algbw = size / seconds / 1e9
            rows.append(
                BenchRow(
                    collective,
                    world,
                    format_size(size),
                    size,
                    count,
                    iters,
                    seconds * 1e6,
                    algbw,
                    bus_bandwidth(algbw, world),
                    correct,
                )
            )
            if ctx.is_main:
                cli.progress(
                    f"[collectives_bench] {collective:>16} {format_size(size):>5}: {iters} iters, "
                    f"{seconds * 1e3:.3f} ms, {'ok' if correct else 'WRONG'}"
                )
    return to_records(rows)


# ---------------------------------------------------------------- command line

COLUMNS = ["collective", "ranks", "size", "bytes", "count", "iters", "time_us", "algbw_gbps", "busbw_gbps", "check"]


def to_records(rows: list[BenchRow]) -> list[dict]:
    """Rows as flat records for `cli.format_records`; `check` reads ok or WRONG."""
    return [{**asdict(r), "check": "ok" if r.correct else "WRONG"} for r in rows]


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="python -m ddp.collectives_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--world-size", type=int, default=4, help="ranks to spawn on this machine (default 4)")
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=["1K", "64K", "1M", "16M"],
        metavar="SIZE",
        help="message sizes in bytes; K, M, G are powers of 1024 (default: 1K 64K 1M 16M)",
    )
    parser.add_argument(
        "--collectives",
        "--algorithms",
        dest="collectives",
        nargs="+",
        default=list(COLLECTIVES),
        choices=list(COLLECTIVES),
        metavar="COLLECTIVE",
        help=f"collectives to time (default: all of {', '.join(COLLECTIVES)}); --algorithms is its old name",
    )
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES), help="element type (default float32)")
    parser.add_argument(
        "--seconds-per-case",
        type=float,
        default=0.5,
        help="timing budget per collective and size, which sets the iteration count (default 0.5)",
    )
    parser.add_argument("--max-iters", type=int, default=100, help="cap on timed iterations per case (default 100)")
    parser.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default="gloo",
        help="process-group backend (default gloo; tensors go on each rank's GPU when one is visible)",
    )
    parser.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="stdout format: a human table, or CSV / JSON records for machines",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = BenchConfig(
            world_size=args.world_size,
            sizes=tuple(parse_size(s) for s in args.sizes),
            collectives=tuple(args.collectives),
            dtype=args.dtype,
            seconds_per_case=args.seconds_per_case,
            max_iters=args.max_iters,
        )
    except ValueError as error:
        parser.error(str(error))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cli.progress(
        f"[collectives_bench] {cfg.world_size} ranks ({args.backend}), {cfg.dtype}, "
        f"1-min load average {load:.1f} on {cpu_count()} CPUs"
    )
    records = launch(run_rank, cfg.world_size, cfg, backend=args.backend)
    if int(os.environ.get("RANK", 0)) != 0:  # under torchrun every rank has the records: rank 0 reports
        return cli.EXIT_OK
    print(cli.format_records(records, args.format, COLUMNS, float_digits=3))
    wrong = [f"{r['collective']} {r['size']}" for r in records if r["check"] != "ok"]
    if wrong:
        cli.progress(f"collectives_bench: wrong results: {', '.join(wrong)}")
        return cli.EXIT_CHECK_FAILED
    return cli.EXIT_OK


if __name__ == "__main__":
    cli.run_main(main)

"""Bus-bandwidth benchmark of every all-reduce algorithm in `ddp.collectives`, in isolation.

    python -m ddp.collectives_bench --world-size 4 --sizes 1K 64K 1M 16M [--format table|csv|json]

Per algorithm and message size: the time of one all-reduce (the slowest rank's mean over the
timed iterations), algorithm bandwidth algbw = bytes / time and bus bandwidth
busbw = algbw * 2(n-1)/n, the nccl-tests definition: the traffic a ring puts on each link, so
figures are comparable across world sizes. Before timing, each case checks its result against
the exact closed-form sum; exit status 1 if any case is wrong.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from ddp.collectives import ALGORITHMS, all_reduce
from ddp.launcher import DistContext, RankFailedError, launch

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32, "int64": torch.int64}
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_DEVICE = torch.device("cpu")  # the rank's device, set by run_rank


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
    algorithms: tuple[str, ...] = field(default_factory=lambda: tuple(ALGORITHMS))
    dtype: str = "float32"
    seconds_per_case: float = 0.5
    max_iters: int = 100

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"--world-size must be >= 1, got {self.world_size}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        unknown = [a for a in self.algorithms if a not in ALGORITHMS]
        if unknown:
            raise ValueError(f"unknown algorithm {unknown[0]!r}: choose from {', '.join(ALGORITHMS)}")
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
    """One algorithm at one size, as rank 0 reports it."""
    algorithm: str
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


def _slowest(seconds: float) -> float:
    """The maximum of a per-rank number over all ranks (always through torch's collective)."""
    t = torch.tensor([seconds], dtype=torch.float64, device=_DEVICE)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_result(algorithm: str, count: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Reduce a rank-dependent pattern whose exact sum is known; True on every rank iff all ranks match."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pattern = torch.arange(count, dtype=torch.int64, device=device) % 251  # small integers: exact in every dtype
    x = (pattern * (rank + 1)).to(dtype)
    all_reduce(x, algorithm)
    ok = torch.equal(x, (pattern * (world * (world + 1) // 2)).to(dtype))
    return _slowest(0.0 if ok else 1.0) == 0.0


def time_one(algorithm: str, count: int, dtype: torch.dtype, device: torch.device,
             cfg: BenchConfig) -> tuple[int, float]:
    """(iterations, seconds per all-reduce of the slowest rank), with iterations sized to the budget."""
    # Zeros keep the repeatedly reduced buffer finite (no inf/denormal slow paths) at the same cost.
    x = torch.zeros(count, dtype=dtype, device=device)
    all_reduce(x, algorithm)  # warm-up: connections, buffers, the worker thread
    dist.barrier()
    t0 = time.perf_counter()
    all_reduce(x, algorithm)
    _sync(device)
    once = _slowest(time.perf_counter() - t0)
    iters = max(1, min(cfg.max_iters, math.ceil(cfg.seconds_per_case / max(once, 1e-9))))
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        all_reduce(x, algorithm)
    _sync(device)
    return iters, _slowest((time.perf_counter() - t0) / iters)


def run_rank(ctx: DistContext, cfg: BenchConfig) -> list[BenchRow]:
    """Every rank runs this (through `ddp.launcher.launch`); every rank returns the same rows."""
    global _DEVICE
    _DEVICE = ctx.device
    dtype, world = DTYPES[cfg.dtype], ctx.world_size
    rows = []
    for size in cfg.sizes:
        count = size // dtype.itemsize
        for algorithm in cfg.algorithms:
            correct = check_result(algorithm, count, dtype, ctx.device)
            iters, seconds = time_one(algorithm, count, dtype, ctx.device, cfg)
            algbw = size / seconds / 1e9
            rows.append(BenchRow(algorithm, format_size(size), size, count, iters, seconds * 1e6, algbw,
                                 bus_bandwidth(algbw, world), correct))
            if ctx.is_main:
                print(f"[collectives_bench] {algorithm:>16} {format_size(size):>6}: {iters} iters, "
                      f"{seconds * 1e3:.3f} ms", file=sys.stderr, flush=True)
    return rows


# ---------------------------------------------------------------- output

_COLUMNS = [("algorithm", "algorithm", "{}"), ("size", "size", "{}"), ("count", "count", "{}"),
            ("iters", "iters", "{}"), ("time_us", "time (us)", "{:.1f}"), ("algbw_gbps", "algbw (GB/s)", "{:.3f}"),
            ("busbw_gbps", "busbw (GB/s)", "{:.3f}"), ("correct", "check", "{}")]


def render(rows: list[BenchRow], fmt: str, world_size: int) -> str:
    """The rows as an aligned table, CSV or JSON."""
    if fmt == "json":
        import json
        return json.dumps({"world_size": world_size, "rows": [asdict(r) for r in rows]}, indent=2)
    if fmt == "csv":
        lines = [",".join(key for key, _, _ in _COLUMNS)]
        lines += [",".join(str(getattr(r, key)) for key, _, _ in _COLUMNS) for r in rows]
        return "\n".join(lines)
    cells = [[title for _, title, _ in _COLUMNS]]
    for r in rows:
        cells.append([("ok" if r.correct else "WRONG") if key == "correct" else spec.format(getattr(r, key))
                      for key, _, spec in _COLUMNS])
    widths = [max(len(row[i]) for row in cells) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in cells]
    lines.insert(1, "-" * len(lines[0]))
    return f"all-reduce, {world_size} ranks (gloo/CPU unless launched on GPUs)\n" + "\n".join(lines)

"""Cost of ddp.comm.nvtx_ranges calls with no profiler attached, against a training step.

    python benchmarks/ddp_nvtx_overhead.py [--pairs 100000] [--step-ms 40]

Prints nanoseconds per push/pop pair and per start/end pair, then the ranges one step of each
implementation emits on the tiny model and what they add to a step of --step-ms milliseconds
(about the tiny model's step in `python -m ddp.benchmark` on the 2-core development machine).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from ddp.comm import nvtx_ranges
from ddp.training.models import build_model


def ns_per_pair(fn: Callable[[int], object], pairs: int) -> float:
    t0 = time.perf_counter_ns()
    fn(pairs)
    return (time.perf_counter_ns() - t0) / pairs


def push_pop(pairs: int) -> None:
    for _ in range(pairs):
        with nvtx_ranges.range("bench"):
            pass


def start_end(pairs: int) -> None:
    for _ in range(pairs):
        nvtx_ranges.end(nvtx_ranges.start("bench"))


def empty_loop(pairs: int) -> None:
    for _ in range(pairs):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--step-ms", type=float, default=40.0)
    args = parser.parse_args()
    loop = ns_per_pair(empty_loop, args.pairs)
    push = ns_per_pair(push_pop, args.pairs) - loop
    start = ns_per_pair(start_end, args.pairs) - loop
    print(f"nvtx available: {nvtx_ranges.AVAILABLE}; {args.pairs} pairs each")
    print(f"push/pop  (range):     {push:7.0f} ns per pair")
    print(f"start/end (async):     {start:7.0f} ns per pair")
    params = sum(1 for _ in build_model("tiny").parameters())
    # per step: step, forward, backward, grad_sync, optimizer + one comm range per collective
    for impl, comm, kind in [("naive", params, push), ("flat", 1, push), ("overlap", params, start)]:
        cost_us = (5 * push + comm * kind) / 1e3
        print(
            f"{impl:8s} tiny model: {5 + comm:3d} ranges/step = {cost_us:6.1f} us/step "
            f"= {cost_us / 1e3 / args.step_ms * 100:.3f}% of a {args.step_ms:g} ms step"
        )


if __name__ == "__main__":
    main()

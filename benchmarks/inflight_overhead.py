"""What recording collectives in `ddp.comm.inflight` costs per collective (the price of naming a hung one).

    python benchmarks/inflight_overhead.py [--calls 100000]

Prints the best of 3 passes, in microseconds per collective: begin+end alone, with the shared slot a
spawned rank mirrors into, and an async handle (TrackedWork on an already-completed torch Future, so the
done-callback and wait run too). Compare with a collective's own time (tens of microseconds for a small
gloo all-reduce on CPU, more on GPUs); run it on an idle machine for figures to quote.
"""

from __future__ import annotations

import argparse
import multiprocessing.sharedctypes
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddp, not an installed one
from contract import ALL_REDUCE, comm_range
from ddp.comm import inflight

NAME = comm_range(ALL_REDUCE, "layers.0.attn.wq.weight")


class _DoneWork:
    """A Work-like handle whose future is already complete."""

    def __init__(self) -> None:
        self.future: torch.futures.Future[None] = torch.futures.Future()
        self.future.set_result(None)

    def get_future(self) -> torch.futures.Future[None]:
        return self.future

    def wait(self) -> bool:
        return True


def best_us(fn: Callable[[], object], calls: int) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100_000)
    calls = parser.parse_args().calls
    plain = best_us(lambda: inflight.end(inflight.begin(NAME)), calls)
    inflight.attach(multiprocessing.sharedctypes.RawArray(inflight.Slot, 1)[0])
    shared = best_us(lambda: inflight.end(inflight.begin(NAME)), calls)
    work = _DoneWork()
    tracked = best_us(lambda: inflight.TrackedWork(work, inflight.begin(NAME)).wait(), calls)
    print(
        f"us per collective: begin+end {plain:.2f}, with shared slot {shared:.2f}, "
        f"async handle (TrackedWork) {tracked:.2f}"
    )


if __name__ == "__main__":
    main()

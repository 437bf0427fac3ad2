"""`--slow-rank RANK:PLACE:MS`: one rank made slow at one place of every training step, for tests and
demonstrations of the straggler analysis (analysis.collectives names the rank and the cause).

The stall is a host sleep of MS milliseconds on rank RANK, at PLACE:
  data       inside the `data` range, while the rank's batch is made (late data);
  forward    at the start of the `forward` range (longer compute in forward);
  backward   at the start of the `backward` range, before any gradient is reduced (longer backward);
  optimizer  at the start of the `optimizer` range (the others wait for it in the next step's collectives);
  issue      after `backward` and before the gradient synchronisation issues or waits for its collectives,
             inside no range (a host that launched late while its compute was done). Strategies that issue
             every collective during backward (overlap, overlap_bucket, torch) are held by it in the next step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from contract import SLOW_PLACES

Stall = Callable[[str], None]  # called at each place of a step (contract.SLOW_PLACES): sleeps there on the slow rank


@dataclass(frozen=True)
class SlowRank:
    """Rank `rank` sleeps `ms` milliseconds at `place` (one of contract.SLOW_PLACES) every step."""

    rank: int
    place: str
    ms: float

    def stall(self, rank: int, place: str) -> None:
        """Sleep here when this is the slow rank's place (a no-op on every other rank and place)."""
        if rank == self.rank and place == self.place:
            time.sleep(self.ms / 1e3)


def parse_slow_rank(text: str) -> SlowRank:
    """`RANK:PLACE:MS` -> SlowRank; ValueError naming the bad part."""
    parts = str(text).split(":")
    if len(parts) != 3:
        raise ValueError(f"slow_rank={text!r}: expected RANK:PLACE:MS, e.g. 1:backward:50")
    rank, place, ms = parts
    if not rank.isdigit():
        raise ValueError(f"slow_rank={text!r}: RANK {rank!r} must be an integer >= 0")
    if place not in SLOW_PLACES:
        raise ValueError(f"slow_rank={text!r}: unknown PLACE {place!r}: choose from {', '.join(SLOW_PLACES)}")
    try:
        stall_ms = float(ms)
    except ValueError:
        stall_ms = float("nan")
    if not stall_ms > 0 or stall_ms == float("inf"):
        raise ValueError(f"slow_rank={text!r}: MS {ms!r} must be a positive number of milliseconds")
    return SlowRank(int(rank), place, stall_ms)


def check_slow_rank(name: str, value: object) -> None:
    """RunConfig's check of `slow_rank` on its own (the rank against the world size is checked with it)."""
    if not isinstance(value, str):
        raise ValueError(f"{name}={value!r}: expected RANK:PLACE:MS, e.g. 1:backward:50")
    parse_slow_rank(value)


def no_stall(place: str) -> None:
    """The stall of a run without a slow rank."""


def stall_of(slow_rank: str | None, rank: int) -> Stall:
    """Rank `rank`'s stall for a run's `slow_rank` setting: no_stall when unset."""
    if slow_rank is None:
        return no_stall
    slow = parse_slow_rank(slow_rank)
    return lambda place: slow.stall(rank, place)


def slow_rank_meta(slow_rank: str | None) -> dict | None:
    """ddp.meta's `slow_rank` (contract.SLOW_RANK_KEY): the rank slowed, where and by how much; None if none."""
    if slow_rank is None:
        return None
    slow = parse_slow_rank(slow_rank)
    return {"rank": slow.rank, "place": slow.place, "ms": slow.ms}

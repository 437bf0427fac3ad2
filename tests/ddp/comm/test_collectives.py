"""All-reduce from point-to-point messages (ring, reduce_broadcast) against dist.all_reduce, on gloo/CPU.

One spawned group of 4 ranks runs every case (sizes x dtypes x collectives x blocking/async) over the
first 1, 2, 3 and 4 of its ranks in turn, because starting ranks (importing torch) costs far more than
the cases. The collectives see nothing of the world but their group's size and their rank in it (peers are
mapped through `dist.get_global_rank`), so the first n ranks of 4 are a world of n to them; the 4 are the
default group itself (`group=None`). Rank 0 gathers every rank's failures and each size's test fails with
all of them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, strategies as st

from ddp.comm import collectives, reduce_broadcast, ring_allreduce
from ddp.comm.ring_allreduce import chunk_bounds
from ddp.launch.launcher import DistContext, launch

# Through the one entry point every wrapper uses, so the registration is tested too.
P2P_COLLECTIVES = {
    name: functools.partial(collectives.all_reduce, collective=name) for name in ("ring", "reduce_broadcast")
}
SIZES = (0, 1, 7, 1000, 100_003)
WORLDS = (1, 2, 3, 4)
Group = dist.ProcessGroup | None
DTYPES = (torch.float64, torch.int64)


# ---------------------------------------------------------------- per-rank checks


def _rank_input(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Different values on every rank; integers span negatives and large magnitudes."""
    g = torch.Generator().manual_seed(1000 * rank + numel)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=g, dtype=dtype) * 1e3
    return torch.randint(-(2**40), 2**40, (numel,), generator=g, dtype=dtype)


def _mismatch(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None if equal (exactly for integers, to rounding for floats), else what differs."""
    if got.dtype.is_floating_point:
        close = torch.allclose(got, want, rtol=1e-12, atol=1e-9)
    else:
        close = torch.equal(got, want)
    if close:
        return None
    bad = (got != want).nonzero().flatten()[:3].tolist()
    return f"differs from dist.all_reduce at indices {bad}"


def _check_sizes_and_dtypes(rank: int, world: int, group: Group) -> list[str]:
    """Blocking calls: every collective x size x dtype equals dist.all_reduce and works in place."""
    failures = []
    for name, all_reduce in P2P_COLLECTIVES.items():
        for numel in SIZES:
            for dtype in DTYPES:
                x = _rank_input(rank, numel, dtype)
                want = x.clone()
                dist.all_reduce(want, group=group)
                got = all_reduce(x, group=group)
                case = f"{name} numel={numel} {dtype}"
                if got is not x:
                    failures.append(f"{case}: did not return the input tensor")
                if (msg := _mismatch(x, want)) is not None:
                    failures.append(f"{case}: {msg}")
    return failures


def _check_async_shapes_and_order(rank: int, world: int, group: Group) -> list[str]:
    """Async handles interleaved with blocking calls, multi-dimensional and non-contiguous tensors."""
    failures = []
    for name, all_reduce in P2P_COLLECTIVES.items():
        inputs = [_rank_input(rank, n, torch.int64) for n in (5, 0, 1001, 64)]
        inputs[3] = inputs[3].view(8, 8).t()  # non-contiguous: the result must land in the original
        inputs[2] = torch.nn.Parameter(inputs[2].double(), requires_grad=True)  # in place despite autograd
        wants = [t.clone() for t in inputs]
        for want in wants:
            dist.all_reduce(want, group=group)
        handles = [all_reduce(t, group=group, async_op=True) for t in inputs[:2]]
        all_reduce(inputs[2], group=group)  # blocking, issued after two async ops still in flight
        handles.append(all_reduce(inputs[3], group=group, async_op=True))
        futures = [h.get_future() for h in handles]
        for h in reversed(handles):
            h.wait()
        if not all(h.is_completed() for h in handles):
            failures.append(f"{name}: a waited handle is not completed")
        if futures[2].value() is not inputs[3]:
            failures.append(f"{name}: the future's value is not the reduced tensor")
        for i, (got, want) in enumerate(zip(inputs, wants, strict=True)):
            if (msg := _mismatch(got, want)) is not None:
                failures.append(f"{name} async/mixed input {i}: {msg}")
    return failures


def _check_phase_ranges(rank: int, world: int, group: Group) -> list[str]:
    """Each collective opens its NVTX phase ranges, in order, on the p2p worker thread."""
    seen: list[tuple[str, str]] = []

    def recording_range(name: str):
        seen.append((name, threading.current_thread().name))
        return contextlib.nullcontext()

    modules = (ring_allreduce, reduce_broadcast)
    originals = [m.nvtx_range for m in modules]
    try:
        for m in modules:
            m.nvtx_range = recording_range
        for all_reduce in P2P_COLLECTIVES.values():
            all_reduce(torch.ones(10), group=group)
    finally:
        for m, original in zip(modules, originals, strict=True):
            m.nvtx_range = original
    phases = ["ring:reduce_scatter", "ring:all_gather", "reduce_broadcast:reduce", "reduce_broadcast:broadcast"]
    want = [(name, "p2p-collectives") for name in phases] if world > 1 else []
    return [] if seen == want else [f"phase ranges {seen}, expected {want}"]


def _parity_groups(world: int) -> dict[int, Group]:
    """The even and the odd ones of the first `world` ranks (world >= 3). Every rank of the launch must create
    every group, in the same order, so this runs on all of them."""
    return {parity: dist.new_group([r for r in range(world) if r % 2 == parity]) for parity in (0, 1)}


def _check_subgroups(rank: int, world: int, parity_groups: dict[int, Group]) -> list[str]:
    """Over a subgroup (even or odd ranks), ranks map to the right peers and the sum covers the subgroup only."""
    if world < 3:
        return []
    group = parity_groups[rank % 2]
    failures = []
    for name, all_reduce in P2P_COLLECTIVES.items():
        x = _rank_input(rank, 1001, torch.int64)
        want = x.clone()
        dist.all_reduce(want, group=group)
        all_reduce(x, group=group)
        if (msg := _mismatch(x, want)) is not None:
            failures.append(f"{name} over the {'odd' if rank % 2 else 'even'} ranks: {msg}")
    return failures


def _check_other_root(rank: int, world: int, group: Group) -> list[str]:
    """reduce_broadcast rooted at the last rank: the tree is relabelled, the sum is the same."""
    x = _rank_input(rank, 333, torch.int64)
    want = x.clone()
    dist.all_reduce(want, group=group)
    reduce_broadcast.reduce_broadcast_all_reduce(x, group=group, root=world - 1)
    msg = _mismatch(x, want)
    return [] if msg is None else [f"reduce_broadcast rooted at rank {world - 1}: {msg}"]


def _check_world(rank: int, world: int, group: Group) -> list[str]:
    """Every check on this rank of a world of `world` ranks (`group`: the first `world` ranks, None: all)."""
    parity_groups = _parity_groups(world) if world >= 3 else {}  # created on every rank of the launch
    if rank >= world:
        return []
    return (
        _check_sizes_and_dtypes(rank, world, group)
        + _check_async_shapes_and_order(rank, world, group)
        + _check_phase_ranges(rank, world, group)
        + _check_subgroups(rank, world, parity_groups)
        + _check_other_root(rank, world, group)
    )


def _check_all(ctx: DistContext) -> dict[int, list[str]]:
    """Every check over the first 1, 2, ... ranks in turn; rank 0 returns, per world size, all ranks'
    failures, each prefixed by its rank."""
    assert ctx.world_size == max(WORLDS)
    failures = {}
    for world in WORLDS:
        group = None if world == ctx.world_size else dist.new_group(list(range(world)))  # on every rank
        failures[world] = _check_world(ctx.rank, world, group)
    everyone: list = [None] * ctx.world_size
    dist.all_gather_object(everyone, failures)
    return {world: [f"rank {r}: {msg}" for r, got in enumerate(everyone) for msg in got[world]] for world in WORLDS}


# ---------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def failures_per_world() -> dict[int, list[str]]:
    return launch(_check_all, max(WORLDS), backend="gloo", timeout_s=120)


@pytest.mark.ranks  # spawns 4 ranks (module fixture)
@pytest.mark.parametrize("world", WORLDS)
def test_p2p_all_reduce_equals_dist_all_reduce(failures_per_world: dict[int, list[str]], world: int) -> None:
    assert failures_per_world[world] == []


@given(numel=st.integers(0, 10_000), parts=st.integers(1, 64))
def test_chunk_bounds_tile_the_tensor_evenly(numel: int, parts: int) -> None:
    bounds = chunk_bounds(numel, parts)
    assert len(bounds) == parts
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(end == nxt for (_, end), (nxt, _) in itertools.pairwise(bounds))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)

"""fsdp's collectives and buffer events in issue order, and the rules of docs/fsdp.md's "Streams and buffer
lifetimes" checked on them (module level: spawned ranks import it).

On CUDA a collective runs on NCCL's stream; `work.wait()` orders the current stream after it (not the host),
and the caching allocator hands a block freed on a stream to the next allocation on that stream. So a buffer
a collective reads or writes may be freed, handed to another unit or rewritten only after the stream doing so
waited for that work: in this log, after the work's `wait`. CPU runs the same code, so the order of these calls
on gloo is the order they have on NCCL. `host_sees_complete` makes every work say it is complete from the
start (what `is_completed()` may say on CUDA while the current stream has not waited): a rule that leaned on
`is_completed()` instead of a wait shows up as a violation, and on gloo as wrong bits.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ddp.launch.launcher import DistContext
from ddp.sharding.gradient_buffers import GradientBuffers
from ddp.sharding.unit_state import UnitState
from ddp.strategies import fsdp as fsdp_module, registry
from ddp.training.data import shard
from tests.ddp.strategies.fsdp_cases import batch, build, loss_of, optimizer

Span = tuple[int, int]  # (first byte's address, bytes)
# Which pending accesses each buffer event conflicts with: freeing, handing out or rewriting a buffer needs every
# collective that reads or writes it waited for; reading one needs its writers waited for.
BOTH = ("reads", "writes")
CONFLICTS = {"free": BOTH, "take": BOTH, "write": BOTH, "read": ("writes",)}


def span(t: torch.Tensor) -> Span:
    return t.data_ptr(), t.numel() * t.element_size()


class LoggedWork:
    """A collective's handle that logs its wait (and, with `host_sees_complete`, always says it is complete)."""

    def __init__(self, work: Any, k: int, log: OrderLog):
        self._work, self._k, self._log = work, k, log

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        self._log.events.append(("wait", self._k, []))
        return result

    def is_completed(self) -> bool:
        return True if self._log.host_sees_complete else bool(self._work.is_completed())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class OrderLog:
    """Events (kind, work number or None, spans): `issue` (spans: [reads, writes], group), `wait`, `free`, `take`,
    `write`, `read`, `step_end`."""

    def __init__(self, host_sees_complete: bool = False):
        self.events: list[tuple[str, int | None, list]] = []
        self.groups: list[str] = []  # per work: the process group it went through
        self.host_sees_complete = host_sees_complete

    def collective(self, function: Any, op: str) -> Any:
        def issue(output: torch.Tensor, input: torch.Tensor, group: Any = None, async_op: bool = False, **kw: Any):
            work = function(output, input, group=group, async_op=async_op, **kw)
            if not async_op:
                return work
            k = len(self.groups)
            self.groups.append(str(getattr(group, "group_name", group)))
            self.events.append(("issue", k, [op, [span(input)], [span(output)]]))
            return LoggedWork(work, k, self)

        return issue

    def buffer(self, kind: str, spans: list[Span]) -> None:
        self.events.append((kind, None, spans))


def violations(events: list[tuple[str, int | None, list]]) -> list[str]:
    """Every buffer event that comes before the wait of a collective it conflicts with (CONFLICTS), and every
    collective not waited for by the end of its step."""
    pending: dict[int, dict[str, Any]] = {}
    found = []
    for n, (kind, k, spans) in enumerate(events):
        if kind == "issue":
            op, reads, writes = spans
            pending[k] = {"op": op, "reads": reads, "writes": writes}  # type: ignore[index]
        elif kind == "wait":
            pending.pop(k, None)  # type: ignore[arg-type]
        elif kind == "step_end":
            found += [f"event {n}: step ended with work {j} ({w['op']}) not waited" for j, w in pending.items()]
        else:
            for j, w in pending.items():
                touched = [t for access in CONFLICTS[kind] for t in w[access]]
                if any(_overlap(s, t) for s in spans for t in touched):
                    found.append(f"event {n}: {kind} of a buffer work {j} ({w['op']}) uses, before its wait")
    return found


def _overlap(a: Span, b: Span) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1] and a[1] > 0 and b[1] > 0


def _instrument(log: OrderLog) -> list[tuple[Any, str, Any]]:
    """Route fsdp's collectives and buffer events through `log`; what to restore."""
    saved = [
        (fsdp_module, "_all_gather", fsdp_module._all_gather),
        (fsdp_module, "_reduce_scatter", fsdp_module._reduce_scatter),
        (UnitState, "free", UnitState.free),
        (UnitState, "gather_buffers", UnitState.gather_buffers),
        (UnitState, "take_mean_gradient", UnitState.take_mean_gradient),
        (GradientBuffers, "take", GradientBuffers.take),
    ]
    fsdp_module._all_gather = log.collective(fsdp_module._all_gather, "all_gather")
    fsdp_module._reduce_scatter = log.collective(fsdp_module._reduce_scatter, "reduce_scatter")
    free, gather_buffers, take_mean, take = (s[2] for s in saved[2:])

    def logged_free(self: UnitState) -> None:
        storage = self.full.untyped_storage()
        log.buffer("free", [(storage.data_ptr(), storage.nbytes())])
        free(self)

    def logged_gather_buffers(self: UnitState) -> tuple[torch.Tensor, torch.Tensor]:
        if self.send is not self.unit.shard:  # the cast shard is rewritten for every gather
            log.buffer("write", [span(self.send)])
        return gather_buffers(self)

    def logged_take_mean(self: UnitState, world_size: int) -> None:
        log.buffer("read", [span(self.unit.grad)])
        take_mean(self, world_size)

    def logged_take(self: GradientBuffers, owner: object) -> torch.Tensor:
        buffer = take(self, owner)
        log.buffer("take", [span(buffer)])
        return buffer

    UnitState.free = logged_free  # type: ignore[method-assign]
    UnitState.gather_buffers = logged_gather_buffers  # type: ignore[method-assign]
    UnitState.take_mean_gradient = logged_take_mean  # type: ignore[method-assign]
    GradientBuffers.take = logged_take  # type: ignore[method-assign]
    return saved


def ordering_run(ctx: DistContext, case: dict) -> dict:
    """Train `case` (model, optimizer, steps, batch_size, kwargs, host_sees_complete) with fsdp's events logged;
    the log, the process group of each work, and the full parameters after each step."""
    warnings.simplefilter("error")
    torch.use_deterministic_algorithms(True)
    log = OrderLog(case.get("host_sees_complete", False))
    saved = _instrument(log)
    try:
        wrapper = registry.get("fsdp")(build(case["model"], seed=ctx.rank), **case.get("kwargs", {}))
        opt = optimizer(case["optimizer"], wrapper.parameters())
        history = []
        for step in range(case["steps"]):
            x, y = shard(batch(step, case["batch_size"]), ctx.rank, ctx.world_size)
            opt.zero_grad(set_to_none=True)
            loss_of(wrapper(x), y).backward()
            wrapper.finish_gradient_synchronization()
            log.buffer("step_end", [])
            log.buffer("write", [span(s.unit.shard) for s in wrapper.states])  # the optimizer updates the shards
            opt.step()
            wrapper.reset_comm_stats()
            history.append(wrapper.gather_full_params())
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
    groups = {"default": str(getattr(wrapper.group, "group_name", None))}
    rs_group = getattr(wrapper, "rs_group", None)
    if rs_group is not None:
        groups["reduce_scatter"] = str(rs_group.group_name)
    return {"events": log.events, "work_groups": log.groups, "groups": groups, "history": history,
            "threads": torch.get_num_threads()}  # fmt: skip


def ordering_worker(ctx: DistContext, cases: list[dict]) -> list[dict]:
    return [ordering_run(ctx, case) for case in cases]

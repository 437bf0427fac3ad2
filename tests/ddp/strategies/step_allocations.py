"""Counting what a training step allocates, and where (for the sharded strategies' steady-state tests).

`StepAllocations` is a TorchDispatchMode: every aten op that returns a tensor whose storage none of its
inputs held made a new storage; it is recorded with its bytes and the innermost Python frame outside
torch (the code that asked for it: a wrapper's hook, a model's forward, or `loss.backward()` for the
ops autograd runs). Storages regrown through `UntypedStorage.resize_` (FSDP's gather buffers) go
around the dispatcher, so `resize_` is watched too while the mode is open.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

TORCH_DIR = os.path.dirname(torch.__file__)
HERE = os.path.abspath(__file__)


@dataclass(frozen=True)
class Allocation:
    """One new storage: who made it (an aten op, or `resize_`), its bytes, and the code that asked."""

    op: str
    nbytes: int
    where: str  # "path/relative/to/the/repo.py:function"


def _caller() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(TORCH_DIR) and path != HERE:
            return f"{os.path.relpath(path)}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def _storages(tree: object) -> set[int]:
    leaves, _ = tree_flatten(tree)
    return {t.untyped_storage().data_ptr() for t in leaves if isinstance(t, torch.Tensor)}


class StepAllocations(TorchDispatchMode):
    """Context manager: `allocations`, in order, of every new storage with bytes made while it is open."""

    def __init__(self) -> None:
        super().__init__()
        self.allocations: list[Allocation] = []
        self._resize = torch.UntypedStorage.resize_

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        held = _storages((args, kwargs))
        out = func(*args, **(kwargs or {}))
        leaves, _ = tree_flatten(out)
        for t in leaves:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if storage.nbytes() and storage.data_ptr() not in held:
                    held.add(storage.data_ptr())
                    self.allocations.append(Allocation(str(func), storage.nbytes(), _caller()))
        return out

    def __enter__(self) -> StepAllocations:
        mode = self
        original = self._resize

        def resize(storage: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
            grown = size > storage.nbytes()
            result = original(storage, size)
            if grown:
                mode.allocations.append(Allocation("UntypedStorage.resize_", size, _caller()))
            return result

        torch.UntypedStorage.resize_ = resize  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        torch.UntypedStorage.resize_ = self._resize  # type: ignore[method-assign]
        super().__exit__(*exc)

    def made_in(self, *paths: str) -> list[Allocation]:
        """The allocations asked for by code in files under `paths` (relative to the repository root)."""
        return [a for a in self.allocations if a.where.startswith(paths)]


def steady_state_allocations(ctx, cases: list[dict]) -> list[dict]:
    """Per case: train 4 steps of `fsdp` (warnings as errors, deterministic algorithms), recording what each
    step's forward, backward and gradient synchronisation allocate; also each unit's forward calls per step,
    and the flat gradient buffers' addresses after every step."""
    import warnings

    from ddp.strategies import registry
    from ddp.training.data import shard
    from tests.ddp.strategies import fsdp_cases

    warnings.simplefilter("error")
    torch.use_deterministic_algorithms(True)
    outcomes = []
    for case in cases:
        module = fsdp_cases.build(case["model"], seed=0)
        calls: dict[str, int] = {}
        for name, sub in module.named_modules():
            sub.register_forward_pre_hook(
                lambda *_, name=name, calls=calls: calls.update({name: calls.get(name, 0) + 1})
            )
        wrapper = registry.get("fsdp")(module, **case.get("kwargs", {}))
        opt = fsdp_cases.optimizer(case["optimizer"], wrapper.parameters())
        steps, buffers = [], []
        for step in range(4):
            x, y = shard(fsdp_cases.batch(step, 8), ctx.rank, ctx.world_size)
            opt.zero_grad(set_to_none=True)
            calls.clear()
            with StepAllocations() as seen:
                fsdp_cases.loss_of(wrapper(x), y).backward()
                wrapper.finish_gradient_synchronization()
            opt.step()
            wrapper.reset_comm_stats()
            steps.append({"allocations": seen.allocations, "calls": dict(calls)})
            buffers.append([b.data_ptr() for b in wrapper.comm_buffers()])
        outcomes.append({"steps": steps, "buffers": buffers, "units": [s.unit.name for s in wrapper.states]})
    return outcomes

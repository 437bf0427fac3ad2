"""The gathered memory of `torch_fsdp` (ddp.strategies.torch_fsdp): what PyTorch's FSDP2 holds of full
parameters, counted from its own objects (`torch.distributed.fsdp._fully_shard`, private: `fsdp_params_of` finds
them on every torch the project supports, and says None where it cannot, so that the figure reads "n/a").

FSDP2 gathers a unit in two kinds of tensors:
- the *all-gather output*, one flat buffer per unit and all-gather (every rank's padded shards end to end, in
  the dtype on the wire), allocated through the custom all-gather's `allocate` (ours: TimedAllGather) and
  dropped after its copy-out: in backward at once, in forward only once the next unit's all-gather has been
  waited for (FSDP2 keeps it so that the next all-gather may overlap the copy-out);
- each parameter's *unsharded copy*: `FSDPParam.all_gather_outputs` (the storage behind the `_unsharded_param`
  the module computes with), allocated by `alloc_all_gather_outputs()` during the copy-out and resized to
  0 bytes by `free_unsharded_param()` when the unit reshards: after its forward (all units but the root,
  which keeps its parameters unsharded from forward to backward) and after its backward.

`GatheredMemory` follows both: the flat buffers from allocation until they are garbage, the unsharded copies
by their storages' sizes after each `alloc_all_gather_outputs()` and `free_unsharded_param()` (wrapped on each
FSDPParam instance), and keeps the most bytes alive at once. Gathered memory only grows at those two points
(a flat buffer allocated, a parameter's copy allocated), so the high-water mark is exact for these tensors.

FSDP2 keeps its parameters in private state that moved between releases: each `fully_shard` module's
`FSDPState` holds one `_fsdp_param_group` (torch 2.9 to 2.12) or a list `_fsdp_param_groups` (2.13 on, where
the singular is a property that fails on a grouped `fully_shard([a, b])`); each group's `fsdp_params` are the
FSDPParam objects. No public API exposes them. Where a future torch moves them again, `fsdp_params_of` returns
None and `GatheredMemory.peak` is None: the gathered part (and the accounted peak) read "n/a", training goes on.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ddp.comm.instrumented import nbytes


class GatheredMemory:
    """Bytes of FSDP2's all-gather outputs and unsharded parameter copies alive now (`live`), the most alive
    at once so far (`peak`); `peak` is None when the FSDPParam objects could not be found (`fsdp_params` None)."""

    def __init__(self, fsdp_params: Iterable[Any] | None):
        self.flat = 0  # all-gather outputs alive
        self.unsharded = 0  # unsharded parameter copies alive
        self.known = fsdp_params is not None  # without the FSDPParams the copies go uncounted: no figure
        self._peak = 0
        self._counted: dict[int, int] = {}  # id(FSDPParam) -> bytes of its copies counted in `unsharded`
        for fsdp_param in fsdp_params or ():
            fsdp_param.alloc_all_gather_outputs = self._recount_after(fsdp_param, fsdp_param.alloc_all_gather_outputs)
            fsdp_param.free_unsharded_param = self._recount_after(fsdp_param, fsdp_param.free_unsharded_param)

    @property
    def peak(self) -> int | None:
        """The most bytes alive at once so far; None when the unsharded copies could not be counted."""
        return self._peak if self.known else None

    @property
    def live(self) -> int:
        return self.flat + self.unsharded

    def track_flat(self, buffer: torch.Tensor) -> torch.Tensor:
        """Count `buffer` (an all-gather output) as alive until it is garbage."""
        size = nbytes(buffer)
        self.flat += size
        self._sample()
        weakref.finalize(buffer, self._drop_flat, size)
        return buffer

    def _drop_flat(self, size: int) -> None:
        self.flat -= size

    def _recount_after(self, fsdp_param: Any, method: Callable[[], None]) -> Callable[[], None]:
        def recount() -> None:
            method()
            tensors = [*fsdp_param.all_gather_outputs, *getattr(fsdp_param, "_unsharded_inner_tensors", ())]
            now = sum(t.untyped_storage().nbytes() for t in tensors)
            self.unsharded += now - self._counted.get(id(fsdp_param), 0)
            self._counted[id(fsdp_param)] = now
            self._sample()

        return recount

    def _sample(self) -> None:
        self._peak = max(self._peak, self.live)


# What GatheredMemory wraps and reads on each FSDPParam (the same from torch 2.9 to 2.14).
FSDP_PARAM_API = ("alloc_all_gather_outputs", "free_unsharded_param", "all_gather_outputs")


def param_groups(state: Any) -> list[Any] | None:
    """The FSDPParamGroups of one FSDPState: `_fsdp_param_groups` (torch >= 2.13), else the one
    `_fsdp_param_group` (2.9 to 2.12; None when the module had no parameters of its own); None when neither
    attribute exists."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    if not hasattr(state, "_fsdp_param_group"):
        return None
    group = state._fsdp_param_group
    return [] if group is None else [group]


def fsdp_params_of(modules: Iterable[torch.nn.Module]) -> list[Any] | None:
    """The FSDPParam objects of the modules `fully_shard` was applied to (each module's param groups), or None
    when this torch keeps them where `param_groups` does not look (then gathered memory is not counted)."""
    found = []
    for module in modules:
        get_state = getattr(module, "_get_fsdp_state", None)
        groups = param_groups(get_state()) if callable(get_state) else None
        if groups is None:
            return None
        for group in groups:
            fsdp_params = getattr(group, "fsdp_params", None)
            if fsdp_params is None:
                return None
            found.extend(fsdp_params)
    if not all(hasattr(p, name) for p in found for name in FSDP_PARAM_API):
        return None
    return found

"""TorchFSDP (registry name `torch_fsdp`): PyTorch's FSDP2 (`fully_shard`) behind the wrappers' interface.

The reference for `fsdp`, as `torch` is for the DDP wrappers: every module matched by `shard` becomes one
FSDP2 unit (`fully_shard` on it, then on the root for the parameters left over: norms, tied weights), so
each rank stores 1/W of every parameter along dim 0 (a `DTensor`; FSDP2 pads each parameter's dim 0 to a
multiple of W). FSDP2 all-gathers a unit before its forward and again before its backward, and
reduce-scatters its gradient after; `compute_dtype` becomes `MixedPrecisionPolicy(param_dtype=...,
reduce_dtype=float32)`: weights are cast before they are communicated, gradients reduced in float32.

The collectives go through FSDP2's custom-comm hooks (`set_custom_all_gather`/`set_custom_reduce_scatter`),
which issue exactly what FSDP2's defaults issue inside a `comm:all_gather:<unit>` / `comm:reduce_scatter:<unit>`
range (payload in nccl-tests' convention: the gathered output, the scattered input), timed and tracked like
every other wrapper's. A gloo group has no averaging reduce-scatter: there it sums, then divides by W.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

try:  # FSDP2 with its custom-comm hooks (torch >= 2.9; AllGather/ReduceScatter are not re-exported)
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

    FSDP2_MISSING = ""
except ImportError:  # an older torch: the other strategies still import, torch_fsdp refuses in one line
    AllGather = ReduceScatter = FSDPModule = object  # type: ignore[misc,assignment]
    FSDP2_MISSING = f"torch_fsdp needs torch>=2.9 (FSDP2's custom collectives), not torch {torch.__version__}"

from contract import ALL_GATHER, REDUCE_SCATTER, REDUCE_SCATTER_GROUP, comm_range, sharded_entry
from ddp.memory.accounting import MemoryParts, storage_bytes
from ddp.memory.fsdp2_gathered import GatheredMemory, fsdp_params_of
from ddp.strategies.base import DataParallelBase, nbytes

ShardSpec = tuple[type[nn.Module], ...] | Callable[[nn.Module], bool]
COMPUTE_DTYPES = (None, torch.float32, torch.float16, torch.bfloat16)
# What FSDP2's defaults call (the older names warn in recent PyTorch, and older PyTorch lacks the new ones).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
ROOT_UNIT = "root"  # the tag of the root unit's collectives (the parameters no matched module owns)


class TorchFSDP(DataParallelBase):
    """PyTorch's FSDP2 around `module`; see the module docstring.

    Every rank must call the same units in the same order (FSDP2's rule: the collectives pair up by issue
    order). A module whose parameters are shared with another module (tied weights) is left to the root
    unit. `.module` is the model with its parameters replaced by FSDP2's `DTensor` shards under their
    original names (what an optimizer steps); `gather_full_params()` returns them in full.
    """

    shard_group_name: str | None = None  # the group its ranges name (contract/groups.py); None: the default group

    def __init__(
        self,
        module: nn.Module,
        compute_dtype: torch.dtype | None = None,
        *,
        shard: ShardSpec = (nn.Linear, nn.Embedding),
        collective: str = "torch",
        prefetch: int | None = None,
        separate_reduce_scatter: bool = False,
    ):
        if collective != "torch":
            raise ValueError(f"TorchFSDP runs FSDP2's own collectives: collective must be 'torch', got {collective!r}")
        check_fsdp2_settings(prefetch, separate_reduce_scatter)
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be None, torch.float16 or torch.bfloat16, got {compute_dtype!r}")
        if not (isinstance(shard, tuple) or callable(shard)):
            raise ValueError(f"shard must be a tuple of module types or a predicate, got {shard!r}")
        super().__init__(module, collective)  # rank 0's state everywhere before each rank keeps its slice
        self.compute_dtype = compute_dtype
        self.rank = dist.get_rank()
        self.shard_world = self.world_size  # the ranks each parameter is sharded over
        mesh = self._device_mesh(module)
        mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32 if compute_dtype else None)
        self.units = [*unit_modules(module, shard), (ROOT_UNIT, module)]
        for tag, unit in self.units:
            fully_shard(unit, mesh=mesh, mp_policy=mp)
            unit.set_custom_all_gather(TimedAllGather(self, tag, self.shard_group_name))  # type: ignore[operator]
            group = REDUCE_SCATTER_GROUP if separate_reduce_scatter else self.shard_group_name
            unit.set_custom_reduce_scatter(TimedReduceScatter(self, tag, group))  # type: ignore[operator]
        if separate_reduce_scatter:  # a collective (dist.new_group): every rank constructs alike
            module.set_separate_reduce_scatter_group(True)  # type: ignore[operator]
        self.prefetch, self.separate_reduce_scatter = prefetch, separate_reduce_scatter
        self._forward_order: list[nn.Module] | None = [] if prefetch is not None else None
        if prefetch is not None:  # the first forward's order of the units, for FSDP2's explicit prefetch lists
            for _, unit in self.units[:-1]:
                unit.register_forward_pre_hook(lambda m, _a: self._note_forward(m))
        self.gathered = GatheredMemory(fsdp_params_of(unit for _, unit in self.units))
        # FSDP2 replaced the parameters by DTensors: the base's list must name the new objects.
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.param_names, self.params = [n for n, _ in named], [p for _, p in named]

    def _device_mesh(self, module: nn.Module) -> Any:
        """The DeviceMesh `fully_shard` gets: None, FSDP2's default (every rank, one dimension)."""
        return None

    def comm_layout(self) -> list[dict]:
        """No all-reduce: FSDP2 reduce-scatters every gradient (see `sharded_layout`)."""
        return []

    def _synchronize(self) -> None:
        # FSDP2 waited for its reduce-scatters at the end of backward: nothing is left in flight.
        if self._forward_order:  # after the first step: prefetch in the order the units ran
            set_prefetch_lists(self._forward_order, self.prefetch or 2)
            self._forward_order = None

    def _note_forward(self, unit: nn.Module) -> None:
        if self._forward_order is not None and all(u is not unit for u in self._forward_order):
            self._forward_order.append(unit)

    def sharded_layout(self) -> list[dict]:
        """One `contract.sharded_entry` per FSDP2 unit with parameters, in registration order (root last)."""
        comm_itemsize = torch.empty((), dtype=self.compute_dtype or torch.float32).element_size()
        entries = []
        for tag, unit in self.units:
            own = unit_parameters(self.module, unit, self.units)
            if not own:
                continue
            padded = sum(padded_numel(p.shape, self.shard_world) for _, p in own)
            entry = sharded_entry(
                tag, [n for n, _ in own], sum(p.numel() for _, p in own), padded, comm_itemsize, 4, self.shard_world
            )
            # Gradients are reduced in float32, and only the trainable parameters' (frozen ones are gathered).
            trainable = sum(padded_numel(p.shape, self.shard_world) for _, p in own if p.requires_grad)
            entry["reduce_scatter_bytes"] = trainable * 4
            entries.append(entry)
        return entries

    def memory_parts(self) -> MemoryParts:
        """This rank's shards (padded, as FSDP2 stores them) and their gradients, and as `gathered` the most bytes
        of all-gather outputs and unsharded parameter copies alive at once so far (ddp.memory.fsdp2_gathered)."""
        seen: set[tuple[str, int]] = set()
        return MemoryParts(
            parameters=storage_bytes([*self.module.parameters(), *self.module.buffers()], seen),
            gradients=storage_bytes((p.grad for p in self.module.parameters()), seen),
            gathered=self.gathered.peak,
        )

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter in full under its name in `.module` (collective: every rank calls it)."""
        return {
            n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for n, p in self.module.named_parameters()
        }

    # ---- the collectives FSDP2 issues through TimedAllGather / TimedReduceScatter ----------------
    def timed_collective(self, name: str, size: int, issue: Callable[[], Any], async_op: bool) -> Any:
        """Issue a collective through the wrapper's instrumented call (ddp.comm.instrumented): inside range `name`
        (payload `size`), timed and tracked; its tracked work if async (what FSDP2 waits for), else None."""
        if not async_op:
            self.collectives.blocking(name, size, issue)
            return None
        return self.collectives.start(name, size, issue).work


class TimedAllGather(AllGather):
    """FSDP2's default all-gather of one unit, inside its `comm:all_gather:<unit>` range."""

    def __init__(self, owner: TorchFSDP, tag: str, group: str | None = None):
        self.owner, self.name = owner, comm_range(ALL_GATHER, tag, group)

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.owner.gathered.track_flat(torch.empty(size, dtype=dtype, device=device))

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup, async_op: bool = False
    ) -> Any:
        def issue() -> Any:
            return _all_gather(output_tensor, input_tensor, group=group, async_op=async_op)

        return self.owner.timed_collective(self.name, nbytes(output_tensor), issue, async_op)


class TimedReduceScatter(ReduceScatter):
    """FSDP2's default reduce-scatter of one unit's gradient, inside its `comm:reduce_scatter:<unit>` range."""

    def __init__(self, owner: TorchFSDP, tag: str, group: str | None = None):
        self.owner, self.name = owner, comm_range(REDUCE_SCATTER, tag, group)

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        average = op == dist.ReduceOp.AVG and dist.get_backend(group) == "gloo"

        def issue() -> Any:
            return _reduce_scatter(
                output_tensor, input_tensor, op=dist.ReduceOp.SUM if average else op, group=group, async_op=async_op
            )

        work = self.owner.timed_collective(self.name, nbytes(input_tensor), issue, async_op)
        if average:
            if work is not None:
                work.wait()
            output_tensor.div_(group.size())
        return work


def check_fsdp2_settings(prefetch: int | None, separate_reduce_scatter: bool) -> None:
    """ValueError for what FSDP2's public API cannot do: gather on demand (prefetch 1: FSDP2 always lets the
    next unit's all-gather run ahead, implicitly when its explicit lists are empty), or a separate
    reduce-scatter group on a torch without `FSDPModule.set_separate_reduce_scatter_group`; and anything on a
    torch without FSDP2's custom collectives (before 2.9)."""
    if FSDP2_MISSING:
        raise ValueError(FSDP2_MISSING)
    if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1):
        raise ValueError(f"prefetch={prefetch!r}: must be a positive integer")
    if prefetch == 1:
        raise ValueError(
            "torch_fsdp cannot gather on demand (prefetch=1): FSDP2 has no public API to stop prefetching the next "
            "unit (its default when no explicit list is set); use prefetch 2 or more, or fsdp"
        )
    if separate_reduce_scatter and not hasattr(FSDPModule, "set_separate_reduce_scatter_group"):
        raise ValueError(
            f"torch_fsdp cannot run its reduce-scatters on their own process group with torch {torch.__version__}: "
            "FSDP2 has no FSDPModule.set_separate_reduce_scatter_group there; use fsdp"
        )


def set_prefetch_lists(order: Sequence[nn.Module], depth: int) -> None:
    """FSDP2's explicit prefetch for `depth` (fsdp's meaning): each unit, in forward, prefetches the next
    `depth` - 1 units of `order` (its forward order) and, in backward, the previous `depth` - 1."""
    for i, unit in enumerate(order):
        unit.set_modules_to_forward_prefetch(list(order[i + 1 : i + depth]))  # type: ignore[operator]
        unit.set_modules_to_backward_prefetch(list(order[max(0, i - depth + 1) : i][::-1]))  # type: ignore[operator]


def matches(shard: ShardSpec, module: nn.Module) -> bool:
    return isinstance(module, shard) if isinstance(shard, tuple) else bool(shard(module))


def unit_modules(root: nn.Module, shard: ShardSpec) -> list[tuple[str, nn.Module]]:
    """The modules matched by `shard` that own parameters no other module shares, by name, in registration order."""
    owners: dict[int, int] = {}  # parameter id -> how many distinct modules hold it directly
    for _, m in root.named_modules():
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    return [
        (name, m)
        for name, m in root.named_modules()
        if m is not root
        and matches(shard, m)
        and any(True for _ in m.parameters())
        and all(owners[id(p)] == 1 for p in m.parameters())
    ]


def unit_parameters(
    root: nn.Module, unit: nn.Module, units: list[tuple[str, nn.Module]]
) -> list[tuple[str, nn.Parameter]]:
    """The parameters FSDP2 puts in `unit`'s group (frozen ones too), by their names in `root`: those under
    `unit`, less those of the units inside it."""
    inside = [other for _, other in units if other is not unit and any(m is other for m in unit.modules())]
    inner = {id(p) for other in inside for p in other.parameters()}
    mine = {id(p) for p in unit.parameters()}
    return [(n, p) for n, p in root.named_parameters() if id(p) in mine and id(p) not in inner]


def padded_numel(shape: torch.Size, world: int) -> int:
    """Elements of one parameter's all-gather output: dim 0 padded to a multiple of `world` (FSDP2's chunking)."""
    if not shape:
        return world
    rest = math.prod(shape[1:])
    return math.ceil(shape[0] / world) * world * rest

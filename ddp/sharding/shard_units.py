"""The sharded modules of `fsdp` (ddp.strategies.fsdp): which parameters each one owns, the flat layout they are
gathered in, each rank's slice of it, and the per-parameter views that slice is exposed through.

A *unit* is one module matched by FSDP's `shard` option. Its trainable parameters (tied ones excepted, see
`find_units`) are laid end to end in one flat vector of `numel` elements, each starting on a multiple of
ALIGN elements, zeros between them and after, up to `padded_numel`, a multiple of W * ALIGN (W: world
size). Rank r stores elements [r * S, (r + 1) * S), S = padded_numel / W, in float32: its *shard*. Each
parameter is exposed to the optimizer as the part of it that falls in this rank's shard (a 1-D view, empty
where none does), under the parameter's own name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

ShardSpec = tuple[type[nn.Module], ...] | Callable[[nn.Module], bool]
# Each parameter starts, and each rank's slice starts and ends, on a multiple of ALIGN elements. ATen's
# elementwise kernels run vectors over blocks of 2 * vector width (up to 32 float32 with AVX-512) from a
# tensor's first element and finish the rest with scalar code that may round differently (no fused multiply-
# add): aligned slices put every element in the same kind of block as in the whole parameter, which keeps the
# optimizer's update on a shard bit-identical to the update of the whole parameter (AdamW's lerp, addcdiv).
ALIGN = 64


@dataclass
class UnitParam:
    """One trainable parameter of a unit: where it lives in the module and in the flat vector."""

    name: str  # its (first) name in the wrapped model
    places: list[tuple[nn.Module, str]]  # (module, attribute) pairs that hold it (several when reused)
    original: nn.Parameter | None  # the full parameter it replaces (dropped by `split`)
    offset: int  # first element in the unit's flat vector
    piece: nn.Parameter | None = None  # this rank's part of it, 1-D

    def __post_init__(self):
        assert self.original is not None
        self.shape, self.numel = self.original.shape, self.original.numel()


@dataclass
class ShardUnit:
    """A sharded module: its parameters' layout and this rank's float32 shard."""

    name: str
    module: nn.Module
    params: list[UnitParam]
    world_size: int
    rank: int
    shard: torch.Tensor = field(init=False)  # float32 master weights, shard_numel elements
    grad: torch.Tensor = field(init=False)  # the mean gradient of `shard`, float32

    @property
    def numel(self) -> int:
        """The parameters' elements (without padding)."""
        return sum(p.numel for p in self.params)

    @property
    def padded_numel(self) -> int:
        """The flat vector's length: the aligned parameters, padded to W slices of a multiple of ALIGN."""
        end = self.params[-1].offset + self.params[-1].numel
        return -(-end // (self.world_size * ALIGN)) * self.world_size * ALIGN

    @property
    def shard_numel(self) -> int:
        return self.padded_numel // self.world_size

    def split(self) -> None:
        """Keep this rank's slice of the parameters (float32) and register its views in their place."""
        originals = [p.original for p in self.params if p.original is not None]
        flat = torch.zeros(self.padded_numel, dtype=originals[0].dtype, device=originals[0].device)
        for p, original in zip(self.params, originals, strict=True):
            flat[p.offset : p.offset + p.numel].copy_(original.detach().reshape(-1))
        lo = self.rank * self.shard_numel
        self.shard = flat[lo : lo + self.shard_numel].clone()
        self.grad = torch.zeros_like(self.shard)
        for p in self.params:
            start, stop = max(p.offset, lo) - lo, min(p.offset + p.numel, lo + self.shard_numel) - lo
            p.piece = nn.Parameter(self.shard[start : max(start, stop)])
            self.show(p, p.piece)
            p.original = None  # the full copy is no longer held

    @staticmethod
    def show(p: UnitParam, tensor: torch.Tensor) -> None:
        """Make every attribute that holds `p` return `tensor` (the gathered view, or the piece again)."""
        for module, attr in p.places:
            module._parameters[attr] = tensor  # type: ignore[assignment]

    def views(self, full: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter as a view of the gathered flat vector `full`, in its own shape."""
        return [full[p.offset : p.offset + p.numel].view(p.shape) for p in self.params]

    def gaps(self) -> list[tuple[int, int]]:
        """The [start, stop) ranges of the flat vector no parameter covers (alignment and padding)."""
        ends = [(p.offset, p.offset + p.numel) for p in self.params] + [(self.padded_numel, self.padded_numel)]
        gaps, at = [], 0
        for start, stop in ends:
            if start > at:
                gaps.append((at, start))
            at = stop
        return gaps

    def full_params(self, full: torch.Tensor) -> dict[str, torch.Tensor]:
        """The gathered float32 vector cut into parameters, under their names (copies)."""
        return {p.name: view.clone() for p, view in zip(self.params, self.views(full), strict=True)}

    def give_grads(self) -> None:
        """Point every piece's .grad at its part of the mean gradient shard."""
        lo = self.rank * self.shard_numel
        for p in self.params:
            assert p.piece is not None
            start = max(p.offset, lo) - lo
            p.piece.grad = self.grad[start : start + p.piece.numel()]


def matches(module: nn.Module, shard: ShardSpec) -> bool:
    return isinstance(module, shard) if isinstance(shard, tuple) else bool(shard(module))


def find_units(root: nn.Module, shard: ShardSpec, world_size: int, rank: int) -> list[ShardUnit]:
    """The units of `root`, in registration order, each owning the trainable parameters below it that no
    deeper unit owns. A parameter reachable from two units that do not contain one another (weights tied
    across modules) belongs to neither: it stays replicated, as do frozen parameters and those outside units."""
    first_name = {id(p): n for n, p in root.named_parameters()}
    matched = [(n, m) for n, m in root.named_modules() if matches(m, shard)]
    owner: dict[int, str | None] = {}
    for name, module in matched:  # named_modules lists parents first: a deeper unit takes over
        for _, p in module.named_parameters():
            prev = owner.get(id(p), name)
            inside = prev is not None and (name == prev or name.startswith(prev + ".") or prev == "")
            owner[id(p)] = name if id(p) not in owner or inside else None
    units = []
    for name, module in matched:
        places: dict[int, list[tuple[nn.Module, str]]] = {}
        tensors: dict[int, nn.Parameter] = {}
        for _, sub in module.named_modules(remove_duplicate=False):
            for attr, p in sub._parameters.items():
                if p is None or not p.requires_grad or owner.get(id(p)) != name:
                    continue
                held = places.setdefault(id(p), [])
                if all(m is not sub or a != attr for m, a in held):
                    held.append((sub, attr))
                tensors[id(p)] = p
        params, offset = [], 0
        for key, p in tensors.items():
            params.append(UnitParam(first_name[key], places[key], p, offset))
            offset += -(-p.numel() // ALIGN) * ALIGN
        if params:
            units.append(ShardUnit(name, module, params, world_size, rank))
    return units

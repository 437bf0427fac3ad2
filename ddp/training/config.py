"""One training run's settings, declared once: `RunConfig`.

Each field is a `setting(default, doc, ...)`: its docstring (`doc`), the choices it takes and the check
that names a bad value. The CLIs (`ddp.verify`, `ddp.benchmark`, `profiling.run`, `run_nsys.sh`) build
their options from these fields (`ddp.cli.add_settings`), so adding a knob is adding one field here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from contract import default_shard_size, hsdp_layout
from ddp.comm.collectives import COLLECTIVES
from ddp.strategies import registry
from ddp.training.data import check_divisible
from ddp.training.models import MODEL_NAMES
from ddp.training.slow_rank import check_slow_rank, parse_slow_rank

OPTIMIZERS = ("sgd", "adamw")
COMPUTE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}  # --compute-dtype's names
BACKENDS = ("gloo", "nccl")
SHARDED_ONLY = ("compute_dtype", "prefetch", "separate_reduce_scatter")  # settings of fsdp and torch_fsdp only


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r}: must be a positive integer")


def _non_negative_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r}: must be an integer >= 0")


def _positive_or_none(name: str, value: Any) -> None:
    if value is not None and not (isinstance(value, (int, float)) and value > 0):
        raise ValueError(f"{name}={value!r}: must be positive (MiB), or None for one unbounded bucket")


def _positive_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}={value!r}: must be a positive number")


def _integer(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r}: must be an integer")


def _flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: must be True or False")


def setting(
    default: Any,
    doc: str,
    *,
    check: Callable[[str, Any], None] | None = None,
    choices: Sequence[str] | None = None,
    label: str | None = None,
    optional: bool = False,
) -> Any:
    """A RunConfig field: default, docstring, and how a value is checked (a check, or choices named
    `label` in the error; `optional`: None is also accepted)."""
    meta = {"doc": doc, "check": check, "choices": tuple(choices) if choices else None, "label": label}
    return dataclasses.field(default=default, metadata={**meta, "optional": optional})


@dataclass
class RunConfig:
    """One training run; validates itself and names the bad value."""

    impl: str = setting(
        "overlap_bucket",
        "the data-parallel strategy, by registry name",
        choices=list(registry.IMPLEMENTATIONS),
        label="implementation",
    )
    model: str = setting("tiny", "the model size (ddp.training.models)", choices=MODEL_NAMES, label="model")
    world_size: int = setting(2, "ranks in the run", check=_positive_int)
    batch_size: int = setting(16, "global batch: sequences per step, split across ranks", check=_positive_int)
    context_length: int = setting(128, "tokens per sequence (LMs)", check=_positive_int)
    steps: int = setting(10, "measured training steps", check=_positive_int)
    warmup: int = setting(3, "untimed (uncaptured) steps before the measured ones", check=_non_negative_int)
    bucket_mb: float | None = setting(25.0, "bucket size in MiB (overlap_bucket, torch)", check=_positive_or_none)
    optimizer: str = setting("sgd", "the optimizer (adamw: weight decay 0.01)", choices=OPTIMIZERS, label="optimizer")
    lr: float = setting(1e-2, "learning rate", check=_positive_number)
    seed: int = setting(0, "seed of the model and the synthetic data", check=_integer)
    collective: str = setting(
        "torch", "the hand-written wrappers' all-reduce collective", choices=list(COLLECTIVES), label="collective"
    )
    shard_optimizer: bool = setting(
        False, "shard the optimizer state across ranks (ddp.ShardedOptimizer, ZeRO-1), with any strategy", check=_flag
    )
    compute_dtype: str | None = setting(
        None,
        "the sharded strategies' compute dtype: weights cast before they are communicated and used; master "
        "weights, the gradients the optimizer sees and the update stay fp32 (unset: fp32 throughout)",
        choices=list(COMPUTE_DTYPES),
        label="compute dtype",
        optional=True,
    )
    prefetch: int | None = setting(
        None,
        "the sharded strategies' prefetch depth: a unit's all-gather is issued once the unit this many places "
        "before it has finished (1: on demand, 2: one gather in flight under the previous unit's compute; "
        "torch_fsdp: FSDP2's explicit prefetch of the next N-1 units, N >= 2) (unset: fsdp's 2, FSDP2's default)",
        check=_positive_int,
        optional=True,
    )
    separate_reduce_scatter: bool = setting(
        False,
        "the sharded strategies' reduce-scatters on their own process group, so that they do not queue behind the "
        "all-gathers (own NCCL communicator and stream on GPU, own gloo group on CPU)",
        check=_flag,
    )
    shard_size: int | None = setting(
        None,
        "hsdp and torch_hsdp: ranks per shard group (parameters sharded within it, gradient shards all-reduced "
        "across the world size / shard size replicas); must divide the world size (unset: half the ranks from 4 "
        "even ranks, else all of them)",
        check=_positive_int,
        optional=True,
    )
    backend: str | None = setting(
        None,
        "process-group backend (unset: nccl when every local rank has a GPU, else gloo)",
        choices=BACKENDS,
        label="backend",
        optional=True,
    )
    slow_rank: str | None = setting(
        None,
        "RANK:PLACE:MS: rank RANK sleeps MS ms at PLACE every step (forward, backward, optimizer, data, or "
        "issue: after backward, before the gradient synchronisation), for straggler tests and demonstrations "
        "(unset: no rank slowed)",
        check=check_slow_rank,
        optional=True,
    )

    def __post_init__(self) -> None:
        check_settings(dataclasses.asdict(self))
        check_divisible(self.batch_size, self.world_size)
        if self.impl == "torch" and self.collective != "torch":
            raise ValueError(f"implementation 'torch' only runs collective 'torch', got {self.collective!r}")
        for name in SHARDED_ONLY:
            value = getattr(self, name)
            if value not in (None, False) and self.impl not in registry.SHARDED:
                raise ValueError(
                    f"{name}={value!r} applies to the sharded strategies ({', '.join(registry.SHARDED)}), "
                    f"not to {self.impl!r}"
                )
        if self.shard_size is not None and self.impl not in registry.HYBRID:
            raise ValueError(
                f"shard_size={self.shard_size!r} applies to {', '.join(registry.HYBRID)}, not to {self.impl!r}"
            )
        if self.impl in registry.HYBRID:
            hsdp_layout(self.world_size, self.resolved_shard_size)
            if self.separate_reduce_scatter:
                raise ValueError(f"separate_reduce_scatter=True applies to fsdp and torch_fsdp, not to {self.impl!r}")
        if self.slow_rank is not None and parse_slow_rank(self.slow_rank).rank >= self.world_size:
            raise ValueError(f"slow_rank={self.slow_rank!r}: RANK must be below the world size {self.world_size}")
        if self.impl in ("torch_fsdp", "torch_hsdp"):  # what FSDP2's API cannot do, refused before any rank starts
            from ddp.strategies.torch_fsdp import check_fsdp2_settings  # FSDP2's import, only for FSDP2 (registry)

            check_fsdp2_settings(self.prefetch, self.separate_reduce_scatter)

    @property
    def resolved_shard_size(self) -> int:
        """The shard group size in effect (hsdp, torch_hsdp): `shard_size`, or contract.default_shard_size."""
        return default_shard_size(self.world_size) if self.shard_size is None else self.shard_size


SETTINGS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(RunConfig)}


def check_settings(values: Mapping[str, Any]) -> None:
    """Check each given setting on its own (no cross-field rules); ValueError naming the bad value."""
    for name, value in values.items():
        if name not in SETTINGS:
            raise ValueError(f"unknown run setting {name!r}: choose from {', '.join(SETTINGS)}")
        meta = SETTINGS[name].metadata
        if value is None and meta["optional"]:
            continue
        if meta["choices"] is not None and value not in meta["choices"]:
            raise ValueError(f"unknown {meta['label']} {value!r}: choose from {', '.join(meta['choices'])}")
        if meta["check"] is not None:
            meta["check"](name, value)

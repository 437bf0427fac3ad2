"""Process groups in the contract: which communicator a `comm:<op>:<tag>` range's collective ran on.

A collective of the default group (every rank of the run) is named as before, `comm:all_reduce:bucket3`: old
traces read the same, and a comm range without a group is the default group's. A collective of another group
adds `@<group>` to its range's name, `comm:reduce_scatter:layers.0@shard`, and each rank's `ddp.meta` lists the
groups it belongs to under GROUPS_KEY: {group name: {"ranks": its members' global ranks, "description": what
it is for}}. The name is the rank's own label of the group (two shard groups of an HSDP run may both be called
`shard`): the group is its name with its members.

`dimension_of` labels a group by the parallel dimension its name or description says (torch's DeviceMesh
describes its groups as `mesh_<dim name>`): shard, replicate, tp, pp, ep, dp; None when they say none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

GROUP_SEPARATOR = "@"  # between a comm range's tag and its group's name
GROUPS_KEY = "process_groups"  # in ddp.meta: {name: {"ranks": [...], "description": "..."}}
DEFAULT_GROUP = "default"  # the name analysis gives the default group (every rank) of our own ranges
DIMENSIONS = ("shard", "replicate", "tp", "pp", "ep", "dp")
# the sharded strategies' reduce-scatters on a process group of their own (`--separate-reduce-scatter`): every rank
REDUCE_SCATTER_GROUP = "reduce_scatter"
# HSDP's two groups: parameters sharded within a `shard` group, gradient shards all-reduced across `replicate`
SHARD_GROUP, REPLICATE_GROUP = "shard", "replicate"
# words in a group's name or description -> the dimension they say (matched whole, case-insensitive)
_DIMENSION_WORDS = {
    "shard": "shard",
    "sharding": "shard",
    "fsdp": "shard",
    "replicate": "replicate",
    "replica": "replicate",
    "replicas": "replicate",
    "replication": "replicate",
    "tp": "tp",
    "tensor": "tp",
    "pp": "pp",
    "pipeline": "pp",
    "ep": "ep",
    "expert": "ep",
    "experts": "ep",
    "moe": "ep",
    "dp": "dp",
    "ddp": "dp",
    "data": "dp",
}
_WORD = re.compile(r"[a-z]+")


def with_group(name: str, group: str | None) -> str:
    """A comm range's name for a collective of `group` (None or "": the default group, the name unchanged)."""
    if not group:
        return name
    if GROUP_SEPARATOR in group or ":" in group:
        raise ValueError(f"process group name {group!r}: expected no {GROUP_SEPARATOR!r} or ':'")
    return f"{name}{GROUP_SEPARATOR}{group}"


def group_entry(ranks: Iterable[int], description: str = "") -> dict[str, Any]:
    """One GROUPS_KEY entry: the group's members (global ranks, ascending) and what it is for."""
    members = sorted(int(r) for r in ranks)
    if not members or len(set(members)) != len(members):
        raise ValueError(f"process group ranks {members}: expected distinct ranks, at least one")
    return {"ranks": members, "description": description}


def separate_reduce_scatter_groups(world_size: int) -> dict[str, dict[str, Any]]:
    """ddp.meta's GROUPS_KEY of a sharded run whose reduce-scatters ran on a group of their own (every rank)."""
    return {REDUCE_SCATTER_GROUP: group_entry(range(world_size), "separate reduce-scatter group")}


def default_shard_size(world_size: int) -> int:
    """HSDP's shard group size when none is given: half the ranks (2 replicas) from 4 even ranks, else all."""
    return world_size // 2 if world_size >= 4 and world_size % 2 == 0 else world_size


def hsdp_layout(world_size: int, shard_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """HSDP's groups on a (replicate, shard) mesh of `world_size` ranks, rank = replica * shard_size + shard
    index (torch's DeviceMesh order): the shard groups (consecutive ranks) and the replicate groups (the ranks
    holding the same shard). ValueError naming a shard size that does not divide the world."""
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"shard_size={shard_size!r}: must be a positive integer")
    if world_size % shard_size:
        raise ValueError(f"shard_size={shard_size}: must divide the world size {world_size}")
    replicas = world_size // shard_size
    shards = [list(range(r * shard_size, (r + 1) * shard_size)) for r in range(replicas)]
    return shards, [list(range(s, world_size, shard_size)) for s in range(shard_size)]


def hsdp_groups(world_size: int, shard_size: int, rank: int) -> dict[str, dict[str, Any]]:
    """ddp.meta's GROUPS_KEY of an HSDP rank: its shard group and its replicate group."""
    shards, replicas = hsdp_layout(world_size, shard_size)
    return {
        SHARD_GROUP: group_entry(shards[rank // shard_size], "HSDP shard group: all-gather, reduce-scatter"),
        REPLICATE_GROUP: group_entry(replicas[rank % shard_size], "HSDP replicate group: gradient-shard all-reduce"),
    }


def dimension_of(*texts: object) -> str | None:
    """The parallel dimension the first of `texts` (a group's name, then its description) that says one says."""
    for text in texts:
        if not isinstance(text, str):
            continue
        for word in _WORD.findall(text.lower()):
            if word in _DIMENSION_WORDS:
                return _DIMENSION_WORDS[word]
    return None

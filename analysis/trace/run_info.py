"""What a reader needs to trust a trace's figures: the run's setup, and which ranks share a GPU.

Sources, both optional: the `ddp.meta {json}` mark our runner writes per rank (backend, world size,
model, torch/NCCL/CUDA versions) and the export's target description (GPU models and uuids, driver,
CUDA driver; see nsys_db.NsysExport.target_info). What is not known is None, never a placeholder: a
CPU run has no GPU, driver or CUDA, and the strings "None"/"none" older runs recorded read as None.

Design notes (`design_notes`): figures a run's strategy or backend decides before anything is measured.
A 0% overlap reads as a failure unless the reader knows it is by construction: naive and flat communicate
after backward by design, FSDP2 on gloo issues its collectives synchronously, ranks that
share a GPU do not own its time. The notes come from the run's own metadata (the implementation, the
backend and the ranks sharing a GPU that ddp.meta and the export record), one line each, and every page
and table that shows the figures prints them beside the figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from analysis.trace.frames import Trace
from contract import MEMORY_CUDA, MEMORY_KEY, MEMORY_PARTS, MEMORY_PEAK

if TYPE_CHECKING:
    import pandas as pd

META_FIELDS = {
    "backend": ("backend",),
    "world_size": ("world_size",),
    "model": ("model",),
    "torch": ("versions", "torch"),
    "nccl": ("versions", "nccl_loaded"),  # the library the ranks loaded (an LD_PRELOAD may replace torch's)
    "nccl_build": ("versions", "nccl"),  # the NCCL torch was built with (torch.cuda.nccl.version())
    "cuda": ("versions", "cuda"),
}
MIB = 2**20
# ddp.meta `memory` (bytes, per rank) as summary columns in MiB: the parts, their sum and CUDA's own peak
MEMORY_COLUMNS = [f"mem_{part}_mib" for part in (*MEMORY_PARTS, MEMORY_PEAK)] + [f"{MEMORY_CUDA}_mib"]
# what older runs wrote where a value was missing (str(None), "none"): read as missing
MISSING = (None, "", "None", "none")


def _distinct(values: Iterable[Any]) -> str | int | None:
    """One value when all agree, else the distinct ones joined by ', ' (None when there are none)."""
    seen = list(dict.fromkeys(v for v in values if not _missing(v)))
    if not seen:
        return None
    return seen[0] if len(seen) == 1 else ", ".join(map(str, seen))


def _missing(value: Any) -> bool:
    return isinstance(value, str | type(None)) and value in MISSING


def _meta_value(meta: dict, path: tuple[str, ...]) -> Any:
    value: Any = meta  # JSON: a dict down the path, then the value
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def recorded(metas: Iterable[dict], path: tuple[str, ...]) -> str | int | None:
    """The value the ranks' ddp.meta marks recorded at `path` (distinct ones joined), None when none did."""
    return _distinct(_meta_value(m, path) for m in metas)


def largest_rank_memory(metas: Iterable[dict]) -> dict[str, float | None]:
    """MEMORY_COLUMNS of the rank whose ddp.meta `memory` has the largest peak (a run is as big as its biggest
    rank), in MiB; None each when no rank recorded memory (older runs, --warmup 0, foreign traces)."""
    recorded = [m[MEMORY_KEY] for m in metas if isinstance(m.get(MEMORY_KEY), dict)]
    if not recorded:
        return dict.fromkeys(MEMORY_COLUMNS)
    top = max(recorded, key=lambda memory: memory.get(MEMORY_PEAK) or 0)
    keys = [*MEMORY_PARTS, MEMORY_PEAK, MEMORY_CUDA]
    return {
        column: None if top.get(key) is None else round(top[key] / MIB, 3)
        for column, key in zip(MEMORY_COLUMNS, keys, strict=True)
    }


def profiler_label(trace: Trace) -> str:
    """What recorded the trace and its version: 'nsys 2025.3.2.0', 'torch.profiler 2.11.0+cu130', or the
    profiler's name alone when its version is unknown."""
    return f"{trace.profiler} {trace.profiler_version}" if trace.profiler_version else trace.profiler


def _used_gpus(trace: Trace) -> list[str]:
    """Names of the GPUs the ranks ran on (every GPU of the export when ranks have no device)."""
    names = []
    for part, device in zip(trace.ranks["part"], trace.ranks["device"], strict=True):
        gpus = trace.info.get(int(part), {}).get("gpus", {})
        if int(device) in gpus:
            names.append(gpus[int(device)]["name"])
        elif int(device) < 0:
            names += [g["name"] for g in gpus.values()]
    return names


def nccl_label(loaded: object, build: object) -> str | None:
    """The NCCL a run used, for people: '2.32.3 (torch built with 2.28.9)' when the library the ranks
    loaded differs from torch's build, the one version when they agree or only the loaded one is known,
    the build marked as such when only it was recorded (older runs); None when neither is known."""
    loaded, build = (None if _missing(v) or v != v else v for v in (loaded, build))  # v != v: NaN
    if loaded is None:
        return None if build is None else f"{build} (torch's build; loaded library not recorded)"
    return str(loaded) if build is None or build == loaded else f"{loaded} (torch built with {build})"


def trace_metadata(trace: Trace) -> dict:
    """gpus, driver, cuda_driver, cuda (torch's build), nccl (the library the ranks loaded), nccl_build
    (torch's build), torch, backend, world_size, model, shared_gpus, and the largest rank's memory
    (MEMORY_COLUMNS); None where unknown (a CPU run: no gpus, driver, cuda_driver, cuda, nccl or CUDA
    memory; runs before the loaded NCCL was recorded: no nccl)."""
    metas = list(trace.meta.values())
    infos = list(trace.info.values())
    out: dict[str, Any] = {
        "gpus": _distinct(_used_gpus(trace)),
        "driver": _distinct(i.get("driver") for i in infos),
        "cuda_driver": _distinct(i.get("cuda_driver") for i in infos),
    }
    out.update({name: recorded(metas, path) for name, path in META_FIELDS.items()})
    groups = shared_gpu_groups(trace)
    out["shared_gpus"] = [sorted(g) for g in groups] or None
    out.update(largest_rank_memory(metas))
    return out


def _gpu_identity(trace: Trace, part: int, pid: int, device: int) -> tuple:
    """Which physical GPU a rank ran on: the export's uuid for the device when known, else the host
    (ddp.meta hostname, else the file) and device number."""
    gpu = trace.info.get(part, {}).get("gpus", {}).get(device, {})
    if gpu.get("uuid"):
        return ("uuid", gpu["uuid"])
    host = trace.meta.get((part, pid), {}).get("hostname") or trace.info.get(part, {}).get("hostname")
    return ("host", host or f"file {part}", device)


def shared_gpu_groups(trace: Trace) -> list[set[int]]:
    """Sets of ranks (two or more) that ran on the same physical GPU."""
    groups: dict[tuple, set[int]] = {}
    for rank, part, pid, device in trace.ranks[["rank", "part", "pid", "device"]].itertuples(index=False):
        if device >= 0:  # one row per rank: a handful
            groups.setdefault(_gpu_identity(trace, int(part), int(pid), int(device)), set()).add(int(rank))
    return [g for g in groups.values() if len(g) > 1]


def shared_gpu_ranks(trace: Trace) -> set[int]:
    """Ranks whose GPU also ran another rank's work: their compute and idle are not exclusive GPU time."""
    return set().union(*shared_gpu_groups(trace)) if trace.ranks["device"].ge(0).any() else set()


AFTER_BACKWARD = {
    "naive": "naive all-reduces each gradient after backward, one blocking call at a time",
    "flat": "flat all-reduces one flat buffer of every gradient after backward, in one blocking call",
}


def design_notes(implementation: object, backend: object, shared_gpus: object) -> list[str]:
    """The notes for one run: `implementation` and `backend` as ddp.meta recorded them, `shared_gpus` the
    summary's 'ranks,sharing; ...' text (None/NaN when no ranks share a GPU)."""
    notes = []
    if implementation in AFTER_BACKWARD:
        notes.append(f"{AFTER_BACKWARD[implementation]}: no overlap with backward, by design")
    if implementation == "torch_fsdp" and isinstance(backend, str) and backend.lower() == "gloo":
        notes.append(
            "torch_fsdp on gloo: FSDP2 issues its all-gathers and reduce-scatters synchronously there (its "
            "streams are CUDA's), so none of its communication can overlap compute; on NCCL it can"
        )
    if isinstance(shared_gpus, str) and shared_gpus:
        notes.append(
            f"ranks {shared_gpus} share one GPU: their compute and idle are not exclusive GPU time, and one "
            "rank's kernels slow the other's"
        )
    return notes


def summary_notes(summary: pd.DataFrame) -> list[list[str]]:
    """design_notes for each row of an analysis summary (one row per run)."""
    return [
        design_notes(row.get("implementation"), row.get("backend"), row.get("shared_gpus"))
        for row in summary.to_dict("records")
    ]


def labelled(labels: Sequence[str], notes: Sequence[Sequence[str]]) -> list[str]:
    """One line per distinct note, after the labels of every run it applies to ("a, b: note"), in the
    order of their first run: five runs of ranks sharing one GPU read as one line, not five."""
    runs: dict[str, list[str]] = {}
    for label, said in zip(labels, notes, strict=True):
        for note in said:
            runs.setdefault(note, []).append(label)
    return [f"{', '.join(names)}: {note}" for note, names in runs.items()]

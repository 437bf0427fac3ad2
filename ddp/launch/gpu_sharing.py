"""More ranks than GPUs with NCCL: which NCCL this process really loaded, and whether ranks may share.

NCCL before 2.30 refuses two ranks on one GPU ("Duplicate GPU detected", inside a DistBackendError).
From 2.30 it accepts them with NCCL_MULTI_RANK_GPU_ENABLE=1 (experimental), and CUDA MPS lets both
ranks' kernels run at once, which NCCL needs. The version that counts is the library mapped into
this process (an LD_PRELOAD can replace torch's), read with its own `ncclGetVersion`:
`torch.cuda.nccl.version()` reports the version torch was built with.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

MIN_SHARING = (2, 30, 0)
ENABLE_VAR = "NCCL_MULTI_RANK_GPU_ENABLE"
CAVEAT = "timings of ranks sharing a GPU are not multi-GPU timings"
NO_SHARING = "use --backend gloo, or at most {gpus} rank(s) on this machine"
WAYS_OUT = NO_SHARING + (
    ", or NCCL >= 2.30 (e.g. LD_PRELOAD a newer libnccl.so.2) with --share-gpus, which sets "
    "NCCL_MULTI_RANK_GPU_ENABLE=1; run it under CUDA MPS (nvidia-cuda-mps-control -d) so the "
    "ranks' kernels run at once"
)


@dataclass(frozen=True)
class NcclLibrary:
    path: str
    version: tuple[int, int, int]

    @property
    def label(self) -> str:
        return f"NCCL {'.'.join(map(str, self.version))} ({self.path})"


def decode_version(code: int) -> tuple[int, int, int]:
    """ncclGetVersion's integer as (major, minor, patch): X*10000+Y*100+Z since 2.9, X*1000+Y*100+Z before."""
    if code >= 10000:
        return code // 10000, code % 10000 // 100, code % 100
    return code // 1000, code % 1000 // 100, code % 100


def nccl_paths_in_maps(maps: str) -> list[str]:
    """The libnccl shared objects listed in a /proc/<pid>/maps text, each once, in order."""
    paths: list[str] = []
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and re.match(r"libnccl[^/]*\.so", Path(parts[5].strip()).name):
            path = parts[5].strip()
            if path not in paths:
                paths.append(path)
    return paths


def pick_library(paths: list[str], preload: str = "") -> str | None:
    """The library whose symbols the process uses: one named in LD_PRELOAD first, else the first mapped."""
    preloaded = {os.path.realpath(p) for p in re.split(r"[:\s]+", preload) if p}
    for path in paths:
        if os.path.realpath(path) in preloaded:
            return path
    return paths[0] if paths else None


def loaded_nccl(maps_file: str = "/proc/self/maps") -> NcclLibrary | None:
    """The NCCL library mapped into this process and its version; None when none is (CPU-only torch)."""
    try:
        maps = Path(maps_file).read_text()
    except OSError:
        return None
    path = pick_library(nccl_paths_in_maps(maps), os.environ.get("LD_PRELOAD", ""))
    if path is None:
        return None
    try:
        get_version = ctypes.CDLL(path).ncclGetVersion  # already mapped: dlopen returns that copy
        code = ctypes.c_int(0)
        if get_version(ctypes.byref(code)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return NcclLibrary(path, decode_version(code.value))


def mps_running(env: Mapping[str, str] | None = None) -> bool:
    """True when a CUDA MPS control daemon's pipe exists ($CUDA_MPS_PIPE_DIRECTORY or /tmp/nvidia-mps)."""
    environ = os.environ if env is None else env
    return Path(environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps", "control").exists()


@dataclass
class SharingPlan:
    """What to do before the ranks start: variables to set in each rank, and a line to print (or none)."""

    env: dict[str, str] = field(default_factory=dict)
    note: str = ""


def plan_sharing(
    backend: str,
    local_ranks: int,
    gpus: int,
    nccl: NcclLibrary | None,
    share_gpus: bool,
    enabled_by_env: bool = False,
    mps: bool = True,
) -> SharingPlan:
    """Decide for `local_ranks` ranks on `gpus` GPUs; ValueError (one line, the ways out) when NCCL would refuse.

    `enabled_by_env`: NCCL_MULTI_RANK_GPU_ENABLE=1 is already set by the user.
    """
    if gpus < 1 or local_ranks <= gpus:
        note = f"--share-gpus: {local_ranks} rank(s) on {gpus} GPU(s), nothing to share" if share_gpus else ""
        return SharingPlan(note=note)
    sharing = f"{local_ranks} ranks on {gpus} GPU(s)"
    if backend != "nccl":
        return SharingPlan(note=f"{sharing} with {backend}: {CAVEAT}")
    ways_out = WAYS_OUT.format(gpus=gpus)
    if nccl is None:
        if share_gpus:
            raise ValueError(
                f"--share-gpus needs NCCL >= 2.30, and this process has no NCCL library loaded to check; {ways_out}"
            )
        return SharingPlan()  # cannot tell: NCCL's own error, if any, is explained when it comes
    if nccl.version < MIN_SHARING:
        flag = "--share-gpus needs NCCL >= 2.30" if share_gpus else "NCCL before 2.30 refuses two ranks on one GPU"
        raise ValueError(f'{sharing} with {nccl.label}: {flag} ("Duplicate GPU detected"); {ways_out}')
    if not (share_gpus or enabled_by_env):
        raise ValueError(
            f"{sharing} with {nccl.label}: NCCL refuses two ranks on one GPU unless "
            f"{ENABLE_VAR}=1; add --share-gpus to set it, or {NO_SHARING.format(gpus=gpus)}"
        )
    mps_hint = (
        ""
        if mps
        else (
            "; CUDA MPS is not running: start it (nvidia-cuda-mps-control -d) so the ranks' "
            "kernels run at once, or NCCL may hang"
        )
    )
    return SharingPlan(
        env={ENABLE_VAR: "1"}, note=f"{sharing} with {nccl.label} and {ENABLE_VAR}=1: {CAVEAT}{mps_hint}"
    )


def explain_failure(text: str) -> str | None:
    """One line for NCCL's refusal of two ranks on one GPU (the DistBackendError's text), else None."""
    found = re.search(r"Duplicate GPU detected\s*:?\s*([^\n]*)", text)
    if not found:
        return None
    version = re.search(r"NCCL version (\d+\.\d+\.\d+)", text)
    detail = f": {found.group(1).strip()}" if found.group(1).strip() else ""
    return (
        f"NCCL{' ' + version.group(1) if version else ''} refused two ranks on one GPU "
        f"(Duplicate GPU detected{detail}); use --backend gloo, or one rank per GPU, or NCCL >= 2.30 with "
        f"--share-gpus (sets {ENABLE_VAR}=1; run under CUDA MPS: nvidia-cuda-mps-control -d)"
    )

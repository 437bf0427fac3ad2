"""What one `run_nsys.sh` call will do: the settings (defaults chosen from the machine) and the commands.

No torch here: GPUs are counted with nvidia-smi so that planning, `--help` and `--dry-run` stay quick.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from profiling.session import CPU_TRACE, NsysOptions

BACKENDS = ("gloo", "nccl")
PROFILERS = ("nsys", "torch")
DEVICES = ("cpu", "cuda")


def local_gpu_count() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else what `nvidia-smi -L` lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


@dataclass
class ProfilePlan:
    """Settings of one profiling call; None means "the machine's default" (filled by `resolved`)."""

    impls: list[str]
    out_dir: Path = Path("traces")
    world_size: int | None = None
    model: str | None = None
    backend: str | None = None
    device: str | None = None
    gpus: int | None = None
    share_gpus: bool = False
    per_rank: bool = False
    torchrun_args: list[str] = field(default_factory=list)
    trace: str | None = None
    sample: bool = False
    timeout_s: float = 3600
    runner_args: list[str] = field(default_factory=list)
    profiler: str = "nsys"  # or "torch": torch.profiler in every rank, one <impl>.rank<N>.json.gz each
    # the other run settings given (ddp.training.config.RunConfig field -> value), passed on as options
    run_settings: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.impls:
            raise ValueError("no implementation given")
        for name in ("world_size", "gpus"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "gpus" else 1):
                raise ValueError(f"{name.replace('_', '-')}={value}: must be >= {0 if name == 'gpus' else 1}")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: choose from {', '.join(BACKENDS)}")
        if self.device is not None and self.device not in DEVICES:
            raise ValueError(f"device={self.device!r}: choose from {', '.join(DEVICES)}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout={self.timeout_s}: must be > 0")
        if self.torchrun_args and not self.per_rank:
            raise ValueError("--torchrun needs --per-rank (one report per rank under torchrun)")
        if self.backend == "nccl" and self.device == "cpu":
            raise ValueError("backend=nccl needs device=cuda")
        if self.profiler not in PROFILERS:
            raise ValueError(f"profiler={self.profiler!r}: choose from {', '.join(PROFILERS)}")

    def resolved(self) -> ProfilePlan:
        """A copy with every machine-dependent default filled in (GPUs: NCCL over all of them; more
        ranks than GPUs: gloo, unless --share-gpus)."""
        gpus = local_gpu_count() if self.gpus is None else self.gpus
        device = self.device or ("cuda" if gpus > 0 else "cpu")
        if device == "cuda" and gpus == 0:
            raise ValueError("device=cuda but no GPU is visible (nvidia-smi lists none)")
        world_size = self.world_size or (gpus if device == "cuda" else 2)
        own_gpus = world_size <= gpus or self.share_gpus or bool(self.torchrun_args)
        return replace(
            self,
            gpus=gpus,
            device=device,
            backend=self.backend or ("nccl" if device == "cuda" and own_gpus else "gloo"),
            world_size=world_size,
            model=self.model or "auto",
            trace=self.trace or ("cuda,nvtx,osrt" if device == "cuda" else CPU_TRACE),
        )

    def known_world_size(self) -> int | None:
        """Ranks in each run: the resolved world size, or under --torchrun its --nnodes x --nproc-per-node
        when both are plain numbers (None when the ranks will know it only from torchrun)."""
        if not self.torchrun_args:
            return self.world_size
        given = dict(zip(self.torchrun_args, self.torchrun_args[1:], strict=False))
        given |= dict(a.split("=", 1) for a in self.torchrun_args if a.startswith("--") and "=" in a)
        nodes = given.get("--nnodes", "1")
        per_node = given.get("--nproc-per-node", given.get("--nproc_per_node", ""))
        return int(nodes) * int(per_node) if nodes.isdigit() and per_node.isdigit() else None

    @property
    def nsys_options(self) -> NsysOptions:
        return NsysOptions(self.trace or CPU_TRACE, self.sample)

    def stem(self, impl: str) -> Path:
        """Output path without extension: `<out>/<impl>`, or `<out>/<impl>.rank{rank}` per rank
        (torch.profiler: always per rank, `<out>/<impl>.rank<N>.json.gz`)."""
        return self.out_dir / (f"{impl}.rank{{rank}}" if self.per_rank else impl)

    def runner_command(self, impl: str) -> list[str]:
        """`python -m profiling.run ...` for `impl`; under torchrun the world comes from torchrun."""
        cmd = [
            sys.executable,
            "-m",
            "profiling.run",
            "--impl",
            impl,
            "--model",
            str(self.model),
            "--backend",
            str(self.backend),
            "--device",
            str(self.device),
        ]
        if not self.per_rank:
            cmd += ["--world-size", str(self.world_size)]
        if self.share_gpus:
            cmd.append("--share-gpus")
        for name, value in self.run_settings.items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                cmd += [flag] if value else []
            elif value is not None:
                cmd += [flag, str(value)]
        if self.profiler == "torch":
            cmd += ["--torch-trace", str(self.out_dir / impl)]
        return cmd + self.runner_args

    def torchrun_command(self, impl: str) -> list[str]:
        """torchrun launching one `profiling.session` (one nsys, one report) per rank."""
        targs = self.torchrun_args or ["--standalone", "--nproc-per-node", str(self.world_size)]
        if self.profiler == "torch":  # each rank profiles itself: no session wrapper
            return [sys.executable, "-m", "torch.distributed.run", *targs, "--no-python", *self.runner_command(impl)]
        session = [
            sys.executable,
            "-m",
            "profiling.session",
            "--stem",
            str(self.stem(impl)),
            "--trace",
            self.nsys_options.trace,
            "--timeout",
            str(self.timeout_s),
        ]
        if self.sample:
            session.append("--sample")
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *targs,
            "--no-python",
            *session,
            "--",
            *self.runner_command(impl),
        ]

    def describe(self) -> str:
        """One line for the progress log."""
        where = shlex.join(self.torchrun_args) if self.torchrun_args else f"{self.world_size} local ranks"
        tool = "torch.profiler" if self.profiler == "torch" else f"nsys -t {self.trace}"
        return (
            f"{where}, {self.backend} on {self.device}, model {self.model}, {tool}"
            f"{', one report per rank' if self.per_rank else ''}"
        )

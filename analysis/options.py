"""The analysis commands' options, declared once: `AnalysisOptions`.

Each field is an `option(default, help, ...)`: its help, metavar and type. The CLIs (`analysis.overlap`,
`.collectives`, `.timeline`, `.report`, `.advise`) build their argparse options from these fields
(`add_options`), each taking only the ones it uses, so an option has one name, one metavar and one check
everywhere. `__post_init__` names a bad value (the same line whether it came from a CLI or the API).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from analysis.errors import TraceError
from analysis.trace.patterns import Patterns

FORMATS = ("table", "csv", "json")  # --format: what a command prints
IMAGE_FORMATS = ("png", "svg")  # --png / --svg: figures written beside the HTML
TRACE_HELP = (
    "nsys SQLite exports (`nsys export --type sqlite`) or torch.profiler JSON traces (.json/.json.gz); "
    "<run>.rank<N>.* files of one folder (run_nsys.sh --per-rank, --profiler torch) are one run, "
    "any files are one run with --merge"
)
INPUTS = ("paths", "merge", "export", "skip_steps", "step", "rank", "jobs", "dask", "no_cache")
PATTERNS = ("comm_pattern", "comm_range_pattern", "backward_pattern", "step_pattern")


def option(default: Any, help: str, *, type: Any = None, metavar: str | None = None, **more: Any) -> Any:
    """A field of AnalysisOptions with what its argparse option needs (more: nargs, choices, ...)."""
    return field(default=default, metadata={"help": help, "type": type, "metavar": metavar, **more})


def check_not_negative(**values: int | None) -> None:
    """A TraceError naming the first of --step/--rank/--skip-steps (given by field name) below 0."""
    for name, value in values.items():
        if value is not None and value < 0:
            raise TraceError(f"--{name.replace('_', '-')} {value}: must be >= 0")


def check_jobs(jobs: int | None) -> None:
    """A TraceError naming --jobs unless it is None or a whole number >= 1."""
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise TraceError(f"--jobs {jobs}: must be a whole number >= 1")


@dataclass(frozen=True)
class AnalysisOptions:
    """What an analysis command reads (inputs, patterns, selection) and how it answers (format, images)."""

    paths: Sequence[str] = option((), TRACE_HELP, metavar="TRACE", nargs="+", positional=True)
    merge: bool = option(
        False,
        "treat all TRACEs as one run (one rank per file, clocks aligned); files of different runs, "
        "or the same rank twice, are refused",
    )
    export: bool = option(False, "given a .nsys-rep, run `nsys export` first when nsys is found")
    skip_steps: int = option(0, "leave each rank's first N steps out (warm-up)", type=int, metavar="N")
    step: int | None = option(None, "only step N", type=int, metavar="N")
    rank: int | None = option(None, "only rank R", type=int, metavar="R")
    jobs: int | None = option(
        None,
        "analyse files in N processes (overlap's default: the usable cores, at most one per file, "
        "fewer when memory cannot hold that many files at once, 1 for inputs under 64 MB in all; "
        "collectives, timeline and report, which need every run's events, default to 1: each run read "
        "once, here)",
        type=int,
        metavar="N",
    )
    dask: str | None = option(
        None,
        "run the per-file tasks on the Dask cluster at ADDRESS (tcp://host:8786; 'local': a "
        "LocalCluster of --jobs workers); paths must be visible to the workers. Needs dask[distributed]",
        metavar="ADDRESS",
    )
    no_cache: bool = option(
        False,
        "neither read nor write the analysis cache beside the first trace (.<name>.analysis-cache/: "
        "the loaded trace and this command's answer, for the next look at the same files)",
    )
    comm_pattern: str = option(
        Patterns.comm_kernel,
        "regex for communication kernel names (default: NCCL/RCCL kernels of every era)",
        metavar="RE",
    )
    comm_range_pattern: str = option(
        Patterns.comm_range,
        "regex for NVTX communication ranges (work launched inside counts as communication)",
        metavar="RE",
    )
    backward_pattern: str = option(Patterns.backward, "regex for backward NVTX ranges", metavar="RE")
    step_pattern: str = option(
        Patterns.step, "regex for step NVTX ranges; group 1, if any, is the step number", metavar="RE"
    )
    format: str = option("table", "output format (default table)", choices=list(FORMATS))
    png: bool = option(False, "also write the figures as PNG through kaleido and the system Chromium")
    svg: bool = option(False, "also write the figures as SVG through kaleido and the system Chromium")

    def __post_init__(self) -> None:
        check_jobs(self.jobs)
        check_not_negative(step=self.step, rank=self.rank, skip_steps=self.skip_steps)
        if self.format not in FORMATS:
            raise TraceError(f"--format {self.format}: expected one of {', '.join(FORMATS)}")

    @property
    def patterns(self) -> Patterns:
        """The Patterns the options name (TraceError naming a bad regex)."""
        return Patterns(
            comm_kernel=self.comm_pattern,
            comm_range=self.comm_range_pattern,
            backward=self.backward_pattern,
            step=self.step_pattern,
        )

    @property
    def images(self) -> list[str]:
        """The image formats asked for (--png, --svg), in IMAGE_FORMATS order."""
        return [f for f in IMAGE_FORMATS if getattr(self, f)]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AnalysisOptions:
        """The options a parsed command line names; options a CLI does not take keep their defaults."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


OPTIONS = {f.name: f for f in fields(AnalysisOptions)}


def add_options(
    parser: argparse.ArgumentParser,
    names: Sequence[str],
    helps: Mapping[str, str] | None = None,
    metavars: Mapping[str, str] | None = None,
) -> None:
    """One argparse option per named AnalysisOptions field, in the order given (`--skip-steps` for
    `skip_steps`); `helps` replaces a field's help for this CLI (what its output is, what it writes),
    `metavars` a field's metavar."""
    helps, metavars = helps or {}, metavars or {}
    for name in names:
        fld = OPTIONS[name]
        meta = {**fld.metadata, **({"metavar": metavars[name]} if name in metavars else {})}
        kwargs: dict[str, Any] = {"help": helps.get(name, meta.pop("help"))}
        if meta.pop("positional", False):
            parser.add_argument(name, **kwargs, **{k: v for k, v in meta.items() if v is not None})
            continue
        default = fld.default
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true", **kwargs)
            continue
        parser.add_argument(flag, default=default, **kwargs, **{k: v for k, v in meta.items() if v is not None})

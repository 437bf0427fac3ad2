"""Reading a trace in either format: `read_trace(paths) -> Trace`, and which files form one job.

The format is recognised from the content (torch.profiler JSON, gzipped or not, else an nsys SQLite
export), the file(s) go to their reader (nsys.py, kineto.py), and several files are merged as the
one-rank files of one job. The frames come back as read: which GPU work is communication
(gpu_ops.is_comm) is decided after reading, by `analysis.engine.runs.load_trace`, the entry every
CLI and the Python API use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from analysis.errors import TraceError
from analysis.frames.patterns import Patterns
from analysis.frames.trace import Trace
from analysis.readers.kineto_json import is_kineto

# run_nsys.sh --per-rank: <impl>.rank<N>.sqlite; --profiler torch: <impl>.rank<N>.json.gz
RANK_FILE = re.compile(r"^(?P<run>.+)\.rank\d+(?:\.json)?$")


def read_trace(paths: str | Path | Iterable[str | Path], patterns: Patterns | None = None) -> Trace:
    """Read one file, or several one-rank files of the same job merged onto the first file's clock
    (`patterns` name the steps and backward ranges a torch.profiler trace's backward pass is built in)."""
    files = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not files:
        raise TraceError("no trace path given")
    patterns = patterns or Patterns()
    if one_format(files):  # torch.profiler JSON: its own reader, the same frames
        from analysis.readers.kineto import load_kineto

        trace = load_kineto(files, patterns)
    else:
        from analysis.readers.nsys import load_nsys

        trace = load_nsys(files, patterns)
    return trace


def one_format(files: list[Path]) -> bool:
    """Whether the files are torch.profiler JSON (else nsys exports); a mix of both is a TraceError."""
    kineto = [is_kineto(p) for p in files]
    if any(kineto) and not all(kineto):
        raise TraceError(f"{', '.join(map(str, files))}: cannot merge torch.profiler JSON with nsys exports")
    return any(kineto)


@dataclass(frozen=True)
class TraceInput:
    """One trace given on a command line: a single file, or the one-rank files of a per-rank run."""

    name: str  # file stem, or <impl> of <impl>.rank<N>.sqlite
    paths: tuple[Path, ...]

    @property
    def label(self) -> str:
        if len(self.paths) == 1:
            return str(self.paths[0])
        suffix = re.sub(r"^.*\.rank\d+", "", self.paths[0].name)  # .sqlite, .json.gz, ...
        return str(self.paths[0].parent / f"{self.name}.rank*{suffix}") + f" ({len(self.paths)} files)"


def group_inputs(paths: list[Path]) -> list[TraceInput]:
    """Each path is a trace, except `<run>.rank<N>.*` files of one folder, which form one trace."""
    groups: dict[tuple, list[Path]] = {}
    for path in paths:  # a handful of command-line paths
        found = RANK_FILE.match(path.stem)
        key = (str(path.parent), found["run"]) if found else (str(path),)
        groups.setdefault(key, []).append(path)
    return [
        TraceInput(
            k[1] if len(k) == 2 else g[0].stem.removesuffix(".json"),  # k[1]: the run of rank files
            tuple(g),
        )
        for k, g in groups.items()
    ]

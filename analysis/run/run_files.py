"""Which input files form one run: `find_runs(paths, merge)`, the one rule every analysis CLI and the
Python API use to turn paths into runs: each path is a run, except `<run>.rank<N>.*` files of one
folder (run_nsys.sh --per-rank, --profiler torch), which form one; with merge=True all paths are one
run. Light on purpose (no pandas): the CLIs group their inputs before they import the analysis.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from analysis.errors import TraceError
from analysis.trace.readers.nsys_export import export_report, is_report, report_error

# run_nsys.sh --per-rank: <run>.rank<N>.sqlite; --profiler torch: <run>.rank<N>.json(.gz)
RANK_FILE = re.compile(r"^(?P<run>.+)\.rank\d+(?:\.json)?$")


@dataclass(frozen=True)
class RunFiles:
    """One run given on a command line: a single file, or the one-rank files of a per-rank run."""

    name: str  # file stem, or <run> of <run>.rank<N>.sqlite
    paths: tuple[Path, ...]

    @property
    def label(self) -> str:
        """The path, or for several files their pattern and count."""
        if len(self.paths) == 1:
            return str(self.paths[0])
        found = RANK_FILE.match(self.paths[0].stem)
        if found and all(p.parent == self.paths[0].parent for p in self.paths):
            suffix = re.sub(r"^.*\.rank\d+", "", self.paths[0].name)  # .sqlite, .json.gz, ...
            return str(self.paths[0].parent / f"{self.name}.rank*{suffix}") + f" ({len(self.paths)} files)"
        return ", ".join(str(p) for p in self.paths)


def distinct_names(runs: Sequence[RunFiles]) -> list[str]:
    """A short name per run, unique among `runs`: the run's name, with as many of its folders in front
    as it takes to tell it from the others' (a/fsdp and b/fsdp); the whole label when even that is not
    enough (find_runs makes labels unique)."""
    names = unique_tails([(*r.paths[0].parent.resolve().parts, r.name) for r in runs])
    return names if len(set(names)) == len(names) else [r.label for r in runs]


def shown_files(labels: Sequence[str]) -> list[str]:
    """How pages name each run's file(s): the file name, with folders in front where two runs' files
    share a name (unique_tails of the run labels)."""
    return unique_tails([Path(label).parts for label in labels])


def unique_tails(parts: Sequence[Sequence[str]]) -> list[str]:
    """Each sequence's last part, or where two would read the same, as many of its last parts joined
    by '/' as tell it from the others (a/fsdp, b/fsdp); duplicates stay when the whole sequences are."""
    names = [p[-1] if p else "" for p in parts]
    for n in range(2, max((len(p) for p in parts), default=0) + 1):
        counts = [names.count(x) for x in names]
        if all(c == 1 for c in counts):
            break
        names = ["/".join(p[-n:]) if c > 1 else x for p, x, c in zip(parts, names, counts, strict=True)]
    return names


def _stem(path: Path) -> str:
    return path.stem.removesuffix(".json")


def _exported(path: Path, export: bool) -> Path:
    """An nsys report's SQLite export (made when `export`), else the path itself."""
    if is_report(path) and path.exists():
        if not export:
            raise report_error(path)
        return export_report(path)
    return path


def find_runs(paths: str | Path | Iterable[str | Path], merge: bool = False, export: bool = False) -> list[RunFiles]:
    """The runs the paths hold, in the order given: every path its own run except `<run>.rank<N>.*`
    files of one folder, which form one; merge=True: all paths one run. A file given twice is a
    TraceError; `export`: .nsys-rep reports are exported first (else they are a TraceError)."""
    given = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not given:
        raise TraceError("no trace path given")
    seen: dict[Path, Path] = {}
    for p in given:
        if p.resolve() in seen:
            raise TraceError(f"{p}: given twice (as {seen[p.resolve()]} too)")
        seen[p.resolve()] = p
    files = [_exported(p, export) for p in given]
    if merge:
        found = RANK_FILE.match(files[0].stem)
        return [RunFiles(found["run"] if found else _stem(files[0]), tuple(files))]
    groups: dict[tuple, list[Path]] = {}
    for path in files:  # a handful of command-line paths
        found = RANK_FILE.match(path.stem)
        groups.setdefault((str(path.parent), found["run"]) if found else (str(path),), []).append(path)
    return [RunFiles(k[1] if len(k) == 2 else _stem(g[0]), tuple(g)) for k, g in groups.items()]

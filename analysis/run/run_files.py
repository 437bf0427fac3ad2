"""Which input files form one run: `find_runs(paths, merge)`, the one rule every analysis CLI and the
Python API use to turn paths into runs: each path is a run, except `<run>.rank<N>.*` files of one
folder (run_nsys.sh --per-rank, --profiler torch), which form one; with merge=True all paths are one
run. Light on purpose (no pandas): the CLIs group their inputs before they import the analysis.

Whether files given together are ranks of one run: `file_identity` says what a file records about its
run, `check_one_run` refuses files that cannot be one run's, with one line naming both.

Files are one run's only if, where both say: the same implementation and world size, the same run id
(ddp.meta's run_id, one per launch), both or neither carrying our ddp.meta (our rank 0 with a plain
PyTorch script's rank 1 is not one run), the same number of steps recorded (ddp.meta's `steps`) and
found (step ranges per rank), no rank twice, and captures that overlap in time on their recorded clocks
(ranks of one run record together; two recordings minutes apart do not, and no alignment on the
collectives can make them one). nsys exports and torch.profiler files alike: the loader
(loaded_run.load_trace) and the per-file merge (rank_merge.combine) both call it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.errors import TraceError
from analysis.trace.readers.nsys_export import export_report, is_report, report_error
from contract import RUN_ID_KEY

if TYPE_CHECKING:
    import pandas as pd

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


# Captures further apart than this and than the longer capture cannot be ranks of one run: hosts' clocks
# disagree by milliseconds (clocks.py), ranks of one run record at the same time.
MAX_CLOCK_GAP_NS = 1_000_000_000


@dataclass(frozen=True)
class FileIdentity:
    """What one file records about the run it belongs to; None where it does not say. `has_meta`: whether
    it carries this project's ddp.meta; `steps`: the steps its ddp.meta says the run measured; `steps_found`:
    the most step ranges one of its ranks holds; `span_ns`: its first step's start and last step's end in
    UTC ns (its recorded clock)."""

    path: str
    implementation: str | None
    world_size: int | None
    ranks: tuple[int, ...]  # the ranks its processes record
    run_id: str | None = None
    has_meta: bool | None = None
    steps: int | None = None
    steps_found: int | None = None
    span_ns: tuple[int, int] | None = None

    def describe(self, *more: str) -> str:
        """'traces/naive.rank0.sqlite is run naive, 2 ranks' (the path as given, as much as the file says),
        then `more`."""
        what = [f"run {self.implementation}" if self.implementation else "a run"]
        if self.world_size is not None:
            what.append(f"{self.world_size} ranks")
        return f"{self.path} is {', '.join([*what, *more])}"


def file_identity(
    path: str | Path, metas: Iterable[Mapping], steps: pd.DataFrame | None = None, clock_offset_ns: int = 0
) -> FileIdentity:
    """A file's identity from its processes' run metadata (ddp.meta, or a torch.profiler file's
    distributedInfo, which its reader puts first) and, when given, its step ranges (pid, step, start,
    end on its own clock; `clock_offset_ns`: UTC minus that clock)."""
    metas = list(metas)
    impl = next((str(m["implementation"]) for m in metas if m.get("implementation")), None)
    world = next((m["world_size"] for m in metas if _whole(m.get("world_size"))), None)
    ranks = tuple(int(m["rank"]) for m in metas if _whole(m.get("rank")))
    run_id = next((str(m[RUN_ID_KEY]) for m in metas if m.get(RUN_ID_KEY)), None)
    recorded = next((int(m["steps"]) for m in metas if _whole(m.get("steps"))), None)
    found, span = None, None
    if steps is not None and len(steps):
        found = int(steps.groupby("pid")["step"].nunique().max())
        span = (int(steps["start"].min()) + clock_offset_ns, int(steps["end"].max()) + clock_offset_ns)
    has_meta = any("implementation" in m for m in metas)  # our ddp.meta always names it; distributedInfo never
    return FileIdentity(str(path), impl, world, ranks, run_id, has_meta, recorded, found, span)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse(a: FileIdentity, b: FileIdentity, why: str, said_a: str = "", said_b: str = "") -> TraceError:
    first, second = a.describe(*filter(None, [said_a])), b.describe(*filter(None, [said_b]))
    return TraceError(f"cannot merge files of different runs: {first}; {second} ({why}; give one run's files together)")


def _first_difference(files: Sequence[FileIdentity], what: str) -> tuple[FileIdentity, FileIdentity] | None:
    said = [f for f in files if getattr(f, what) is not None]
    other = next((f for f in said if getattr(f, what) != getattr(said[0], what)), None)
    return None if other is None else (said[0], other)


def check_one_run(files: Sequence[FileIdentity]) -> None:
    """Files given together must be ranks of one run (module docstring); a TraceError naming both files
    and what tells them apart otherwise."""
    if len(files) < 2:
        return
    for what in ("implementation", "world_size"):
        pair = _first_difference(files, what)
        if pair is not None:
            raise _refuse(*pair, f"their {what.replace('_', ' ')}s differ")
    pair = _first_difference(files, "run_id")
    if pair is not None:
        a, b = pair
        raise _refuse(a, b, "different run ids", f"run id {a.run_id}", f"run id {b.run_id}")
    pair = _first_difference(files, "has_meta")
    if pair is not None:
        ours, other = pair if pair[0].has_meta else pair[::-1]
        raise _refuse(ours, other, "one carries this project's ddp.meta, the other not: another program's run")
    for what, said in (("steps", "measured"), ("steps_found", "in the trace")):
        pair = _first_difference(files, what)
        if pair is not None:
            a, b = pair
            n_a, n_b = getattr(a, what), getattr(b, what)
            raise _refuse(a, b, "different step counts", f"{n_a} steps {said}", f"{n_b} steps {said}")
    seen: dict[int, str] = {}
    for f in files:
        for rank in set(f.ranks):
            if rank in seen:
                raise TraceError(
                    f"{seen[rank]} and {f.path} both hold rank {rank}: files of different runs (or one file twice)"
                )
            seen[rank] = f.path
    _check_same_time(files)


def _check_same_time(files: Sequence[FileIdentity]) -> None:
    """Refuse files whose captures, on their recorded clocks, are further apart than clocks of one run's
    hosts can disagree (MAX_CLOCK_GAP_NS) and than the longer capture."""
    timed = [f for f in files if f.span_ns is not None]
    for f in timed[1:]:
        a, b = timed[0].span_ns, f.span_ns
        assert a is not None and b is not None
        gap = max(a[0], b[0]) - min(a[1], b[1])  # > 0: the captures do not overlap
        if gap > max(MAX_CLOCK_GAP_NS, a[1] - a[0], b[1] - b[0]):
            raise _refuse(
                timed[0],
                f,
                f"recorded {gap / 1e9:.1f} s apart, while ranks of one run record at the same time",
                f"captured for {(a[1] - a[0]) / 1e9:.3f} s",
                f"for {(b[1] - b[0]) / 1e9:.3f} s",
            )

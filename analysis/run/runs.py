"""Runs: whether files given together belong together, and a run loaded ready to measure.

`find_runs(paths, merge)` (run_files.py) is the one rule that turns paths into runs. `check_one_run`
(run_identity.py) refuses files that are not ranks of one run (two implementations, world sizes, run
ids or step counts, ddp.meta in one only, captures far apart in time, the same rank twice), in either
format, from what each file records (`ddp.meta`, torch.profiler's distributedInfo, its steps and clock);
`load_trace(paths)` reads a run's file(s) (trace/readers/load.py), checks them, decides once which GPU work
is communication (measure/phases.communication_mask: gpu_ops.is_comm is what every measure and view
reads) and puts every file on the first file's clock (clocks.align_on_collectives).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from analysis.cache.loads import cached_load
from analysis.cache.unpacked import unpacked
from analysis.errors import TraceError
from analysis.measure.phases import communication_mask, find_steps
from analysis.run.clocks import align_on_collectives
from analysis.run.run_identity import FileIdentity as FileIdentity, check_one_run, file_identity  # re-exported
from analysis.trace.frames import CLOCK_OFFSET_KEY, Trace
from analysis.trace.patterns import Patterns
from analysis.trace.readers.load import read_trace


def trace_identities(trace: Trace, paths: Sequence[str | Path], patterns: Patterns | None = None) -> list[FileIdentity]:
    """Each part's identity, from the loaded trace's ddp.meta, step ranges and recorded clock (part i is paths[i])."""
    steps = find_steps(trace.nvtx, patterns or Patterns())
    by_part = steps.groupby("part").indices if len(steps) else {}
    return [
        file_identity(
            p,
            (m for (part, _), m in trace.meta.items() if part == i),
            steps.iloc[by_part[i]] if i in by_part else None,
            int(trace.info.get(i, {}).get(CLOCK_OFFSET_KEY, 0) or 0),
        )
        for i, p in enumerate(paths)
    ]


def load_trace(
    paths: str | Path | Iterable[str | Path], patterns: Patterns | None = None, cache: bool | None = None
) -> Trace:
    """Load one file, or several one-rank files of one run on the first file's clock (check_one_run
    refuses files of different runs), with gpu_ops.is_comm set by `patterns`; from the load cache
    beside the first file when it holds this load (load_cache.py; cache=False: neither read nor
    written, None: on unless ANALYSIS_NO_CACHE is set)."""
    files = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    patterns = patterns or Patterns()
    if not files:
        raise TraceError("no trace path given")
    return cached_load(files, patterns, lambda: _load(files, patterns, cache), cache)


def _load(files: list[Path], patterns: Patterns, cache: bool | None = None) -> Trace:
    trace = _read(files, patterns, cache)
    check_one_run(trace_identities(trace, files, patterns))
    trace.gpu_ops["is_comm"] = communication_mask(trace.gpu_ops, trace.nvtx, patterns)  # a frame of our own
    return align_on_collectives(trace, patterns)  # the calls it checks the clocks with need is_comm


def _read(files: list[Path], patterns: Patterns, cache: bool | None) -> Trace:
    """read_trace of the files, a compressed export read from its decompressed copy (cache/unpacked.py);
    the trace and its errors name the files as given."""
    with unpacked(files, cache) as readable:
        if readable == files:
            return read_trace(files, patterns)
        try:
            trace = read_trace(readable, patterns)
        except TraceError as e:
            message = str(e)
            for given, read in zip(files, readable, strict=True):
                message = message.replace(str(read), str(given))
            raise TraceError(message) from None
    return replace(trace, path=", ".join(str(p) for p in files))

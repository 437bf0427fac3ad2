"""Reading a trace in either format: `read_trace(paths) -> Trace`.

The format is recognised from the content (torch.profiler JSON, gzipped or not, else an nsys SQLite
export), the file(s) go to their reader (nsys.py, kineto.py), and several files are merged as the
one-rank files of one run, each on its own clock. The frames come back as read: whether the files
are one run's, their common clock and which GPU work is communication (gpu_ops.is_comm) are decided
after reading, by `analysis.run.loaded_run.load_trace`, the entry every CLI and the Python API use.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.errors import TraceError
from analysis.trace.frames import Trace
from analysis.trace.patterns import Patterns
from analysis.trace.readers.sniff import Sniffed, sniff

if TYPE_CHECKING:
    from analysis.trace.readers.read_ahead import StartedRead


def read_trace(
    paths: str | Path | Iterable[str | Path], patterns: Patterns | None = None, *, started: StartedRead | None = None
) -> Trace:
    """Read one file, or several one-rank files of the same job merged onto the first file's clock
    (`patterns` name the steps and backward ranges a torch.profiler trace's backward pass is built in;
    `started`: the first file's read, started already (read_ahead.start_read))."""
    files = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not files:
        raise TraceError("no trace path given")
    patterns = patterns or Patterns()
    sniffed = sniffed_alike(files, started)  # each file opened once (here, or by start_read); the reader once more
    if sniffed[0].kineto:  # torch.profiler JSON: its own reader, the same frames
        from analysis.trace.readers.kineto import load_kineto

        trace = load_kineto(files, patterns)
    else:
        from analysis.trace.readers.nsys import load_nsys

        export = started.export if started is not None else None
        trace = load_nsys(files, patterns, heads=[s.head for s in sniffed], started=export)
    return trace


def sniffed_alike(files: list[Path], started: StartedRead | None = None) -> list[Sniffed]:
    """Each file's format (sniff.py), all the same: a mix of torch.profiler JSON and nsys exports is a TraceError.
    The `started` file was sniffed when its read started: that sniff is taken."""
    known = {started.sniffed.path: started.sniffed} if started is not None else {}
    sniffed = [known.get(p) or sniff(p) for p in files]
    kineto = [s.kineto for s in sniffed]
    if any(kineto) and not all(kineto):
        raise TraceError(f"{', '.join(map(str, files))}: cannot merge torch.profiler JSON with nsys exports")
    return sniffed


def one_format(files: list[Path]) -> bool:
    """Whether the files are torch.profiler JSON (else nsys exports); a mix of both is a TraceError."""
    return sniffed_alike(files)[0].kineto

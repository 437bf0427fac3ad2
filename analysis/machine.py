"""What the machine offers the analysis: the cores it may run on (`usable_cores`), the memory it may
still take (`available_memory`), and memory it freed handed back to the system (`release_free_memory`,
glibc's malloc_trim).

glibc keeps what a process frees in its heap for later allocations, and each thread's arena keeps its
own. After a step that built and dropped large temporaries, that memory stays counted in the process,
and the next step's allocations do not always fit into it. connectorx builds each batch of a read on
its worker threads, in their arenas, which the analysis (on the main thread) never reuses: after the
read of the 1M-kernel, 8-rank export the process kept about 65 MB more than it held. On the 10M-kernel
export it held about 110 MB more than it used once the ranks' activity was measured (after the sort of
every kernel row and each rank's windowing). Trimming at those points keeps the peak to what is in use:
a first look at the 10M-kernel, 8-rank export (`python -m analysis.overlap`, cache off) peaked at about
900 MiB with it and 1090-1150 MiB without, a fifth more (benchmarks/headline.py's nsys_10m_x8, runs in
turns on 2 cores). Elsewhere than glibc it does nothing; libc is looked up on first use, never when the
package is imported.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

_LIBC: ctypes.CDLL | bool | None = None


def release_free_memory() -> None:
    """Return the heap's free pages to the system (malloc_trim(0)); a no-op where libc is not glibc."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):  # not glibc
            _LIBC = False
    if isinstance(_LIBC, ctypes.CDLL):
        _LIBC.malloc_trim(0)


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask: taskset, cgroup cpusets), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable), capped by a cgroup v2
    memory limit when one is set; None when neither is known."""
    values = []
    try:
        with open("/proc/meminfo") as f:
            values += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            values.append(int(limit) - used)
    except (OSError, ValueError):
        pass
    return min(values) if values else None

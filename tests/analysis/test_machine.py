"""machine.release_free_memory: glibc's heap handed back where there is one, nothing elsewhere."""

from __future__ import annotations

import ctypes

import numpy as np

from analysis import machine


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def test_freed_heap_goes_back_to_the_system(monkeypatch):
    """Many 64 KB arrays (on the heap, below glibc's mmap threshold) freed with one kept above them: the heap
    cannot shrink past that one by itself; the trim hands back the free pages beneath it."""
    monkeypatch.setattr(machine, "_LIBC", None)
    pieces = [np.ones(8_000) for _ in range(6_000)]  # 384 MB
    top = np.ones(8_000)
    del pieces
    before = rss_kb()
    machine.release_free_memory()
    assert rss_kb() < before - 200_000  # most of the 384 MB handed back
    assert top.sum() == 8_000


class NoGlibc(ctypes.CDLL):
    def __init__(self, name: str, *args: object, **kwargs: object) -> None:
        raise OSError(f"{name}: cannot open shared object file")


def test_no_glibc_is_no_op(monkeypatch):
    monkeypatch.setattr(machine, "_LIBC", None)
    monkeypatch.setattr(ctypes, "CDLL", NoGlibc)
    machine.release_free_memory()  # nothing to call: no error
    machine.release_free_memory()  # nor looked for again
    assert machine._LIBC is False


def test_usable_cores_follow_the_affinity_mask():
    """A process pinned to one core (taskset, a cpuset) may use one, whatever the machine has."""
    import os

    mask = os.sched_getaffinity(0)
    assert machine.usable_cores() == len(mask)
    os.sched_setaffinity(0, {min(mask)})
    try:
        assert machine.usable_cores() == 1
    finally:
        os.sched_setaffinity(0, mask)


def test_available_memory_is_below_what_the_machine_has():
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert 0 < machine.available_memory() <= total

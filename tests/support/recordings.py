"""Small real recordings on CPU ranks, each implementation recorded once for the whole suite.

The tests of the recorded traces (tests/profiling, the collectives' bytes, the report's gate, the
bucket advice, the CPU report pages) read the same few runs: one `run_nsys.sh` recording per
implementation and profiler, made when a test first asks for it, into one folder per profiler (which
also holds `keep.txt`, a file not ours that no recording may touch). All with the same settings: 2 gloo
ranks, the tiny model at batch 8 x 64, WARMUP warm-up steps (torch's DDP buckets are final from its
second step) then STEPS measured ones, 1 MiB buckets (so that overlap_bucket and torch split the tiny
model into several). When several test modules of a session read a profiler's recordings, the first
request records what all of them ask for (ASKED) in one run_nsys.sh: one start of the recorder and its
imports instead of one per module.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import small_run
from tests.support import owned

STEPS, WARMUP = 4, 3
BUCKET_MB = "1"
KEEP = "keep.txt"
# Someone else's job (tests/support/plain_ddp.py) recorded with plain torch.profiler: its first step is
# the profiler's warm-up, ProfilerStep#1..#10 are recorded. Where nsys is installed the same run is also
# recorded by a plain `nsys profile` (PLAIN_NSYS, no option of ours): one run of the job for both.
PLAIN_DDP = Path(__file__).resolve().parent / "plain_ddp.py"
PLAIN_DDP_STEPS = 11
PLAIN_NSYS = ["profile", "-t", "nvtx,osrt", "-s", "none", "--cpuctxsw=none", "-f", "true"]
# What each test module reading the recordings asks for, by profiler: a session of several of them records
# the union of theirs with the first request. (A module missing here, or asking for more, still gets what
# it asks for, in a run_nsys.sh of its own.)
ASKED = {
    "nsys": {
        "test_advice_recorded": ("overlap", "overlap_bucket", "torch"),
        "test_browser_cpu_pages": ("naive", "overlap"),
        "test_report_gate": ("naive", "overlap_bucket"),
        "test_comm_bytes_trace": ("overlap_bucket", "torch"),
        "test_end_to_end": ("naive", "overlap"),
        "test_fsdp_trace": ("fsdp", "torch_fsdp"),
        "test_kineto_bytes": ("fsdp",),
    },
    "torch": {"test_torch_profiler": ("naive", "overlap"), "test_kineto_bytes": ("fsdp",)},
}


def asked_together(profiler: str, modules: set[str]) -> tuple[str, ...]:
    """The implementations the named test modules (their last dotted part) ask `profiler` for, when more
    than one of them is in the session; none otherwise."""
    if len(modules) < 2:
        return ()
    asked = [impl for module in sorted(modules) for impl in ASKED[profiler].get(module.rpartition(".")[2], ())]
    return tuple(dict.fromkeys(asked))


def record_plain_ddp(out: Path) -> Path:
    """`out`, holding plain_ddp.rank<N>.json and the job's own timer.rank<N>.json; where nsys is installed,
    also plain_ddp.sqlite, the export of the plain `nsys profile` the job ran under."""
    from tests import nsys_cli
    from tests.support.nsys import NSYS

    job = [sys.executable, str(PLAIN_DDP), "--out", str(out), "--steps", str(PLAIN_DDP_STEPS)]
    if NSYS is None:
        done = owned.run(job, capture_output=True, text=True, timeout=300, cwd=small_run.REPO)
        assert done.returncode == 0, done.stderr[-2000:]
        return out
    report = out / "plain_ddp"
    # A hung run is stopped and made again (tests/nsys_cli.py). The run takes 8-10 s alone and 15.5 s in a
    # whole-suite run: 90 s is well past it without waiting long on a hang.
    try:
        nsys_cli.profile([str(NSYS), *PLAIN_NSYS, "-o", str(report), *job], cwd=small_run.REPO, timeout_s=90)
    except subprocess.CalledProcessError as err:
        raise AssertionError(f"nsys profile failed (exit {err.returncode}): {err.stderr[-2000:]}") from None
    export = [str(NSYS), "export", "--type", "sqlite", "-o", str(out / "plain_ddp.sqlite"), f"{report}.nsys-rep"]
    owned.run(export, capture_output=True, timeout=300, check=True)
    return out


class Recordings:
    """`recordings("naive", "overlap")` -> the folder holding `<impl>.sqlite` (nsys) or
    `<impl>.rank<N>.json.gz` (torch.profiler) of each, recording those not made yet in one run_nsys.sh."""

    def __init__(self, folder: Path, profiler: str, ahead: tuple[str, ...] = ()) -> None:
        self.folder, self.profiler = folder, profiler
        self.ahead = ahead  # recorded with the first request too
        self.runs: dict[str, subprocess.CompletedProcess] = {}  # the run_nsys.sh that recorded each impl
        folder.mkdir(parents=True, exist_ok=True)
        (folder / KEEP).write_text("not ours")

    def __call__(self, *impls: str) -> Path:
        todo = [impl for impl in dict.fromkeys((*impls, *self.ahead)) if impl not in self.runs]
        self.ahead = ()
        if todo:
            extra = ["--bucket-mb", BUCKET_MB, "--profiler", self.profiler]
            done = small_run.record(todo, self.folder, STEPS, WARMUP, *extra, timeout_s=240 * len(todo))
            assert done.returncode == 0, done.stderr[-3000:]
            self.runs |= dict.fromkeys(todo, done)
        return self.folder

    def outputs(self) -> list[str]:
        """The file names the recordings made so far should have left in the folder, `keep.txt` included."""
        if self.profiler == "nsys":
            made = [f"{impl}.{ext}" for impl in self.runs for ext in ("nsys-rep", "sqlite")]
        else:
            made = [f"{impl}.rank{rank}.json.gz" for impl in self.runs for rank in (0, 1)]
        return sorted([KEEP, *made])

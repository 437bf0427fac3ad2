"""One `nsys profile` session of one program, ending in `<stem>.nsys-rep` and `<stem>.sqlite`.

Only the measured steps are captured: the program pushes the NVTX range `profile` after its warm-up
(see profiling.capture) and nsys records from the first such push until the first pop.

Under torchrun, `python -m profiling.session --stem traces/overlap.rank{rank} ... -- PROGRAM...`
is each rank's entry point (`--per-rank` of profiling.record): one report per rank, `{rank}` taken
from the RANK variable torchrun sets.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from contract import PROFILE
from contract.nsys_cli import partial_name, sqlite_export_command
from profiling import nsys_layout
from profiling.nsys import NsysError, export_sqlite, find_nsys, nsys_version
from profiling.processes import exit_on_sigterm, run_forwarding_output

PROFILER_ENV = "DDP_PROFILER"  # "nsys <version>": the profiled run records it in its ddp.meta mark
# nsys 2022.4's own failures (a C++ exception from its QuadD/boost internals), as opposed to the program's.
# nsys's own failures to start a session: a boost exception, or (the session's channel closed under it)
# boost's bare "End of file" on a line of its own (seen once, as a recording started right after another).
_NSYS_LAUNCH_FAILURE = re.compile(r"boost::wrapexcept|QuadDCommon::|errinfo_api_function|^End of file$", re.M)
START_ATTEMPTS = 3
RESULT_PREFIX = "[profiling.session] wrote "  # then: report TAB sqlite TAB "in <wall seconds> s" (result_line)
# CPU runs: NVTX alone. OS runtime tracing (osrt) intercepts every thread's OS calls, gloo's too, and made
# CPU steps about 4 % slower on average than NVTX alone (docs/measurements/2026-11-29-cpu-trace-overhead.md); the
# analysis reads none of it.
CPU_TRACE = "nvtx"
KNOWN_TRACES = {
    "cuda",
    "nvtx",
    "osrt",
    "cublas",
    "cudnn",
    "nvvideo",
    "opengl",
    "mpi",
    "ucx",
    "oshmem",
    "vulkan",
    "none",
}


@dataclass(frozen=True)
class NsysOptions:
    """What nsys records: `trace` is nsys's -t list; `sample` turns CPU IP sampling and context switches on."""

    trace: str = CPU_TRACE
    sample: bool = False

    def __post_init__(self) -> None:
        unknown = [t for t in self.trace.split(",") if t not in KNOWN_TRACES]
        if unknown:
            raise ValueError(
                f"trace={self.trace!r}: unknown nsys trace {', '.join(map(repr, unknown))} "
                f"(an empty list is not allowed); known: {','.join(sorted(KNOWN_TRACES))}"
            )

    def profile_args(self) -> list[str]:
        """The `nsys profile` arguments before the program, minus the output name."""
        scope = "process-tree" if self.sample else "none"
        args = [
            "profile",
            "--trace",
            self.trace,
            "--sample",
            scope,
            "--cpuctxsw",
            scope,
            "--capture-range",
            "nvtx",
            "--nvtx-capture",
            PROFILE,
            "--capture-range-end",
            "stop",
            "--force-overwrite",
            "true",
        ]
        if "cuda" in self.trace.split(","):
            args += ["--cuda-memory-usage", "false"]
        return args


@dataclass
class Recorded:
    """The files one session produced and how long it took."""

    report: Path
    sqlite: Path
    wall_s: float


def profile_command(nsys: Path, opts: NsysOptions, report: Path, program: Sequence[str]) -> list[str]:
    """The full `nsys profile ... program` command line writing `report`."""
    return [str(nsys), *opts.profile_args(), "--output", str(report), *program]


def profiled_env(base: dict[str, str] | None = None, profiler: str | None = None) -> dict[str, str]:
    """The environment for a profiled run: NVTX ranges from unregistered strings also open the capture."""
    env = dict(os.environ if base is None else base)
    env["NSYS_NVTX_PROFILER_REGISTER_ONLY"] = "0"
    if profiler:
        env[PROFILER_ENV] = profiler
    return env


def result_line(done: Recorded) -> str:
    """What a per-rank session prints when done: RESULT_PREFIX, report TAB sqlite TAB "in 7.469 s" (the
    wall time of its recording and export); parse_result reads it back."""
    return f"{RESULT_PREFIX}{done.report}\t{done.sqlite}\tin {done.wall_s:.3f} s"


def parse_result(kept: str) -> Recorded:
    """A result_line, less its RESULT_PREFIX (as run_forwarding_output keeps it), as a Recorded."""
    report, sqlite, took = kept.split("\t")
    return Recorded(Path(report), Path(sqlite), float(took.split()[1]))


def nsys_failed_to_start(output: str) -> bool:
    """True when `output` shows nsys itself failing, which nsys 2022.4 now and then does while other
    nsys sessions run on the machine ("sem_open", "Local Endpoint is not available", "End of file");
    worth a retry."""
    return bool(_NSYS_LAUNCH_FAILURE.search(output))


def prepare_output_folder(folder: Path) -> None:
    """Make `folder` if needed and prove it takes a new file (a probe, written and removed): ValueError
    naming the folder and the cause otherwise. Permission bits do not say it for root, a read-only
    filesystem or an immutable folder; only a write does."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-", suffix=".partial"):
            pass
    except OSError as err:
        raise ValueError(f"output folder {folder} cannot be written to: {err.strerror or err}") from None


def record(
    nsys: Path,
    opts: NsysOptions,
    program: Sequence[str],
    stem: Path,
    timeout_s: float = 3600,
    env: dict[str, str] | None = None,
) -> Recorded:
    """Profile `program` into `<stem>.nsys-rep` and `<stem>.sqlite`, replacing those two files only.

    Both are written under temporary names first: a failed or interrupted run leaves the previous
    outputs (if any) as they were and no partial file behind.
    """
    report, sqlite, tmp_report = _names(stem)
    t0 = time.monotonic()
    cmd = profile_command(nsys, opts, tmp_report, program)
    run_env = profiled_env(env, f"nsys {nsys_version(nsys)}")
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            tail: list[str] = []
            rc = run_forwarding_output(cmd, run_env, timeout_s, tail=tail)
            if rc == 0 or attempt == START_ATTEMPTS or not nsys_failed_to_start("\n".join(tail)):
                break
            print(
                f"[profiling] nsys failed to start (see above); trying again ({attempt + 1}/{START_ATTEMPTS})",
                file=sys.stderr,
            )
            time.sleep(attempt)
        capture = tmp_report.with_suffix(".qdstrm")  # nsys's raw capture, before its importer runs
        importer_said = [line for line in tail if nsys_layout.IMPORTER_FAILED.search(line)]
        if not tmp_report.is_file() and capture.is_file() and (rc == 0 or importer_said):
            import_or_keep(nsys, capture, Path(f"{stem}.qdstrm"), importer_said, timeout_s)
        elif rc != 0:
            raise NsysError(f"the profiled run failed (exit {rc}); see its output above")
        if not tmp_report.is_file():
            raise NsysError(
                "nsys wrote no report: the run never opened the NVTX range 'profile' (did it reach the measured steps?)"
            )
        export_sqlite(nsys, tmp_report, sqlite)
        os.replace(tmp_report, report)
    finally:
        for partial in (tmp_report, tmp_report.with_suffix(".qdstrm")):
            with contextlib.suppress(OSError):  # absent, or a folder turned read-only: not the error to report
                partial.unlink(missing_ok=True)
    return Recorded(report, sqlite, time.monotonic() - t0)


def _names(stem: Path) -> tuple[Path, Path, Path]:
    """The report, the SQLite export and the report's temporary name while nsys writes it."""
    report = Path(f"{stem}.nsys-rep")
    return report, Path(f"{stem}.sqlite"), partial_name(report, ".nsys-rep")


def planned_commands(nsys: Path, opts: NsysOptions, program: Sequence[str], stem: Path) -> list[str]:
    """The shell lines `record` runs (--dry-run): nsys profile and nsys export under temporary names,
    then the renames to the final names. The temporary names carry the recording process's id."""
    report, sqlite, tmp_report = _names(stem)
    env = profiled_env({}, f"nsys {nsys_version(nsys)}")  # what record adds to the environment
    tmp_sqlite = partial_name(sqlite, ".sqlite")
    return [
        shlex.join([*(f"{k}={v}" for k, v in env.items()), *profile_command(nsys, opts, tmp_report, program)]),
        shlex.join(sqlite_export_command(nsys, tmp_report, tmp_sqlite)),
        shlex.join(["mv", "-f", str(tmp_sqlite), str(sqlite)]),
        shlex.join(["mv", "-f", str(tmp_report), str(report)]),
    ]


def import_or_keep(nsys: Path, capture: Path, keep: Path, importer_said: list[str], timeout_s: float) -> None:
    """nsys recorded `capture` but its importer failed: import it here if an importer runs (the report
    appears beside `capture`), else move `capture` to `keep` and raise the steps that import it."""
    why = " ".join(importer_said) or "its importer did not run"
    importer = nsys_layout.find_importer(nsys)
    tried = ""
    if importer is not None:
        print(
            f"[profiling] nsys recorded the run but did not import it ({why}); importing with {importer}",
            file=sys.stderr,
            flush=True,
        )
        result = nsys_layout.import_capture(importer, capture, timeout_s)
        if result.report is not None:
            if result.report != capture.with_suffix(".nsys-rep"):
                os.replace(result.report, capture.with_suffix(".nsys-rep"))
            return
        missing = nsys_layout.missing_libraries(importer)
        tried = (
            f" Running {importer.name} here failed too ({result.message})"
            + (
                f"; it lacks {', '.join(missing)}: install {'it' if len(missing) == 1 else 'them'} or put "
                f"{'its' if len(missing) == 1 else 'their'} folder on LD_LIBRARY_PATH"
                if missing
                else ""
            )
            + "."
        )
    os.replace(capture, keep)
    command = shlex.join([str(importer or nsys_layout.IMPORTER), "-i", str(keep)])
    where = (
        ""
        if importer
        else (
            f" ({nsys_layout.IMPORTER} ships with nsys: look in host-linux-x64/ "
            f"or linux-desktop-glibc_*-x64/ beside {Path(nsys).resolve().parent})"
        )
    )
    raise NsysError(
        f"nsys recorded the run but its importer failed ({why}); the capture is kept in {keep}.{tried} "
        f"Import it with: {command}{where}, then: python -m profiling.nsys export "
        f"{keep.with_suffix('.nsys-rep')} {keep.with_suffix('.sqlite')}"
    )


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m profiling.session", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stem", required=True, help="output path without extension; {rank} is replaced by $RANK")
    parser.add_argument("--trace", default=NsysOptions.trace, help="nsys -t list (default: %(default)s)")
    parser.add_argument("--sample", action="store_true", help="CPU sampling and context switches on")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before the run is stopped")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- then the command to profile")
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    exit_on_sigterm()
    try:
        if not program:
            raise ValueError("no program to profile: give it after --")
        if "{rank}" in args.stem and "RANK" not in os.environ:
            raise ValueError("--stem has {rank} but RANK is not set (run this under torchrun)")
        stem = Path(args.stem.replace("{rank}", os.environ.get("RANK", "")))
        prepare_output_folder(stem.parent)
        done = record(find_nsys(), NsysOptions(args.trace, args.sample), program, stem, args.timeout)
    except (NsysError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2 if isinstance(err, ValueError) else 1
    print(result_line(done), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())

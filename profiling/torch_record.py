"""`run_nsys.sh IMPL --profiler torch`: record with torch.profiler instead of nsys (no nsys needed).

Runs `python -m profiling.run ... --torch-trace <out>/<impl>` (spawned local ranks, or torchrun with
--per-rank/--torchrun); every rank records its measured steps with torch.profiler
(profiling.torch_profile) and writes `<out>/<impl>.rank<N>.json.gz`, replacing a file of that name
only once the new one is complete.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass

from profiling.nsys import NsysError
from profiling.plan import ProfilePlan
from profiling.processes import run_forwarding_output
from profiling.record_outputs import print_rows
from profiling.session import profiled_env


@dataclass
class TorchOutput:
    """One rank's trace written by this call."""

    impl: str
    trace: str
    trace_bytes: int
    wall_s: float


def command(plan: ProfilePlan, impl: str) -> list[str]:
    return plan.torchrun_command(impl) if plan.per_rank else plan.runner_command(impl)


def record_torch(plan: ProfilePlan, impl: str) -> list[TorchOutput]:
    """Run `impl` with torch.profiler in every rank; one TorchOutput per trace file written.

    The files written are found on disk (this node's `<impl>.rank<N>.json.gz` replaced during the
    run), not from the ranks' output, where profiler log lines can run into theirs."""
    started, since = time.monotonic(), time.time()
    rc = run_forwarding_output(command(plan, impl), profiled_env(), plan.timeout_s)
    if rc != 0:
        raise NsysError(f"the profiled run failed (exit {rc}); see its output above")
    ranks = sorted(plan.out_dir.glob(f"{impl}.rank*.json.gz"), key=lambda p: p.name)
    written = [p for p in ranks if p.stat().st_mtime >= since - 1]
    if not written:
        raise NsysError(f"the run finished but no rank wrote a trace in {plan.out_dir}")
    stale = [p.name for p in ranks if p not in written]
    if stale and not plan.per_rank:  # under torchrun other nodes write their own ranks
        print(
            f"[run_nsys] note: {', '.join(stale)} in {plan.out_dir} are from an earlier run (left as they were); "
            "analysing them with this run's files will fail as files of different jobs",
            file=sys.stderr,
        )
    wall = time.monotonic() - started
    return [TorchOutput(impl, str(p), p.stat().st_size, wall) for p in written]


def print_summary(outputs: list[TorchOutput], fmt: str) -> None:
    rows = [{**asdict(o), "wall_s": round(o.wall_s, 2)} for o in outputs]
    print_rows(
        rows,
        fmt,
        f"{'impl':<15} {'trace':<45} {'trace KB':>9} {'wall s':>7}",
        lambda r: f"{r['impl']:<15} {r['trace']:<45} {r['trace_bytes'] / 1024:>9.0f} {r['wall_s']:>7.1f}",
    )

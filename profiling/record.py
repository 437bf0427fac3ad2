"""Record Nsight Systems traces of data-parallel implementations (what `run_nsys.sh` runs).

For each implementation, runs `python -m profiling.run` under `nsys profile`, capturing only the
measured steps (warm-up happens before the NVTX range `profile` opens), and writes
<out>/<impl>.nsys-rep (for the Nsight Systems GUI) and <out>/<impl>.sqlite (for `python -m analysis.overlap`).
With --per-rank, each rank runs under its own nsys via torchrun: <out>/<impl>.rank<N>.{nsys-rep,sqlite}.

Existing outputs of the same names are replaced; nothing else in the output directory is touched.
Each file is written under a hidden temporary name and renamed when complete, so a failed or
interrupted run leaves the previous outputs as they were.

Defaults follow the machine: without a GPU, gloo over 2 CPU ranks and the tiny model (well under a
minute), traced with -t nvtx (OS runtime tracing slowed CPU steps by 4 % on average, and nothing reads
it); with GPUs, NCCL over all local GPUs and the largest model that fits, traced with
-t cuda,nvtx,osrt. CPU sampling is off unless --sample.

nsys is $NSYS if set, else the first found on PATH, /usr/local/cuda*/bin, /opt/nvidia/nsight-systems*,
Debian's nsight-systems package (bash scripts/install_nsys.sh installs it on Debian 12 as root), or
Nsight Compute's (/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys); one whose importer is not
at ../host-linux-x64 runs from a private folder that has it. When nsys leaves only a .qdstrm (its
importer failed), the capture is imported here, or kept as <out>/<impl>.qdstrm with the command to run.

More ranks than GPUs: gloo by default; NCCL needs NCCL >= 2.30 loaded and --share-gpus (not
multi-GPU timings). DDP_TIMEOUT_S sets the ranks' process-group timeout (default 300 s).

With --profiler torch, nsys is not used at all: every rank records the same measured steps with
torch.profiler (CPU activities, plus CUDA on GPUs) into <out>/<impl>.rank<N>.json.gz, with
record_function ranges named as the NVTX ranges are (profiling.torch_record).

Exit codes: 0 all recorded, 1 a profiled run or export failed, 2 bad arguments or nsys missing.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ddp import cli
from ddp.strategies import registry
from ddp.training.config import check_settings
from profiling.nsys import NsysError, find_nsys
from profiling.plan import DEVICES, PROFILERS, ProfilePlan
from profiling.processes import exit_on_sigterm, run_forwarding_output
from profiling.record_outputs import Output, print_summary, written_output
from profiling.run import run_config
from profiling.session import (
    RESULT_PREFIX,
    parse_result,
    planned_commands,
    prepare_output_folder,
    profiled_env,
    record,
)


def log(msg: str) -> None:
    print(f"[run_nsys] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str]) -> tuple[ProfilePlan, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        prog="run_nsys.sh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="bash run_nsys.sh IMPL|all [IMPL...] [options] [-- args for python -m profiling.run]",
    )
    parser.add_argument(
        "impls", nargs="+", metavar="IMPL", help=f"one or more of: {', '.join(registry.IMPLEMENTATIONS)}, or all"
    )
    run = parser.add_argument_group("the profiled run (default: the machine's, see above)")
    cli.add_settings(
        run,
        skip={"impl"},  # the positional IMPL list
        extra_choices={"model": ["auto"]},
        notes={
            "model": "or auto: the largest that fits the GPU, tiny on CPU",
            "world_size": "default: local GPUs, or 2 without GPU",
        },
        aliases={"world_size": ["-n"]},
        only_given=True,
    )
    run.add_argument("--device", choices=DEVICES, help="default: cuda with GPUs, cpu without")
    run.add_argument("--gpus", type=int, help="local GPUs to assume (default: counted by nvidia-smi)")
    run.add_argument(
        "--share-gpus",
        action="store_true",
        help="NCCL with more ranks than GPUs: needs NCCL >= 2.30 loaded, sets "
        "NCCL_MULTI_RANK_GPU_ENABLE=1 (run under CUDA MPS); not multi-GPU timings",
    )
    prof = parser.add_argument_group("profiling")
    prof.add_argument("--out-dir", "-o", type=Path, default=Path("traces"), help="default: %(default)s")
    prof.add_argument(
        "--per-rank",
        action="store_true",
        help="run under torchrun with one nsys per rank: <impl>.rank<N>.{nsys-rep,sqlite}",
    )
    prof.add_argument(
        "--torchrun",
        default="",
        metavar="ARGS",
        help='torchrun arguments for --per-rank, e.g. multi-node: "--nnodes 2 --node-rank 0 '
        '--nproc-per-node 1 --master-addr HOST --master-port 29500" '
        "(default: --standalone --nproc-per-node WORLD_SIZE)",
    )
    prof.add_argument(
        "--profiler",
        choices=PROFILERS,
        default="nsys",
        help="nsys (default), or torch: torch.profiler in every rank, no nsys needed, <impl>.rank<N>.json.gz",
    )
    prof.add_argument("--trace", help="nsys -t list (default: cuda,nvtx,osrt with GPUs, nvtx without)")
    prof.add_argument("--sample", action="store_true", help="turn CPU sampling and context switches on")
    prof.add_argument("--timeout", type=float, default=3600, help="seconds per implementation (default: %(default)s)")
    prof.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    prof.add_argument(
        "--format",
        choices=("table", "csv", "json"),
        default="table",
        help="the summary on stdout (progress goes to stderr)",
    )
    argv = list(argv)
    runner_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    try:
        impls = registry.resolve(args.impls)
    except ValueError as err:
        parser.error(str(err))
    settings = cli.given_settings(args)
    check_settings({k: v for k, v in settings.items() if (k, v) != ("model", "auto")})  # ValueError naming it
    plan = ProfilePlan(
        impls=impls,
        out_dir=args.out_dir,
        world_size=settings.pop("world_size", None),
        model=settings.pop("model", None),
        backend=settings.pop("backend", None),
        run_settings=settings,
        device=args.device,
        gpus=args.gpus,
        share_gpus=args.share_gpus,
        per_rank=args.per_rank,
        torchrun_args=shlex.split(args.torchrun),
        trace=args.trace,
        sample=args.sample,
        timeout_s=args.timeout,
        runner_args=runner_args,
        profiler=args.profiler,
    )
    return plan, args


def record_impl(plan: ProfilePlan, nsys: Path, impl: str) -> list[Output]:
    """Profile one implementation; one Output per trace file written."""
    if not plan.per_rank:
        done = record(nsys, plan.nsys_options, plan.runner_command(impl), plan.stem(impl), plan.timeout_s)
        return [written_output(impl, done.report, done.wall_s)]
    written: list[str] = []
    rc = run_forwarding_output(
        plan.torchrun_command(impl), profiled_env(), plan.timeout_s + 60, keep=written, keep_prefix=RESULT_PREFIX
    )
    if rc != 0:
        raise NsysError(f"torchrun failed (exit {rc}); see the ranks' output above")
    if not written:
        raise NsysError(f"torchrun finished but no rank reported a trace in {plan.out_dir}")
    # This node's ranks, as each one's profiling.session reported them.
    return [written_output(impl, done.report, done.wall_s) for done in map(parse_result, sorted(written))]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        plan, args = parse_args(argv)
        plan = plan.resolved()
        for impl in plan.impls:  # the settings as each run's ranks would check them, seconds later
            run_config(plan.runner_command(impl)[3:], plan.known_world_size())
        nsys = None if plan.profiler == "torch" else find_nsys() if not args.dry_run else _nsys_or_placeholder()
        if not args.dry_run:
            prepare_output_folder(plan.out_dir)  # before anything starts: a run took 12-27 s to fail on it
    except (ValueError, NsysError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if nsys is None:
        return _record_with_torch(plan, args)
    log(f"{', '.join(plan.impls)}: {plan.describe()}")
    if args.dry_run:  # what is really run, temporary names and renames included
        for impl in plan.impls:
            if plan.per_rank:
                print(shlex.join(plan.torchrun_command(impl)))
            else:
                print("\n".join(planned_commands(nsys, plan.nsys_options, plan.runner_command(impl), plan.stem(impl))))
        return 0
    code, outputs = _record_each(
        plan,
        lambda impl: record_impl(plan, nsys, impl),
        lambda o: (
            f"wrote {o.sqlite} ({o.sqlite_bytes / 1024:.0f} KB) and {o.report.name} "
            f"({o.report_bytes / 1024:.0f} KB) in {o.wall_s:.1f} s"
        ),
    )
    if code == 0:
        print_summary(outputs, args.format)
    return code


def _record_each(
    plan: ProfilePlan, record_one: Callable[[str], list], wrote: Callable[[Any], str], how: str = ""
) -> tuple[int, list]:
    """Record every implementation in turn into plan.out_dir (checked by main): (exit code, outputs).
    A one-line error names what failed: 1 when a recording failed or was interrupted (record_one
    leaves no partial outputs behind)."""
    exit_on_sigterm()
    outputs: list = []
    for impl in plan.impls:
        log(f"{impl}: profiling{how} ...")
        try:
            written = record_one(impl)
        except NsysError as err:
            print(f"error: {impl}: {err}", file=sys.stderr)
            return 1, outputs
        except KeyboardInterrupt:
            print(f"error: {impl}: interrupted; no partial outputs left behind", file=sys.stderr)
            return 1, outputs
        for o in written:
            log(f"{impl}: {wrote(o)}")
        outputs += written
    return 0, outputs


def _record_with_torch(plan: ProfilePlan, args: argparse.Namespace) -> int:
    """--profiler torch: the same runs, each rank writing its own torch.profiler trace."""
    from profiling import torch_record

    log(f"{', '.join(plan.impls)}: {plan.describe()}")
    if args.dry_run:
        for impl in plan.impls:
            print(shlex.join(torch_record.command(plan, impl)))
        return 0
    code, outputs = _record_each(
        plan,
        lambda impl: torch_record.record_torch(plan, impl),
        lambda o: f"wrote {o.trace} ({o.trace_bytes / 1024:.0f} KB)",
        " with torch.profiler",
    )
    if code == 0:
        torch_record.print_summary(outputs, args.format)
    return code


def _nsys_or_placeholder() -> Path:
    try:
        return find_nsys()
    except NsysError:
        return Path("nsys")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.SubprocessError as err:  # pragma: no cover - unexpected launch failures
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)

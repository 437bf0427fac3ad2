"""Does `analysis.advise` predict the step at other bucket sizes? Record one run, predict, measure each size.

Records one run at --record-mb (`run_nsys.sh IMPL --bucket-mb R`), predicts every --bucket-mb size from
it (`python -m analysis.advise --format json`), then measures each size with `python -m ddp.benchmark
--bucket-mb ...` (no profiler; --repeat passes pool each size's steps over the whole sweep) and prints
one row per size: predicted and measured ms/step and the error, then the targets (docs/advise.md): the
recorded size within 5 %, every other size within 15 %, the recommended size within 5 % of the best
measured one; each line says met or not, as measured. The last three columns compare each size with the
recorded one (predicted and measured step as ratios to the recorded size's, and their disagreement),
which takes out the machine's load drift between the recording and the measurements.

    python benchmarks/advise_validation.py                                  # overlap_bucket, tiny, 2 CPU ranks
    python benchmarks/advise_validation.py --model small --batch-size 4 --context-length 32 --steps 6
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import tempfile
from pathlib import Path

from validation_runs import run, shape  # benchmarks/: the script's own folder is on sys.path


def record(args: argparse.Namespace, out: Path) -> list[str]:
    cmd = ["bash", "run_nsys.sh", args.impl, "-o", str(out), "--bucket-mb", str(args.record_mb), *shape(args)]
    run([*cmd, "--profiler", args.profiler])
    files = sorted(glob.glob(str(out / f"{args.impl}.sqlite"))) or sorted(glob.glob(str(out / f"{args.impl}.rank*")))
    if not files:
        raise SystemExit(f"no trace of {args.impl} in {out}")
    return files


def predict(files: list[str], sizes: list[float]) -> dict:
    cmd = [sys.executable, "-m", "analysis.advise", *files, "--bucket-mb", *map(str, sizes), "--format", "json"]
    if len(files) > 1:
        cmd.append("--merge")
    (result,) = json.loads(run(cmd))["runs"]
    return result


def measure(args: argparse.Namespace, sizes: list[float]) -> dict[float, dict]:
    cmd = [sys.executable, "-m", "ddp.benchmark", "--impl", args.impl, *shape(args), "--format", "json"]
    cmd += ["--bucket-mb", *map(str, sizes), "--repeat", str(args.repeat)]
    return {float(row["bucket_mb"]): row for row in json.loads(run(cmd))}


def table(result: dict, measured: dict[float, dict], recorded: float) -> list[str]:
    lines = [
        f"recorded {result['implementation']} at {recorded:g} MiB: {result['measured_step_ms']:.1f} ms/step in the "
        f"trace; perfect overlap {result['ideal_step_ms']:.1f}, floor {result['floor_step_ms']:.1f}; compute "
        f"slowdown {result['compute_slowdown']:.3f}",
        f"{'bucket MiB':>10} {'buckets':>7} {'predicted ms':>12} {'± ms':>6} {'measured ms':>11} {'error %':>8} "
        f"{'pred. exposed ms':>16} {'meas. comm after bwd ms':>23} {'vs recorded: pred.':>18} {'meas.':>6} "
        f"{'error %':>7}",
    ]
    errors = {}
    own = next(c for c in result["candidates"] if float(c["bucket_mb"]) == recorded)
    for c in result["candidates"]:
        m = measured[float(c["bucket_mb"])]
        err = 100 * (c["predicted_step_ms"] - m["avg_step_time_ms"]) / m["avg_step_time_ms"]
        errors[float(c["bucket_mb"])] = err
        # the same as ratios to the recorded size: the machine's load drift between recording and
        # measuring cancels out, the model's view of what the bucket size changes remains
        pred_ratio = c["predicted_step_ms"] / own["predicted_step_ms"]
        meas_ratio = m["avg_step_time_ms"] / measured[recorded]["avg_step_time_ms"]
        mark = " (recorded)" if float(c["bucket_mb"]) == recorded else ""
        lines.append(
            f"{c['bucket_mb']:>10g} {c['buckets']:>7} {c['predicted_step_ms']:>12.1f} "
            f"{c.get('predicted_step_ms_err', 0.0):>6.1f} {m['avg_step_time_ms']:>11.1f} "
            f"{err:>+8.1f} {c['predicted_exposed_comm_ms']:>16.1f} {m['avg_comm_time_ms']:>23.1f} {pred_ratio:>18.3f} "
            f"{meas_ratio:>6.3f} {100 * (pred_ratio / meas_ratio - 1):>+7.1f}{mark}"
        )
    others = [abs(e) for mb, e in errors.items() if mb != recorded]
    best = min(measured.values(), key=lambda r: r["avg_step_time_ms"])
    chosen = measured[float(result["recommended_bucket_mb"])]
    gap = 100 * (chosen["avg_step_time_ms"] - best["avg_step_time_ms"]) / best["avg_step_time_ms"]
    met = lambda ok: "met" if ok else "NOT met"
    lines += [
        f"recorded size ({recorded:g} MiB) error {errors[recorded]:+.1f}% (target 5%): "
        f"{met(abs(errors[recorded]) <= 5)}",
        f"other sizes: largest error {max(others, default=0):.1f}% (target 15%): {met(max(others, default=0) <= 15)}",
        f"recommended {result['recommended_bucket_mb']:g} MiB measured {chosen['avg_step_time_ms']:.1f} ms, best "
        f"measured {best['bucket_mb']:g} MiB {best['avg_step_time_ms']:.1f} ms: {gap:.1f}% slower (target 5%): "
        f"{met(gap <= 5)}",
        f"(advise: {(result.get('recommended') or {}).get('reason', 'the fastest predicted')})",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="overlap_bucket", choices=["overlap_bucket", "torch"])
    p.add_argument("--model", default="tiny")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--record-mb", type=float, default=25.0, help="the recorded run's bucket size (default 25)")
    p.add_argument("--bucket-mb", type=float, nargs="+", default=[1.0, 2.0, 5.0, 25.0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--context-length", type=int, default=128)
    p.add_argument("--repeat", type=int, default=2, help="ddp.benchmark --repeat (default 2)")
    p.add_argument("--profiler", choices=["nsys", "torch"], default="nsys")
    p.add_argument("--out", type=Path, default=None, help="keep the recording here (default: a temporary folder)")
    args = p.parse_args(argv)
    sizes = sorted({*args.bucket_mb, args.record_mb})
    with tempfile.TemporaryDirectory(prefix="advise_validation_") as tmp:
        out = args.out or Path(tmp)
        files = record(args, out)
        result = predict(files, sizes)
        measured = measure(args, sizes)
    print("\n".join(table(result, measured, args.record_mb)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

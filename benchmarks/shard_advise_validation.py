"""Does `analysis.advise` predict a sharded run's step at other prefetch depths and with reduce-scatters
on their own process group? Record one run, predict, measure each setting.

Records one fsdp run (`run_nsys.sh fsdp --prefetch R [--separate-reduce-scatter]`), predicts every
setting from it (`python -m analysis.advise --format json`), then measures each setting with
`python -m ddp.benchmark --impl fsdp --prefetch N [--separate-reduce-scatter]` (no profiler; the sweep
of every setting is run --repeat times, the settings interleaved so that the machine's load drifts over
all of them alike, each run giving one ms/step figure) and prints
one row per setting: predicted and measured ms/step (the median of its runs, and their range), the
error, and the same as ratios to the mean over every setting (which takes out the load drift between the
recording and the measurements), then the targets (docs/advise.md): every setting within 10 % (as those
ratios), the recommended setting within 5 % of the best measured one; each line says met or not. The
load average before and after is printed: on a shared machine, say under what load the figures were taken.

    python benchmarks/shard_advise_validation.py                                  # tiny, 2 CPU ranks
    python benchmarks/shard_advise_validation.py --model small --batch-size 4 --context-length 32
    python benchmarks/shard_advise_validation.py --from results.json              # reprint a saved run
    python benchmarks/shard_advise_validation.py --from results.json --more --repeat 2   # add runs (same shape options)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from validation_runs import run, shape  # benchmarks/: the script's own folder is on sys.path


def knobs(prefetch: int, separate: bool) -> list[str]:
    return ["--prefetch", str(prefetch), *(["--separate-reduce-scatter"] if separate else [])]


def key(prefetch: int, separate: bool) -> str:
    return f"{prefetch}{'s' if separate else ''}"


def record(args: argparse.Namespace, out: Path) -> str:
    run(
        [
            "bash",
            "run_nsys.sh",
            "fsdp",
            "-o",
            str(out),
            *shape(args),
            *knobs(args.record_prefetch, args.record_separate),
        ]
    )
    return str(out / "fsdp.sqlite")


def measure(args: argparse.Namespace, settings: list[tuple[int, bool]]) -> dict[str, list[float]]:
    """ms/step of each setting, one figure per benchmark run, the settings interleaved over --repeat sweeps."""
    out: dict[str, list[float]] = {key(*s): [] for s in settings}
    for _ in range(args.repeat):  # interleaved: every setting once per sweep
        for s in settings:
            cmd = [
                sys.executable,
                "-m",
                "ddp.benchmark",
                "--impl",
                "fsdp",
                *shape(args),
                *knobs(*s),
                "--format",
                "json",
            ]
            (row,) = json.loads(run(cmd))
            out[key(*s)].append(float(row["avg_step_time_ms"]))
    return out


def _median(v: list[float]) -> float:
    v = sorted(v)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2


def table(saved: dict) -> list[str]:
    """The table: per setting the prediction, the runs' median (and range), and both as ratios to the
    mean over every setting (which takes out the load drift between the recording and the measurements,
    and does not rest on the recorded setting's runs alone); then the targets, met or not."""
    result, measured = saved["advice"], saved["measured"]
    rec = result["recorded_setting"]
    rows = [(c, measured.get(key(c["prefetch"], c["separate_reduce_scatter"]))) for c in result["candidates"]]
    rows = [(c, runs) for c, runs in rows if runs]
    pred_mean = sum(c["predicted_step_ms"] for c, _ in rows) / len(rows)
    meas_mean = sum(_median(r) for _, r in rows) / len(rows)
    lines = [
        f"recorded fsdp at prefetch {rec['prefetch']}, {'separate' if rec['separate_reduce_scatter'] else 'shared'}: "
        f"{result['measured_step_ms']:.1f} ms/step in the trace (replayed {result['replayed_step_ms']:.1f}); perfect "
        f"overlap {result['ideal_step_ms']:.1f}; compute slowdown {result['compute_slowdown']:.3f}",
        f"load average: {saved.get('load_before', '?')} before, {saved.get('load_after', '?')} after",
        f"{'prefetch':>8} {'RS':>8} {'predicted ms':>12} {'± ms':>6} {'measured ms':>11} {'runs (min-max)':>20} "
        f"{'error %':>8} {'vs mean of all: pred.':>21} {'meas.':>6} {'error %':>7}",
    ]
    errors = {}
    for c, runs in rows:
        m = _median(runs)
        err = 100 * (c["predicted_step_ms"] - m) / m
        pred_ratio, meas_ratio = c["predicted_step_ms"] / pred_mean, m / meas_mean
        k = key(c["prefetch"], c["separate_reduce_scatter"])
        errors[k] = 100 * (pred_ratio / meas_ratio - 1)
        spread = f"{len(runs)} ({min(runs):.0f}-{max(runs):.0f})"
        lines.append(
            f"{c['prefetch']:>8} {'separate' if c['separate_reduce_scatter'] else 'shared':>8} "
            f"{c['predicted_step_ms']:>12.1f} {c['predicted_step_ms_err']:>6.1f} {m:>11.1f} {spread:>20} {err:>+8.1f} "
            f"{pred_ratio:>21.3f} {meas_ratio:>6.3f} {errors[k]:>+7.1f}{' (recorded)' if c['recorded'] else ''}"
        )
    chosen = result["recommended"]["setting"]
    medians = {k: _median(v) for k, v in measured.items() if v}
    best = min(medians, key=medians.__getitem__)
    got = medians[key(chosen["prefetch"], chosen["separate_reduce_scatter"])]
    gap = 100 * (got - medians[best]) / medians[best]
    worst = max(abs(e) for e in errors.values())
    met = lambda ok: "met" if ok else "NOT met"
    lines += [
        f"every setting within 10% (as a ratio to the mean over all settings): largest error {worst:.1f}%: "
        f"{met(worst <= 10)}",
        f"recommended prefetch {chosen['prefetch']}, {'separate' if chosen['separate_reduce_scatter'] else 'shared'} "
        f"measured {got:.1f} ms, best measured {best} {medians[best]:.1f} ms: {gap:.1f}% slower (target 5%): "
        f"{met(gap <= 5)}",
        f"(advise: {result['recommended']['reason']}; measured: the median of each setting's runs, one "
        "figure per ddp.benchmark run)",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--record-prefetch", type=int, default=2)
    p.add_argument("--record-separate", action="store_true")
    p.add_argument("--prefetch", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--context-length", type=int, default=128)
    p.add_argument("--repeat", type=int, default=2, help="sweeps over every setting (default 2)")
    p.add_argument("--out", type=Path, default=None, help="keep the recording here (default: a temporary folder)")
    p.add_argument("--save", type=Path, default=None, help="write the advice and the measurements here (JSON)")
    p.add_argument("--from", dest="saved", type=Path, default=None, help="reprint the table of a --save file")
    p.add_argument(
        "--more", action="store_true", help="with --from: measure every setting again and add the runs to the file"
    )
    args = p.parse_args(argv)
    if args.saved and not args.more:
        print("\n".join(table(json.loads(args.saved.read_text()))))
        return 0
    if args.saved:  # --more: measure every setting again (--repeat sweeps) and add the runs to the file
        saved = json.loads(args.saved.read_text())
        settings = [(c["prefetch"], c["separate_reduce_scatter"]) for c in saved["advice"]["candidates"]]
        for k, runs in measure(args, settings).items():
            saved["measured"].setdefault(k, []).extend(runs)
        saved["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
        args.saved.write_text(json.dumps(saved, indent=1, default=str))
        print("\n".join(table(saved)))
        return 0
    settings = [(d, sep) for d in args.prefetch for sep in (False, True)]
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="shard_advise_validation_") as tmp:
        out = args.out or Path(tmp)
        trace = record(args, out)
        cmd = [sys.executable, "-m", "analysis.advise", trace, "--format", "json"]
        (advice,) = json.loads(run(cmd))["runs"]
        measured = measure(args, settings)
    load_after = " ".join(f"{x:.1f}" for x in os.getloadavg())
    options = {k: str(v) for k, v in vars(args).items() if k not in ("saved", "save")}
    saved = {
        "advice": advice,
        "measured": measured,
        "load_before": load_before,
        "load_after": load_after,
        "args": options,
    }
    if args.save:
        args.save.write_text(json.dumps(saved, indent=1, default=str))
    print("\n".join(table(saved)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

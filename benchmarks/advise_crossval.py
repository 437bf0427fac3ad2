"""Cross-validates `analysis.advise`: record at each setting in turn, predict the others' change, measure.

For every setting of one knob (the bucket size of `overlap_bucket` / `torch`, or fsdp's prefetch depth
with reduce-scatters shared or separate: `2` / `2s`) it records a run under nsys (`run_nsys.sh`), asks
`python -m analysis.advise --format json` for every other setting's predicted change from the recorded
one, measures every setting without a profiler (`python -m ddp.benchmark`, the settings interleaved over
--repeat sweeps, each sweep starting one setting later than the one before, so that no setting keeps one
place: with every other sweep reversed, the middle one of three was always timed second, and measured
4-16 % faster than a setting with the same bucket layout) and prints the error table: per recording and
setting, the predicted change (% of the step, ± its 95 % interval), the measured change, their difference
in percentage points and the verdict (within 10 points; both within the noise: a predicted change advise
cannot tell from none, its `change_beyond_noise` false, and a measured one within the noise below; or
missed), and the change between the two settings' own recordings (each under nsys: what a model that
reproduced every recording would predict, so that an error splits into the model's and the recordings'
own departure from unprofiled runs); then per recording the recommended setting against the best
measured one, both measured as the table's changes are, per sweep (target: within 5 %, or the recorded
setting kept with no difference beyond the noise on both sides: advise kept it because no gain could be
told from the noise, and the best measured setting's change from it is within its measured noise). The
gap between the settings' medians is printed beside it: timed in different sweeps, it carries their drift.

The measured change of a setting is the median over sweeps of its change from the recorded setting timed
in the same sweep, and the noise half the range of those per-sweep changes (listed after the verdict): on
a shared machine the load drifts over a sweep and between sweeps, which moves both settings of a sweep
alike. Figures given with --measured pair by position (the k-th of each setting); where the settings have
different counts, or one sweep only, the change is between the settings' medians and the noise the
larger half-range of their figures.

    python benchmarks/advise_crossval.py --impl overlap_bucket --settings 1 5 25
    python benchmarks/advise_crossval.py --impl fsdp --settings 1 2 2s 3

From recordings made elsewhere (a GPU machine), no recording or measuring here: --traces (one per
recorded setting; each says its setting in ddp.meta) and --measured, a `ddp.benchmark --csv` file whose
rows carry `bucket_mb` (bucket sizes), or SETTING=CSV pairs, one benchmark CSV per setting (fsdp: the
CSV has no prefetch column):

    python benchmarks/advise_crossval.py --impl torch --traces t1.sqlite t25.sqlite --measured sweep.csv
    python benchmarks/advise_crossval.py --impl fsdp --traces p1.sqlite p2.sqlite --measured 1=p1.csv 2=p2.csv

Saved with --save, the recordings and measurements are predicted again (after a change to the model) with
--rescore, recording and measuring nothing:

    python benchmarks/advise_crossval.py --impl fsdp --rescore cv/fsdp_tiny/save.json
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tempfile
from pathlib import Path

from validation_runs import run, say, shape  # benchmarks/: the script's own folder is on sys.path

BUCKETED = ("overlap_bucket", "torch")
SHARDED = ("fsdp", "torch_fsdp")
TARGET_PP = 10.0  # a predicted change within this many percentage points of the measured one
TARGET_BEST = 5.0  # the recommendation within this % of the best measured setting


def knobs(impl: str, key: str) -> list[str]:
    """The training options of one setting: '25' -> --bucket-mb 25; '2s' -> --prefetch 2 --separate-..."""
    if impl in BUCKETED:
        return ["--bucket-mb", key]
    return ["--prefetch", key.rstrip("s"), *(["--separate-reduce-scatter"] if key.endswith("s") else [])]


def bucket_key(mb: float) -> str:
    return f"{float(mb):g}"


def shard_key(setting: dict) -> str:
    return f"{setting['prefetch']}{'s' if setting['separate_reduce_scatter'] else ''}"


def record(args: argparse.Namespace, key: str, out: Path) -> str:
    folder = out / f"{args.impl}_{key}"
    run(["bash", "run_nsys.sh", args.impl, "-o", str(folder), *shape(args), *knobs(args.impl, key)])
    return str(folder / f"{args.impl}.sqlite")


def predict(impl: str, trace: str, keys: list[str]) -> dict:
    """advise's JSON for one trace, asked for every setting of `keys`."""
    if impl in BUCKETED:
        wanted = ["--bucket-mb", *keys]
    else:
        wanted = ["--prefetch", *sorted({k.rstrip("s") for k in keys}, key=int)]
    (result,) = json.loads(run([sys.executable, "-m", "analysis.advise", trace, *wanted, "--format", "json"]))["runs"]
    return result


def predictions(result: dict) -> tuple[str, dict[str, dict]]:
    """(recorded key, key -> candidate) of one advise result."""
    if "recorded_bucket_mb" in result:
        recorded = bucket_key(result["recorded_bucket_mb"])
        return recorded, {bucket_key(c["bucket_mb"]): c for c in result["candidates"]}
    return shard_key(result["recorded_setting"]), {shard_key(c["setting"]): c for c in result["candidates"]}


def measure(args: argparse.Namespace, keys: list[str]) -> dict[str, list[float]]:
    """ms/step of every setting, one figure per sweep, the settings interleaved over --repeat sweeps."""
    out: dict[str, list[float]] = {k: [] for k in keys}
    base = [sys.executable, "-m", "ddp.benchmark", "--impl", args.impl, *shape(args), "--format", "json"]
    for sweep in range(args.repeat):
        order = keys[sweep % len(keys) :] + keys[: sweep % len(keys)]  # each setting takes each place in turn
        if args.impl in BUCKETED:  # one benchmark run times every size
            for row in json.loads(run([*base, "--bucket-mb", *order])):
                out[bucket_key(row["bucket_mb"])].append(float(row["avg_step_time_ms"]))
            continue
        for k in order:
            (row,) = json.loads(run([*base, *knobs(args.impl, k)]))
            out[k].append(float(row["avg_step_time_ms"]))
    return out


def read_measured(impl: str, specs: list[str]) -> dict[str, list[float]]:
    """--measured: one `ddp.benchmark --csv` file with a bucket_mb column, or SETTING=CSV pairs."""
    out: dict[str, list[float]] = {}
    for spec in specs:
        key, _, path = spec.rpartition("=")
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("implementation", impl) == impl]
        if not rows:
            raise SystemExit(f"{path}: no rows of {impl}")
        for r in rows:
            k = key or (bucket_key(float(r["bucket_mb"])) if r.get("bucket_mb") else "")
            if not k:
                raise SystemExit(f"{spec}: give the setting as SETTING=CSV (the CSV has no bucket_mb)")
            out.setdefault(k, []).append(float(r["avg_step_time_ms"]))
    return out


def rescored(path: Path, impl: str) -> tuple[list[str], dict[str, list[float]]]:
    """(traces, measurements) of a --save file of `impl`'s recordings, to predict again."""
    try:
        saved = json.loads(path.read_text())
        traces, measured = [r["trace"] for r in saved["advice"]], {k: list(v) for k, v in saved["measured"].items()}
        recorded = {str(r["implementation"]) for r in saved["advice"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{path}: not a --save file of this script ({e})") from None
    if recorded != {impl}:
        raise SystemExit(f"{path}: recordings of {', '.join(sorted(recorded))}, not of --impl {impl}")
    return traces, measured


def spread_pct(values: list[float], base: float) -> float:
    """Half the range of a setting's sweeps, % of `base` (0 with one sweep)."""
    return 100.0 * (max(values) - min(values)) / 2 / base if len(values) > 1 else 0.0


def paired_pct(values: list[float], recorded: list[float]) -> list[float]:
    """Each sweep's change of a setting from the recorded one timed in the same sweep (% of the latter); empty
    when the two were not timed the same number of times (figures from elsewhere). Load that drifts over a
    sweep moves both alike, so the per-sweep changes spread less than the settings' own figures."""
    if len(values) != len(recorded) or len(values) < 2:
        return []
    return [100.0 * (v - r) / r for v, r in zip(values, recorded, strict=True)]


def error_rows(
    result: dict, measured: dict[str, list[float]], recorded_steps: dict[str, float] | None = None
) -> list[dict]:
    """One row per measured setting of one recording: predicted and measured change and their difference, and
    (where `recorded_steps` has the setting's own recording, under the profiler) the change between the two
    recordings' steps: what a model that reproduced every recording exactly would predict."""
    recorded, by = predictions(result)
    if recorded not in measured:
        raise SystemExit(f"{result['trace']}: its recorded setting {recorded} was not measured")
    base = statistics.median(measured[recorded])
    noise_pred = 100.0 * result.get("step_noise_ms", 0.0) / result["measured_step_ms"]
    rows = []
    for key, values in measured.items():
        c = by.get(key)
        if c is None:
            continue
        paired = paired_pct(values, measured[recorded])
        got = statistics.median(paired) if paired else 100.0 * (statistics.median(values) - base) / base
        pred = c["predicted_change_pct"]
        noise = max(spread_pct(values, base), spread_pct(measured[recorded], base))
        if paired and key != recorded:  # the spread of the per-sweep changes: drift common to a sweep cancels
            noise = (max(paired) - min(paired)) / 2
        # the prediction is within the noise where the advisor says so: a change it cannot tell from none
        told = c.get("change_beyond_noise", abs(pred) > noise_pred)
        quiet = not told and abs(got) <= noise
        verdict = "met" if abs(pred - got) <= TARGET_PP else ("both within the noise" if quiet else "MISSED")
        steps = recorded_steps or {}
        between = 100.0 * (steps[key] / steps[recorded] - 1) if key in steps and recorded in steps else None
        rows.append(
            {"recorded": recorded, "setting": key, "predicted_pct": pred,
             "predicted_err": c["predicted_change_pct_err"], "measured_pct": got, "error_pp": pred - got,
             "noise_pct": noise, "verdict": verdict, "per_sweep_pct": paired, "recordings_pct": between}
        )  # fmt: skip
    return rows


def measured_change(values: list[float], recorded: list[float]) -> tuple[float, float]:
    """(change %, noise %) of a setting from the recorded one, as the error table measures it: the median of
    the per-sweep changes and half their range, or (figures unpaired) the change between the medians and the
    larger half-range of the two settings' figures."""
    base = statistics.median(recorded)
    paired = paired_pct(values, recorded)
    if paired:
        return statistics.median(paired), (max(paired) - min(paired)) / 2
    got = 100.0 * (statistics.median(values) - base) / base
    return got, max(spread_pct(values, base), spread_pct(recorded, base))


def kept_within_noise(rec: dict, chosen: str, recorded: str, best_measured: tuple[float, float]) -> bool:
    """The recorded setting kept with no difference beyond the noise, on both sides (as a pair's "both
    within the noise"): advise kept it because no gain could be told from the noise (not because it was
    predicted fastest), and the best measured setting's change from it is within its measured noise."""
    if chosen != recorded or not rec.get("kept"):
        return False
    predicted_fastest = rec.get("beyond_noise", True) and not rec.get("gain_ms")
    change, noise = best_measured
    return not predicted_fastest and abs(change) <= noise


def behind_best(chosen: str, measured: dict[str, list[float]]) -> tuple[str, float]:
    """(best setting, % the chosen one is slower than it), each setting's gap measured as the table's changes
    are (measured_change: per sweep where the two were timed alike, else between their medians)."""
    behind = {k: measured_change(measured[chosen], v)[0] for k, v in measured.items()}
    best = max(behind, key=lambda k: behind[k])
    return best, behind[best]


def recommendation(result: dict, measured: dict[str, list[float]]) -> str:
    """The recommended setting against the best measured one, or the recorded one kept within the noise."""
    recorded, _ = predictions(result)
    rec = result["recommended"]
    chosen = bucket_key(rec["bucket_mb"]) if "bucket_mb" in rec else shard_key(rec["setting"])
    if chosen not in measured:
        return f"recorded {recorded}: recommends {chosen} ({rec['reason']}), not measured: add it to --settings"
    best, slower = behind_best(chosen, measured)
    medians = {k: statistics.median(v) for k, v in measured.items()}
    fastest = min(medians.values())
    by_medians = 100.0 * (medians[chosen] - fastest) / fastest
    change, noise = measured_change(measured[best], measured[recorded])
    quiet = kept_within_noise(rec, chosen, recorded, (change, noise))
    verdict = "met" if slower <= TARGET_BEST else ("kept: no difference beyond the noise" if quiet else "MISSED")
    return (
        f"recorded {recorded}: recommends {chosen} ({rec['reason']}); measured {medians[chosen]:.1f} ms/step, "
        f"best {best} {medians[best]:.1f}: {slower:+.1f} % per sweep, {by_medians:+.1f} % by the medians (target "
        f"{TARGET_BEST:g} %; {best} from {recorded} measured {change:+.1f} %, noise {noise:.1f} %): {verdict}"
    )


def table(results: list[dict], measured: dict[str, list[float]]) -> list[str]:
    recorded_steps = {predictions(r)[0]: float(r["measured_step_ms"]) for r in results}
    lines = [
        "measured (no profiler), median ms/step: "
        + ", ".join(f"{k} {statistics.median(v):.1f} ({len(v)} sweeps)" for k, v in measured.items()),
        f"{'recorded':>8} {'setting':>7} {'predicted %':>16} {'measured %':>10} {'error pp':>8} {'noise %':>7} "
        f"{'recordings %':>12}  verdict (per-sweep changes, each against the recorded setting timed in the same "
        "sweep)",
    ]
    for result in results:
        for r in error_rows(result, measured, recorded_steps):
            between = "" if r["recordings_pct"] is None else f"{r['recordings_pct']:+.1f}"
            lines.append(
                f"{r['recorded']:>8} {r['setting']:>7} {r['predicted_pct']:>+8.1f} ± {r['predicted_err']:<5.1f} "
                f"{r['measured_pct']:>+10.1f} {r['error_pp']:>+8.1f} {r['noise_pct']:>7.1f} {between:>12}  "
                f"{r['verdict']}"
                + (f" ({', '.join(f'{v:+.1f}' for v in r['per_sweep_pct'])})" if r["per_sweep_pct"] else "")
            )
    lines += [recommendation(result, measured) for result in results]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="overlap_bucket", choices=[*BUCKETED, *SHARDED])
    p.add_argument("--settings", nargs="+", default=None, help="bucket MiB (1 5 25) or prefetch[s] (1 2 2s)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=6, help="timed steps per run (default 6)")
    p.add_argument(
        "--warmup", type=int, default=3,
        help="untimed steps before them (default 3, as every run of the project; after 1, the small model's "
        "first timed step was longer than the others' mean in 9 of 13 recordings, by up to 34 %%)",
    )  # fmt: skip
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--context-length", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2, help="unprofiled sweeps over every setting (default 2)")
    p.add_argument("--out", type=Path, default=None, help="keep the recordings here (default: a temporary folder)")
    p.add_argument("--traces", nargs="+", default=None, help="recorded traces: predict from these, record none")
    p.add_argument("--measured", nargs="+", default=None, help="ddp.benchmark CSV, or SETTING=CSV pairs: measure none")
    p.add_argument("--save", type=Path, default=None, help="write the predictions and measurements here (JSON)")
    p.add_argument("--rescore", type=Path, default=None, help="a --save file: predict its recordings again")
    args = p.parse_args(argv)
    if args.rescore is not None and (args.traces is not None or args.measured is not None):
        p.error("--rescore takes its recordings and measurements from the saved file")
    if (args.traces is None) != (args.measured is None):
        p.error("--traces and --measured go together (recordings made elsewhere)")
    if args.traces is None and args.rescore is None and not args.settings:
        p.error("--settings: the settings to record at and measure")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        if args.rescore is not None:
            traces, measured = rescored(args.rescore, args.impl)
        elif args.traces is not None:
            measured = read_measured(args.impl, args.measured)
            traces = args.traces
        else:
            keys = [bucket_key(float(k)) if args.impl in BUCKETED else k for k in args.settings]
            traces = [record(args, k, out) for k in keys]
            measured = measure(args, keys)
        results = [predict(args.impl, t, list(measured)) for t in traces]
    if args.save:
        args.save.write_text(json.dumps({"advice": results, "measured": measured}, indent=1))
    say("done")
    print("\n".join(table(results, measured)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

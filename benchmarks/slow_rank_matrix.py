"""Is the slowed rank named, with the right cause? 4 and 8 CPU ranks (gloo, tiny model) x every place.

    python benchmarks/slow_rank_matrix.py [--traces DIR] [--ranks 4 8] [--ms 1000] [--steps 10]

Records (with run_nsys.sh, `flat`: it issues its all-reduce after backward, so every place holds the
others in the step it happens in) one run per world size and place with `--slow-rank R:PLACE:MS`
(R = world size - 3), and one without a slow rank; a run whose export is already in DIR is reused.
Then analyses each with analysis.collectives and prints, per run, the measured steps counted, in how
many the straggler was the slowed rank, in how many its cause was the place too, and which ranks the
summary calls recurrently late. Counted: every measured step, except the first for `optimizer` (the
optimizer of step k holds the others in step k+1; the first measured step follows a barrier). On a
shared 2-core machine the ranks' own timings jitter by hundreds of ms: MS must stand above that.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.api import analyze_collectives  # noqa: E402
from contract import OPTIMIZER, SLOW_PLACES  # noqa: E402


def record(out: Path, world: int, place: str | None, args: argparse.Namespace) -> Path:
    """The run's export in `out` (recorded unless it is there already)."""
    sqlite = out / "flat.sqlite"
    if sqlite.exists():
        return sqlite
    cmd = ["bash", "run_nsys.sh", "flat", "-n", str(world), "--model", "tiny", "--steps", str(args.steps)]
    cmd += ["--warmup", "1", "--batch-size", "8", "--context-length", "32", "-o", str(out)]
    if place is not None:
        cmd += ["--slow-rank", f"{world - 3}:{place}:{args.ms:g}"]
    print(" ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    return sqlite


def score(sqlite: Path, world: int, place: str | None) -> dict:
    """One run's counts: steps counted, named right, cause right; the ranks called recurrently late."""
    view = analyze_collectives([sqlite])
    strag = view.stragglers.sort_values("step")
    if place == OPTIMIZER:
        strag = strag.iloc[1:]
    slow = world - 3
    named = strag["straggler"] == slow
    right = named & (strag["cause"] == place)
    summary = view.straggler_summary
    late = [int(r) for r in summary.loc[summary["recurrently_late"].astype(bool), "rank"]]
    wrong = [f"{r.step}:{r.straggler}:{r.cause}" for r in strag[~right].itertuples()]
    return {"steps": len(strag), "named": int(named.sum()), "right": int(right.sum()), "late": late, "wrong": wrong}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", type=Path, default=Path("traces/slow_rank"), help="default: %(default)s")
    p.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    p.add_argument("--ms", type=float, default=1000.0, help="the stall (default: %(default)s)")
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    print(
        "ranks  place      slow rank  steps  named  cause right  right %  recurrently late  "
        "misses; for none every straggler (step:rank:cause)"
    )
    for world in args.ranks:
        for place in (None, *SLOW_PLACES):
            sqlite = record(args.traces / f"r{world}_{place or 'none'}", world, place, args)
            s = score(sqlite, world, place)
            pct = 100.0 * s["right"] / s["steps"] if place and s["steps"] else float("nan")
            slow, named, right = (str(world - 3), str(s["named"]), str(s["right"])) if place else ("-", "-", "-")
            late = ",".join(map(str, s["late"])) or "none"
            print(
                f"{world:>5}  {place or 'none':<9}  {slow:>9}  {s['steps']:>5}  {named:>5}  {right:>11}  "
                f"{pct:>7.1f}  {late:>16}  {' '.join(s['wrong']) or '-'}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

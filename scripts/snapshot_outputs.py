"""Snapshot every analysis CLI's output on the shared real traces and small synthetic ones, and compare two.

    python scripts/snapshot_outputs.py OUT [--quick] [--repo PATH] [--inputs DIR]
    python scripts/snapshot_outputs.py --compare OLD NEW     # prints the differing cases, exit 1 if any

Each case is one command (overlap, collectives incl. --units and --prefetch-chart, timeline, report incl.
--baseline, advise; every --format they offer; serial, --jobs 2 and --dask local on per-rank sets) run in a
fresh process from the inputs folder with relative paths, against the code of --repo (default: this
script's repository, put first on PYTHONPATH). It writes OUT/<case>.<ext> (stdout), OUT/<case>.stderr
(when not empty), OUT/<case>.<file> for each file the command wrote (timeline page, report folder) and
OUT/manifest.json (command, exit status and seconds of each case, sha256 of each input).

Normalised, because they differ run to run: the absolute paths of the inputs and of the scratch folder
(<INPUTS>, <OUT>), ISO timestamps (results.db's written-at column), seconds and rates in stderr's progress
lines; results.db is compared as its SQL dump; files over 1 MB (plotly.min.js) by sha256; the --dask
cases keep only `error:` lines of stderr (Dask logs addresses and ports).
Inputs (~/.cache/ddp-overlap/snapshot-inputs): ../shared/data's .xz decompressed, its two foreign traces
copied, the synthetic traces written once with fixed seeds (tests/support); all made read-only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
INPUTS = Path.home() / ".cache" / "ddp-overlap" / "snapshot-inputs"
BIG = 4 << 20  # plotly.min.js; the largest page here is ~1.5 MB
H100 = [f"h100/{n}.sqlite" for n in ("naive", "flat", "overlap", "overlap_bucket", "torch", "gloo_cuda_overlap")]
H100_SOME = [H100[0], H100[2], H100[4], H100[5]]  # naive, overlap, torch, gloo
H100_RANKS = ["h100/overlap.rank0.sqlite", "h100/overlap.rank1.sqlite"]
NAIVE_RANKS = ["h100/naive.rank0.sqlite", "h100/naive.rank1.sqlite"]
H200 = ["h200/fsdp_bf16.sqlite", "h200/torch.sqlite"]
REAL_FOREIGN = ["shared/nsys2026_2xH100_torchrun.sqlite", "shared/kineto_ddp_2rank_nccl.json.gz"]
SYN_RANKS = ["syn/naive.rank0.sqlite", "syn/naive.rank1.sqlite"]
KINETO = ["syn/k.rank0.json.gz", "syn/k.rank1.json.gz"]
SYN = ["syn/ddp.sqlite", *SYN_RANKS, *KINETO, "syn/ddp2022.sqlite", "syn/not_syncing.sqlite", "syn/host_copies.sqlite"]
FORMATS = ("table", "csv", "json")
EXT = {"table": "txt", "csv": "csv", "json": "json"}

# (case, command argv after `python -m analysis.`, in --quick?); "{out}" is the case's scratch folder.
# A case's name ends in the extension of its stdout: .txt (table), .csv or .json.
Case = tuple[str, list[str], bool]


def cases() -> list[Case]:
    """Every case, in run order."""
    c: list[Case] = []

    def add(name: str, argv: list[str], quick: bool = False) -> None:
        fmt = next((argv[i + 1] for i, a in enumerate(argv) if a == "--format"), "table")
        c.append((f"{name}.{EXT[fmt]}", argv, quick))

    def fmts(name: str, argv: list[str], quick: bool = False, formats: tuple[str, ...] = FORMATS) -> None:
        for f in formats:
            add(name, [*argv, "--format", f], quick and f == "table")

    per_rank = [*H100_RANKS, *NAIVE_RANKS]
    fmts("overlap.h100", ["overlap", *H100_SOME])
    add(
        "overlap.h100_per_step",
        ["overlap", "h100/overlap.sqlite", "--per-step", "--skip-steps", "1", "--format", "csv"],
    )
    for label, way in (
        ("", []),
        (".jobs2", ["--jobs", "2"]),
        (".dask", ["--dask", "local", "--jobs", "2"]),
    ):  # serial = --jobs 2 = Dask
        add(f"overlap.h100_ranks{label}", ["overlap", *per_rank, *way, "--format", "json"])
    add("overlap.h200", ["overlap", *H200, "--format", "json"])
    fmts("overlap.foreign", ["overlap", *REAL_FOREIGN], quick=True, formats=("table", "json"))
    fmts("overlap.syn", ["overlap", *SYN], quick=True)
    c[-1] = (c[-1][0], c[-1][1], True)  # and its json
    add("overlap.syn_ranks.serial", ["overlap", *SYN_RANKS, "--jobs", "1", "--format", "json"], True)
    add("overlap.syn_ranks.jobs2", ["overlap", *SYN_RANKS, "--jobs", "2", "--format", "json"], True)
    add("overlap.syn_merge_step", ["overlap", "--merge", *SYN_RANKS, "--step", "1", "--rank", "0"])
    add("overlap.err_missing", ["overlap", "syn/absent.sqlite"])
    add("overlap.err_step", ["overlap", "syn/ddp.sqlite", "--step", "99"], True)

    fmts("collectives.h100_overlap", ["collectives", "h100/overlap.sqlite", "--peak-busbw", "100"], quick=True)
    for label, way in (("", []), (".jobs2", ["--jobs", "2"]), (".dask", ["--dask", "local"])):
        add(
            f"collectives.h100_ranks{label}",
            ["collectives", *H100_RANKS, *way, "--format", "json"],
        )
    fsdp = ["collectives", "h200/fsdp_bf16.sqlite"]
    add("collectives.fsdp_units", [*fsdp, "--summary", "--units", "5", "--prefetch-chart", "{out}/prefetch.html"])
    add("collectives.fsdp", [*fsdp, "--format", "json"])
    add("collectives.h200_torch", ["collectives", "h200/torch.sqlite", "--summary"])
    add("collectives.foreign", ["collectives", *REAL_FOREIGN])
    fmts("collectives.syn", ["collectives", *SYN], quick=True, formats=("table", "json"))
    gathers = ["collectives", "syn/gathers.sqlite", "--units", "5", "--prefetch-chart", "{out}/prefetch.html"]
    add("collectives.syn_gathers", gathers, True)
    add("collectives.syn_ranks.serial", ["collectives", *SYN_RANKS, "--format", "json"])
    add("collectives.syn_ranks.jobs2", ["collectives", *SYN_RANKS, "--jobs", "2", "--format", "json"])

    page = ["-o", "{out}/t.html"]
    for f in ("table", "json"):
        add("timeline.h100_overlap", ["timeline", "h100/overlap.sqlite", *page, "--format", f])
    add("timeline.h100_ranks", ["timeline", *H100_RANKS, *page, "--step", "3"])
    add("timeline.h100_ranks.jobs2", ["timeline", *H100_RANKS, *page, "--step", "3", "--jobs", "2"])
    add("timeline.fsdp", ["timeline", "h200/fsdp_bf16.sqlite", *page, "--width", "800"])
    add("timeline.foreign", ["timeline", *REAL_FOREIGN, *page, "--format", "json"])
    add("timeline.syn", ["timeline", *SYN, *page], True)

    folder, quiet = ["-o", "{out}/r"], ["-o", "{out}/r", "--no-timelines"]
    add("report.h100", ["report", "h100/naive.sqlite", "h100/overlap.sqlite", "h100/torch.sqlite", *folder])
    add("report.h200_ranks", ["report", *H200, *H100_RANKS, *quiet])
    add("report.syn", ["report", "syn/ddp.sqlite", *SYN_RANKS, *KINETO, *folder, "--peak-busbw", "50"], True)
    syn_runs = ["report", "syn/ddp.sqlite", *SYN_RANKS, "syn/ddp2022.sqlite", *quiet]
    add("report.syn_runs", [*syn_runs, "--format", "json"])
    add("report.syn_runs.jobs2", [*syn_runs, "--jobs", "2", "--format", "json"])
    add("report.syn_runs", [*syn_runs, "--format", "csv"])
    add("report.foreign", ["report", *REAL_FOREIGN, *folder, "--format", "json"])
    gate = ["report", "h100/overlap.sqlite", "--baseline", "h100/naive.sqlite", "--fail-if", "exposed_comm_ms:+10%"]
    fmts("report.baseline", gate, quick=True, formats=("table", "json"))
    add("report.baseline_ranks", ["report", *H100_RANKS, "--baseline", *NAIVE_RANKS])

    fmts("advise.h200_torch", ["advise", "h200/torch.sqlite"], formats=("table", "json"))
    add("advise.fsdp", ["advise", "h200/fsdp_bf16.sqlite", "--format", "json"])
    fmts("advise.syn_overlap", ["advise", "syn/advise_overlap.sqlite", "--bucket-mb", "1", "5"], quick=True)
    add("advise.syn_torch", ["advise", "syn/advise_torch.sqlite"])
    add("advise.syn_ddp", ["advise", "syn/ddp.sqlite"])
    add("advise.err_no_bytes", ["advise", "h100/overlap.sqlite"], True)
    names = [n for n, _, _ in c]
    assert len(names) == len(set(names)), "case names must be unique"
    return c


def _readonly_copy(write: Callable[[Path], object], target: Path) -> None:
    """Make target via write(partial_path), read-only, whole or not at all (two snapshots may race)."""
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    write(partial)
    partial.chmod(0o444)
    partial.replace(target)


def prepare_inputs(inputs: Path) -> None:
    """The real traces decompressed and copied, the synthetic ones written, into `inputs` (once)."""
    for sub, names in (("h100", H100 + H100_RANKS + NAIVE_RANKS), ("h200", H200)):
        for rel in names:
            source = SHARED / f"gpu_{sub}" / f"{Path(rel).name}.xz"

            def unxz(p: Path, source: Path = source) -> None:
                with lzma.open(source) as src, open(p, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)

            _readonly_copy(unxz, inputs / rel)
    for rel in REAL_FOREIGN:
        _readonly_copy(lambda p, rel=rel: shutil.copyfile(SHARED / Path(rel).name, p), inputs / rel)
    sys.path.insert(0, str(REPO))
    from tests.analysis.advise import (  # advise's worked runs live in its tests
        test_advice as advice_runs,
        test_advice_gpu_synthetic as advice_gpu_runs,
    )
    from tests.support import synthetic_ddp, synthetic_gather, synthetic_gpu, synthetic_kineto

    syn = inputs / "syn"

    writers: dict[str, Callable[[Path], object]] = {
        "ddp.sqlite": lambda p: synthetic_ddp.write_ddp_trace(p, 8000, 2, 4, implementation="overlap_bucket"),
        "ddp2022.sqlite": lambda p: synthetic_ddp.write_ddp_trace(p, 3000, 2, 3, flavour="2022", shuffle=True, seed=3),
        "advise_overlap.sqlite": advice_runs.write_overlap_run,
        "advise_torch.sqlite": lambda p: advice_gpu_runs.write_run(p, stalled=False),
        "not_syncing.sqlite": synthetic_gpu.write_host_not_syncing,
        "host_copies.sqlite": synthetic_gpu.write_host_side_and_copies,
        "gathers.sqlite": lambda p: synthetic_gather.write_gathers(
            p, ([synthetic_gather.Gather("u", 100, 300, 320, 150, 160, 50, 100)],) * 2, queue=(100, 300)
        ),
    }
    for r in (0, 1):
        start = 1_700_000_000_000_000_000 + r * 10**6  # the per-rank captures began 1 ms apart
        writers[f"naive.rank{r}.sqlite"] = lambda p, r=r, start=start: synthetic_ddp.write_ddp_trace(
            p, 4000, 1, 3, first_rank=r, world_size=2, seed=r, session_start_utc_ns=start, implementation="naive"
        )
    syn.mkdir(parents=True, exist_ok=True)
    for name, write in writers.items():
        _readonly_copy(write, syn / name)
    if not all((inputs / k).exists() for k in KINETO):
        with tempfile.TemporaryDirectory(dir=syn) as d:
            for made in synthetic_kineto.write_kineto_ddp_trace(Path(d) / "k", 4000, 2, 3, 2, gz=True):
                _readonly_copy(lambda p, made=made: shutil.copyfile(made, p), syn / made.name)


def sha256(path: Path) -> str:
    """The file's sha256, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


ISO = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?")
PROGRESS = re.compile(rb"\[\w+\] \d+/\d+ files done")  # printed every few seconds
SECONDS = re.compile(rb"\d+(\.\d+)? ?(s|files/s)\b")


def normalise(data: bytes, inputs: Path, scratch: Path) -> bytes:
    """Absolute paths of the inputs and scratch folders, and ISO timestamps, replaced by placeholders."""
    for folder, name in ((scratch, b"<OUT>"), (inputs, b"<INPUTS>")):
        data = data.replace(str(folder.resolve()).encode(), name).replace(str(folder).encode(), name)
    return ISO.sub(b"<TIME>", data)


def keep_file(src: Path, dst: Path, inputs: Path, scratch: Path) -> None:
    """One file a command wrote, normalised: as text, as its SQL dump (.db), or its sha256 (over 4 MB)."""
    if src.suffix == ".db":
        con = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
        raw = "\n".join(con.iterdump()).encode() + b"\n"
        con.close()
        dst = dst.with_name(dst.name + ".sql")
    else:
        raw = src.read_bytes()
    data = normalise(raw, inputs, scratch)
    if len(data) > BIG:
        data, dst = f"{hashlib.sha256(data).hexdigest()}  {src.name}\n".encode(), dst.with_name(dst.name + ".sha256")
    dst.write_bytes(data)


def run_case(case: Case, inputs: Path, out: Path, repo: Path, extra_env: dict[str, str]) -> dict:
    """Run one case in a fresh process; write its outputs into `out`; return its manifest entry."""
    name, argv, _ = case
    scratch = Path(tempfile.mkdtemp(prefix="snap-"))
    try:
        args = [a.replace("{out}", str(scratch)) for a in argv]
        env = {**os.environ, **extra_env, "PYTHONPATH": str(repo), "COLUMNS": "200"}
        started = time.perf_counter()
        command = [sys.executable, "-m", f"analysis.{args[0]}", *args[1:]]
        with open(scratch / ".stdout", "w+b") as so, open(scratch / ".stderr", "w+b") as se:
            p = subprocess.Popen(command, cwd=inputs, env=env, stdout=so, stderr=se)
            _, status, usage = os.wait4(p.pid, 0)  # its CPU time: the machine is shared, wall time is noise
            p.returncode = os.waitstatus_to_exitcode(status)
            seconds = time.perf_counter() - started
            so.seek(0), se.seek(0)
            stdout, stderr = so.read(), se.read()
        (scratch / ".stdout").unlink(), (scratch / ".stderr").unlink()
        (out / name).write_bytes(normalise(stdout, inputs, scratch))
        lines = stderr.splitlines(keepends=True)
        if ".dask." in name:
            lines = [line for line in lines if line.startswith(b"error:")]
        err = b"".join(line for line in lines if not PROGRESS.match(line))
        err = SECONDS.sub(b"<t>", normalise(err, inputs, scratch))
        if err:
            (out / f"{name}.stderr").write_bytes(err)
        for f in sorted(q for q in scratch.rglob("*") if q.is_file()):
            keep_file(f, out / f"{name}.{'.'.join(f.relative_to(scratch).parts)}", inputs, scratch)
        cpu = usage.ru_utime + usage.ru_stime
        return {"argv": argv, "rc": p.returncode, "seconds": round(seconds, 2), "cpu_s": round(cpu, 2)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def snapshot(
    out: Path, inputs: Path, repo: Path, quick: bool, workers: int, only: str | None, extra_env: dict[str, str]
) -> int:
    """Run the cases into `out`; print one line per case; 0 ok, 2 when `out` is not empty."""
    if out.exists() and any(out.iterdir()):
        print(f"error: {out} is not empty", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    prepare_inputs(inputs)
    probe = [sys.executable, "-c", "import analysis; print(analysis.__file__)"]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    where = subprocess.run(probe, cwd=inputs, env=env, capture_output=True, text=True).stdout.strip()
    if not where.startswith(str(repo.resolve())):
        print(f"error: analysis imports from {where}, not from {repo}", file=sys.stderr)
        return 2
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    manifest: dict = {"repo": str(repo), "head": head.stdout.strip(), "quick": quick, "env": extra_env}
    manifest |= {"cases": {}, "inputs": {}}
    started = time.perf_counter()
    todo = [c for c in cases() if (c[2] or not quick) and (only is None or re.search(only, c[0]))]
    with ThreadPoolExecutor(workers) as pool:  # each case is its own process: threads only wait
        running = {pool.submit(run_case, case, inputs, out, repo, extra_env): case[0] for case in todo}
        for i, done in enumerate(as_completed(running), 1):
            entry = done.result()
            say = f"exit {entry['rc']}, {entry['seconds']} s wall, {entry['cpu_s']} s cpu"
            print(f"[{i}/{len(todo)}] {running[done]}: {say}", file=sys.stderr, flush=True)
            manifest["cases"][running[done]] = entry
    manifest["cases"] = {c[0]: manifest["cases"][c[0]] for c in todo}
    manifest["seconds"] = round(time.perf_counter() - started, 1)
    manifest["cpu_s"] = round(sum(e["cpu_s"] for e in manifest["cases"].values()), 1)
    manifest["load_average"] = os.getloadavg()
    hidden = lambda q: any(part.startswith(".") for part in q.relative_to(inputs).parts)  # caches, partials
    for f in sorted(q for q in inputs.rglob("*") if q.is_file() and not hidden(q)):
        manifest["inputs"][str(f.relative_to(inputs))] = sha256(f)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    _same_as_serial(out, [c[0] for c in todo])
    print(f"{len(todo)} cases in {manifest['seconds']} s wall, {manifest['cpu_s']} s cpu, into {out}")
    return 0


def _same_as_serial(out: Path, names: list[str]) -> None:
    """Warn when a --jobs 2 or --dask case's stdout differs from its serial twin's in the same snapshot."""
    for name in names:
        for way in (".jobs2.", ".dask."):
            if way not in name:
                continue
            twin = next((t for t in (name.replace(way, ".serial."), name.replace(way, ".")) if t in names), None)
            if twin and (out / twin).read_bytes() != (out / name).read_bytes():
                print(f"warning: {name} differs from its serial twin {twin}", file=sys.stderr)


def compare(old: Path, new: Path) -> int:
    """Print the cases whose outputs or exit status differ between two snapshots; 1 if any, else 0."""
    mo, mn = (json.loads((d / "manifest.json").read_text()) for d in (old, new))
    if mo["inputs"] != mn["inputs"]:
        bad = sorted(k for k in mo["inputs"].keys() | mn["inputs"].keys() if mo["inputs"].get(k) != mn["inputs"].get(k))
        print(f"warning: the inputs differ: {', '.join(bad)}")
    both = mo["cases"].keys() & mn["cases"].keys()
    differ = {n for n in both if mo["cases"][n]["rc"] != mn["cases"][n]["rc"]}
    files = {f.name for d in (old, new) for f in d.iterdir() if f.name != "manifest.json"}
    for name in sorted(files):
        case = next((n for n in both if name == n or name.startswith(n + ".")), None)
        if case is None:
            continue  # a case only one snapshot ran (--quick)
        a, b = old / name, new / name
        if not (a.exists() and b.exists() and a.read_bytes() == b.read_bytes()):
            differ.add(case)
            print(
                f"{case}: {name} {'differs' if a.exists() and b.exists() else 'only in ' + str(a if a.exists() else b)}"
            )
    for n in sorted(both):
        if mo["cases"][n]["rc"] != mn["cases"][n]["rc"]:
            print(f"{n}: exit {mo['cases'][n]['rc']} -> {mn['cases'][n]['rc']}")
    print(f"{len(differ)} of {len(both)} cases differ ({old} vs {new})")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, help="folder to write the snapshot into (must be empty)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("OLD", "NEW"), help="compare two snapshots")
    parser.add_argument("--quick", action="store_true", help="a ~1-minute subset of the cases")
    parser.add_argument("--only", metavar="RE", help="only the cases whose name matches RE (re.search)")
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="set for every command (repeatable)"
    )
    parser.add_argument("--workers", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose code runs (default: this one)")
    parser.add_argument("--inputs", type=Path, default=INPUTS, help=f"input cache folder (default {INPUTS})")
    args = parser.parse_args(argv)
    if args.compare:
        missing = [str(d) for d in args.compare if not (d / "manifest.json").is_file()]
        if missing:
            print(f"error: not a snapshot (no manifest.json): {', '.join(missing)}", file=sys.stderr)
            return 2
        return compare(*args.compare)
    if args.out is None:
        parser.error("give OUT or --compare OLD NEW")
    if any("=" not in e for e in args.env):
        parser.error(f"--env {' '.join(args.env)}: expected KEY=VALUE")
    extra_env = dict(e.split("=", 1) for e in args.env)
    return snapshot(
        args.out, args.inputs.resolve(), args.repo.resolve(), args.quick, args.workers, args.only, extra_env
    )


if __name__ == "__main__":
    sys.exit(main())

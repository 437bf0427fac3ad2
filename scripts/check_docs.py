"""Run the commands README.md and docs/*.md show with quoted output, and compare the figures they quote.

    python scripts/check_docs.py                 # every page; one line per quoted output: OK, DIFF or SKIP
    python scripts/check_docs.py docs/gpu.md     # some pages only
    python scripts/check_docs.py --list          # what would run, without running it

Run it before submitting a change that touches an output or a page (CI runs it where the data is).
Exit status 1 when a quoted figure differs from what the command prints now, else 0.

Which command an output block quotes (a fence with no language, or `text`/`console`):
  - `$ CMD` lines inside the block: each command's output is the lines up to the next `$ ` line;
  - else the one command of the ```bash block just before it (at most MAX_GAP lines of prose between;
    a block of several commands does not say which one printed it);
  - or a marker, an HTML comment (invisible on the rendered page) in the lines just before the block:
      <!-- check: CMD -->             the block is CMD's output
      <!-- check tol=5%: CMD -->      the same, figures within 5% (default: DEFAULT_TOL)
      <!-- check: skip REASON -->     not checked here (a GPU, a long recording, a machine-dependent time)
Runs only `python -m analysis.*` commands (they read files and are deterministic); any other command
(recordings, benchmarks, training) is skipped unless a marker names it. A command whose input files
are not here is skipped, naming the first missing one; the H100/H200 fixtures of ../shared/data are
decompressed into /tmp/gpu_h100 and /tmp/gpu_h200 when a command reads them there (as docs/gpu.md does).

Comparison: each quoted line must appear in the command's output (stdout and stderr), in order, with the
same text once figures are masked and spacing is collapsed (so an excerpt, `...` lines, a table
whose columns moved, or one quoted without its last columns still match) and each figure within the
tolerance (default: as printed). DIFF names the first line that does not, and its first figure that moved.
"""

from __future__ import annotations

import argparse
import lzma
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
MAX_GAP = 12  # lines of prose between a command block and the output block it printed
DEFAULT_TOL = 0.0  # relative: the analysis of a given file is deterministic, so its printed figures must not move
TIMEOUT_S = 600
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
MARKER = re.compile(r"<!--\s*check(?:\s+tol=(?P<tol>[\d.]+)(?P<pct>%?))?:\s*(?P<what>.*?)\s*-->")
INPUT = re.compile(r"\.(sqlite|json|json\.gz|nsys-rep|csv|xz)$")
FIXTURES = {"/tmp/gpu_h100": SHARED / "gpu_h100", "/tmp/gpu_h200": SHARED / "gpu_h200"}


@dataclass(frozen=True)
class Check:
    """One quoted output: where, the command that prints it (None: skipped, `why`), its lines, tolerance."""

    page: str
    line: int
    command: str | None
    quoted: list[str]
    tol: float = DEFAULT_TOL
    why: str = ""


def fences(lines: list[str]) -> list[tuple[int, int, str]]:
    """(first content line, end fence line, language) of every fenced block."""
    out, open_at, lang = [], None, ""
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            if open_at is None:
                open_at, lang = i, line.strip()[3:].strip()
            else:
                out.append((open_at + 1, i, lang))
                open_at = None
    return out


def _commands(block: list[str]) -> list[str]:
    """The command lines of a shell block (comments, blank lines and continuations joined)."""
    text = "\n".join(block).replace("\\\n", " ")
    return [re.sub(r"\s+#.*$", "", c).strip() for c in text.splitlines() if c.strip() and not c.strip().startswith("#")]


def page_checks(page: str) -> list[Check]:
    """Every quoted output of one page with the command that prints it."""
    lines = (ROOT / page).read_text().splitlines()
    blocks = fences(lines)
    checks = []
    for n, (start, end, lang) in enumerate(blocks):
        if lang not in ("", "text", "console"):
            continue
        body = lines[start:end]
        before = blocks[n - 1] if n else None
        prose = lines[(before[1] + 1 if before else 0) : start - 1]
        marker = next((m for m in map(MARKER.search, reversed(prose[-3:])) if m), None)
        if marker is not None:
            tol = float(marker["tol"]) / (100 if marker["pct"] else 1) if marker["tol"] else DEFAULT_TOL
            what = marker["what"]
            if what.startswith("skip"):
                checks.append(Check(page, start, None, body, why=what[4:].strip() or "marked skip"))
            else:
                checks.append(Check(page, start, what, body, tol))
            continue
        if any(line.startswith("$ ") for line in body):
            cmd, quoted, at = None, [], start
            for i, line in enumerate([*body, "$ "]):
                if line.startswith("$ "):
                    if cmd is not None:
                        checks.append(Check(page, at, cmd, quoted))
                    cmd, quoted, at = line[2:].strip(), [], start + i
                else:
                    quoted.append(line)
            continue
        shell = before if before and before[2] in ("bash", "sh", "shell") and len(prose) <= MAX_GAP else None
        commands = _commands(lines[shell[0] : shell[1]]) if shell else []
        if len(commands) == 1:
            checks.append(Check(page, start, commands[0], body))
        else:
            why = "several commands before it" if commands else "no command before it"
            checks.append(Check(page, start, None, body, why=f"{why}: mark it <!-- check: CMD -->"))
    return checks


def _prepare(command: str) -> None:
    """Decompress the real fixtures where a command reads them (docs/gpu.md's recipe, with lzma)."""
    for folder, source in FIXTURES.items():
        if folder in command and source.is_dir():
            Path(folder).mkdir(exist_ok=True)
            for xz in source.glob("*.xz"):
                target = Path(folder) / xz.stem
                if not target.exists():
                    target.write_bytes(lzma.decompress(xz.read_bytes()))


def _missing(command: str) -> str | None:
    """The first input file of the command that is not here (after the shell's expansion), or None."""
    words = [w for w in shlex.split(command) if INPUT.search(w) or "*" in w or "{" in w]
    words = [w for w in words if not w.startswith("-")]
    if not words:
        return None
    script = "shopt -s nullglob; for w in " + " ".join(words) + '; do [ -e "$w" ] || { echo "$w"; exit 3; }; done'
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True)
    if done.returncode == 3:
        return done.stdout.strip() or words[0]
    expanded = subprocess.run(
        ["bash", "-c", "shopt -s nullglob; echo " + " ".join(words)], cwd=ROOT, capture_output=True, text=True
    )
    return None if expanded.stdout.strip() else words[0]


def runnable(check: Check, marked: bool) -> str:
    """Why a check's command is not run here ('' when it is)."""
    if check.command is None:
        return check.why
    if not marked and not re.match(r"python -m analysis\.", check.command):
        return "not an analysis command (a recording, a benchmark, training: mark it to run it)"
    if "nvidia-smi" in check.command or "--gpus" in check.command:
        return "needs a GPU"
    _prepare(check.command)
    missing = _missing(check.command)
    return f"input not here: {missing}" if missing else ""


def _skeleton(line: str) -> str:
    return " ".join(NUMBER.sub("#", line).split())


def _starts(line: str, quoted: str) -> bool:
    """Whether a printed line is the quoted one, or the quoted one with columns left off at its end."""
    return line == quoted or (bool(quoted) and line.startswith(quoted + " "))


def _close(a: list[str], b: list[str], tol: float) -> bool:
    return len(a) == len(b) and all(
        x == y or abs(float(x) - float(y)) <= tol * max(abs(float(x)), abs(float(y))) for x, y in zip(a, b, strict=True)
    )


def compare(quoted: list[str], printed: list[str], tol: float) -> str:
    """'' when every quoted line is printed, in order, its figures within tol; else what differs."""
    at = 0
    for want in quoted:
        if not want.strip() or want.strip() in ("...", "…"):
            continue
        shape, figures = _skeleton(want), NUMBER.findall(want)
        same_shape = [i for i in range(at, len(printed)) if _starts(_skeleton(printed[i]), shape)]
        hit = next((i for i in same_shape if _close(figures, NUMBER.findall(printed[i])[: len(figures)], tol)), None)
        if hit is None:
            if not same_shape:
                return f"quoted `{want.strip()[:100]}`, printed no line of that shape (its words or columns changed)"
            got = NUMBER.findall(printed[same_shape[0]])
            first = next(i for i, (x, y) in enumerate(zip(figures, got, strict=True)) if not _close([x], [y], tol))
            return (
                f"quoted `{want.strip()[:60]}...`: figure {first + 1} is {figures[first]}, printed {got[first]}"
                if len(want.strip()) > 60
                else f"quoted `{want.strip()}`, printed `{printed[same_shape[0]].strip()}`"
            )
        at = hit + 1
    return ""


@cache  # several pages quote the same command: it runs once (its output does not change in between)
def printed_by(command: str) -> list[str] | None:
    """The lines `command` prints (stdout, then stderr), run from ROOT; None when it ran past TIMEOUT_S."""
    command = re.sub(r"^python ", f"{shlex.quote(sys.executable)} ", command)
    try:
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None
    return (done.stdout + "\n" + done.stderr).splitlines()


def run(check: Check) -> tuple[str, str]:
    """(OK|DIFF|SKIP, detail) of one check."""
    printed = printed_by(check.command or "")
    if printed is None:
        return "SKIP", f"ran past {TIMEOUT_S} s"
    differs = compare(check.quoted, printed, check.tol)
    return ("DIFF", differs) if differs else ("OK", "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pages", nargs="*", help="pages to check (default: README.md and docs/*.md)")
    ap.add_argument("--list", action="store_true", help="say what would run, run nothing")
    args = ap.parse_args(argv)
    diffs = 0
    for page in args.pages or PAGES:
        page = str(Path(page).resolve().relative_to(ROOT)) if Path(page).exists() else page
        for check in page_checks(page):
            marked = bool(
                MARKER.search("\n".join((ROOT / page).read_text().splitlines()[max(0, check.line - 4) : check.line]))
            )
            where = f"{page}:{check.line}"
            why = runnable(check, marked)
            if why:
                print(f"SKIP {where} ({why})", flush=True)
                continue
            if args.list:
                print(f"RUN  {where} {check.command}", flush=True)
                continue
            verdict, detail = run(check)
            diffs += verdict == "DIFF"
            print(f"{verdict:4} {where} {check.command}" + (f": {detail}" if detail else ""), flush=True)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())

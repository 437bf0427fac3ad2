"""Make an nsys CLI work wherever it is installed: find its importer, and give it one where it looks.

`nsys profile` writes a raw capture (`.qdstrm`) and turns it into the `.nsys-rep` with QdstrmImporter,
which it looks for in `host-linux-x64/` beside the folder it really lives in (`../host-linux-x64`,
symlinks resolved). Two installs put the importer elsewhere, and nsys then writes only a `.qdstrm`:
- Debian's packages: CLI in /usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64, importer in
  /usr/lib/nsight-systems/host-linux-x64;
- the nsys inside Nsight Compute: CLI in /opt/nvidia/nsight-compute/<ver>/host/target-linux-x64,
  importer in host/linux-desktop-glibc_*-x64.
`runnable_nsys` gives such a CLI a private folder under the temp dir: copies (or hard links) of its
executables, symlinks to everything else, and a `host-linux-x64` symlink to the importer's folder.
Copies, because nsys finds `..` from its real path; built once per install and reused.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

IMPORTER = "QdstrmImporter"
DEBIAN_CLI_DIR = Path("/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64")
DEBIAN_IMPORTER_DIR = Path("/usr/lib/nsight-systems/host-linux-x64")
# What nsys prints when its import step fails (2022.4: "Importer error status: The importer binary and
# its dependencies were not found."; 2025.3: "Importer error status: An unknown error occurred.").
IMPORTER_FAILED = re.compile(r"importer|qdstrm", re.IGNORECASE)


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _version_key(path: Path) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", str(path)))


def importer_dirs(
    nsys: Path, debian_cli_dir: Path = DEBIAN_CLI_DIR, debian_importer_dir: Path = DEBIAN_IMPORTER_DIR
) -> list[Path]:
    """Folders that may hold this nsys's importer, the one nsys itself uses (../host-linux-x64) first."""
    cli_dir = Path(nsys).resolve().parent
    dirs = [cli_dir.parent / "host-linux-x64"]
    dirs += sorted(cli_dir.parent.glob("linux-desktop-glibc_*-x64"), key=_version_key, reverse=True)
    if cli_dir == debian_cli_dir.resolve():
        dirs.append(debian_importer_dir)
    return dirs


def find_importer(nsys: Path, **dirs: Path) -> Path | None:
    """The QdstrmImporter that belongs to `nsys` (same install), else one on PATH; None if neither."""
    for folder in importer_dirs(nsys, **dirs):
        if _is_executable(folder / IMPORTER):
            return folder / IMPORTER
    on_path = shutil.which(IMPORTER)
    return Path(on_path) if on_path else None


def importer_beside(nsys: Path) -> bool:
    """True when nsys will find its importer by itself (at ../host-linux-x64 of its real folder)."""
    return _is_executable(Path(nsys).resolve().parent.parent / "host-linux-x64" / IMPORTER)


def farm_root() -> Path:
    """Where private nsys folders are built: one per user under the temp dir."""
    return Path(tempfile.gettempdir()) / f"ddp-overlap-nsys-{os.getuid()}"


def runnable_nsys(nsys: Path, root: Path | None = None, **dirs: Path) -> Path:
    """`nsys` itself when it finds its importer; else the same CLI in a private folder that has it.

    With no importer anywhere, `nsys` is returned unchanged (it will write a .qdstrm only, which the
    session reports with the import command).
    """
    nsys = Path(nsys)
    if importer_beside(nsys):
        return nsys
    importer = next((d for d in importer_dirs(nsys, **dirs)[1:] if _is_executable(d / IMPORTER)), None)
    if importer is None:
        return nsys
    real = nsys.resolve()
    root = farm_root() if root is None else Path(root)
    key = hashlib.sha1(f"{real}|{importer}|{real.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    farm = root / key
    cli = farm / real.parent.name / real.name
    if _is_executable(cli) and (farm / "host-linux-x64").exists():
        return cli
    print(
        f"[profiling] {nsys} looks for its importer in ../host-linux-x64, which is missing: "
        f"running a private copy in {farm} with host-linux-x64 -> {importer}",
        file=sys.stderr,
        flush=True,
    )
    root.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        _link_farm(real.parent, building / real.parent.name)
        (building / "host-linux-x64").symlink_to(importer, target_is_directory=True)
        try:
            building.rename(farm)
        except OSError:  # another rank built it first: use theirs
            if not _is_executable(cli):
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return cli


def _link_farm(source: Path, target: Path) -> None:
    """`target` mirrors `source`: executables hard-linked or copied (they resolve `..` from their own
    real path), every other entry a symlink."""
    target.mkdir()
    for entry in source.iterdir():
        dest = target / entry.name
        if entry.is_file() and not entry.is_symlink() and os.access(entry, os.X_OK) and ".so" not in entry.name:
            try:
                os.link(entry, dest)
            except OSError:  # another filesystem, or not allowed
                shutil.copy2(entry, dest)
        else:
            dest.symlink_to(entry)


@dataclass
class ImportResult:
    """What running the importer on a capture gave: the report, or why not."""

    report: Path | None
    message: str


def import_capture(importer: Path, qdstrm: Path, timeout_s: float = 3600) -> ImportResult:
    """`QdstrmImporter -i X.qdstrm` (writes X.nsys-rep beside it); the report, or the importer's message."""
    try:
        res = subprocess.run(
            [str(importer), "-i", str(qdstrm)], capture_output=True, text=True, errors="replace", timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return ImportResult(None, str(err))
    for suffix in (".nsys-rep", ".qdrep"):  # .qdrep: importers before 2021.4
        report = qdstrm.with_suffix(suffix)
        if res.returncode == 0 and report.is_file():
            return ImportResult(report, "")
    lines = [ln.strip() for ln in (res.stderr + "\n" + res.stdout).replace("\r", "\n").splitlines() if ln.strip()]
    return ImportResult(None, f"exit {res.returncode}" + (f": {lines[-1]}" if lines else ""))


def missing_libraries(binary: Path) -> list[str]:
    """Shared libraries `binary` needs and the loader cannot find (from ldd), e.g. ['libdw.so.1']."""
    try:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_ldd_missing(out)


def parse_ldd_missing(ldd_output: str) -> list[str]:
    """The `NAME => not found` names of ldd's output, in order."""
    return [m.group(1) for m in re.finditer(r"^\s*(\S+)\s+=>\s+not found", ldd_output, re.MULTILINE)]

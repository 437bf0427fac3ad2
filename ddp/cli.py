"""Plumbing shared by `python -m ddp.verify` and `python -m ddp.benchmark`: arguments, errors, output."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NoReturn

from ddp.launch.launcher import RankFailedError
from ddp.training.config import SETTINGS, check_settings

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error and exit code 2."""

    def error(self, message: str) -> NoReturn:  # argparse's hook: one line, exit code 2
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(EXIT_BAD_INPUT)


def add_settings(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    skip: Collection[str] = (),
    defaults: Mapping[str, Any] | None = None,
    many: Collection[str] = (),
    extra_choices: Mapping[str, Sequence[str]] | None = None,
    notes: Mapping[str, str] | None = None,
    aliases: Mapping[str, Sequence[str]] | None = None,
    only_given: bool = False,
) -> None:
    """One option per RunConfig field (`--batch-size` for `batch_size`), its help the field's docstring.

    `defaults` replaces a field's default for this CLI, `many` makes an option take a list (a sweep),
    `extra_choices` adds choices before the field's own ("all", "auto"), `notes` replaces the default's
    description; `only_given`: options left out are absent from the namespace (the help still names the
    default the run then takes).
    """
    defaults, extra_choices, notes, aliases = defaults or {}, extra_choices or {}, notes or {}, aliases or {}
    for name, fld in SETTINGS.items():
        if name in skip:
            continue
        meta, kind = fld.metadata, _option_type(str(fld.type))
        flags = [*aliases.get(name, ()), "--" + name.replace("_", "-")]
        shown = defaults.get(name, fld.default)  # with only_given, what the run falls back to: still shown
        default = argparse.SUPPRESS if only_given else shown
        choices = [*extra_choices.get(name, ()), *(meta["choices"] or ())] or None
        parts = [meta["doc"], f"one of: {', '.join(choices)}" if choices else "", notes.get(name, "")]
        if not parts[-1] and shown is not None and shown is not False:
            parts[-1] = "default: " + " ".join(map(str, shown if isinstance(shown, list) else [shown]))
        help_text = "; ".join(p for p in parts if p).replace("%", "%%")
        if kind is bool:
            parser.add_argument(*flags, dest=name, action="store_true", default=default, help=help_text)
            continue
        kwargs: dict[str, Any] = {"dest": name, "type": kind, "default": default, "help": help_text}
        if choices:
            kwargs |= {"choices": choices, "metavar": name.upper()}
        if name in many:
            kwargs["nargs"] = "+"
            if default is not argparse.SUPPRESS and not isinstance(default, list):
                kwargs["default"] = [default]
        parser.add_argument(*flags, **kwargs)


def _option_type(annotation: str) -> type:
    """The argparse type of a field annotated `annotation` ("float | None" -> float)."""
    base = annotation.split("|")[0].strip()
    return {"int": int, "float": float, "bool": bool}.get(base, str)


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run settings in `args`, by field name (what `add_settings` put there)."""
    return {name: getattr(args, name) for name in SETTINGS if hasattr(args, name)}


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """--share-gpus and --format, which every training CLI has beside the run settings."""
    parser.add_argument(
        "--share-gpus",
        action="store_true",
        help="NCCL with more ranks than GPUs: needs NCCL >= 2.30 loaded (sets "
        "NCCL_MULTI_RANK_GPU_ENABLE=1; run under CUDA MPS); such timings are not "
        "multi-GPU timings",
    )
    parser.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="stdout format: a human table, or CSV / JSON records for machines",
    )


def resolve_world_size(requested: int | None) -> int:
    """--world-size, else torchrun's WORLD_SIZE, else 2; ValueError unless positive."""
    world = requested if requested is not None else int(os.environ.get("WORLD_SIZE", 2))
    check_settings({"world_size": world})
    return world


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> None:
    """Call `main` and turn known failures into one line on stderr and an exit code."""
    prog = "ddp"
    try:
        code = main(argv)
    except (ValueError, FileExistsError) as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        code = EXIT_BAD_INPUT
    except RankFailedError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        code = EXIT_CHECK_FAILED
    except OSError as exc:  # e.g. an output file that cannot be written
        sys.stderr.write(f"{prog}: error: {exc}\n")
        code = EXIT_BAD_INPUT
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        code = 130
    raise SystemExit(code)


def progress(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def format_records(records: list[dict], fmt: str, columns: list[str], float_digits: int = 4) -> str:
    """Records as an aligned text table, CSV (header + rows) or a JSON list."""
    if fmt == "json":
        return json.dumps(records, indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows({c: "" if r.get(c) is None else r.get(c) for c in columns} for r in records)
        return buf.getvalue().rstrip("\n")
    cells = [[_cell(r.get(c), float_digits) for c in columns] for r in records]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)), "  ".join("-" * w for w in widths)]
    lines += [
        "  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells
    ]
    return "\n".join(lines)


def _cell(value: object, digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e-3 and value else f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return str(value)


def _numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False

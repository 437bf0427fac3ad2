"""Plumbing shared by `python -m ddp.verify` and `python -m ddp.benchmark`: arguments, errors, output."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from ddp.comm.collectives import COLLECTIVES
from ddp.launch.launcher import RankFailedError
from ddp.strategies.registry import IMPLEMENTATIONS
from ddp.training.loop import OPTIMIZERS
from ddp.training.models import MODEL_NAMES

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error and exit code 2."""

    def error(self, message: str) -> NoReturn:  # argparse's hook: one line, exit code 2
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(EXIT_BAD_INPUT)


def add_run_arguments(parser: argparse.ArgumentParser, model_default: str | None) -> None:
    """Arguments every training CLI shares; choices come from the registries."""
    parser.add_argument(
        "--impl",
        nargs="+",
        default=["all"],
        choices=["all", *IMPLEMENTATIONS],
        metavar="IMPL",
        help=f"implementations to run: all or any of {', '.join(IMPLEMENTATIONS)}",
    )
    parser.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="ranks to spawn on this machine (default 2; under torchrun its WORLD_SIZE)",
    )
    parser.add_argument(
        "--model", choices=MODEL_NAMES, default=model_default, metavar="MODEL", help=f"one of {', '.join(MODEL_NAMES)}"
    )
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd")
    parser.add_argument("--lr", type=float, default=1e-2, help="learning rate (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the synthetic data")
    parser.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default=None,
        help="default: nccl when every local rank has a GPU, else gloo",
    )
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
    if world < 1:
        raise ValueError(f"world size must be a positive integer, got {world}")
    return world


def collective_choices() -> list[str]:
    return list(COLLECTIVES)


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

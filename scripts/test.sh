#!/usr/bin/env bash
# The test command: installs what the tests need (scripts/setup.sh --tests: into the project's .venv,
# or into $PYTHON when set), runs scripts/lint.sh (ruff check, ruff format --check, mypy), then the whole
# suite with that interpreter (--whole-suite: the costly tests a bare pytest leaves out too; on two xdist
# workers, the modules that start ranks or nsys on one of them: tests/conftest.py; `-n 0` runs it in one
# process), printing the 25 slowest tests.
#   usage: bash scripts/test.sh [--no-system] [pytest args...]
#     --no-system   setup changes nothing outside the repository (no apt); same as DDP_NO_APT=1
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python.sh
args=()
for arg in "$@"; do
    if [ "$arg" = --no-system ]; then export DDP_NO_APT=1; else args+=("$arg"); fi
done
bash scripts/setup.sh --tests
# The project's modules compiled once: with PYTHONDONTWRITEBYTECODE set (some machines set it), each of
# the hundreds of processes the suite starts (ranks, CLIs) would otherwise compile them again, ~0.3 s each.
"$PY" -m compileall -q analysis contract ddp profiling tests
export PYTHON="$PY"   # run_nsys.sh, started by the tests, uses the same interpreter as pytest
# ruff (lint + format check) and mypy first: they take seconds, and CI fails on their findings too
bash scripts/lint.sh
exec "$PY" -m pytest -q --whole-suite --durations=25 ${args[@]+"${args[@]}"}

#!/usr/bin/env bash
# Lint, format check and type check, with the versions and settings of pyproject.toml:
#   ruff check . ; ruff format --check . (lists the files) ; mypy (files listed in [tool.mypy])
# Runs every check and exits non-zero when any of them found something. Uses the project's interpreter
# (.venv, or $PYTHON); the tools come with the test extra (bash scripts/setup.sh --tests).
#   usage: bash scripts/lint.sh [--fix]    (--fix: apply ruff's safe fixes and format the code)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/python.sh
fix=0
case "${1:-}" in
    "") ;;
    --fix) fix=1 ;;
    *) echo "lint.sh: unknown option $1 (expected --fix)" >&2; exit 2 ;;
esac
for tool in ruff mypy; do
    "$PY" -m "$tool" --version >/dev/null 2>&1 || {
        echo "lint.sh: $tool is not installed for $PY (run: bash scripts/setup.sh --tests)" >&2; exit 2; }
done
status=0
if [ "$fix" = 1 ]; then
    "$PY" -m ruff check --fix . || status=1
    "$PY" -m ruff format . || status=1
else
    echo "== ruff check" >&2;          "$PY" -m ruff check --output-format concise . || status=1
    echo "== ruff format --check" >&2; "$PY" -m ruff format --check --output-format concise . || status=1
fi
echo "== mypy" >&2; "$PY" -m mypy || status=1
exit $status

#!/usr/bin/env bash
# Record Nsight Systems traces of the data-parallel implementations:
#   bash run_nsys.sh overlap            -> traces/overlap.nsys-rep, traces/overlap.sqlite
#   bash run_nsys.sh all                -> the same for every implementation
#   bash run_nsys.sh --help             -> every option (world size, model, steps, warm-up, ...)
# Environment: NSYS=/path/to/nsys picks the nsys binary; PYTHON picks the interpreter (default: the
# project's .venv made by scripts/setup.sh, else python3 on PATH).
# The work is done by `python -m profiling.record`; this wrapper only makes it runnable from anywhere.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/scripts/python.sh"
[ -n "${PYTHON:-}" ] || [ -x "$PY" ] || PY=python3
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m profiling.record "$@"

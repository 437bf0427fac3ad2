# Sourced (not run) by run.sh, run_nsys.sh and scripts/{setup,test,lint}.sh so that they all use one
# interpreter. Sets ROOT (the repository), VENV (the project's virtual environment) and PY:
#   PY = $PYTHON when set (an interpreter you chose: setup installs into its environment),
#        else $VENV/bin/python (scripts/setup.sh creates $VENV with the `python3` on PATH).
# Never the system Python by default.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$ROOT/.venv
PY=${PYTHON:-$VENV/bin/python}

#!/usr/bin/env bash
# The test command: installs what the tests need, then runs the whole suite.
#   usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
exec "${PYTHON:-python3}" -m pytest -q "$@"

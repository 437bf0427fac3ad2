#!/usr/bin/env bash
# Installs what the project needs into the current Python: torch (the CPU wheel when no NVIDIA
# GPU is present, so pip never drags in CUDA packages), the project itself, and, where the machine
# allows (Debian, root), Nsight Systems and Chromium. Safe to re-run: finished steps are skipped.
#   usage: bash scripts/setup.sh [--tests]      (--tests also installs the test extras and Chromium)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
with_tests=0
[ "${1:-}" = "--tests" ] && with_tests=1

say() { printf '[setup] %s\n' "$*" >&2; }

if ! "$PY" -c 'import torch' 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        say "installing torch (CUDA build: a GPU is present)"
        "$PY" -m pip install -q torch
    else
        say "installing torch 2.13.0 (no GPU: to skip the CUDA packages, install the CPU build of torch first)"
        "$PY" -m pip install -q torch==2.13.0
    fi
fi

extras="train"
[ "$with_tests" = 1 ] && extras="train,test"
say "installing the project (.[$extras])"
"$PY" -m pip install -q -e ".[$extras]"

for helper in scripts/install_nsys.sh $([ "$with_tests" = 1 ] && echo scripts/install_chromium.sh); do
    [ -f "$helper" ] && { bash "$helper" || say "$helper failed; the tests that need it will be skipped"; }
done
say "done"

#!/usr/bin/env bash
# Installs what the project needs into the project's virtual environment .venv (created with the
# `python3` on PATH when absent; PYTHON=/path/to/python installs into that interpreter instead; the
# system Python is never touched otherwise):
#   - torch: with an NVIDIA GPU, PyPI's default build (CUDA); without one, torch==2.13.0 (TORCH_VERSION)
#     from PyTorch's CPU wheel index, i.e. the CPU build; when that index does not answer within 5 s,
#     torch==2.13.0 from pip's configured registries instead, which is the CPU build only where they
#     carry 2.13.0+cpu (as on the machines here): the messages say which index and which build;
#   - the project itself (editable) with its extras;
#   - as root on Debian (system-wide, skipped by --no-system or DDP_NO_APT=1): Nsight Systems from
#     Debian's non-free component (adds an apt source) and, with --tests, Debian's Chromium.
# Safe to re-run: finished steps are skipped.
#   usage: bash scripts/setup.sh [--tests] [--no-system]
#     --tests       also install the test extras (pytest, hypothesis, kaleido, ruff, mypy) and Chromium
#     --no-system   change nothing outside the repository: no apt sources, no apt-get (same: DDP_NO_APT=1)
#   environment: PYTHON (interpreter), TORCH_CPU_INDEX (default https://download.pytorch.org/whl/cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python.sh

TORCH_VERSION=2.13.0
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
with_tests=0
for arg in "$@"; do
    case "$arg" in
        --tests) with_tests=1 ;;
        --no-system) export DDP_NO_APT=1 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup.sh: unknown option $arg (expected --tests, --no-system)" >&2; exit 2 ;;
    esac
done

say() { printf '[setup] %s\n' "$*" >&2; }
pip() { "$PY" -m pip "$@"; }

make_venv() {
    if [ -n "${PYTHON:-}" ]; then
        "$PY" -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null && return 0
        say "PYTHON=$PYTHON is not a Python >= 3.10 interpreter"; exit 2
    fi
    [ -x "$PY" ] && return 0
    say "creating the virtual environment $VENV (python3 = $(command -v python3 || echo missing))"
    python3 -m venv "$VENV" || {
        say "python3 -m venv failed (Debian/Ubuntu: apt-get install python3-venv); or set PYTHON=/path/to/python"
        rm -rf "$VENV"; exit 1; }
}

# True when the CPU index answers within 5 s: pip itself would retry an unreachable index for minutes.
cpu_index_reachable() {
    "$PY" - "$TORCH_CPU_INDEX/torch/" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="HEAD"), timeout=5)
PY
}

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

install_torch() {
    if has_gpu; then
        say "installing torch from PyPI (its default build uses CUDA: an NVIDIA GPU is present)"
        pip install -q torch
    elif cpu_index_reachable; then
        say "installing torch==$TORCH_VERSION, CPU build, from $TORCH_CPU_INDEX (no NVIDIA GPU)"
        pip install -q --retries 0 --timeout 15 --index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION" || {
            say "that failed; installing the pinned torch==$TORCH_VERSION from pip's configured registries"
            pip install -q "torch==$TORCH_VERSION"; }
    else
        say "PyTorch's CPU index ($TORCH_CPU_INDEX) is unreachable: installing the pinned" \
            "torch==$TORCH_VERSION from pip's configured registries instead (it is the CPU build" \
            "where they offer torch-$TORCH_VERSION+cpu)"
        pip install -q "torch==$TORCH_VERSION"
    fi
    build=$("$PY" -c 'import torch; print(torch.__version__, f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build")' 2>/dev/null)
    say "installed torch $build"
    case "$build" in
        *CUDA*) has_gpu || say "note: that is torch's CUDA build, although no GPU is present: install the CPU" \
                               "build yourself (pip install torch --index-url $TORCH_CPU_INDEX) to avoid it" ;;
    esac
}

make_venv
"$PY" -c 'import torch' 2>/dev/null || install_torch

extras="train"
[ "$with_tests" = 1 ] && extras="train,test"
say "installing the project into $("$PY" -c 'import sys; print(sys.prefix)') (.[$extras])"
pip install -q -e ".[$extras]"
# An editable install leaves the project's own modules uncompiled (pip compiles only what it copies), so
# where Python writes no bytecode itself (PYTHONDONTWRITEBYTECODE, a read-only checkout) every command
# would compile them again: about 0.1 s of each table command. compileall writes their bytecode either way.
"$PY" -m compileall -q -j 0 analysis contract ddp profiling >/dev/null ||
    say "could not write the project's bytecode (a read-only checkout?): each command compiles what it imports"

if [ "${DDP_NO_APT:-0}" = 1 ]; then
    say "--no-system / DDP_NO_APT=1: no apt sources, no apt-get; nsys and Chromium are used only if already installed"
fi
for helper in scripts/install_nsys.sh $([ "$with_tests" = 1 ] && echo scripts/install_chromium.sh); do
    [ -f "$helper" ] && { bash "$helper" || say "$helper failed; the tests that need it will be skipped"; }
done
say "done: the project's interpreter is $PY"

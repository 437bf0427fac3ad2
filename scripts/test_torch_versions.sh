#!/usr/bin/env bash
# Runs the project on several torch releases: for each VERSION, a virtual environment with PyPI's
# torch==VERSION (its default build, CUDA, which runs on a CPU-only machine too) and the project's
# dependencies (pyproject.toml: `dependencies`, the `train` extra, pytest and hypothesis), then, with
# PYTHONPATH at this repository, `python -m ddp.verify --impl all --world-size 2` and the tests that depend
# on torch's version (TESTS: the strategies and their helpers, the run settings, verify's rules; the slow ones included).
# One line per version: PASS or FAIL, the torch it ran, the times; exit 1 when any version failed. A
# developer's check (CI does not download three torch builds): 4 to 6 minutes to install a version the
# first time on the 2-core VM, then about 5 minutes to run it (docs/fsdp.md#which-torch).
# The environments are kept and reused (torch-VERSION under the cache folder); the logs go beside them.
#   usage: bash scripts/test_torch_versions.sh [--quick] [VERSION ...]
#     VERSION   a torch release, e.g. 2.11.0 (default: 2.9.0 2.11.0 2.14.1: the declared minimum,
#               what the GPU machines here ship, the newest installable here)
#     --quick   those tests without the slow ones (no spawned ranks; verify still spawns 2)
#   environment: TORCH_VERSIONS_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/ddp-overlap),
#                BASE_PYTHON (the interpreter the environments are made from; default python3, >= 3.11)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${TORCH_VERSIONS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddp-overlap}
BASE_PYTHON=${BASE_PYTHON:-python3}
DEFAULT_VERSIONS=(2.9.0 2.11.0 2.14.1)
TESTS=(tests/ddp/strategies tests/ddp/grads tests/ddp/sharding tests/ddp/training tests/ddp/test_verify_rules.py)

error() { echo "error: $*" >&2; exit 2; }

quick=0
versions=()
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) error "unknown option $arg (expected --quick or torch versions such as 2.11.0)" ;;
        *) [[ "$arg" =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] || error "not a torch version: '$arg' (expected e.g. 2.11.0)"
           versions+=("$arg") ;;
    esac
done
[ ${#versions[@]} -gt 0 ] || versions=("${DEFAULT_VERSIONS[@]}")
command -v "$BASE_PYTHON" >/dev/null || error "BASE_PYTHON=$BASE_PYTHON not found"
"$BASE_PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null \
    || error "$BASE_PYTHON is older than Python 3.11 (it reads pyproject.toml with tomllib): set BASE_PYTHON"
mkdir -p "$CACHE" || error "cannot create the cache folder $CACHE"

# The requirements, one a line: the project's dependencies, the train extra with torch pinned, the test runners.
requirements() {
    "$BASE_PYTHON" - "$ROOT/pyproject.toml" "$1" <<'PY'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
test = [r for r in project["optional-dependencies"]["test"] if re.match(r"(pytest|hypothesis)\b", r)]
for req in [*project["dependencies"], *project["optional-dependencies"]["train"], *test]:
    print(f"torch=={sys.argv[2]}" if re.match(r"torch\b", req) else req)
PY
}

# Makes (or reuses) the environment for torch $1 in $2; its `installed` file lists what was installed.
install() {
    local version=$1 venv=$2 reqs
    reqs=$(requirements "$version")
    if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/installed" 2>/dev/null)" = "$reqs" ]; then
        return 0
    fi
    [ -x "$venv/bin/python" ] || "$BASE_PYTHON" -m venv "$venv"
    rm -f "$venv/installed"
    mapfile -t args <<<"$reqs"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${args[@]}"
    printf '%s\n' "$reqs" >"$venv/installed"
}

seconds() { echo $(( $(date +%s) - $1 )); }

# Installs and runs one version; prints its line; returns 1 when it failed.
run_version() {
    local version=$1 venv=$CACHE/torch-$1 log=$CACHE/torch-$1.log start torch_seen
    local install_s verify_s tests_s marks=()
    [ $quick = 1 ] && marks=(-m "not (ranks or nsys or browser or pool or real or pages or subprocess)")
    : >"$log"
    start=$(date +%s)
    if ! install "$version" "$venv" >>"$log" 2>&1; then
        echo "FAIL  torch $version  install failed after $(seconds "$start") s (log: $log)"
        return 1
    fi
    install_s=$(seconds "$start")
    torch_seen=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>>"$log") || torch_seen="$version (import failed)"
    start=$(date +%s)
    local ok=1
    (cd "$ROOT" && PYTHONPATH=$ROOT timeout 900 "$venv/bin/python" -m ddp.verify --impl all --world-size 2) \
        >>"$log" 2>&1 || ok=0
    verify_s=$(seconds "$start")
    start=$(date +%s)
    (cd "$ROOT" && PYTHONPATH=$ROOT timeout 2400 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        ${marks[@]+"${marks[@]}"} "${TESTS[@]}") >>"$log" 2>&1 || ok=0
    tests_s=$(seconds "$start")
    local tally verdict=PASS where=""
    tally=$(grep -E '^=* ?[0-9]+ (passed|failed|error)' "$log" | tail -1 | sed -E 's/=//g; s/ in [0-9.]+s.*//' | xargs)
    [ $ok = 1 ] || { verdict=FAIL; where=" (log: $log)"; }
    echo "$verdict  torch $torch_seen  verify ${verify_s} s, tests ${tests_s} s (${tally:-no tally})," \
        "install ${install_s} s$where"
    [ $ok = 1 ]
}

failed=0
for version in "${versions[@]}"; do
    run_version "$version" || failed=1
done
exit $failed

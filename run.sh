#!/usr/bin/env bash
# The main job: set up, profile every implementation under Nsight Systems, analyse the traces and
# write the comparison report.  Outputs: traces/<impl>.{nsys-rep,sqlite}, reports/index.html.
#   usage: bash run.sh [--no-system] [run_nsys.sh options, e.g. --steps 20 --batch-size 32]
#     --no-system   setup changes nothing outside the repository (no apt); same as DDP_NO_APT=1
# Installs into the project's .venv (PYTHON=/path/to/python: into that interpreter instead), and every
# step below runs with that interpreter. Without nsys (none found after setup), the runs are recorded
# with torch.profiler instead: traces/<impl>.rank<N>.json.gz, analysed the same way.
# The traces go to traces/ and the report to reports/: for other folders or --per-rank, run
# run_nsys.sh and the analysis commands yourself (README).
set -euo pipefail
cd "$(dirname "$0")"
. scripts/python.sh
args=()
for arg in "$@"; do
    case "$arg" in
        --no-system) export DDP_NO_APT=1 ;;
        -o|--out-dir|--out-dir=*|--per-rank|--torchrun|--torchrun=*)
            echo "run.sh: $arg is not for the main job (it writes traces/ and reports/); use run_nsys.sh directly" >&2
            exit 2 ;;
        *) args+=("$arg") ;;
    esac
done
bash scripts/setup.sh
export PYTHON="$PY"   # run_nsys.sh and the processes it starts use the interpreter setup installed into
mapfile -t impls < <("$PY" -c 'from ddp.strategies.registry import IMPLEMENTATIONS; print("\n".join(IMPLEMENTATIONS))')
if PYTHONPATH=. "$PY" -c 'from profiling.nsys import find_nsys; find_nsys()' 2>/dev/null; then
    bash run_nsys.sh all ${args[@]+"${args[@]}"}
    # exactly this run's traces, not whatever else lies in traces/
    traces=("${impls[@]/#/traces/}"); traces=("${traces[@]/%/.sqlite}")
    "$PY" -m analysis.overlap "${traces[@]}"
else
    echo "run.sh: nsys not found: recording with torch.profiler instead (traces/<impl>.rank<N>.json.gz)" >&2
    bash run_nsys.sh all --profiler torch ${args[@]+"${args[@]}"}
    traces=()
    for impl in "${impls[@]}"; do
        ranks=(traces/"$impl".rank*.json.gz)
        "$PY" -m analysis.overlap --merge "${ranks[@]}"
        traces+=("${ranks[@]}")
    done
fi
"$PY" -m analysis.report "${traces[@]}" -o reports/ --overwrite  # reports/ is this job's: replace an earlier run's report
echo "open reports/index.html"

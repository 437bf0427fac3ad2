#!/usr/bin/env bash
# The main job: set up, profile every implementation under Nsight Systems, analyse the traces and
# write the comparison report.  Outputs: traces/<impl>.{nsys-rep,sqlite}, reports/index.html.
#   usage: bash run.sh [run_nsys.sh options...]
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
bash run_nsys.sh all "$@"
python3 -m analysis.overlap traces/*.sqlite
python3 -m analysis.report traces/*.sqlite -o reports/
echo "open reports/index.html"

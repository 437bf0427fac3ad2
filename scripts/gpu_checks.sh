#!/usr/bin/env bash
# The GPU checks of the slow-rank knob, process groups and the what-if, in one bounded run for a machine
# with one H100/H200 (two ranks share it: NCCL >= 2.30 under MPS, as ../shared/notes/gpu.md describes).
# In the project root, after `bash ../shared/tools/gpu-carry.sh` built .gpu/ (send it along):
#   bash scripts/gpu_checks.sh          every step (about 9 minutes)
#   bash scripts/gpu_checks.sh slow     the two slow-rank recordings alone (about 3 minutes)
# Each slow-rank recording is analysed on the machine too: summary.txt gets one `straggler` line per measured
# step (the rank named, its cause, cause_ms, late_ms) and one `held` line per rank (steps held, causes).
# Writes under $OUT (or ./gpu-out): log.txt, summary.txt and the recordings (xz-compressed exports,
# torch.profiler files, ddp.benchmark CSVs), which are analysed on any machine afterwards:
#   slow_<place>/overlap_bucket.sqlite.xz  rank 1 held back 40 ms at <place> (backward, issue)
#   advise/                                the what-if's recordings and unprofiled sweeps (scripts/gpu_advise_sweeps.sh)
# fsdp with --separate-reduce-scatter (a second NCCL communicator) hung with two ranks sharing one H200
# under MPS (2026-11-28, docs/measurements/2026-11-28-gpu-h200.md), so it is not among the steps.
# Every step is bounded; a failing step is logged and the next one runs. Most needed first: a run cut
# short keeps what it recorded.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
L=$OUT/log.txt
: > "$L"
export PYTHONUNBUFFERED=1 PYTHON=${PYTHON:-python3}
# sourced, never in a pipe: a pipe runs it in a subshell and its exports (LD_PRELOAD, NSYS, MPS) are lost
source .gpu/setup.sh >> "$L" 2>&1
ONLY=${1:-all}
gpu_free() {  # wait (up to 30 s) until no process of ours holds the GPU; then kill the ones still listed, by pid
    local i pids
    for i in $(seq 30); do
        pids=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2> /dev/null |
            grep -v mps-server | cut -d, -f1 | tr -d ' ')
        [ -z "$pids" ] && return 0
        sleep 1
    done
    echo "=== GPU still held by pid(s) $pids: killed" >> "$L"
    for p in $pids; do kill -9 "$p" 2> /dev/null; done
    sleep 3
}
step() {
    local t=$1
    shift
    gpu_free
    echo "=== $(date +%T) [$t s] $*" >> "$L"
    timeout -k 5 "$t" "$@" >> "$L" 2>&1
    echo "=== rc=$?" >> "$L"
    # a step cut by its timeout can leave ranks holding the GPU ("busy or unavailable" for the next one)
    pkill -9 -f "multiprocessing.spawn|-m profiling.run|-m ddp.benchmark" > /dev/null 2>&1
    sleep 2
}
{ nvidia-smi -L; $PYTHON -c "import torch,sys;print(sys.version.split()[0], torch.__version__)"; } >> "$L" 2>&1
N="--world-size 2 --backend nccl --share-gpus --model medium"
S="--steps 5 --warmup 2"
T="--trace cuda,nvtx"
record() {  # record TIMEOUT FOLDER IMPL ARGS...: an nsys run, its export compressed at once (a cut run keeps it)
    local t=$1 folder=$OUT/$2
    shift 2
    step "$t" bash run_nsys.sh "$@" $N $S -o "$folder"
    rm -f "$folder"/*.nsys-rep
    case "$folder" in */slow_*) stragglers "$folder"/*.sqlite ;; esac
    xz -T0 -6 "$folder"/*.sqlite 2> /dev/null
}
stragglers() {  # stragglers EXPORT: per measured step the rank named and why (analysis.collectives' JSON)
    [ -f "$1" ] || return 0
    echo "=== stragglers of $1" >> "$L"
    timeout 120 $PYTHON -m analysis.collectives "$1" --format json --no-cache 2>> "$L" | $PYTHON -c '
import json, sys
t = json.load(sys.stdin)["traces"][0]
for s in t["stragglers"]:
    print("straggler step", s["step"], "rank", s["straggler"], "cause", s["cause"],
          "cause_ms %.1f late_ms %.1f" % (s["cause_ms"] or 0, s["late_ms"] or 0))
for r in t["straggler_summary"]:
    print("held rank", r["rank"], r["steps_held"], "of", r["steps"], "causes", r["causes"])' >> "$L" 2>&1
}
bench() {  # bench TIMEOUT CSV ARGS...: the unprofiled step time
    local t=$1 csv=$OUT/$2
    shift 2
    step "$t" $PYTHON -m ddp.benchmark $N --steps 8 --warmup 3 --csv "$csv" --overwrite "$@"
}
# the host stall before a collective is issued: its cause must read `issue` (a sleep in backward: `backward`)
record 75 slow_issue overlap_bucket $T --slow-rank 1:issue:40
record 75 slow_backward overlap_bucket $T --slow-rank 1:backward:40
# ---- advise (what-if) GPU error tables: recordings and unprofiled sweeps of overlap_bucket, torch and fsdp, in
# $OUT/advise (scripts/gpu_advise_sweeps.sh: what it records, its own budget ADVISE_BUDGET_S, default 420 s, and
# the offline commands that make the tables). `slow` or ADVISE=0 leaves it out.
if [ "$ONLY" != slow ] && [ "${ADVISE:-1}" != 0 ]; then
    OUT=$OUT/advise ADVISE_KEEP_MPS=1 bash scripts/gpu_advise_sweeps.sh > /dev/null 2>&1
fi
# ---- end of the advise block
echo quit | nvidia-cuda-mps-control > /dev/null 2>&1
grep -vE "Warning|warn_once|return func" "$L" | grep -E "^===|PASS|FAIL|error|Error|ms/step|illegal|^straggler|^held" > "$OUT/summary.txt"
cat "$OUT/summary.txt"
